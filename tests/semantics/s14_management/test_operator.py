"""The operator's message operations (spec §14.3): browse, get, remove, purge, move, copy, retry,
delete; each bounded, each counted and logged, bad input refused without changes."""

from __future__ import annotations

import pytest

from broker_core.broker import Broker
from broker_core.errors import OperationRefused, UnknownDestination, UnknownMessage
from broker_core.event_stream import expand
from broker_core.messages import Message

from ...helpers.broker import consumer, drain


def fill(broker, n, dest="orders", **kw):
    return broker.send(dest, [Message(body=str(i), properties={"i": i}, **kw) for i in range(n)])


def test_browse_pages_through_every_message_without_changing_anything(broker):
    c = consumer(broker, prefetch=2)
    ids = fill(broker, 7)
    before = broker.stats("orders")
    seen, cursor = [], None
    while True:
        page = broker.browse("orders", cursor=cursor, limit=3)
        seen += [(b.message.message_id, b.state) for b in page.messages]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sorted(m for m, _ in seen) == sorted(ids)
    assert [s for _, s in seen].count("inflight") == 2
    after = broker.stats("orders")
    assert (after.pending, after.in_flight, after.dispatched) == (before.pending, before.in_flight,
                                                                  before.dispatched)
    del c


def test_browse_has_no_400_message_cap_and_filters_with_a_selector(broker):
    fill(broker, 1500)
    cursor, matched = None, []
    while True:
        page = broker.browse("orders", selector="i >= 1450", cursor=cursor, limit=100)
        matched += [b.message.body for b in page.messages]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert matched == [str(i) for i in range(1450, 1500)]


def test_a_queue_browsers_view_leaves_parked_messages_out_and_is_capped_by_max_browse_page_size(broker):
    """What a queue browser (STOMP browser:true) sees: pending and in-flight messages, not scheduled ones
    (ActiveMQ keeps those outside the queue until due), each page examining only pending then in flight;
    at most the policy's maxBrowsePageSize (spec §1.6)."""
    c = consumer(broker, prefetch=1)
    fill(broker, 3)
    broker.send("orders", Message(body="later", delay_ms=3_600_000))
    seen, cursor = [], None
    while True:
        page = broker.browse("orders", cursor=cursor, limit=2, parked=False)
        seen += [b.state for b in page.messages]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sorted(seen) == ["inflight", "pending", "pending"]
    assert [b.state for b in broker.browse("orders", limit=10).messages].count("parked") == 1
    assert broker.browser_limit("orders") == 400
    broker.policies.set_entry("queue", "capped", {"maxBrowsePageSize": 3})
    assert broker.browser_limit("capped") == 3
    with pytest.raises(OperationRefused):
        broker.browser_limit("topic://prices")
    del c


def test_get_message_shows_headers_properties_body_and_where_it_is(broker):
    c = consumer(broker, prefetch=1, consumer_id="A")
    first, second = fill(broker, 2)
    got = broker.get_message("orders", first)
    assert (got.state, got.message.consumer_id, got.message.body, got.message.properties) == (
        "inflight", "A", "0", {"i": 0})
    assert broker.get_message("orders", second).state == "pending"
    with pytest.raises(UnknownMessage):
        broker.get_message("orders", "ID:none")
    del c


def test_remove_message_takes_it_from_wherever_it_is_and_counts_it(broker):
    c = consumer(broker, prefetch=1, ack_mode="client-individual")
    first, second = fill(broker, 2)
    assert broker.remove_message("orders", first)  # in flight
    assert not broker.remove_message("orders", first)
    stats = broker.stats("orders")
    assert (stats.queue_size, stats.purged) == (1, 1)
    assert [d.body for d in drain(broker, c)] == ["1"]  # its window opened again
    del second


def test_a_purge_of_100000_messages_completes_in_bounded_calls_while_work_goes_on(
        broker, redis_client, namespace, clock):
    for _ in range(100):
        fill(broker, 1000)
    c = consumer(broker, prefetch=10, ack_mode="client-individual")
    held = drain(broker, c)
    other = Broker(redis_client, namespace, clock)  # another process's view of the same broker
    during = {"sent": 0, "acked": 0}

    def work_goes_on(removed, total):
        # between two bounded purge calls, a producer sends and the consumer acks
        during["sent"] += len(other.send("orders", Message(body="during")))
        for d in other.receive(c, 10):
            during["acked"] += other.ack(c, d.message_id)
        assert removed <= total

    calls = []

    def progress(done, total):
        calls.append(done)
        work_goes_on(done, total)

    removed = broker.purge("orders", progress=progress)
    stats = broker.stats("orders")
    acked = stats.dequeued - stats.purged
    assert removed == stats.purged and len(calls) >= 99
    assert during["acked"] == acked > 0 and len(held) == 10
    # every message ends exactly once: purged, acked, or still on the queue
    assert 100_000 + during["sent"] == stats.purged + acked + stats.queue_size
    assert removed + acked >= 100_000 - 10  # what was there at the start went, the held ten aside


def test_move_takes_matching_messages_to_another_queue_and_copy_leaves_them(broker):
    broker.ensure_destination("archive")
    fill(broker, 10)
    assert broker.copy_matching("orders", "i < 3", "archive") == 3
    assert broker.move_matching("orders", "i >= 8", "archive") == 2
    assert broker.stats("orders").queue_size == 8
    bodies = sorted(d.body for d in drain(broker, consumer(broker, "archive")))
    assert bodies == ["0", "1", "2", "8", "9"]
    assert broker.stats("orders").moved == 2


def test_moving_to_a_missing_or_the_same_destination_is_refused_and_changes_nothing(broker):
    (m,) = fill(broker, 1)
    with pytest.raises(UnknownDestination, match="nowhere"):
        broker.move_message("orders", m, "nowhere")
    with pytest.raises(OperationRefused, match="itself"):
        broker.move_message("orders", m, "orders")
    assert broker.stats("orders").pending == 1


def test_a_message_in_flight_is_not_moved(broker):
    broker.ensure_destination("archive")
    consumer(broker, prefetch=1)
    (m,) = fill(broker, 1)
    with pytest.raises(OperationRefused, match="in flight"):
        broker.move_message("orders", m, "archive")


def test_retry_returns_a_dead_letter_to_its_original_queue_where_it_is_delivered(broker):
    c = consumer(broker, ack_mode="client-individual")
    (m,) = fill(broker, 1)
    broker.nack(c, drain(broker, c)[0].message_id, poison=True)
    assert broker.stats("ActiveMQ.DLQ").queue_size == 1
    assert broker.retry_message("ActiveMQ.DLQ", m) == 1
    (again,) = drain(broker, c)
    assert again.message_id == m and again.body == "0"
    assert broker.stats("ActiveMQ.DLQ").queue_size == 0


def test_retry_all_sends_every_dead_letter_home(broker):
    a = consumer(broker, "a", ack_mode="client-individual")
    b = consumer(broker, "b", ack_mode="client-individual")
    fill(broker, 2, dest="a")
    fill(broker, 1, dest="b")
    broker.nack(a, [d.message_id for d in drain(broker, a)], poison=True)
    broker.nack(b, [d.message_id for d in drain(broker, b)], poison=True)
    assert broker.retry_messages("ActiveMQ.DLQ") == 3
    assert (len(drain(broker, a)), len(drain(broker, b))) == (2, 1)


def test_retry_from_a_queue_that_is_not_a_dlq_is_refused(broker):
    (m,) = fill(broker, 1)
    with pytest.raises(OperationRefused, match="only possible on Dead Letter Queues"):
        broker.retry_message("orders", m)


def test_deleting_a_destination_removes_it_and_its_messages(broker):
    fill(broker, 5)
    consumer(broker)
    assert broker.delete_destination("orders") == 5
    assert broker.destinations() == []


def test_every_operation_is_logged_in_the_event_stream(broker, redis_client, namespace):
    broker.ensure_destination("archive")
    a, b, c = fill(broker, 3)
    broker.move_message("orders", a, "archive")
    broker.copy_message("orders", b, "archive")
    broker.remove_message("orders", c)
    broker.purge("orders")
    kinds = [e[b"type"] for _, e in expand(redis_client.xrange(f"{namespace}:{{q:orders}}:events"))]
    assert kinds.count(b"move") == 1 and kinds.count(b"copy") == 1 and kinds.count(b"remove") == 1
    assert b"purge" in kinds


def test_remove_matching_takes_what_a_selector_matches_wherever_it_is_in_bounded_calls(broker):
    c = consumer(broker, prefetch=3)
    fill(broker, 1000)  # i = 0..999; the consumer holds three of them
    broker.send("orders", Message(body="later", properties={"i": 1}, delay_ms=60_000))  # parked, matches
    held = [int(d.properties["i"]) for d in drain(broker, c)]
    assert held == [0, 1, 2]  # in flight: 0 and 1 match
    seen: list[tuple[int, int]] = []
    removed = broker.remove_matching("orders", "i % 2 = 1 OR i < 2",
                                     progress=lambda done, total: seen.append((done, total)))
    # odd i (500, i = 1 in flight) plus i = 0 (in flight), plus the parked one
    assert removed == 502
    # page by page (at most REMOVE_PAGE removed a call), total = what the queue held at the start
    assert len(seen) >= 3 and seen[-1] == (502, 1001)
    left = []
    cursor = None
    while True:
        page = broker.browse("orders", cursor=cursor, limit=1000)
        left += [int(b.message.properties["i"]) for b in page.messages]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(left) == list(range(2, 1000, 2))
    stats = broker.stats("orders")
    assert stats.queue_size + stats.parked == 499 and stats.purged == 501
    # the delayed one was not on the queue yet: cancelled, and never enqueued or dequeued (ActiveMQ's
    # scheduler held it), so enqueued = dequeued + what the queue holds
    assert stats.cancelled == 1 and stats.enqueued == stats.dequeued + stats.queue_size == 1000


def test_remove_matching_stops_at_its_limit_and_refuses_a_bad_selector_without_changes(broker):
    fill(broker, 50)
    assert broker.remove_matching("orders", "i >= 10", limit=5) == 5
    assert broker.stats("orders").queue_size == 45
    with pytest.raises(Exception, match="selector"):
        broker.remove_matching("orders", "i >=")
    assert broker.stats("orders").queue_size == 45
