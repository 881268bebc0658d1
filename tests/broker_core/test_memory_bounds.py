"""What a destination keeps beside its messages is bounded and counted: the lifecycle event stream
(eventsMaxLen; trimmed events are counted, no message goes with them) and the duplicate audit
(maxQueueAuditDepth; trimmed at most 1,024 ids a call). Real Redis, real scripts."""

from __future__ import annotations

import pytest

from broker_core import event_stream
from broker_core.broker import Broker
from broker_core.errors import InvalidPolicy
from broker_core.event_stream import expand
from broker_core.messages import Message
from broker_core.model import ConsumerSpec


@pytest.fixture
def broker(redis_client, namespace, clock) -> Broker:
    return Broker(redis_client, namespace, clock)


def policy(broker: Broker, kind: str = "queue", **attributes) -> None:
    broker.policies.set_entry(kind, ">", attributes)
    broker.refresh_policies()


def test_the_event_stream_stays_at_eventsMaxLen_and_counts_what_it_trimmed(broker):
    policy(broker, eventsMaxLen=200)
    broker.ensure_destination("orders")
    for i in range(1_000):
        broker.send("orders", Message(body=str(i), message_id=f"m{i}"))
    stats = broker.stats("orders")
    assert stats.queue_size == 1_000  # trimming loses events only
    assert stats.events == 200  # one event an entry here: the oldest go, exactly down to the bound
    assert stats.events + stats.events_trimmed == 1_000  # one enqueue event per message, each counted
    assert broker.redis.xlen(f"{broker.namespace}:{{q:orders}}:events") == stats.events


def _stream(broker: Broker, dest: str = "orders") -> list[tuple[bytes, dict[bytes, bytes]]]:
    return broker.redis.xrange(f"{broker.namespace}:{{q:{dest}}}:events")


def test_a_call_with_many_events_writes_them_in_one_entry_read_back_in_order(broker):
    c = broker.add_consumer("orders", ConsumerSpec(prefetch=1_000, ack_mode="client"))
    ids = broker.send("orders", [Message(body=str(i)) for i in range(150)])
    entries = _stream(broker)
    # consumer_add, then the send's calls: 150 enqueues and 150 dispatches; a call's first two events an
    # entry each, the rest packed, at most 100 an entry
    counts = [event_stream.count(f) for _, f in entries]
    assert counts[0] == 1 and sum(counts) == 301 and max(counts) == 100 and len(entries) < 12
    events = [e for _, e in expand(entries)][1:]
    order = {(e[b"type"], e[b"msg"].decode()): place for place, e in enumerate(events)}
    assert [e[b"msg"].decode() for e in events if e[b"type"] == b"enqueue"] == ids
    assert [e[b"msg"].decode() for e in events if e[b"type"] == b"dispatch"] == ids
    assert all(order[(b"enqueue", i)] < order[(b"dispatch", i)] for i in ids)
    assert all(e[b"consumer"] == c.consumer_id.encode() for e in events if e[b"type"] == b"dispatch")
    assert events[0][b"priority"] == b"4" and events[0][b"size"].isdigit()  # numbers as Redis writes them
    assert broker.stats("orders").events == 301


def test_trimming_entries_that_hold_many_events_counts_each_event(broker):
    policy(broker, eventsMaxLen=250)
    broker.ensure_destination("orders")
    for start in range(0, 1_000, 50):
        broker.send("orders", [Message(body="x", message_id=f"m{i}") for i in range(start, start + 50)])
    stats = broker.stats("orders")
    assert stats.queue_size == 1_000
    assert stats.events == sum(event_stream.count(f) for _, f in _stream(broker)) == 250
    assert stats.events + stats.events_trimmed == 1_000


def test_a_count_gone_wrong_is_right_again_once_a_trim_reads_to_the_stream_s_end(broker):
    policy(broker, eventsMaxLen=300)
    broker.ensure_destination("orders")
    for _ in range(3):  # each call: two entries of one event, one of 98
        broker.send("orders", [Message(body="x") for _ in range(100)])
    packed = next(i for i, f in _stream(broker) if event_stream.count(f) > 1)
    broker.redis.xdel(f"{broker.namespace}:{{q:orders}}:events", packed)  # not through the scripts
    for _ in range(3):
        broker.send("orders", [Message(body="x") for _ in range(100)])
    held = sum(event_stream.count(f) for _, f in _stream(broker))
    assert broker.stats("orders").events == held <= 300


def test_the_archive_trim_drops_entries_below_an_id_and_keeps_the_count(broker):
    from broker_core import event_archive
    from broker_core.destinations import parse_destination

    broker.ensure_destination("orders")
    for _ in range(100):  # each call: two entries of one event, one of three
        broker.send("orders", [Message(body="x") for _ in range(5)])
    entries = _stream(broker)
    assert len(entries) == 300 and sum(event_stream.count(f) for _, f in entries) == 500
    below = entries[150][0].decode()  # more than one step (event_archive.TRIM_STEP entries a call)
    gone = sum(event_stream.count(f) for _, f in entries[:150])
    assert event_archive.trim(broker, parse_destination("orders"), below) == gone == 250
    assert _stream(broker)[0][0] == entries[150][0]
    stats = broker.stats("orders")
    assert stats.events == 250 and stats.events_trimmed == 0  # archived, not trimmed by the bound


def test_a_topic_counts_the_events_trimmed_off_its_stream_subscriptions_included(broker):
    policy(broker, "topic", eventsMaxLen=100)
    broker.policies.set_entry("topic", "unbounded", {"eventsMaxLen": 1_000_000})
    broker.refresh_policies()

    def workload(topic: str) -> None:
        c = broker.add_consumer(topic, ConsumerSpec(prefetch=1_000, ack_mode="auto"))
        for i in range(300):
            broker.send(topic, Message(body=str(i)))
        for _ in range(10):
            assert len(broker.receive(c, 30)) == 30

    workload("topic://prices")
    workload("topic://unbounded")  # the same events, none trimmed
    stats, whole = broker.stats("topic://prices"), broker.stats("topic://unbounded")
    assert whole.events_trimmed == 0 and whole.events > 900
    assert stats.events <= 100 + 100 + 60 and stats.events_trimmed > 0  # one call (30 x 2 events) over
    assert stats.events + stats.events_trimmed == whole.events  # every event kept or counted


def test_the_duplicate_audit_keeps_maxQueueAuditDepth_ids_and_shrinks_in_bounded_steps(broker):
    policy(broker, maxQueueAuditDepth=5_000)
    for start in range(0, 3_000, 100):
        broker.send("orders", [Message(body="x", message_id=f"m{i}") for i in range(start, start + 100)])
    assert broker.stats("orders").audit_size == 3_000
    policy(broker, maxQueueAuditDepth=10)
    sizes = []
    for i in range(3_000, 3_000 + 64 * 4, 64):
        broker.send("orders", [Message(body="x", message_id=f"m{k}") for k in range(i, i + 64)])
        sizes.append(broker.stats("orders").audit_size)
    # each send crossing a multiple of 64 trims at most 1,024 of the oldest ids
    assert sizes[0] == 3_000 + 64 - 1_024 and sizes[1] == sizes[0] + 64 - 1_024
    assert sizes[-1] == 10
    stats = broker.stats("orders")
    assert stats.queue_size == 3_000 + 64 * 4 and stats.duplicates == 0
    # the newest ids are still audited: a repeat of one is a duplicate, not a second message
    c = broker.add_consumer("orders", ConsumerSpec(prefetch=1_000, ack_mode="auto"))
    while broker.receive(c, 1_000):
        pass
    newest = f"m{3_000 + 64 * 4 - 1}"
    assert [s.status for s in broker.send("orders", Message(body="x", message_id=newest))] == ["duplicate"]


def test_the_bounds_have_a_ceiling(broker):
    with pytest.raises(InvalidPolicy, match="maxQueueAuditDepth"):
        policy(broker, maxQueueAuditDepth=2_000_000)
    with pytest.raises(InvalidPolicy, match="eventsMaxLen"):
        policy(broker, eventsMaxLen=5_000_000)
