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


def sampling_broker(redis_client, console_server, topic_name: str, policy: dict | None = None) -> Any:
    """(a broker whose clock stands a minute back, on a 5 s step, the rate chart's ranges, the topic's uri),
    with `policy` set on the topic."""
    now = time.time_ns() // 1_000_000
    clock = FakeClock(now - now % 5_000 - 60_000)
    broker = Broker(redis_client, console_server.namespace, clock)
    if policy:
        broker.policies.set_entry("topic", topic_name, policy)
        broker.refresh_policies()
    return broker, clock, f"topic://{topic_name}"


EVICT_PAST_2 = {"pendingMessageLimitStrategy": "constant", "pendingMessageLimit": 2}


def chart_peak(page, console_server, topic_name: str, label: str) -> float | None:
    """The topic page's rate chart: the highest value its `label` series draws (None: no such series)."""
    page.goto(f"{console_server.url}/console/topics/{topic_name}/")
    page.wait_for_selector("#rate-chart[data-loaded-range='5m']")
    return page.evaluate("""(label) => {
      const u = document.querySelector('#rate-chart').uplot;
      const i = u.series.findIndex((s) => s.label === label);
      return i < 0 ? null : Math.max(...u.data[i].filter((v) => v !== null));
    }""", f"{label}/s")


def test_the_rate_chart_draws_the_messages_a_topic_discarded(admin_page, console_server, redis_client,
                                                            topic_name):
    """A pending-message limit evicts from a slow subscription: the evictions are a series of their own
    (they were in none: the chart showed messages enqueued and nothing else leaving)."""
    broker, clock, uri = sampling_broker(redis_client, console_server, topic_name, EVICT_PAST_2)
    broker.add_consumer(uri, ConsumerSpec(prefetch=1, lease_ms=600_000))
    rates.sample(broker, [uri])
    clock.advance(5_000)
    broker.send(uri, [Message(body=str(i)) for i in range(28)])  # 1 dispatched, 2 kept, 25 evicted
    rates.sample(broker, [uri])
    assert broker.stats(uri).evicted == 25

    assert chart_peak(admin_page, console_server, topic_name, "discarded") == 5.0  # 25 in 5 s
    expect(admin_page.locator("#rate-chart .rate-now")).to_contain_text("discarded")


def test_the_chart_counts_every_subscription_as_the_cards_do(admin_page, console_server, redis_client,
                                                            topic_name):
    """Past 100 subscriptions the chart's series summed the first 100 while the cards count all: 150
    subscriptions, one message each dispatched, are 150 on the card and 150 in the chart's step."""
    broker, clock, uri = sampling_broker(redis_client, console_server, topic_name)
    for _ in range(150):
        broker.add_consumer(uri, ConsumerSpec(prefetch=1, lease_ms=600_000))
    rates.sample(broker, [uri])
    clock.advance(5_000)
    broker.send(uri, Message(body="x"))
    rates.sample(broker, [uri])

    assert chart_peak(admin_page, console_server, topic_name, "dispatched") * 5 == 150
    expect(admin_page.locator('#stats [data-stat="dispatched"]')).to_have_text("150")


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


def test_the_topic_s_discard_cards_add_up_to_the_chart_s_discarded_series(admin_page, console_server,
                                                                         redis_client, topic_name):
    """Evicted, dropped by a pending limit (here a non-durable subscription's poison) and dead letters
    discarded each have a card, an ended subscription's included; their sum is the chart's series (the
    page had only *Evicted*, so the chart's discards matched no figure)."""
    broker, clock, uri = sampling_broker(redis_client, console_server, topic_name, EVICT_PAST_2)
    quick = broker.add_consumer(uri, ConsumerSpec(prefetch=1, lease_ms=600_000))
    keep = durable(broker, topic_name, "app", "keep", prefetch=10)
    rates.sample(broker, [uri])
    clock.advance(5_000)
    broker.send(uri, [Message(body=str(i)) for i in range(6)])  # quick: 1 dispatched, 2 kept, 3 evicted
    (first,) = broker.receive(quick, 1)
    broker.nack(quick, first.message_id, poison=True)  # dropped: a non-durable subscription's poison
    broker.close_consumer(quick)  # ended: its counts stay the topic's
    broker.send(uri, [Message(body=f"np{i}", persistent=False) for i in range(2)])
    for d in broker.receive(keep, 8):
        if d.body.startswith("np"):
            broker.nack(keep, d.message_id, poison=True)  # a non-persistent dead letter: discarded
        else:
            broker.ack(keep, [d.message_id], mode="individual")
    rates.sample(broker, [uri])

    page = admin_page
    drawn = chart_peak(page, console_server, topic_name, "discarded")
    assert drawn * 5 == 6  # the series' count over its 5 s step: the cards' sum
    cards = {stat: page.locator(f'#stats [data-stat="{stat}"]') for stat in
             ("evicted", "dropped", "discarded", "discards")}
    for stat, shown in (("evicted", "3"), ("dropped", "1"), ("discarded", "2"), ("discards", "6")):
        expect(cards[stat]).to_have_text(shown)
    for stat in ("evicted", "dropped", "discarded"):
        title = cards[stat].locator("xpath=../dt").get_attribute("title")
        assert "discarded series" in title and "rate chart" in title


def test_the_topic_s_scheduled_count_is_its_jobs_not_its_redelivery_delayed_messages(admin_page,
                                                                                    console_server, broker,
                                                                                    topic_name):
    """"The first 50 of N": N counts scheduled jobs only, not a subscription's message waiting for its
    redelivery delay (the stats' parked counts both)."""
    uri = f"topic://{topic_name}"
    broker.policies.set_entry("topic", topic_name, {"initialRedeliveryDelay": 3_600_000})
    broker.refresh_policies()
    sub = durable(broker, topic_name, "app", "slow", prefetch=1)
    broker.send(uri, Message(body="now"))
    (d,) = broker.receive(sub, 1)
    broker.nack(sub, d.message_id)  # back in an hour: parked on the subscription
    broker.send(uri, [Message(body=str(i), delay_ms=3_600_000 + i) for i in range(55)])
    st = broker.stats(uri)
    assert (st.parked, st.scheduled, st.redelivery_delayed) == (56, 55, 1)
    page = admin_page
    page.goto(f"{console_server.url}/console/topics/{topic_name}/")
    expect(page.locator('#stats [data-stat="scheduled"]')).to_have_text("55")
    expect(page.locator('#stats [data-stat="redelivery_delayed"]')).to_have_text("1")
    expect(page.locator("#scheduled tbody tr")).to_have_count(50)
    expect(page.locator("#scheduled-more")).to_have_text("The first 50 of 55, the soonest due first.")
