"""Topic edge cases (issue 5 items 1-4) found by a review against the spec: durable keys, operator calls
on topics, counters, recovery order, memory, slow marking, evictions."""

from __future__ import annotations

import pytest
import redis

from broker_core import maintenance
from broker_core.destinations import parse_destination
from broker_core.drivers.loop import typed_error as _typed_error
from broker_core.effects import Command, Eval
from broker_core.errors import BrokerError, DurableSubscriptionInUse, InvalidConsumer, OperationRefused
from broker_core.messages import Message
from broker_core.model import ConsumerSpec

from ...helpers.broker import drain
from .test_topics import bodies, sub

T = "topic://review"
T2 = "topic://review.other"
T3 = "topic://review.third"


def set_topic_policy(broker, **attributes):
    broker.policies.set_entry("topic", ">", attributes)
    broker.refresh_policies()


def durable(broker, dest=T, consumer_id=None, client="cl", name="d", **kw):
    return sub(broker, dest, consumer_id=consumer_id, client_id=client, subscription_name=name, **kw)


class Stepper:
    """Drives one operation generator step by step, so a test can stop it (a crash) or interleave it."""

    def __init__(self, broker, op):
        self.broker, self.op = broker, op
        self.request = next(op)
        self.done, self.value = False, None

    def run_until(self, stop=lambda r: False):
        while not self.done:
            if stop(self.request):
                return self
            error, reply = None, None
            try:
                reply = self.broker._step(self.request)
            except redis.ResponseError as exc:
                error = _typed_error(exc)
            try:
                self.request = self.op.throw(error) if error else self.op.send(reply)
            except StopIteration as stop_iteration:
                self.done, self.value = True, stop_iteration.value
        return self

    def crash(self):
        self.op.close()


def is_registry_write(request):
    return isinstance(request, Command) and request.args[0] in ("HSET", "HDEL") and \
        str(request.args[1]).endswith(":durables")


def is_eval(name):
    return lambda request: isinstance(request, Eval) and request.script == name


def sub_keys(broker, dest):
    return sorted(s.key for s in broker.subscriptions(dest))


# -- §7.5 retained message ---------------------------------------------------------------------------

def test_replayed_retained_message_carries_retained_flag_even_while_another_subscription_holds_it(broker):
    """RetainedMessageSubscriptionRecoveryPolicy replays a COPY with ActiveMQ.Retained=true, also while the
    published message (without the flag) is still stored for another subscription: the copy is stored
    under its own id then, not shared with the published one."""
    holder = sub(broker, T, prefetch=1)  # keeps the message stored (never acks)
    broker.send(T, Message(body="r", properties={"ActiveMQ.Retain": True}))
    [got] = drain(broker, sub(broker, T, retroactive=True))
    assert got.properties.get("ActiveMQ.Retained") is True
    assert holder


# -- §7.4 durable re-subscribe / registry ----------------------------------------------------------

def test_a_refused_resubscribe_on_another_topic_leaves_the_old_durable_subscription_alone(broker):
    """Bad input must change no state: the old subscription (and its messages) is deleted *before* the
    new subscribe is attempted, so a refused subscribe (here: consumer id already used on T2) loses it."""
    d = durable(broker, T)
    broker.close_consumer(d)
    broker.send(T, [Message(body="kept-1"), Message(body="kept-2")])
    sub(broker, T2, consumer_id="busy")
    with pytest.raises(InvalidConsumer):
        durable(broker, T2, consumer_id="busy")
    assert [s.pending for s in broker.subscriptions(T)] == [2]


def test_a_crash_between_unsubscribe_and_registry_cleanup_blocks_the_durable_key_forever(broker):
    """unsubscribe = script, then HDEL of <ns>:durables. A crash in between leaves a registry entry
    pointing at a topic without the subscription; subscribe() then calls unsubscribe on it, which raises
    UnknownSubscription (only UnknownDestination is caught), so the key can never subscribe elsewhere."""
    d = durable(broker, T)
    broker.close_consumer(d)
    op = broker.ops.unsubscribe(parse_destination(T), "cl", "d", broker._now())
    Stepper(broker, op).run_until(is_registry_write).crash()
    assert sub_keys(broker, T) == []
    durable(broker, T2)  # must work: the key is free
    assert len(sub_keys(broker, T2)) == 1


def test_a_crash_right_after_a_durable_subscribe_leaves_it_registered_so_a_later_one_elsewhere_replaces_it(
        broker, clock):
    """Review finding 3 (second test, rewritten): the registry entry used to be written after
    topic_subscribe, so a crash in between left an unregistered subscription that a re-subscribe on
    another topic never replaced. topic_subscribe now writes it in the same step, so there is no
    registry write to crash before: crash right after the script instead. The crashed process's
    consumer is still attached until its lease lapses (§7.4: a durable key in use cannot move); once it
    is reaped, subscribing the key on T2 replaces the subscription on T."""
    spec = ConsumerSpec(client_id="cl", subscription_name="d", ack_mode="client-individual")
    dest = parse_destination(T)
    broker.ensure_destination(T)
    step = Stepper(broker, broker.ops.add_consumer(dest, spec, broker._now(), "c-first"))
    step.run_until(is_eval("topic_subscribe"))
    step.run_until(lambda r: not is_eval("topic_subscribe")(r)).crash()
    assert len(sub_keys(broker, T)) == 1
    with pytest.raises(DurableSubscriptionInUse):
        durable(broker, T2)
    clock.advance(spec.lease_ms + 1)
    broker.reap_lapsed(T, 100)
    d = durable(broker, T2)
    broker.close_consumer(d)
    assert sub_keys(broker, T) == [], "the same durable key now lives on two topics"
    assert len(sub_keys(broker, T2)) == 1


def test_two_concurrent_subscribes_of_one_durable_key_on_two_topics_make_one_subscription(broker):
    """Review finding 3 (first test; expectation corrected): the registry check, topic_subscribe and the
    registry write were separate steps, so two workers subscribing the same (client id, name) to T and T2
    at once both created a subscription. They are now one step; the worker that comes second finds the
    key active on the other topic and is refused with ActiveMQ's "Durable consumer is in use" (§7.4: one
    active consumer per durable subscription; ActiveMQ would not even accept a second connection with the
    same client id), where the original test expected it to complete."""
    mk = parse_destination
    spec = ConsumerSpec(client_id="cl", subscription_name="d", ack_mode="client-individual")
    first = Stepper(broker, broker.ops.add_consumer(mk(T), spec, broker._now(), "w1"))
    first.run_until(is_eval("topic_subscribe"))
    Stepper(broker, broker.ops.add_consumer(mk(T2), spec, broker._now(), "w2")).run_until()
    with pytest.raises(DurableSubscriptionInUse):
        first.run_until()
    total = len(sub_keys(broker, T)) + len(sub_keys(broker, T2))
    assert total == 1, "one durable key, two live subscriptions (both active at once)"


def test_durable_keys_do_not_collide_for_different_client_id_and_name_pairs(broker):
    """durable_key/durable_registry_field join client id and name with NUL, which neither is checked
    for: ("a\\0b", "c") and ("a", "b\\0c") are different SubscriptionKeys in ActiveMQ but one here."""
    first = durable(broker, T, client="a\x00b", name="c")
    broker.close_consumer(first)
    second = durable(broker, T, client="a", name="b\x00c")
    assert len(sub_keys(broker, T)) == 2
    assert second


def test_a_durable_subscription_on_an_advisory_topic_is_refused(broker):
    """§7.4: "Durable subscriptions on advisory topics are rejected" (TopicRegion.addConsumer: "Cannot
    create a durable subscription for an advisory Topic"). Here it is created."""
    with pytest.raises(BrokerError):
        durable(broker, "topic://ActiveMQ.Advisory.Consumer.Queue.orders")
    assert broker.subscriptions("topic://ActiveMQ.Advisory.Consumer.Queue.orders") == []



# -- counters ---------------------------------------------------------------------------------------

def test_topic_dequeue_and_dispatch_counts_do_not_go_down_when_a_subscription_ends(broker):
    """A topic's DequeueCount/DispatchCount (§14.2) are monotonic in ActiveMQ. ops/topics.stats sums them
    over the *current* subscriptions' metas, and remove_subscription DELetes the meta, so closing a
    non-durable subscriber (or unsubscribing / timing out a durable) makes the topic's counts fall."""
    c = sub(broker, T)
    broker.send(T, [Message(body=str(i)) for i in range(3)])
    for d in drain(broker, c):
        broker.ack(c, d.message_id)
    before = broker.stats(T)
    assert (before.dequeued, before.dispatched) == (3, 3)
    broker.close_consumer(c)
    after = broker.stats(T)
    assert (after.dequeued, after.dispatched) == (3, 3)


def test_evictions_and_expiries_stay_counted_on_the_topic_after_the_subscription_ends(broker):
    """Same defect for what §8.5 says must be counted: evicted (DiscardedCount) and dead-lettered
    messages vanish from the topic's stats with the subscription."""
    set_topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=1)
    c = sub(broker, T, prefetch=1)
    broker.send(T, [Message(body=str(i)) for i in range(4)])  # 1 in flight, 1 pending, 2 evicted
    assert broker.stats(T).evicted == 2
    broker.close_consumer(c)
    st = broker.stats(T)
    assert (st.evicted, st.deadlettered) == (2, 2)


# -- §8.1 / §8.5 -------------------------------------------------------------------------------------

def test_a_topic_subscriber_is_marked_slow_only_when_more_than_prefetch_already_wait(broker):
    """TopicSubscription.add checks `matched.size() > prefetch` BEFORE adding the new message. With
    prefetch 2: messages 1-2 dispatched, 3-5 arrive with 0, 1, 2 already waiting -> not slow; the 6th
    (3 waiting) marks it. Here the count includes the new message, so the 5th marks it."""
    c = sub(broker, T, prefetch=2)
    for i in range(5):
        broker.send(T, Message(body=str(i)))
    slow = [s.slow_since for s in broker.subscriptions(T) if s.consumer_id == c.consumer_id]
    assert slow == [None]
    broker.send(T, Message(body="5"))
    slow = [s.slow_since for s in broker.subscriptions(T) if s.consumer_id == c.consumer_id]
    assert slow[0] is not None


def test_a_consumer_can_ask_for_a_smaller_pending_message_limit(broker):
    """§8.5 / PolicyEntry.configure: with a strategy, the consumer's own maximumPendingMessageLimit wins
    when > 0 and smaller (STOMP `activemq.maximumPendingMessageLimit`). ConsumerSpec has no such field,
    so the consumer's value cannot be given at all."""
    set_topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=1000)
    spec = ConsumerSpec(prefetch=1, maximum_pending_message_limit=2)  # type: ignore[call-arg]
    c = broker.add_consumer(T, spec)
    broker.send(T, [Message(body=str(i)) for i in range(6)])
    assert [s.pending for s in broker.subscriptions(T)] == [2]
    assert c


def test_unsubscribe_finds_the_durable_subscription_by_its_key(broker):
    """§7.4: the identity is SubscriptionKey(clientId, subscriptionName); ActiveMQ's RemoveSubscriptionInfo
    (and STOMP UNSUBSCRIBE with activemq.subscriptionName) carries no destination. <ns>:durables knows
    the topic, but unsubscribe() only looks on the topic it is given and reports the existing
    subscription as missing."""
    d = durable(broker, T)
    broker.close_consumer(d)
    broker.ensure_destination(T2)
    broker.unsubscribe(T2, client_id="cl", subscription_name="d")
    assert sub_keys(broker, T) == []


# -- memory (§7.5 buffers; issue item 6's limits) ---------------------------------------------------

def test_messages_kept_by_the_recovery_policy_count_in_the_topics_memory_usage(broker):
    """FixedCount/FixedSized/Timed/LastImage buffers and the retained message hold message references
    (counted in ActiveMQ's memory usage while referenced). Here :recov/:recovmsg and :retain are never
    charged, so a topic with no subscriber holds 100 x 10 KB that memoryLimit never sees."""
    set_topic_policy(broker, subscriptionRecoveryPolicy="fixedCount")
    broker.send(T, [Message(body="x" * 10_000) for _ in range(20)])
    held = broker.redis.hlen(f"{broker.namespace}:{{t:review}}:recovmsg")
    assert held == 20
    assert broker.stats(T).memory_usage >= 20 * 10_000


# -- operator operations on a topic -----------------------------------------------------------------

def dangling(broker, dest=T):
    """Ids some subscription holds (pending, parked, in flight) whose message is no longer stored."""
    name = dest.removeprefix("topic://")
    base = f"{broker.namespace}:{{t:{name}}}"
    stored_ids = set(broker.redis.hkeys(f"{base}:msgs"))
    out = set()
    for key in sub_keys(broker, dest):
        held = set(broker.redis.zrange(f"{base}:s:{key}:pending", 0, -1))
        held |= set(broker.redis.zrange(f"{base}:s:{key}:parked", 0, -1))
        held |= set(broker.redis.hkeys(f"{base}:s:{key}:inflight"))
        out |= held - stored_ids
    return out


def test_operator_remove_on_a_topic_does_not_pull_the_message_from_under_its_subscriptions(broker):
    """remove.lua on the topic prefix (SUB nil): locate() finds nothing, but take_out() still reads the
    shared blob from <topic>:msgs and drop_message() HDELs it without touching :refs, reporting 1
    removed. The subscriptions keep the id pending with no message behind it, and their consumers never
    get it: lost. (TopicView has no removeMessage; refusing with a typed error would do.)"""
    a, b = sub(broker, T, prefetch=1), sub(broker, T, prefetch=1)
    broker.send(T, Message(body="first"))
    [mid] = broker.send(T, Message(body="second"))
    with pytest.raises(OperationRefused):  # a topic's messages belong to its subscriptions
        broker.remove_message(T, mid)
    with pytest.raises(OperationRefused):
        broker.move_message(T, mid, "queue://elsewhere")
    assert dangling(broker) == set()
    for c in (a, b):
        got = []
        for _ in range(3):
            for d in broker.receive(c, 10):
                got.append(d.body)
                broker.ack(c, d.message_id)
        assert got == ["first", "second"]


def test_a_new_retroactive_durable_with_a_backlog_gets_the_backlog_not_the_recovery_buffer(broker):
    """Topic.activate recovers the store backlog (addAckLocationForRetroactiveSub) into the pending
    cursor first; DurableTopicSubscription.activate then calls recoverRetroactiveMessages, whose wrapped
    policy runs only if pending is empty (§7.5). topic_subscribe.lua computes `empty` before the backlog
    and replays the buffer first: messages no durable holds any more come back, ahead of older ones."""
    set_topic_policy(broker, subscriptionRecoveryPolicy="fixedCount")
    broker.send(T, Message(body="only-in-buffer"))  # nobody subscribed: kept only by the buffer
    other = durable(broker, T, name="other")
    broker.close_consumer(other)
    broker.send(T, Message(body="stored-for-other"))
    late = durable(broker, T, name="late", retroactive=True)
    assert bodies(drain(broker, late)) == ["stored-for-other"]


def test_no_local_without_a_connection_id_is_refused_rather_than_silently_ignored(broker):
    """§7.3: NoLocalExpression compares connection ids. ConsumerSpec(no_local=True) without
    connection_id is accepted and topic.matches then never filters (s.def.conn is nil): the subscriber
    gets its own messages. Bad input should raise a typed error naming the field."""
    with pytest.raises(InvalidConsumer):
        sub(broker, T, no_local=True)


# -- queue-only policy fields leaking into subscriptions (§13) ---------------------------------------

def test_topic_deliveries_never_carry_group_first_for_consumer(broker):
    """JMSXGroupFirstForConsumer is set by Queue.assignMessageGroup only (§3.3); topics have no group
    assignment. A subscription runs the queue's group code."""
    c = sub(broker, T)
    broker.send(T, Message(body="x", group_id="g"))
    [d] = drain(broker, c)
    assert d.group_first_for_consumer is False


# -- scale -------------------------------------------------------------------------------------------

def test_a_topic_with_8000_subscriptions_still_accepts_sends(broker):
    """topic.subscriptions() does HMGET <topic>:subs unpack(keys) over every subscription key; Lua's
    unpack() fails past ~8000 values ("too many results to unpack"), so once a topic has that many
    subscribers every send (and subscribe, retroactive or not) fails."""
    for i in range(8100):  # ~30 s
        broker.add_consumer(T, ConsumerSpec(prefetch=1), consumer_id=f"s{i}")
    [status] = broker.send(T, Message(body="x"))
    assert status.status == "ok"


# -- crash between a topic send and its forwards ----------------------------------------------------

def test_forwards_a_crashed_topic_send_left_are_delivered_by_maintenance_even_without_subscriptions(
        broker, clock):
    """topic_send records forwards (dead letters, virtual-topic/composite copies, advisories) in
    <topic>:fwd; finish_send delivers them. If the process dies in between, run_due is the safety net,
    but for a topic it only visits the topic's *subscriptions* (maintenance.py, TOPICS edit): a topic
    with none (a VirtualTopic.>, a composite, a topic nobody listens to) never has its forwards
    delivered. Here: a persistent message expired on arrival must reach the DLQ."""
    broker.ensure_destination(T)
    msg = Message(body="late", expiration=clock.now_ms() - 1)
    step = Stepper(broker, broker.ops.send(parse_destination(T), [msg], broker._now()))
    step.run_until(is_eval("topic_send"))
    step.run_until(lambda r: not is_eval("topic_send")(r))  # topic_send ran; crash before forwarding
    step.crash()
    assert broker.redis.hlen(f"{broker.namespace}:{{t:review}}:fwd") == 1
    for _ in range(3):  # a first sighting starts the grace period; later runs deliver
        clock.advance(600_000)
        maintenance.run_due(broker)
    assert broker.redis.hlen(f"{broker.namespace}:{{t:review}}:fwd") == 0
    assert broker.stats("queue://ActiveMQ.DLQ").enqueued == 1


def test_prioritized_messages_does_not_reorder_a_non_durable_subscribers_pending_messages(broker):
    """TopicSubscription's `matched` cursor is built with prioritizedMessages=false hard-coded
    (new FilePendingMessageCursor(broker, name, false) / VMPendingMessageCursor(false)); only durable
    subscriptions' store cursors get the policy's prioritizedMessages. pending_score applies it to every
    subscription, so a non-durable subscriber gets a higher-priority later message first."""
    set_topic_policy(broker, prioritizedMessages=True)
    c = sub(broker, T, prefetch=1)
    broker.send(T, [Message(body="in-flight"), Message(body="low", priority=1),
                    Message(body="high", priority=9)])
    got = []
    for _ in range(3):
        for d in broker.receive(c, 1):
            got.append(d.body)
            broker.ack(c, d.message_id)
    assert got == ["in-flight", "low", "high"]


def test_an_eviction_counts_on_the_topics_dequeues_but_not_the_subscriptions(broker):
    """TopicSubscription.discard: discarded++ and destination.getDestinationStatistics().getDequeues()
    ++ only; the subscription's DequeueCounter (SubscriptionView, §14.4) counts acks. discard_pending
    bumps the subscription's 'dequeued' too, so SubscriptionStats.dequeued counts evictions as acks."""
    set_topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=1)
    c = sub(broker, T, prefetch=1)
    broker.send(T, [Message(body=str(i)) for i in range(4)])  # 1 in flight, 1 pending, 2 evicted
    [s] = broker.subscriptions(T)
    assert (s.evicted, s.dequeued) == (2, 0)
    assert broker.stats(T).dequeued == 2
    assert c
