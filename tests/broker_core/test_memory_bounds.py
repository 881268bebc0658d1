"""What a destination keeps beside its messages is bounded and counted: the lifecycle event stream
(eventsMaxLen; trimmed events are counted, no message goes with them) and the duplicate audit
(maxQueueAuditDepth; trimmed at most 1,024 ids a call). Real Redis, real scripts."""

from __future__ import annotations

import pytest

from broker_core.broker import Broker
from broker_core.errors import InvalidPolicy
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
    assert 200 <= stats.events <= 200 + 100  # approximate: whole stream nodes (100 entries) go
    assert stats.events + stats.events_trimmed == 1_000  # one enqueue event per message, each counted
    assert broker.redis.xlen(f"{broker.namespace}:{{q:orders}}:events") == stats.events


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
