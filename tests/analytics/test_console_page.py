"""The console's Analytics pages in a real browser: the numbers of the last run, the rebalance
recommendation, and the "Remove all message groups" button next to it."""

from __future__ import annotations

import re
import time

import pytest

from analytics.archive import ArchiveLocation, archive_all
from analytics.pipeline import run
from tests.analytics.test_end_to_end import send_and_consume
from tests.console.conftest import (  # noqa: F401 - the console suite's fixtures
    admin_page,
    broker,
    chromium,
    console_server,
    queue_name,
    reader_page,
)

pytestmark = pytest.mark.e2e


def confirm(page) -> None:
    from playwright.sync_api import expect

    dialog = page.locator("dialog#confirm")
    expect(dialog).to_be_visible()
    dialog.locator("#confirm-ok").click()
    expect(dialog).to_be_hidden()


@pytest.fixture
def analysed(spark, broker, console_server, queue_name, redis_client, tmp_path):  # noqa: F811
    since = int(time.time() * 1000) - 60_000
    send_and_consume(broker, queue_name)
    archive_all(broker, ArchiveLocation.parse(tmp_path / "archive"), destinations=[f"queue://{queue_name}"])
    run(spark, since_ms=since, until_ms=int(time.time() * 1000) + 1000, archive=str(tmp_path / "archive"),
        output=str(tmp_path / "out"), redis_client=redis_client, namespace=console_server.namespace)
    return queue_name


def test_the_analytics_page_shows_the_run_and_resets_groups_from_the_recommendation(
        admin_page, console_server, broker, analysed):  # noqa: F811
    from playwright.sync_api import expect

    page = admin_page
    page.goto(f"{console_server.url}/console/analytics/")
    row = page.locator("#analytics-destinations tr", has=page.locator(f"a:text-is('queue://{analysed}')"))
    expect(row).to_contain_text("rebalance recommended")
    link = row.locator("a")
    link.click()
    expect(page.locator("[data-counter=enqueued] dd")).to_have_text("50")
    expect(page.locator("[data-counter=acked] dd")).to_have_text("48")
    expect(page.locator("[data-counter=dead_lettered] dd")).to_have_text("2")
    expect(page.locator("[data-counter=redelivered] dd")).to_have_text("5")
    expect(page.locator("#latency tbody tr[data-metric=send_to_ack]").first).to_contain_text("48")
    expect(page.locator("#dead-letters tbody")).to_contain_text("poison")
    expect(page.locator("#group-consumers tbody tr[data-consumer=early]")).to_contain_text("40")
    expect(page.locator("#recommendation")).to_contain_text(f"Remove all message groups on queue://{analysed}")
    assert {g.group_id for g in broker.message_groups(analysed)} == {"g0", "g1", "g2", "g3"}

    page.click("#remove-all-groups")
    confirm(page)
    expect(page.locator("#toast")).to_contain_text("Message groups removed")
    assert broker.message_groups(analysed) == []


def test_a_reader_sees_the_charts_but_no_reset_button(reader_page, console_server, analysed):  # noqa: F811
    from playwright.sync_api import expect

    page = reader_page
    page.goto(f"{console_server.url}/console/analytics/queue/{analysed}/")
    expect(page.locator("[data-counter=enqueued] dd")).to_have_text("50")
    expect(page.locator("#remove-all-groups")).to_have_count(0)


def test_a_destination_without_a_run_says_so(admin_page, console_server):  # noqa: F811
    from playwright.sync_api import expect

    page = admin_page
    page.goto(f"{console_server.url}/console/analytics/queue/never.used/")
    # Without a run at all the page says how to start one; with a run, that it saw nothing here.
    said = re.compile("no events on queue://never.used|have not run yet")
    expect(page.locator("#range")).to_have_text(said)
