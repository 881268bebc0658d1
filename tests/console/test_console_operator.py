"""What an operator hit first on a busy broker (session 25): pages that scroll sideways on a phone or clip
their figures on a laptop, and failures the queue page did not count. In Debian's headless Chromium against
live gateways; broker state made and checked with broker_core."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from broker_core.broker import Broker
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from tests.console.conftest import login
from tests.helpers.gateway_server import start_gateway

pytestmark = pytest.mark.e2e

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def own_gateway(console_server, redis_client) -> Iterator[Any]:
    """A gateway on a namespace of its own (the session's users): the overview's largest backlog is this
    test's, whatever the other tests left in the session's namespace."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    server = start_gateway(console_server.data_dir, namespace, name="console-own")
    server.url = f"http://127.0.0.1:{server.port}"
    server.broker = Broker(redis_client, namespace)
    yield server
    server.stop()
    assert "Traceback" not in server.output(), server.output()


def sideways(page: Any) -> int:
    """How many CSS pixels the page is wider than the screen (0: nothing scrolls sideways)."""
    return page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")


def test_no_page_an_operator_opens_first_scrolls_sideways_on_a_phone(chromium, own_gateway):
    broker = own_gateway.broker
    topic = "prices.eu"
    # a topic's offline durable backlog, the largest: the overview names its subscription under it
    durable = broker.add_consumer(f"topic://{topic}", ConsumerSpec(
        client_id="pricing-application-eu-west", subscription_name="end-of-day-ticks", lease_ms=120_000))
    broker.close_consumer(durable)
    broker.send(f"topic://{topic}", [Message(body=str(i)) for i in range(30)])
    # scheduled, repeating and cron messages on a queue
    queue = "reports.scheduled"
    broker.send(queue, [Message(body="later", delay_ms=3_600_000),
                        Message(body="again", delay_ms=600_000, period_ms=60_000, repeat=5),
                        Message(body="cron", cron="*/5 * * * *")])
    # dead letters from a queue with a long name
    origin = "payments.settlement.card-authorisations.europe-west"
    consumer = broker.add_consumer(origin, ConsumerSpec(prefetch=5, lease_ms=120_000))
    broker.send(origin, [Message(body=str(i)) for i in range(3)])
    for delivery in broker.receive(consumer, 3):
        broker.nack(consumer, delivery.message_id, poison=True)

    page = login(chromium, own_gateway, viewport=PHONE)
    try:
        largest = page.locator('[data-total="largest"] small.largest')
        expect(largest).to_contain_text("pricing-application-eu-west / end-of-day-ticks (30)")
        assert sideways(page) == 0, "the overview scrolls sideways"
        page.goto(f"{own_gateway.url}/console/queues/{queue}/")
        expect(page.locator("#scheduled tbody tr")).to_have_count(3)
        assert sideways(page) == 0, "the queue page scrolls sideways"
        page.goto(f"{own_gateway.url}/console/dead-letters/")
        expect(page.locator(".dlq tbody tr")).to_have_count(1)
        assert sideways(page) == 0, "the dead letters page scrolls sideways"

        # on a laptop the largest backlog's subscription is not cut off by its card
        page.set_viewport_size({"width": 1366, "height": 900})
        page.goto(f"{own_gateway.url}/console/")
        expect(largest).to_be_visible()
        # (one evaluate that finds the element itself: the live totals replace it every 2 s)
        clipped = page.evaluate(
            "() => { const e = document.querySelector('[data-total=\"largest\"] small.largest');"
            " const card = e.closest('.cards > div').getBoundingClientRect();"
            " const r = e.getBoundingClientRect();"
            " return r.right > card.right + 0.5 || e.scrollWidth > e.clientWidth; }")
        assert not clipped, "the largest backlog's subscription runs out of its card"
    finally:
        page.context.close()


def test_the_queue_page_counts_dead_letters_the_broker_discarded(admin_page, console_server, broker,
                                                                 queue_name):
    """Non-persistent messages refused as poison are dropped, not dead-lettered (ActiveMQ's
    processNonPersistent=false): the queue page must still say where they went."""
    consumer = broker.add_consumer(queue_name, ConsumerSpec(prefetch=10, lease_ms=120_000))
    broker.send(queue_name, [Message(body=f"n{i}", persistent=False) for i in range(4)]
                + [Message(body="p", persistent=True)])
    for delivery in broker.receive(consumer, 5):
        broker.nack(consumer, delivery.message_id, poison=True)
    stats = broker.stats(queue_name)
    assert (stats.deadlettered, stats.discarded, stats.dequeued) == (1, 4, 5)

    page = admin_page
    page.goto(f"{console_server.url}/console/queues/{queue_name}/")
    expect(page.locator('[data-stat="dequeued"]')).to_have_text("5")
    expect(page.locator('[data-stat="deadlettered"]')).to_have_text("1")
    # (the card is the stats' `discards`, the rate chart's discarded series: a queue's are its dead letters)
    expect(page.locator('[data-stat="discards"]')).to_have_text("4")


def test_an_active_durable_subscription_offers_no_delete_that_the_broker_refuses(admin_page, console_server,
                                                                                broker):
    topic = f"ct.{uuid.uuid4().hex[:10]}"
    def durable(client_id: str, name: str) -> Any:
        spec = ConsumerSpec(client_id=client_id, subscription_name=name, lease_ms=120_000)
        return broker.add_consumer(f"topic://{topic}", spec)

    active, offline = durable("risk", "live"), durable("ledger", "eod")
    broker.close_consumer(offline)
    broker.send(f"topic://{topic}", [Message(body="tick")])
    page = admin_page
    page.goto(f"{console_server.url}/console/topics/{topic}/")
    expect(page.locator("#subscriptions tbody tr")).to_have_count(2)
    in_use = page.get_by_role("button", name="Delete subscription risk / live")
    expect(in_use).to_be_disabled()
    expect(in_use).to_have_attribute("title", re.compile("consumer is connected"))
    expect(page.get_by_role("button", name="Delete subscription ledger / eod")).to_be_enabled()
    broker.close_consumer(active)  # offline now: the live feed's next statistics offer the delete
    expect(in_use).to_be_enabled()


def test_a_network_error_is_said_as_one_and_browse_does_not_read_as_an_empty_queue(admin_page, console_server,
                                                                                  broker, queue_name):
    broker.send(queue_name, [Message(body=str(i)) for i in range(3)])
    page = admin_page
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.route("**/api/v1/queues/*/messages?*", lambda route: route.abort("connectionreset"))
    page.goto(f"{console_server.url}/console/queues/{queue_name}/browse/")
    cell = page.locator("#messages tbody td")
    expect(cell).to_contain_text("Could not read the messages")
    expect(cell).not_to_contain_text("No messages match")
    expect(page.locator("#browse-status")).not_to_contain_text("(end)")
    expect(page.locator("#toast")).to_contain_text("did not reach the server")
    page.unroute("**/api/v1/queues/*/messages?*")
    page.reload()
    expect(page.locator("#messages tbody tr")).to_have_count(3)

    # an action whose request is lost: said so, and that it may not have run
    page.goto(f"{console_server.url}/console/queues/{queue_name}/")
    page.route("**/purge", lambda route: route.abort("connectionreset"))
    page.locator("#purge").click()
    page.locator("dialog[open] button", has_text="Purge").click()
    expect(page.locator("#toast")).to_contain_text("did not reach the server")
    assert broker.stats(queue_name).queue_size == 3
    assert errors == []


@pytest.fixture
def quick_slow_gateway(console_server) -> Iterator[Any]:
    """A gateway on the session's broker whose console calls a full consumer slow after 1 s without an ack."""
    server = start_gateway(console_server.data_dir, console_server.namespace, name="console-slow1",
                           SIGNALBOX_CONSOLE_SLOW_SECONDS="1")
    server.url = f"http://127.0.0.1:{server.port}"
    yield server
    server.stop()


def test_the_consumers_table_fits_a_laptop_with_a_slow_consumer(chromium, quick_slow_gateway, broker,
                                                                queue_name):
    """At 1366 px the whole consumers table is on screen (lease expiry too), and the slow badge is one line
    (it wrapped into a six-line pill, the table scrolled sideways)."""
    for client in ("cart-worker-a", "cart-worker-b"):
        spec = ConsumerSpec(prefetch=50, client_id=client, ack_mode="client-individual",
                            connection_id=f"tcp-{uuid.uuid4().hex[:16]}", lease_ms=120_000)
        broker.add_consumer(queue_name, spec)
    broker.send(queue_name, [Message(body=str(i), group_id=f"cart-{i % 2}") for i in range(120)])
    page = login(chromium, quick_slow_gateway)
    try:
        page.goto(f"{quick_slow_gateway.url}/console/queues/{queue_name}/")
        badge = page.locator('#consumers [data-col="slow"] .badge')
        expect(badge).to_have_count(2, timeout=20_000)
        region = page.locator('div.scroll[aria-labelledby="consumers-title"]')
        fits = region.evaluate("(e) => e.scrollWidth <= e.clientWidth")
        assert fits, "the consumers table scrolls sideways at 1366 px"
        heights = badge.evaluate_all("(bs) => bs.map((b) => b.getClientRects().length)")
        assert heights == [1, 1], f"the slow badge wraps over {heights} lines"
    finally:
        page.context.close()


def test_on_a_phone_each_consumer_s_prefetch_window_is_on_screen(chromium, console_server, broker,
                                                                 queue_name):
    """How full each prefetch window is, the queue page's first question, without scrolling a 13-column
    table sideways past the ids: on a phone each consumer is a card with its labelled figures."""
    spec = ConsumerSpec(prefetch=20, client_id="billing-svc", ack_mode="client-individual",
                        connection_id=f"tcp-{uuid.uuid4().hex[:16]}", lease_ms=120_000)
    broker.add_consumer(queue_name, spec)
    broker.send(queue_name, [Message(body=str(i)) for i in range(30)])
    page = login(chromium, console_server, viewport=PHONE)
    try:
        page.goto(f"{console_server.url}/console/queues/{queue_name}/")
        meter = page.locator("#consumers [role=meter]")
        expect(meter).to_have_attribute("aria-valuenow", "20")
        # (one evaluate that finds the element itself: the live statistics redraw the table)
        left, right = page.evaluate(
            "() => { const r = document.querySelector('#consumers [role=meter]').getBoundingClientRect();"
            " return [r.left, r.right]; }")
        assert left >= 0 and right <= PHONE["width"], (left, right)
        region = page.locator('div.scroll[aria-labelledby="consumers-title"]')
        assert region.evaluate("(e) => e.scrollWidth <= e.clientWidth"), "the consumers scroll sideways"
        ack_mode = page.locator('#consumers td[data-label="Ack mode"]')
        expect(ack_mode).to_have_text("client-individual")
        label = ack_mode.evaluate("(e) => getComputedStyle(e, '::before').content")
        assert label == '"Ack mode"', label  # each figure under its label, the header row being hidden
        assert sideways(page) == 0
    finally:
        page.context.close()


def test_send_with_the_priority_left_empty_sends_the_default_priority(admin_page, console_server, broker,
                                                                     queue_name):
    """An emptied Priority field is no priority given (JMS's default, 4), not priority 0, the lowest."""
    broker.ensure_destination(f"queue://{queue_name}")
    page = admin_page
    page.goto(f"{console_server.url}/console/send/?destination=queue://{queue_name}")
    page.fill("#body", "no priority chosen")
    page.fill("#priority", "")
    page.click("#send-button")
    expect(page.locator("#send-result")).to_contain_text("Sent 1 message")
    (stored,) = broker.browse(queue_name).messages
    assert stored.message.priority == 4


def test_browsing_a_queue_that_does_not_exist_says_so_rather_than_no_messages(admin_page, console_server):
    page = admin_page
    page.goto(f"{console_server.url}/console/queues/cq.never-made-{uuid.uuid4().hex[:6]}/browse/")
    cell = page.locator("#messages tbody td")
    expect(cell).to_contain_text("Could not read the messages: no destination queue://cq.never-made-")
    expect(page.locator("#browse-status")).to_have_text("page 1: not read")


def test_the_scheduled_table_says_when_it_lists_only_the_first_of_more(admin_page, console_server, broker,
                                                                       queue_name):
    """The table lists 50; the card above counts them all: 55 scheduled, 50 rows, and a line saying why. A
    message waiting for its redelivery delay is no scheduled job: counted on a card of its own, not in N."""
    broker.policies.set_entry("queue", queue_name, {"initialRedeliveryDelay": 3_600_000})
    broker.refresh_policies()
    broker.send(queue_name, Message(body="now"))
    c = broker.add_consumer(queue_name, ConsumerSpec(prefetch=1, lease_ms=600_000))
    (d,) = broker.receive(c, 1)
    broker.nack(c, d.message_id)  # back in an hour: parked, no job
    broker.send(queue_name, [Message(body=str(i), delay_ms=3_600_000 + i) for i in range(55)])
    assert broker.stats(queue_name).parked == 56
    page = admin_page
    page.goto(f"{console_server.url}/console/queues/{queue_name}/")
    expect(page.locator('[data-stat="scheduled"]')).to_have_text("55")
    expect(page.locator('[data-stat="redelivery_delayed"]')).to_have_text("1")
    expect(page.locator("#scheduled tbody tr")).to_have_count(50)
    expect(page.locator("#scheduled-more")).to_have_text("The first 50 of 55, the soonest due first.")
    # due first, yet no job: not listed (browse shows it). exact=True: has_text ignores case, and two ids
    # of one millisecond can differ by case alone (messages.new_message_id)
    expect(page.locator("#scheduled td.id").get_by_text(d.message_id, exact=True)).to_have_count(0)


def test_the_overview_s_maintenance_tick_age_counts_on_between_health_readings(admin_page, console_server,
                                                                               broker):
    """Health is read every 15 s; "last ran 1s ago" stayed on screen for those 15 s, while docs/console.md
    (Times) says the tick's relative time counts on by itself as every other."""
    from broker_core import maintenance

    key = maintenance._heartbeat_key(broker)
    page = admin_page
    try:
        broker.redis.hset(key, mapping={"last_tick": broker.clock.now_ms(), "duration_ms": 3,
                                        "destinations": 2, "errors": 0})
        page.goto(f"{console_server.url}/console/")
        row = page.locator('#health tbody tr[data-check="maintenance"]')
        expect(row.locator(".badge")).to_have_text("ok")
        details = row.locator("td").nth(1)
        expect(details).to_have_text(re.compile(r"^last ran \d+s ago$"))
        first = int(details.inner_text().split()[2].rstrip("s"))
        page.wait_for_timeout(4500)  # no health reading meanwhile (every 15 s)
        later = int(details.inner_text().split()[2].rstrip("s"))
        assert later >= first + 3, (first, later)
    finally:
        broker.redis.delete(key)


def test_long_health_details_do_not_widen_the_overview_on_a_phone(admin_page, console_server):
    """The health table's details hold names that do not break by themselves: the workers' node names
    (`celery@<host name>`, joined by commas), an error's text with a URL. On a phone they wrapped nowhere and
    made the overview scroll sideways (the full suite's workers had such names). /healthz's answer is
    given here (its form: signalbox/health.py) so that the names are as long as a real host's may be."""
    workers = [f"celery@signalbox-worker-{i}-{'x' * 40}.eu-west-1.compute.internal" for i in range(2)]
    answer = {"status": "error",
              "redis": {"status": "ok", "version": "7.0.15"},
              "database": {"status": "ok", "vendor": "sqlite"},
              "celery": {"status": "ok", "workers": workers},
              "maintenance": {"status": "error",
                              "error": "no tick since redis://127.0.0.1:6379/0?client_name=signalbox-maintenance"}}
    page = admin_page
    page.set_viewport_size(PHONE)
    page.route("**/healthz", lambda route: route.fulfill(status=503, json=answer))
    page.goto(f"{console_server.url}/console/")
    expect(page.locator('#health tr[data-check="celery"]')).to_contain_text(workers[1])
    assert sideways(page) == 0, "the overview scrolls sideways"
