"""Deleting a topic (the console's, REST's and the CLI's one operation, Broker.delete_destination): its
subscriptions go a bounded number per script call, durable and active ones included (ActiveMQ's
BrokerView.removeTopic / the web console's deleteDestination force them off), and the messages held for
them are counted in what the deletion returns, each subscription's own (the topic's Pending), with the
topic's scheduled messages."""

from __future__ import annotations

import pytest

from broker_core.destinations import parse_destination
from broker_core.effects import Eval
from broker_core.errors import UnknownConsumer
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from broker_core.ops import topics

T = "topic://prices"


def durable(broker, i: int, **kw):
    return broker.add_consumer(T, ConsumerSpec(client_id=f"app{i}", subscription_name="s",
                                               ack_mode="client-individual", **kw), consumer_id=f"d{i}")


def script_calls(broker, op):
    """Drive `op` one request at a time; the replies of its topic_admin calls, in order, and its result."""
    replies, request = [], next(op)
    try:
        while True:
            reply = broker._step(request)
            if isinstance(request, Eval) and request.script == "topic_admin":
                replies.append(reply)
            request = op.send(reply)
    except StopIteration as done:
        return replies, done.value


def test_subscriptions_go_a_bounded_number_per_call_and_every_held_message_is_counted(broker, redis_client):
    n = 2 * topics.DELETE_SUBSCRIPTIONS + 7
    for i in range(n):
        broker.close_consumer(durable(broker, i))  # offline durable subscriptions
    broker.send(T, [Message(body="a"), Message(body="b"), Message(body="c")])
    broker.send(T, [Message(body="later", delay_ms=60_000)])  # scheduled on the topic, not yet published
    assert broker.stats(T).pending == 3 * n

    op = broker.ops.delete_destination(parse_destination(T), broker._now())
    replies, removed = script_calls(broker, op)

    # three calls: 50, 50, then 7 subscriptions, each saying how many are left
    assert [int(r[1]) for r in replies] == [n - 50, n - 100, 0]
    assert [int(r[0]) for r in replies] == [150, 150, 21]
    assert removed == 3 * n + 1  # each durable subscription's 3 messages, and the scheduled one
    assert T not in broker.destinations()
    assert list(redis_client.scan_iter(match=f"{broker.namespace}:{{t:prices}}*")) == []
    # the durable subscriptions' registry entries went with them: the same client id and name may
    # subscribe on another topic without releasing anything
    assert not [k for k in redis_client.hkeys(f"{broker.namespace}:durables") if b"app" in k]


def test_active_subscriptions_are_removed_too_and_their_in_flight_messages_counted(broker):
    active = durable(broker, 0, prefetch=10)
    plain = broker.add_consumer(T, ConsumerSpec(ack_mode="client-individual"), consumer_id="n1")
    broker.send(T, [Message(body=str(i)) for i in range(4)])
    assert len(broker.receive(active, 2)) == 2  # 2 in flight, 2 waiting

    assert broker.delete_destination(T) == 8  # 4 for each subscription, in flight or not

    for consumer in (active, plain):
        with pytest.raises(UnknownConsumer):
            broker.receive(consumer, 1)


def _delete_subscribing_after_the_first_call(broker, subscribe):
    """Delete T step by step; right after its first topic_admin call, `subscribe(that call's reply)` makes
    a subscription. (what the deletion returned, that subscription)"""
    op = broker.ops.delete_destination(parse_destination(T), broker._now())
    request, late = next(op), None
    try:
        while True:
            reply = broker._step(request)
            if late is None and isinstance(request, Eval) and request.script == "topic_admin":
                late = subscribe(reply)
            request = op.send(reply)
    except StopIteration as done:
        return done.value, late


def test_subscriptions_made_between_the_calls_go_as_well(broker):
    for i in range(topics.DELETE_SUBSCRIPTIONS + 1):
        broker.close_consumer(durable(broker, i))
    broker.send(T, [Message(body="a")])
    removed, late = _delete_subscribing_after_the_first_call(broker, lambda reply: durable(broker, 999))
    assert removed == topics.DELETE_SUBSCRIPTIONS + 1
    assert T not in broker.destinations()
    with pytest.raises(UnknownConsumer):
        broker.receive(late, 1)


def test_a_subscription_made_after_the_last_call_goes_as_well_and_leaves_nothing(broker, redis_client):
    """A subscriber that comes back at once (a client resubscribing when told its subscription went) may
    subscribe after the call that removed the last subscription and before the topic's own keys go: it
    goes too, with its durable registry entry, instead of being left behind, subscribed to nothing."""
    broker.close_consumer(durable(broker, 0))
    def subscribe(reply):
        assert int(reply[1]) == 0  # the last call: nothing left
        return durable(broker, 1)  # subscribes right after it

    _removed, late = _delete_subscribing_after_the_first_call(broker, subscribe)
    assert T not in broker.destinations()
    with pytest.raises(UnknownConsumer):
        broker.receive(late, 1)
    assert list(redis_client.scan_iter(match=f"{broker.namespace}:{{t:prices}}*")) == []
    assert not [k for k in redis_client.hkeys(f"{broker.namespace}:durables") if b"app" in k]
