"""What the topic page lacked beside the queue page (session 26): deleting the topic (with its durable
subscriptions, and the messages held for them counted and shown), the discarded messages in the rate
chart, and its scheduled messages. In Debian's headless Chromium against a live gateway; broker state made
and checked with broker_core."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from broker_core import rates
from broker_core.broker import Broker
from broker_core.clock import FakeClock
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from tests.console.conftest import login
from tests.console.test_console import confirm

pytestmark = pytest.mark.e2e




@pytest.fixture
def watcher_page(chromium, console_server, topic_reader) -> Iterator[Any]:
    page = login(chromium, console_server, topic_reader)
    yield page
    page.context.close()


def durable(broker: Broker, topic: str, client_id: str, name: str, **kw: Any) -> Any:
    spec = ConsumerSpec(client_id=client_id, subscription_name=name, lease_ms=120_000, **kw)
    return broker.add_consumer(f"topic://{topic}", spec)


def test_an_admin_deletes_a_topic_with_its_durable_subscriptions_and_sees_the_messages_that_went(
        admin_page, watcher_page, console_server, broker, topic_name):
    uri = f"topic://{topic_name}"
    broker.close_consumer(durable(broker, topic_name, "ledger", "eod"))  # offline, holding what is sent
    live = durable(broker, topic_name, "risk", "live", prefetch=2)  # active: ActiveMQ's console forces it off
    broker.add_consumer(uri, ConsumerSpec(lease_ms=120_000, prefetch=2))  # non-durable
    broker.send(uri, [Message(body=str(i)) for i in range(3)])
    assert len(broker.receive(live, 2)) == 2
    held = broker.stats(uri)
    assert held.pending + held.in_flight == 9  # 3 for each subscription

    # a reader is offered no Delete
    watcher_page.goto(f"{console_server.url}/console/topics/{topic_name}/")
    expect(watcher_page.locator("#subscriptions tbody tr")).to_have_count(3)
    expect(watcher_page.locator("#delete")).to_have_count(0)

    page = admin_page
    page.goto(f"{console_server.url}/console/topics/{topic_name}/")
    expect(page.locator('[data-stat="messages"]')).to_have_text("9")
    page.locator("#delete").click()
    text = page.locator("#confirm-text")
    expect(text).to_contain_text(f"Delete the topic {topic_name}")
    expect(text).to_contain_text("3 subscriptions (2 durable, 1 offline)")
    expect(text).to_contain_text("the 9 messages held for them")
    confirm(page)
    page.wait_for_url(f"{console_server.url}/console/destinations/")
    expect(page.locator("#toast")).to_contain_text(f"Deleted {uri}: 9 messages removed")
    assert uri not in broker.destinations()

    # counted where the product counts what an operation removed: the audit log
    page.goto(f"{console_server.url}/console/audit/")
    row = page.locator("#audit tbody tr", has_text=uri).first
    expect(row).to_contain_text("delete_destination")
    expect(row.locator(".audit-result")).to_have_text("deleted with 9 messages")


def test_the_destination_list_deletes_a_topic_for_admins_only(admin_page, watcher_page, console_server,
                                                              broker, topic_name):
    uri = f"topic://{topic_name}"
    broker.close_consumer(durable(broker, topic_name, "ledger", "eod"))
    broker.send(uri, [Message(body="a"), Message(body="b")])
    listing = f"{console_server.url}/console/destinations/?search={topic_name}"

    watcher_page.goto(listing)
    row = watcher_page.locator(f'#destinations tbody tr[data-uri="{uri}"]')
    expect(row).to_have_count(1)
    expect(row.locator('[data-op="delete"]')).to_have_count(0)

    page = admin_page
    page.goto(listing)
    row = page.locator(f'#destinations tbody tr[data-uri="{uri}"]')
    row.locator("summary").click()
    row.locator('[data-op="delete"]').click()
    expect(page.locator("#confirm-text")).to_contain_text(f"Delete the topic {topic_name}")
    confirm(page)
    expect(page.locator("#toast")).to_contain_text(f"Deleted {uri}: 2 messages removed")
    expect(row).to_have_count(0)
    assert uri not in broker.destinations()


def test_the_rate_chart_draws_the_messages_a_topic_discarded(admin_page, console_server, redis_client,
                                                            topic_name):
    """A pending-message limit evicts from a slow subscription: the evictions are a series of their own
    (they were in none: the chart showed messages enqueued and nothing else leaving)."""
    now = time.time_ns() // 1_000_000
    clock = FakeClock(now - now % 5_000 - 60_000)
    broker = Broker(redis_client, console_server.namespace, clock)
    broker.policies.set_entry("topic", topic_name, {"pendingMessageLimitStrategy": "constant",
                                                    "pendingMessageLimit": 2})
    broker.refresh_policies()
    uri = f"topic://{topic_name}"
    broker.add_consumer(uri, ConsumerSpec(prefetch=1, lease_ms=600_000))
    rates.sample(broker, [uri])
    clock.advance(5_000)
    broker.send(uri, [Message(body=str(i)) for i in range(28)])  # 1 dispatched, 2 kept, 25 evicted
    rates.sample(broker, [uri])
    assert broker.stats(uri).evicted == 25

    page = admin_page
    page.goto(f"{console_server.url}/console/topics/{topic_name}/")
    page.wait_for_selector("#rate-chart[data-loaded-range='5m']")
    drawn = page.evaluate("""() => {
      const u = document.querySelector('#rate-chart').uplot;
      const i = u.series.findIndex((s) => s.label === 'discarded/s');
      return i < 0 ? null : Math.max(...u.data[i].filter((v) => v !== null));
    }""")
    assert drawn == 5.0  # 25 in 5 s
    expect(page.locator("#rate-chart .rate-now")).to_contain_text("discarded")


def test_a_topic_page_lists_its_scheduled_messages_as_a_queue_page_does(admin_page, watcher_page,
                                                                        console_server, broker, topic_name):
    uri = f"topic://{topic_name}"
    broker.close_consumer(durable(broker, topic_name, "ledger", "eod"))
    broker.send(uri, Message(body="later", message_id=f"ID:{topic_name}-d", delay_ms=3_600_000))
    broker.send(uri, Message(body="tick", message_id=f"ID:{topic_name}-j", delay_ms=600_000, period_ms=60_000,
                             repeat=4))
    page = admin_page
    page.goto(f"{console_server.url}/console/topics/{topic_name}/")
    table = page.locator("#scheduled tbody")
    delayed = table.locator("tr", has_text=f"ID:{topic_name}-d")
    job = table.locator("tr", has_text=f"ID:{topic_name}-j")
    expect(delayed).to_have_count(1)
    due = broker.parked_times(uri, [f"ID:{topic_name}-d"])[f"ID:{topic_name}-d"]["due"]
    expect(delayed.locator("td.due")).to_have_text(page.evaluate("(ms) => window.SB.fmt.time(ms)", due))
    expect(job).to_contain_text("every 60,000 ms, 4 more")
    job.get_by_role("button", name=f"Cancel ID:{topic_name}-j").click()
    expect(page.locator("#confirm-text")).to_contain_text("repeating")
    confirm(page)
    expect(job).to_have_count(0)
    expect(delayed).to_have_count(1)
    assert broker.stats(uri).cancelled == 1
    # a reader sees them, and no Cancel
    watcher_page.goto(f"{console_server.url}/console/topics/{topic_name}/")
    row = watcher_page.locator("#scheduled tbody tr", has_text=f"ID:{topic_name}-d")
    expect(row).to_have_count(1)
    expect(row.get_by_role("button")).to_have_count(0)
