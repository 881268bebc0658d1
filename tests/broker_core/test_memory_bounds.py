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


def test_the_event_stream_stays_near_eventsMaxLen_and_counts_what_it_trimmed(broker):
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
