"""The console's rate charts in Debian's Chromium against a live gateway (issue #26, item 1): history the
sampler stored before the page opened is drawn at once, with a UTC time axis, round ticks and a sharp
canvas at devicePixelRatio 2; the ranges switch; the tooltip gives each series at the cursor; a purge
is a mark with its count and user, not a dequeue spike. The samples are written by broker_core's
sampler (rates.sample) on a clock set in the past, as the maintenance tick would have written them."""

from __future__ import annotations

import math
import re
import time

import pytest
from playwright.sync_api import expect

from broker_core import rates
from broker_core.broker import Broker
from broker_core.clock import FakeClock
from broker_core.messages import Message
from tests.console.conftest import PASSWORD

pytestmark = pytest.mark.e2e


def hd_login(chromium, server):
    """A logged-in admin page at devicePixelRatio 2 (a HiDPI screen)."""
    context = chromium.new_context(viewport={"width": 1366, "height": 900}, device_scale_factor=2)
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{server.url}/console/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.url}/console/")
    return page


@pytest.fixture
def hd_page(chromium, console_server):
    page = hd_login(chromium, console_server)
    yield page
    page.context.close()


def past_broker(redis_client, namespace: str, seconds_ago: int) -> tuple[Broker, FakeClock]:
    now = time.time_ns() // 1_000_000
    clock = FakeClock(now - now % 5_000 - seconds_ago * 1_000)
    return Broker(redis_client, namespace, clock), clock


def round_ticks(texts: list[str]) -> bool:
    """Evenly spaced by 1, 2 or 5 x 10^n, each a multiple of that step (0, 5, 10, 15, ...; never 16.8)."""
    values = [float(t.replace(",", "")) for t in texts]
    if len(values) < 2:
        return False
    step = values[1] - values[0]
    p = 10 ** math.floor(math.log10(step))
    nice = any(abs(step - m * p) < 1e-9 * step for m in (1, 2, 5))
    return nice and all(abs(b - a - step) < 1e-9 * step and abs(v / step - round(v / step)) < 1e-6
                        for a, b, v in zip(values, values[1:], values[1:], strict=False))


def chart_state(page, selector="#rate-chart"):
    return page.evaluate(f"""() => {{
      const f = document.querySelector("{selector}"); const u = f.uplot;
      return {{ range: f.dataset.loadedRange, yTicks: u.axes[1]._values, xTicks: u.axes[0]._values,
               n: u.data[0].length, sampled: u.data[1].filter((v) => v !== null).length,
               maxEnq: Math.max(...u.data[1].filter((v) => v !== null)),
               canvasWidth: u.ctx.canvas.width, cssWidth: u.ctx.canvas.getBoundingClientRect().width,
               dpr: window.devicePixelRatio }};
    }}""")


def test_stored_history_is_drawn_on_load_with_a_time_axis_round_ticks_ranges_and_a_tooltip(
        hd_page, console_server, redis_client, queue_name):
    page = hd_page
    # 15 minutes of history, written before the page opens: 3 messages per 5 s, a burst of 84 at one step
    broker, clock = past_broker(redis_client, console_server.namespace, 15 * 60)
    broker.ensure_destination(queue_name)
    rates.sample(broker, [queue_name])
    for step in range(180):
        clock.advance(5_000)
        broker.send(queue_name, [Message(body="x") for _ in range(84 if step == 170 else 3)])
        rates.sample(broker, [queue_name])
    burst_at = clock.now_ms() - 9 * 5_000  # the step (start) of the burst

    page.goto(f"{console_server.url}/console/queues/{queue_name}/")
    page.wait_for_selector("#rate-chart[data-loaded-range='5m']")
    s = chart_state(page)
    assert s["n"] == 60 and s["sampled"] >= 55  # the stored past, not an empty chart filling up
    assert s["maxEnq"] == 16.8  # the burst's step: 84 in 5 s
    assert round_ticks(s["yTicks"]), s["yTicks"]  # 0, 5, 10, 15, 20 ...
    assert "16.8" not in s["yTicks"]
    assert all(re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", t) for t in s["xTicks"]), s["xTicks"]
    utc_hour = time.strftime("%H", time.gmtime(time.time() - 120))
    assert any(t.startswith(utc_hour) or t.startswith(str(int(utc_hour))) for t in s["xTicks"])
    # sharp: the canvas has devicePixelRatio device pixels per CSS pixel, across the figure's width
    assert s["dpr"] == 2 and abs(s["canvasWidth"] - 2 * s["cssWidth"]) <= 2
    assert s["cssWidth"] > 900

    # the tooltip at the burst: its time and each series
    x = page.evaluate(f"() => document.querySelector('#rate-chart').uplot.valToPos({burst_at / 1000}, 'x')")
    over = page.locator("#rate-chart .u-over").bounding_box()
    page.mouse.move(over["x"] + x, over["y"] + over["height"] / 2)
    tip = page.locator("#rate-chart .rate-tip")
    tip.wait_for(state="visible")
    text = tip.inner_text()
    assert "16.8/s" in text and "enqueued" in text and "dead-lettered" in text and "UTC" in text
    assert time.strftime("%H:%M:%S", time.gmtime(burst_at / 1000)) in text

    # ranges: 1 h at 5 s and 24 h at 1 min, the past still there
    page.click("#rate-chart button[data-range='1h']")
    page.wait_for_selector("#rate-chart[data-loaded-range='1h']")
    s = chart_state(page)
    assert s["n"] == 720 and 175 <= s["sampled"] <= 185 and s["maxEnq"] == 16.8
    assert page.get_attribute("#rate-chart button[data-range='1h']", "aria-pressed") == "true"
    page.click("#rate-chart button[data-range='24h']")
    page.wait_for_selector("#rate-chart[data-loaded-range='24h']")
    s = chart_state(page)
    assert s["n"] == 1440 and 15 <= s["sampled"] <= 17  # one step a minute
    assert round_ticks(s["yTicks"]), s["yTicks"]
    page.click("#rate-chart button[data-range='5m']")
    page.wait_for_selector("#rate-chart[data-loaded-range='5m']")


def test_a_purge_is_a_mark_with_its_count_not_a_dequeue_spike(hd_page, console_server, redis_client,
                                                              queue_name):
    page = hd_page
    broker, clock = past_broker(redis_client, console_server.namespace, 60)
    broker.send(queue_name, [Message(body=str(i)) for i in range(561)])
    rates.sample(broker, [queue_name])
    for _ in range(6):
        clock.advance(5_000)
        rates.sample(broker, [queue_name])
    page.goto(f"{console_server.url}/console/queues/{queue_name}/")
    page.wait_for_selector("#rate-chart[data-loaded-range='5m']")
    assert chart_state(page)["maxEnq"] == 0  # 561 sent before the first sample: a base, not a spike

    page.click("#purge")
    page.click("#confirm-ok")
    page.wait_for_selector("#toast:has-text('Purge: done (561 removed)')")
    # the tick samples after the purge
    clock.set(time.time_ns() // 1_000_000)
    rates.sample(broker, [queue_name])
    mark = page.locator("#rate-chart .rate-marks li[data-action='purge']")
    mark.wait_for()
    assert "purge 561 messages by admin" in mark.inner_text()
    page.evaluate("() => document.dispatchEvent(new Event('sb:operation'))")  # read the new sample now
    page.wait_for_function(f"""() => document.querySelector('#rate-chart').rateData.sampled_until
      >= {clock.now_ms()}""")
    peaks = page.evaluate("""() => document.querySelector('#rate-chart').uplot.data.slice(1)
      .map((s) => Math.max(0, ...s.filter((v) => v !== null)))""")
    assert peaks == [0] * 7  # no series moved: a purge is none of enqueue ... discarded
    # the mark is in the tooltip at its time
    at = page.evaluate("""() => { const f = document.querySelector('#rate-chart');
      return f.uplot.valToPos(f.marks[0].at / 1000, 'x'); }""")
    over = page.locator("#rate-chart .u-over").bounding_box()
    page.mouse.move(over["x"] + min(at, over["width"] - 2), over["y"] + 20)
    tip = page.locator("#rate-chart .rate-tip")
    tip.wait_for(state="visible")
    assert "purge 561 messages by admin" in tip.inner_text()


def test_the_overview_charts_every_destination_summed(hd_page, console_server, redis_client, queue_name):
    page = hd_page
    broker, clock = past_broker(redis_client, console_server.namespace, 120)
    # the namespace's rings start here: an earlier test's samples of the real clock are newer than this
    # past one's, whose slots they already hold (a ring's slot is one epoch's: rate_sample.lua)
    overview = rates._key(broker, None)
    redis_client.delete(overview, *(f"{overview}:{ring}{added}" for ring in rates.RINGS
                                     for added in ("", *(f":{series}" for series in rates.ADDED))))
    broker.ensure_destination(queue_name)
    rates.sample(broker, [queue_name], pass_span=5_000)
    for _ in range(20):
        clock.advance(5_000)
        broker.send(queue_name, [Message(body="x") for _ in range(10)])
        rates.sample(broker, [queue_name], pass_span=5_000)
    page.goto(f"{console_server.url}/console/")
    page.wait_for_selector("#rates-chart[data-loaded-range='5m']")
    s = chart_state(page, "#rates-chart")
    assert s["sampled"] >= 19 and s["maxEnq"] >= 2.0
    # and a topic's page charts its rates too
    topic = f"topic://{queue_name}.t"
    broker.ensure_destination(topic)
    rates.sample(broker, [topic])
    clock.advance(5_000)
    broker.send(topic, [Message(body="x") for _ in range(5)])
    rates.sample(broker, [topic])
    page.goto(f"{console_server.url}/console/topics/{queue_name}.t/")
    page.wait_for_selector("#rate-chart[data-loaded-range='5m']")
    assert chart_state(page)["maxEnq"] == 1.0


def test_without_uplot_the_chart_says_so_and_shows_the_latest_rates_as_text(admin_page, console_server,
                                                                            redis_client, queue_name):
    """A machine without npm: /static/vendor/uplot/ is not there (here: the browser is refused it)."""
    page = admin_page
    broker, clock = past_broker(redis_client, console_server.namespace, 30)
    broker.ensure_destination(queue_name)
    rates.sample(broker, [queue_name])
    clock.advance(5_000)
    broker.send(queue_name, [Message(body="x") for _ in range(10)])
    rates.sample(broker, [queue_name])
    page.route("**/static/vendor/uplot/**", lambda route: route.fulfill(status=404, body="not installed"))
    page.goto(f"{console_server.url}/console/queues/{queue_name}/")
    missing = page.locator("#rate-chart .chart-missing")
    missing.wait_for()
    assert "uPlot" in missing.inner_text() and "npm ci" in missing.inner_text()
    page.wait_for_selector("#rate-chart .rate-now:has-text('enqueued 2.0/s')")
    assert page.locator("#consumers tbody tr").count() >= 1  # the rest of the page works


def test_a_chart_whose_samples_stopped_says_so(admin_page, console_server, redis_client, queue_name):
    """The maintenance tick stopped (Celery beat or the workers down): the chart's line under it read
    "latest (<a minute ago>): enqueued 2.0/s" as if it were the rate now, under the header's "Live"."""
    page = admin_page
    broker, clock = past_broker(redis_client, console_server.namespace, 120)
    broker.ensure_destination(queue_name)
    rates.sample(broker, [queue_name])
    for _ in range(6):  # samples up to 90 s ago, then none
        clock.advance(5_000)
        broker.send(queue_name, [Message(body="x") for _ in range(10)])
        rates.sample(broker, [queue_name])
    page.goto(f"{console_server.url}/console/queues/{queue_name}/")
    line = page.locator("#rate-chart .rate-now")
    expect(line).to_contain_text(re.compile(r"No samples since \d\d:\d\d:\d\d UTC \(\d+s ago\)"))
    expect(line).to_contain_text("the maintenance tick has stopped sampling")
    expect(line).to_contain_text("enqueued 2.0/s")  # what the last sample said, as such
    # sampling again: the line is the latest rates again, at the next reading (every 5 s)
    clock.advance(90_000)
    rates.sample(broker, [queue_name])
    expect(line).to_contain_text("latest (", timeout=8000)
    expect(line).not_to_contain_text("No samples since")
