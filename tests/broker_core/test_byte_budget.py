"""The byte budget of a call (outbox.lua outbox.CALL_MOST_BYTES, docs/broker_core.md "The delivery path"):
a receive, a browse page and a dispatch's pushes stop once the call holds about 512 KiB of messages (at
least one), so a batch of large messages takes several bounded calls, in order, none lost or twice."""

from __future__ import annotations

import pytest

from broker_core.messages import Message
from broker_core.model import is_push, unpack_pushed

from ..helpers.broker import consumer, published

BUDGET = 512 * 1024  # outbox.CALL_MOST_BYTES
BODY = "x" * (200 * 1024)  # three of them pass the budget: at most three a call
COUNT = 10


def send_large(broker, count=COUNT, dest="orders", tag="m"):
    for i in range(count):
        broker.send(dest, Message(body=BODY, message_id=f"{tag}{i}"))
    return [f"{tag}{i}" for i in range(count)]


@pytest.mark.parametrize("ack_mode", ["client", "auto"])
def test_a_receive_of_many_large_messages_takes_several_calls_in_order(broker, ack_mode):
    c = consumer(broker, prefetch=100, ack_mode=ack_mode)
    ids = send_large(broker)
    got, calls = [], 0
    while batch := broker.receive(c, 100):
        assert 1 <= len(batch) <= 3  # (the budget: three of 200 KiB pass it)
        got += [d.message_id for d in batch]
        calls += 1
    assert got == ids and calls >= 4
    stats = broker.stats("orders")
    # auto: acknowledged as handed over, each of them once; client: all in flight, none left behind
    assert (stats.pending, stats.in_flight) == ((0, 0) if ack_mode == "auto" else (0, COUNT))


def test_receive_after_hands_large_messages_over_in_order_and_again_from_after(broker, channel):
    name, pubsub = channel
    c = consumer(broker, prefetch=100, notify=name, consumer_id="A")
    ids = send_large(broker)
    while published(pubsub, 0.2) is not None:
        pass  # (the outbox's wake-up)
    got, upto, lasts = [], 0, []
    while True:
        batch, upto = broker.receive_after(c, upto, 100, push=5)
        if not batch:
            break
        assert len(batch) <= 3
        got += [d.message_id for d in batch]
        lasts.append(upto)
        if len(got) < COUNT:
            assert published(pubsub) == b"A"  # the budget left some: asked again at once
    assert got == ids and lasts == sorted(set(lasts))
    # all handed over again since 0 (pushes lost, say): the same order, again in bounded calls
    again, upto = [], 0
    while len(again) < COUNT:
        batch, upto = broker.receive_after(c, upto, 100, push=5)
        assert 1 <= len(batch) <= 3
        again += [d.message_id for d in batch]
    assert again == ids and upto == lasts[-1]


def browse_all(broker, parked=True):
    seen, cursor, pages = [], None, 0
    while True:
        page = broker.browse("orders", cursor=cursor, limit=100, parked=parked)
        assert len(page.messages) <= 3
        seen += [(b.message.message_id, b.state) for b in page.messages]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            return seen, pages


def test_browse_pages_of_large_messages_cover_each_once(broker):
    pending = send_large(broker, tag="p")
    seen, pages = browse_all(broker)
    assert seen == [(i, "pending") for i in pending] and pages >= 4


def test_browse_pages_of_large_messages_in_flight_cover_each_once(broker):
    c = consumer(broker, prefetch=COUNT)
    held = send_large(broker, tag="h")  # dispatched to c: in flight
    pending = send_large(broker, tag="p")
    assert broker.stats("orders").in_flight == COUNT
    seen, _ = browse_all(broker)
    assert seen[:COUNT] == [(i, "pending") for i in pending]
    assert sorted(seen[COUNT:]) == [(i, "inflight") for i in sorted(held)]  # (HSCAN's order, each once)
    assert c


def test_pushes_to_many_consumers_stop_at_the_call_budget(broker, redis_client, channel):
    name, pubsub = channel
    consumers = [consumer(broker, prefetch=1, notify=name, consumer_id=f"C{n}") for n in range(6)]
    for c in consumers:
        assert broker.receive_after(c, 0, 1, push=5) == ([], 0)  # armed
    broker.pause("orders")
    ids = send_large(broker, count=6)
    broker.resume("orders")  # one dispatch chunk: a message for each consumer
    pushed, woken = [], []
    while (payload := published(pubsub, 0.3)) is not None:
        if is_push(payload):
            pushed.append(unpack_pushed(payload))
        else:
            woken.append(payload.decode())
    # pushed until the call held the budget (three of 200 KiB), the others disarmed and woken instead
    assert len(pushed) == 3 and sorted(woken) == sorted(f"C{n}" for n in range(6)
                                                      if f"C{n}" not in {p.consumer_id for p in pushed})
    by_id = {c.consumer_id: c for c in consumers}
    got = [d.message_id for p in pushed for d in p.deliveries(by_id[p.consumer_id])]
    for cid in woken:
        batch, _ = broker.receive_after(by_id[cid], 0, 1, push=5)
        got += [d.message_id for d in batch]
    assert sorted(got) == sorted(ids)


def test_a_browse_page_of_messages_in_flight_stops_at_its_limit_inside_an_hscan_page(broker):
    """An HSCAN page of the in-flight hash holds all of a small hash at once: a page stops inside it at
    `limit` (as at the byte budget) and the next goes on after its last id."""
    consumer(broker, prefetch=100)
    held = broker.send("orders", [Message(body="small", message_id=f"h{i:02}") for i in range(25)])
    seen, cursor = [], None
    while True:
        page = broker.browse("orders", cursor=cursor, limit=4)
        assert len(page.messages) <= 4
        seen += [b.message.message_id for b in page.messages]
        if (cursor := page.next_cursor) is None:
            break
    assert sorted(seen) == sorted(held) and len(seen) == len(held)
