"""Slow topic subscribers (spec §8.1, §8.2), pending-message limits and eviction (§8.5)."""

from __future__ import annotations

import pytest

from broker_core import maintenance
from broker_core.errors import UnknownConsumer
from broker_core.messages import Message
from broker_core.model import ConsumerRef, ConsumerSpec

from ...helpers.broker import drain
from ..s07_topics.test_topics import bodies, events, stored, sub

T = "topic://ticks"


def set_topic_policy(broker, **attributes):
    broker.policies.set_entry("topic", ">", attributes)
    broker.refresh_policies()


def send(broker, n, **kw):
    return broker.send(T, [Message(body=str(i), **kw) for i in range(n)])


def info(broker, consumer):
    return next(s for s in broker.subscriptions(T) if s.consumer_id == consumer.consumer_id)


def test_a_non_durable_subscriber_is_slow_once_more_than_its_prefetch_waits(broker):
    c = sub(broker, T, prefetch=2)
    # TopicSubscription.add checks matched.size() > prefetch before adding the new message (§8.1).
    send(broker, 5)
    assert info(broker, c).slow_since is None  # the 5th arrived with 2 waiting: not more than the prefetch
    send(broker, 1)  # arrives with 3 waiting
    assert info(broker, c).slow_since is not None
    assert [e["consumer"] for e in events(broker, T) if e["type"] == "slow"] == [c.consumer_id]
    send(broker, 3)
    assert len([e for e in events(broker, T) if e["type"] == "slow"]) == 1  # marked once


def test_a_non_durable_subscriber_with_a_prefetch_of_one_is_never_marked_slow(broker):
    """TopicSubscription.add marks it only when `info.getPrefetchSize() > 1`."""
    c = sub(broker, T, prefetch=1)
    send(broker, 20)
    assert info(broker, c).slow_since is None and info(broker, c).pending == 19
    assert [e for e in events(broker, T) if e["type"] == "slow"] == []


def test_an_immediate_dispatch_clears_the_slow_mark(broker):
    c = sub(broker, T, prefetch=2)
    send(broker, 5)
    for d in drain(broker, c):
        broker.ack(c, d.message_id)
    while True:
        got = drain(broker, c)
        if not got:
            break
        for d in got:
            broker.ack(c, d.message_id)
    send(broker, 1)
    assert info(broker, c).slow_since is None


def test_a_durable_subscriber_is_slow_as_a_prefetch_subscription_is(broker):
    d = sub(broker, T, client_id="c", subscription_name="d", prefetch=1)
    send(broker, 2)
    assert info(broker, d).slow_since is not None


def test_the_abort_strategy_aborts_a_slow_non_durable_subscriber_and_drops_its_subscription(broker, clock):
    set_topic_policy(broker, slowConsumerStrategy="abortSlowConsumer", maxSlowDuration=30_000,
                     checkPeriod=30_000)
    slow = sub(broker, T, prefetch=2)
    fine = sub(broker, T)
    send(broker, 6)  # the 6th arrives with 3 (> prefetch 2) waiting
    # Marked slow by the send; with the defaults the first check (1 x 30 s >= 30 s) aborts it.
    report = maintenance.run_due(broker)
    assert report.aborted == [f"{T}#{slow.consumer_id}"]
    notice = maintenance.abort_notice(broker, T, slow.consumer_id)
    assert notice is not None and notice.strategy == "abortSlowConsumer"
    with pytest.raises(UnknownConsumer):
        broker.receive(slow)
    assert [s.consumer_id for s in broker.subscriptions(T)] == [fine.consumer_id]
    assert len(drain(broker, fine)) == 6


def test_an_operator_can_abort_a_topic_consumer(broker):
    c = sub(broker, T, consumer_id="op-1")
    maintenance.abort_consumer(broker, ConsumerRef(c.destination, "op-1"), "enough")
    assert maintenance.abort_reason(broker, T, "op-1") == "enough"
    assert broker.subscriptions(T) == []


def test_without_a_limit_strategy_nothing_is_evicted(broker):
    c = sub(broker, T, prefetch=1)
    send(broker, 50)
    assert info(broker, c).pending == 49 and info(broker, c).evicted == 0


def test_a_constant_limit_evicts_the_oldest_pending_and_dead_letters_them(broker):
    set_topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=2)
    c = sub(broker, T, prefetch=1)
    send(broker, 6)
    s = info(broker, c)
    assert (s.in_flight, s.pending, s.evicted) == (1, 2, 3)
    assert bodies(broker.receive(c)) == ["0"]
    assert [e["msg"] for e in events(broker, T) if e["type"] == "evict"] == [
        e["msg"] for e in events(broker, T) if e["type"] == "enqueue"][1:4]
    assert broker.stats("queue://ActiveMQ.DLQ").enqueued == 3  # persistent: the DLQ keeps them
    assert broker.stats(T).evicted == 3
    assert stored(broker, T) == 3


def test_an_evicted_dead_letter_carries_the_subscriptions_discard_cause(broker):
    """ActiveMQ 5.17.2's TopicSubscription.discard sends the evicted message to the dead-letter queue with
    the cause `new Throwable("TopicSubDiscard. ID:" + consumerId)`, which RegionBroker.sendToDeadLetterQueue
    writes into dlqDeliveryFailureCause (5.18 on: "Subscription discard. ID:")."""
    set_topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=1)
    c = sub(broker, T, prefetch=1, consumer_id="slow-1")
    send(broker, 3)
    assert info(broker, c).evicted == 1
    (dead,) = drain(broker, broker.add_consumer("queue://ActiveMQ.DLQ", ConsumerSpec()))
    assert dead.body == "1" and dead.original_destination == T
    assert dead.properties["dlqDeliveryFailureCause"] == "java.lang.Throwable: TopicSubDiscard. ID:slow-1"


def test_evicted_non_persistent_messages_are_discarded_not_dead_lettered(broker):
    set_topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=1)
    c = sub(broker, T, prefetch=1)
    send(broker, 4, persistent=False)
    s = info(broker, c)
    assert (s.evicted, s.discarded, s.deadlettered) == (2, 2, 0)


def test_the_prefetch_rate_limit_is_prefetch_times_the_multiplier(broker):
    set_topic_policy(broker, pendingMessageLimitStrategy="prefetchRate", pendingMessageLimitMultiplier=0.5)
    c = sub(broker, T, prefetch=4)
    send(broker, 10)
    s = info(broker, c)
    assert (s.in_flight, s.pending, s.evicted) == (4, 2, 4)


def test_a_limit_of_zero_drops_what_the_window_cannot_take_without_counting_it_discarded(broker):
    set_topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=0)
    c = sub(broker, T, prefetch=2)
    send(broker, 5)
    s = info(broker, c)
    assert (s.in_flight, s.pending, s.evicted, s.dropped, s.discarded) == (2, 0, 0, 3, 0)
    assert "queue://ActiveMQ.DLQ" not in broker.destinations()
    assert stored(broker, T) == 2


def test_a_limit_of_minus_one_never_evicts(broker):
    set_topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=-1)
    c = sub(broker, T, prefetch=1)
    send(broker, 20)
    assert info(broker, c).evicted == 0 and info(broker, c).pending == 19


def test_durable_subscriptions_are_not_subject_to_pending_limits(broker):
    set_topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=1)
    d = sub(broker, T, client_id="c", subscription_name="d", prefetch=1)
    send(broker, 5)
    assert info(broker, d).evicted == 0 and info(broker, d).pending == 4


def test_oldest_with_lowest_priority_eviction_takes_the_first_lowest_priority_message(broker):
    set_topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=3,
                     messageEvictionStrategy="oldestMessageWithLowestPriority")
    c = sub(broker, T, prefetch=1)
    broker.send(T, [Message(body=f"{i}/p{p}", priority=p) for i, p in enumerate([4, 6, 2, 5, 2])])
    [first] = broker.receive(c)
    broker.ack(c, first.message_id)
    rest = []
    while True:
        got = broker.receive(c)
        if not got:
            break
        rest += bodies(got)
        broker.ack(c, got[0].message_id)
    assert "2/p2" not in rest and "4/p2" in rest and info(broker, c).evicted == 1


def test_unique_property_eviction_keeps_the_newest_message_per_value(broker, clock):
    set_topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=3,
                     messageEvictionStrategy="uniquePropertyMessage", evictionPropertyName="sym")
    c = sub(broker, T, prefetch=1)
    for i, sym in enumerate(["X", "A", "B", "A"]):
        clock.advance(1)
        broker.send(T, Message(body=f"{i}{sym}", properties={"sym": sym}))
    assert info(broker, c).evicted == 0
    clock.advance(1)
    broker.send(T, Message(body="4B", properties={"sym": "B"}))
    # Pending was 1A 2B 3A 4B: the newest A and B stay.
    assert info(broker, c).evicted == 2
    got = []
    for _ in range(4):
        d = broker.receive(c)
        if not d:
            break
        got += bodies(d)
        broker.ack(c, d[0].message_id)
    assert got == ["0X", "3A", "4B"]


def test_unique_property_eviction_without_the_property_evicts_the_oldest(broker):
    set_topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=2,
                     messageEvictionStrategy="uniquePropertyMessage", evictionPropertyName="sym")
    c = sub(broker, T, prefetch=1)
    send(broker, 4)
    assert info(broker, c).evicted == 1
    assert bodies(drain(broker, c)) == ["0"]


def test_over_the_limit_an_expired_pending_message_goes_first(broker, clock):
    set_topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=2)
    c = sub(broker, T, prefetch=1)
    broker.send(T, [Message(body="0"), Message(body="1"), Message(body="old", expiration=clock.now_ms() + 5)])
    clock.advance(10)
    broker.send(T, Message(body="3"))
    s = info(broker, c)
    assert s.expired == 1 and s.evicted == 0 and s.pending == 2
