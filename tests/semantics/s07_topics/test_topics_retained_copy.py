"""The retained message's replayed copy (spec §7.5, RetainedMessageSubscriptionRecoveryPolicy): it carries
ActiveMQ.Retained=true whether or not the published message is still stored for other subscriptions, and
is stored once, with its own reference count, while both exist."""

from __future__ import annotations

from broker_core.messages import Message

from ...helpers.broker import drain
from .test_topics import stored, sub

T = "topic://retained"


def retain(broker, body="r", message_id="r1"):
    broker.send(T, Message(body=body, message_id=message_id, properties={"ActiveMQ.Retain": True}))


def test_while_the_published_message_is_held_the_copy_is_stored_once_for_every_retroactive_subscriber(broker):
    holder = sub(broker, T, prefetch=1)
    retain(broker)
    late = [sub(broker, T, retroactive=True) for _ in range(3)]
    got = [drain(broker, c) for c in late]
    assert [[d.properties.get("ActiveMQ.Retained") for d in one] for one in got] == [[True]] * 3
    assert {d.message_id for one in got for d in one} == {"r1#retained"}  # one copy, its own id
    assert stored(broker, T) == 2  # the published message and the copy, each once
    refs = broker.redis.hgetall(f"{broker.namespace}:{{t:retained}}:refs")
    assert refs == {b"r1": b"1", b"r1#retained": b"3"}
    [published] = drain(broker, holder)
    assert published.message_id == "r1" and "ActiveMQ.Retained" not in published.properties


def test_the_copy_and_the_published_message_go_when_their_last_holders_ack(broker):
    holder = sub(broker, T, prefetch=1)
    retain(broker)
    late = sub(broker, T, retroactive=True)
    [copy] = drain(broker, late)
    [published] = drain(broker, holder)
    broker.ack(late, copy.message_id)
    broker.ack(holder, published.message_id)
    assert stored(broker, T) == 0
    # what is left counted is the retained slot itself (the policy keeps it for later subscribers)
    assert broker.memory().used == broker.stats(T).memory_usage > 0


def test_once_the_published_message_is_gone_the_copy_keeps_the_message_id(broker):
    """ActiveMQ's copy (message.copy()) has the published message's id; the own id is only needed while
    both are stored."""
    holder = sub(broker, T, ack_mode="auto")
    retain(broker)
    drain(broker, holder)  # acknowledged on hand-over: the published message is gone
    [got] = drain(broker, sub(broker, T, retroactive=True))
    assert got.message_id == "r1" and got.properties["ActiveMQ.Retained"] is True


def test_a_subscriber_already_holding_the_published_message_is_not_given_the_copy_as_well(broker):
    """A returning retroactive durable subscription that holds the message does not get it twice."""
    d = sub(broker, T, client_id="app", subscription_name="keep", retroactive=True)
    broker.close_consumer(d)
    other = sub(broker, T, prefetch=1)
    retain(broker)
    back = sub(broker, T, client_id="app", subscription_name="keep", retroactive=True)
    assert [m.message_id for m in drain(broker, back)] == ["r1"]
    assert other
