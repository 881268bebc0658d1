"""Issue 26: the console's figures mean what their labels say. A topic's backlog (its subscriptions'
messages) in the destination list, its sorting and the overview; the badges and counters of the queue
page set by a scenario and left alone by another; every page's connection indicator leaving
"Connecting…"; consumers named by their client id."""

from __future__ import annotations

import time
import uuid

import pytest
from playwright.sync_api import expect

from broker_core.messages import Message
from broker_core.operations import ConsumerSpec

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
