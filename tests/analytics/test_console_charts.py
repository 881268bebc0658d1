"""The Analytics pages' units in Debian's Chromium (issue #26, round 2): the run's range as dates (not
epoch ms), latencies in ms / s / min / h, and the throughput chart drawn by the console's uPlot helper
(rates.js) — sharp at devicePixelRatio 2, UTC time ticks, round messages/s ticks, a minute without
events drawn as 0. The input is a summary as the pipeline stores it (`<ns>:analytics:summary`), written
directly so the figures are known; tests/analytics/test_console_page.py covers a real Spark run."""

from __future__ import annotations

import json
import re

import pytest

from analytics.store import write_summary
from tests.console.conftest import (  # noqa: F401 - the console suite's fixtures
    chromium,
    console_server,
    queue_name,
)
from tests.console.test_rates_console import hd_login, round_ticks

pytestmark = pytest.mark.e2e

COUNTERS = ["enqueued", "dispatched", "acked", "redelivered", "expired", "dead_lettered", "discarded",
            "evicted"]
SINCE = 1_795_255_200_000  # 2026-11-21T10:00:00Z
MINUTE = 60_000


def summary(uri: str, since_ms: int, until_ms: int, per_minute: list[list[int]]) -> str:
    totals = {name: sum(p[i + 1] for p in per_minute) for i, name in enumerate(COUNTERS)}
    stats = lambda count, p50, p95, p99: {"count": count, "p50": p50, "p95": p95, "p99": p99}  # noqa: E731
    entry = {
        "totals": totals, "per_minute": per_minute,
        "latency": {"send_to_dispatch": stats(720, 0.4, 850, 1250),
                    "send_to_ack": stats(700, 42_500, 200_000, 7_500_000)},
        "latency_by_consumer": {}, "redeliveries": {"0": 700}, "dead_letters": [],
        "groups": {"top": [], "consumers": [], "balance": None, "count": 0},
        "slow_consumers": {"episodes": 0, "aborts": 0, "recent_episodes": [], "recent_aborts": []}}
    return json.dumps({"generated_at_ms": until_ms + 5_000, "since_ms": since_ms, "until_ms": until_ms,
                       "counters": COUNTERS, "destinations": {uri: entry}})


def minute(at_ms: int, enqueued: int, acked: int) -> list[int]:
    return [at_ms, enqueued, enqueued, acked, 0, 0, 0, 0, 0]


@pytest.fixture
def hd_page(chromium, console_server):  # noqa: F811
    page = hd_login(chromium, console_server)
    yield page
    page.context.close()


def chart(page) -> dict:
    page.wait_for_function("() => document.querySelector('#throughput-chart').uplot")
    return page.evaluate("""() => {
      const u = document.querySelector("#throughput-chart").uplot;
      return { times: u.data[0], enqueued: u.data[1], acked: u.data[3], labels: u.series.map((s) => s.label),
               legendOneAMinute: u.series[1].value(u, 1 / 60), legendTen: u.series[1].value(u, 10),
               yTicks: u.axes[1]._values, xTicks: u.axes[0]._values,
               canvasWidth: u.ctx.canvas.width, cssWidth: u.ctx.canvas.getBoundingClientRect().width };
    }""")


def test_range_as_dates_latencies_in_units_and_the_throughput_chart_in_uplot(
        hd_page, console_server, redis_client, queue_name):  # noqa: F811
    from playwright.sync_api import expect

    page = hd_page
    uri = f"queue://{queue_name}"
    write_summary(redis_client, console_server.namespace, summary(
        uri, SINCE, SINCE + 30 * MINUTE,
        [minute(SINCE + 2 * MINUTE, 600, 300), minute(SINCE + 10 * MINUTE, 120, 120)]))

    page.goto(f"{console_server.url}/console/analytics/")
    expect(page.locator("#analytics-range")).to_contain_text(
        "2026-11-21 10:00:00 UTC – 2026-11-21 10:30:00 UTC")
    assert not re.search(r"\d{13}", page.locator("#analytics-range").inner_text())  # no epoch ms

    page.goto(f"{console_server.url}/console/analytics/queue/{queue_name}/")
    expect(page.locator("#range")).to_contain_text("2026-11-21 10:00:00 UTC – 2026-11-21 10:30:00 UTC")
    row = page.locator("#latency tbody tr[data-metric=send_to_dispatch]")
    expect(row.locator("td[data-p=p50]")).to_have_text("0.4 ms")
    expect(row.locator("td[data-p=p95]")).to_have_text("850 ms")
    expect(row.locator("td[data-p=p99]")).to_have_text("1.25 s")
    row = page.locator("#latency tbody tr[data-metric=send_to_ack]")
    expect(row.locator("td[data-p=p50]")).to_have_text("42.5 s")
    expect(row.locator("td[data-p=p95]")).to_have_text("3 min 20 s")
    expect(row.locator("td[data-p=p99]")).to_have_text("2 h 5 min")

    drawn = chart(page)
    # One point per minute of the range, a minute without events a 0, counts ÷ 60 as messages/s.
    assert drawn["times"] == [(SINCE + i * MINUTE) / 1000 for i in range(30)]
    assert drawn["enqueued"][2] == 10 and drawn["enqueued"][10] == 2 and drawn["acked"][2] == 5
    assert sum(drawn["enqueued"]) == 12 and drawn["enqueued"].count(0) == 28
    assert drawn["labels"][1:] == ["enqueued/s", "dispatched/s", "acked/s", "redelivered/s", "expired/s",
                                   "dead-lettered/s"]
    assert round_ticks(drawn["yTicks"]), drawn["yTicks"]
    assert (drawn["legendOneAMinute"], drawn["legendTen"]) == ("0.017", "10.0")  # one a minute is not 0.0
    assert all(re.fullmatch(r"\d\d:\d\d", t) for t in drawn["xTicks"]), drawn["xTicks"]
    assert drawn["xTicks"][0] >= "10:00" and drawn["xTicks"][-1] <= "10:29"
    assert drawn["canvasWidth"] == pytest.approx(2 * drawn["cssWidth"], abs=2)  # devicePixelRatio 2
    expect(page.locator("#throughput-caption")).to_have_text(
        "Per-minute averages, 2026-11-21 10:00:00 UTC – 2026-11-21 10:30:00 UTC.")
    assert page.evaluate("() => window.SB.Chart") is None  # one charting implementation in the console

    # A range longer than the summary's 1,440 minutes: the chart shows the range's last 24 h.
    until = SINCE + 3 * 86_400_000
    write_summary(redis_client, console_server.namespace, summary(
        uri, SINCE, until, [minute(SINCE, 60, 60), minute(until - MINUTE, 180, 180)]))
    page.reload()
    drawn = chart(page)
    assert len(drawn["times"]) == 1440 and drawn["times"][0] == (until - 86_400_000) / 1000
    assert drawn["enqueued"][-1] == 3 and sum(drawn["enqueued"]) == 3
    expect(page.locator("#throughput-caption")).to_contain_text("(the last 24 h of the range).")


def test_events_lost_before_archiving_are_said_on_both_pages(
        hd_page, console_server, redis_client, queue_name):  # noqa: F811
    from playwright.sync_api import expect

    page = hd_page
    uri = f"queue://{queue_name}"
    stored = json.loads(summary(uri, SINCE, SINCE + 30 * MINUTE, [minute(SINCE, 600, 300)]))
    stored["counters"].append("lost")
    entry = stored["destinations"][uri]
    entry["totals"]["lost"] = 1234
    entry["per_minute"] = [[*p, 1234] for p in entry["per_minute"]]
    write_summary(redis_client, console_server.namespace, json.dumps(stored))

    page.goto(f"{console_server.url}/console/analytics/")
    expect(page.locator("#analytics-destinations tbody tr")).to_contain_text("1,234 events lost")
    page.goto(f"{console_server.url}/console/analytics/queue/{queue_name}/")
    expect(page.locator("#loss")).to_be_visible()
    expect(page.locator("#loss")).to_contain_text(
        "1,234 events were dropped by the event stream's bound (eventsMaxLen) before they were archived")
    # and without a loss, no warning
    write_summary(redis_client, console_server.namespace, summary(uri, SINCE, SINCE + 30 * MINUTE,
                                                                  [minute(SINCE, 600, 300)]))
    page.reload()
    expect(page.locator("#range")).to_contain_text("2026-11-21 10:00:00 UTC")
    expect(page.locator("#loss")).to_be_hidden()


@pytest.fixture(scope="module")
def scheduled_server(tmp_path_factory):
    """A console whose analytics jobs are scheduled every minute (SIGNALBOX_ANALYTICS_SECONDS=60)."""
    import subprocess
    import sys
    import uuid

    from tests.console.conftest import USERS
    from tests.helpers.gateway_server import ROOT, server_env, start_gateway

    data_dir = tmp_path_factory.mktemp("scheduled")
    namespace = f"t{uuid.uuid4().hex[:12]}"
    env = server_env(data_dir, namespace)
    for command in (["migrate", "--noinput", "-v", "0"], ["shell", "-c", USERS]):
        subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, check=True, timeout=120)
    server = start_gateway(data_dir, namespace, name="console-scheduled", SIGNALBOX_ANALYTICS_SECONDS="60")
    server.namespace = namespace
    server.url = f"http://127.0.0.1:{server.port}"
    yield server
    server.stop()


def test_an_overdue_scheduled_run_is_said_to_be_stale_and_every_run_shows_its_age(
        chromium, scheduled_server, redis_client, queue_name):  # noqa: F811
    import time

    from playwright.sync_api import expect

    page = hd_login(chromium, scheduled_server)
    uri = f"queue://{queue_name}"
    now = int(time.time() * 1000)
    until = now - 2 * 3_600_000 - 5_000  # computed (until + 5 s) two hours ago: 120 periods missed
    write_summary(redis_client, scheduled_server.namespace, summary(
        uri, until - 30 * MINUTE, until, [minute(until - 10 * MINUTE, 60, 60)]))
    page.goto(f"{scheduled_server.url}/console/analytics/")
    expect(page.locator("#analytics-stale")).to_contain_text("scheduled every 1 min")
    expect(page.locator("#analytics-stale")).to_contain_text("stale")
    page.goto(f"{scheduled_server.url}/console/analytics/queue/{queue_name}/")
    expect(page.locator("#stale")).to_be_visible()
    expect(page.locator("#stale")).to_contain_text("scheduled every 1 min")
    expect(page.locator("#range")).to_contain_text("(2 h 0 min ago)")
    # A run a moment ago: no warning.
    until = int(time.time() * 1000) - 10_000
    write_summary(redis_client, scheduled_server.namespace, summary(
        uri, until - 30 * MINUTE, until, [minute(until - 10 * MINUTE, 60, 60)]))
    page.reload()
    expect(page.locator("#range")).to_contain_text("ago)")
    expect(page.locator("#stale")).to_be_hidden()
    page.goto(f"{scheduled_server.url}/console/analytics/")
    expect(page.locator("#analytics-range")).to_be_visible()
    expect(page.locator("#analytics-stale")).to_have_count(0)
    page.context.close()
