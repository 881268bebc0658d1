"""The console's topic page and routing page in Debian's headless Chromium against a live gateway: a
topic's subscriptions (durable offline and active, pending and in-flight counts, deleting a durable one)
and the virtual destination routing in force. Broker state is made and checked with broker_core."""

from __future__ import annotations

import uuid

import pytest
from playwright.sync_api import expect

from broker_core.config.virtual import VirtualConfig
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from broker_core.ops import virtual
from tests.console.conftest import login
from tests.console.test_console import confirm

pytestmark = pytest.mark.e2e




def durable_offline_and_active(broker, topic: str) -> None:
    """One durable subscription taken offline, one active non-durable subscriber, three messages."""
    spec = ConsumerSpec(client_id="app-1", subscription_name="audit", lease_ms=120_000)
    durable = broker.add_consumer(f"topic://{topic}", spec)
    broker.close_consumer(durable)
    broker.add_consumer(f"topic://{topic}", ConsumerSpec(prefetch=2, lease_ms=120_000))
    broker.send(f"topic://{topic}", [Message(body=str(i)) for i in range(3)])


def test_the_topic_page_shows_an_offline_durable_and_an_active_subscriber_with_their_counts(
        admin_page, console_server, broker, topic_name):
    durable_offline_and_active(broker, topic_name)
    page = admin_page
    page.goto(f"{console_server.url}/console/destinations/?search={topic_name}")
    page.get_by_role("link", name=f"{topic_name} (topic)").click()
    page.wait_for_url(f"{console_server.url}/console/topics/{topic_name}/")

    rows = page.locator("#subscriptions tbody tr")
    expect(rows).to_have_count(2)
    offline = page.locator('#subscriptions tr[data-durable="1"]')
    expect(offline.locator("th")).to_have_text("app-1 / audit")
    expect(offline.locator(".state .badge")).to_have_text("offline")
    expect(offline.locator('[data-col="pending"]')).to_have_text("3")
    expect(offline.locator('[data-col="in_flight"]')).to_have_text("0")
    active = page.locator('#subscriptions tr[data-durable="0"]')
    expect(active.locator(".state .badge")).to_have_text("active")
    (live,) = [s for s in broker.subscriptions(f"topic://{topic_name}") if not s.durable]
    assert (live.pending, live.in_flight) == (1, 2)  # two in its prefetch window, one waiting
    expect(active.locator('[data-col="pending"]')).to_have_text("1")
    expect(active.locator('[data-col="in_flight"]')).to_have_text("2")
    expect(active.locator('[data-col="discards"]')).to_have_text("0")
    expect(page.locator('[data-stat="durable_offline"]')).to_have_text("1")
    expect(active.get_by_role("button")).to_have_count(0)  # only durable subscriptions can be deleted

    # live: a fourth message shows up in the offline subscription's pending count without a reload
    broker.send(f"topic://{topic_name}", Message(body="3"))
    expect(offline.locator('[data-col="pending"]')).to_have_text("4")

    offline.get_by_role("button", name="Delete subscription app-1 / audit").click()
    confirm(page)
    expect(rows).to_have_count(1)
    assert [s.durable for s in broker.subscriptions(f"topic://{topic_name}")] == [False]
    page.goto(f"{console_server.url}/console/audit/")
    page.fill("#a-destination", f"topic://{topic_name}")
    page.press("#a-destination", "Enter")
    expect(page.locator("#audit tbody tr")).to_have_count(1)
    expect(page.locator("#audit tbody")).to_contain_text("remove_durable_subscription")


def test_a_reader_sees_the_subscriptions_but_no_delete_action(chromium, console_server, broker, topic_name,
                                                               topic_reader):
    durable_offline_and_active(broker, topic_name)
    page = login(chromium, console_server, topic_reader)
    try:
        page.goto(f"{console_server.url}/console/topics/{topic_name}/")
        expect(page.locator("#subscriptions tbody tr")).to_have_count(2)
        expect(page.locator('#subscriptions tr[data-durable="1"] [data-col="pending"]')).to_have_text("3")
        expect(page.get_by_role("button", name="Delete subscription app-1 / audit")).to_have_count(0)
    finally:
        page.context.close()


def test_the_routing_page_lists_a_configured_composite_queue(admin_page, reader_page, console_server, broker):
    name = f"cq.all.{uuid.uuid4().hex[:8]}"
    config = VirtualConfig.from_config({"compositeQueue": [
        {"name": name, "forwardTo": [f"{name}.eu", {"topic": f"{name}.audit", "selector": "amount > 100"}]}]})
    virtual.configure(broker, config)
    page = admin_page
    page.goto(f"{console_server.url}/console/")
    page.get_by_role("link", name="Routing").click()
    row = page.locator(f'#routing tr[data-name="queue://{name}"]')
    expect(row).to_contain_text("composite queue")
    expect(row.locator("li")).to_have_text([f"queue://{name}.eu", f"topic://{name}.audit where amount > 100"])
    expect(row).to_contain_text("forwardOnly=true")

    # routing is for staff, as the audit log: a reader has no link and gets the refusal page
    expect(reader_page.get_by_role("link", name="Routing")).to_have_count(0)
    reader_page.goto(f"{console_server.url}/console/routing/")
    expect(reader_page.locator("main")).to_contain_text("for staff users")
