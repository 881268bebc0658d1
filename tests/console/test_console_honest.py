"""Issue 26: the console's figures mean what their labels say. A topic's backlog (its subscriptions'
messages) in the destination list, its sorting and the overview; the badges and counters of the queue
page set by a scenario and left alone by another; every page's connection indicator leaving
"Connecting…"; consumers named by their client id."""

from __future__ import annotations

import re
import time
import uuid

import pytest
from playwright.sync_api import expect

from broker_core.messages import Message
from broker_core.operations import ConsumerSpec
from tests.console.conftest import login
from tests.helpers.gateway_server import start_gateway

pytestmark = pytest.mark.e2e


def number(text: str) -> int:
    return int(text.split()[0].replace(",", ""))


def test_a_topic_s_offline_durable_backlog_shows_in_the_list_its_sorting_and_the_overview(
        admin_page, console_server, broker):
    prefix = f"bk{uuid.uuid4().hex[:8]}"
    topic, queue = f"{prefix}.topic", f"{prefix}.queue"
    spec = ConsumerSpec(client_id="billing", subscription_name="ledger", lease_ms=120_000)
    durable = broker.add_consumer(f"topic://{topic}", spec)
    broker.close_consumer(durable)  # offline: it keeps every message sent from now on
    broker.add_consumer(f"topic://{topic}", ConsumerSpec(client_id="audit", subscription_name="copy",
                                                        selector="region = 'eu'", lease_ms=120_000))
    broker.send(f"topic://{topic}", [Message(body="eu", properties={"region": "eu"})])  # the active one's
    backlog = 5_000  # larger than anything else the console tests make: the overview names it
    broker.send(f"topic://{topic}", [Message(body=str(i)) for i in range(backlog)])
    broker.send(queue, [Message(body=str(i)) for i in range(7)])
    stats = broker.stats(f"topic://{topic}")
    assert stats.queue_size == 0  # ActiveMQ's QueueSize of a topic: the list must not show this
    ledger = next(s for s in stats.subscriptions if s.subscription_name == "ledger")
    assert ledger.pending == backlog + 1
    backlog += 1
    total = stats.pending + stats.in_flight

    page = admin_page
    rows = page.locator("#destinations tbody tr")
    # Sorted by Pending, descending: the topic's backlog first, then the queue's 7. The order comes from the
    # statistics index, at most 5 s old (it may predate the sends): reload until it has caught up.
    deadline = time.monotonic() + 20
    while True:
        page.goto(f"{console_server.url}/console/destinations/?search={prefix}&ordering=-messages")
        expect(rows).to_have_count(2)
        if f"{topic} (topic)" in rows.first.locator("th").inner_text():
            break
        assert time.monotonic() < deadline, "the topic never sorted first"
        time.sleep(1)
    cell = rows.first.locator('[data-col="messages"]')
    expect(cell).to_contain_text(f"{total:,}")
    expect(cell.locator(".largest")).to_have_text(f"largest: billing / ledger ({backlog:,})")
    expect(rows.nth(1).locator('[data-col="messages"]')).to_have_text("7")
    # a click on the sorted column reverses it: ascending puts the topic last
    page.locator('#destinations th[data-sort="messages"] button').click()
    expect(rows.nth(1).locator("th")).to_contain_text(f"{topic} (topic)")
    expect(page.locator('#destinations th[data-sort="messages"]')).to_have_attribute("aria-sort", "ascending")

    # The overview counts it (the statistics index is at most a few seconds old) and names it the largest.
    page.goto(f"{console_server.url}/console/")
    largest = page.locator('[data-total="largest"]')
    expect(largest.locator("a")).to_have_text(f"{topic} (topic)", timeout=20_000)
    expect(largest).to_contain_text(f"{total:,}")
    expect(largest.locator(".largest")).to_have_text(f"largest subscription: billing / ledger ({backlog:,})")
    assert number(page.locator('[data-total="topic_messages"]').inner_text()) >= total
    assert number(page.locator('[data-total="messages"]').inner_text()) >= total + 7


@pytest.fixture
def quick_slow_server(console_server):
    """A second gateway on the same broker whose console calls a consumer slow after 2 s without an ack."""
    server = start_gateway(console_server.data_dir, console_server.namespace, name="console-slow",
                           SIGNALBOX_CONSOLE_SLOW_SECONDS="2")
    server.url = f"http://127.0.0.1:{server.port}"
    yield server
    server.stop()


def test_the_slow_badge_stays_off_while_a_full_consumer_acks_and_shows_once_it_stops(
        chromium, quick_slow_server, broker, queue_name):
    consumer = broker.add_consumer(queue_name, ConsumerSpec(prefetch=2, lease_ms=120_000))
    broker.send(queue_name, [Message(body=str(i)) for i in range(40)])
    page = login(chromium, quick_slow_server, "admin")
    try:
        page.goto(f"{quick_slow_server.url}/console/queues/{queue_name}/")
        row = page.locator(f'#consumers tr[data-consumer="{consumer.consumer_id}"]')
        badge = row.locator('[data-col="slow"] .badge')
        expect(row).to_be_visible()
        # Busy and keeping up: every ack frees a slot that the next dispatch fills (broker_core then
        # marks slow_since again, which the old badge showed as "slow since 0s ago"); never slow here.
        marked = False
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            delivered = broker.receive(consumer, 1)
            broker.ack(consumer, [d.message_id for d in delivered])
            marked = marked or any(c.slow_since for c in broker.stats(queue_name).consumers)
            assert badge.count() == 0
            time.sleep(0.3)
        assert marked, "the scenario did not make broker_core mark the consumer full while a message waited"
        # Stops acknowledging with a full window: slow after 2 s, and the badge says since when.
        expect(badge).to_contain_text("slow, last ack", timeout=15_000)
        expect(row.locator('[data-col="slow"]')).not_to_contain_text("0s ago")
    finally:
        page.context.close()


def test_passed_over_by_dispatch_counts_what_no_consumer_could_take_and_stays_0_otherwise(
        admin_page, console_server, broker, queue_name):
    picky = f"{queue_name}.picky"
    broker.add_consumer(picky, ConsumerSpec(prefetch=10, lease_ms=120_000, selector="color = 'red'"))
    broker.send(picky, [Message(body=str(i), properties={"color": "blue"}) for i in range(5)])
    plain = f"{queue_name}.plain"
    broker.add_consumer(plain, ConsumerSpec(prefetch=10, lease_ms=120_000))
    broker.send(plain, [Message(body=str(i), properties={"color": "blue"}) for i in range(5)])
    skipped = broker.stats(picky).skipped
    assert skipped >= 5 and broker.stats(plain).skipped == 0
    page = admin_page
    page.goto(f"{console_server.url}/console/queues/{picky}/")
    card = page.locator('#stats div:has([data-stat="skipped"])')
    expect(card.locator("dt")).to_have_text("Passed over by dispatch")
    expect(card.locator("dt")).to_have_attribute("title", re.compile("selector did not match.*message group"))
    expect(card.locator("dd")).to_have_text(f"{skipped:,}")
    page.goto(f"{console_server.url}/console/queues/{plain}/")
    expect(page.locator('[data-stat="skipped"]')).to_have_text("0")
    expect(page.locator('[data-stat="last_pass_skipped"]')).to_have_text("0")


def test_pages_without_a_feed_of_their_own_do_not_stay_connecting(admin_page, console_server, broker,
                                                                   queue_name):
    ids = broker.send(queue_name, [Message(body="x")])
    page = admin_page
    for path in (f"queues/{queue_name}/browse/", f"queues/{queue_name}/messages/{ids[0]}/", "routing/",
                 "analytics/", f"analytics/queue/{queue_name}/"):
        page.goto(f"{console_server.url}/console/{path}")
        expect(page.locator("#live"), path).to_have_attribute("data-state", "connected")
        expect(page.locator("#live"), path).to_have_text("Live")
    # and the other way round: test_console.py's test_the_live_indicator_shows_when_the_connection_drops
