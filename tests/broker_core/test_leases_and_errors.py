"""Leases, lifecycle events and bad input (typed errors, no state change)."""

from __future__ import annotations

import pytest

from broker_core.errors import (
    InvalidConsumer,
    InvalidDestination,
    InvalidMessage,
    InvalidSelector,
    MessageTooLarge,
    UnknownConsumer,
)
from broker_core.event_stream import expand
from broker_core.messages import Message, TypedValue
from broker_core.model import ConsumerRef

from ..helpers.broker import consumer, drain


def test_a_lapsed_consumer_gets_nothing_and_the_reaper_returns_its_messages(broker, clock):
    a = consumer(broker, prefetch=5, consumer_id="A", lease_ms=1000)
    broker.send("orders", [Message(body="m0"), Message(body="m1")])
    drain(broker, a)
    clock.advance(1500)
    b = consumer(broker, prefetch=5, consumer_id="B")
    broker.send("orders", Message(body="m2"))
    assert [d.body for d in drain(broker, b)] == ["m2"]  # a lapsed lease gets no new messages
    assert broker.reap_lapsed("orders") == ["A"]
    assert [(d.body, d.redelivered) for d in drain(broker, b)] == [("m0", True), ("m1", True)]
    with pytest.raises(UnknownConsumer):
        broker.receive(a)


def test_renewing_a_lease_keeps_the_consumer(broker, clock):
    a = consumer(broker, consumer_id="A", lease_ms=1000)
    clock.advance(800)
    assert broker.renew_leases("orders", ["A", "gone"], 1000) == ["gone"]
    clock.advance(800)
    assert broker.reap_lapsed("orders") == []
    broker.send("orders", Message(body="m"))
    assert [d.body for d in drain(broker, a)] == ["m"]


def test_every_transition_appends_a_lifecycle_event(broker, redis_client, namespace):
    c = consumer(broker, consumer_id="A", ack_mode="client-individual")
    broker.send("orders", Message(body="m", group_id="G"))
    (d,) = drain(broker, c)
    broker.ack(c, d.message_id)
    broker.close_consumer(c)
    events = expand(redis_client.xrange(f"{namespace}:{{q:orders}}:events"))
    kinds = [e[1][b"type"].decode() for e in events]
    assert kinds == ["consumer_add", "enqueue", "group_assign", "dispatch", "ack", "consumer_remove"]
    dispatch = dict(events[3][1])
    assert dispatch[b"msg"].decode() == d.message_id and dispatch[b"consumer"] == b"A"


@pytest.mark.parametrize(
    ("message", "error", "text"),
    [
        (Message(body="x", priority=10), InvalidMessage, "priority must be an integer 0-9"),
        (Message(body="x", priority=-1), InvalidMessage, "priority"),
        (Message(body=3), InvalidMessage, "body must be text or bytes"),
        (Message(body="x", properties={"": 1}), InvalidMessage, "property names"),
        (Message(body="x", properties={"p": [1]}), InvalidMessage, "unsupported type list"),
        (Message(body="x", properties={"p": TypedValue("int", 2**40)}), InvalidMessage, "not a valid int"),
        (Message(body="x", properties={"p": 2**70}), InvalidMessage, "does not fit in a long"),
    ],
)
def test_invalid_messages_are_refused_with_what_is_wrong(broker, message, error, text):
    with pytest.raises(error, match=text):
        broker.send("orders", message)
    assert broker.destinations() == []


def test_an_oversized_body_names_the_limit_and_nothing_is_stored(broker, policy):
    broker.send("orders", Message(body="ok"))
    policy("orders", maxMessageSize=1024)
    with pytest.raises(MessageTooLarge, match="maxMessageSize=1024"):
        broker.send("orders", [Message(body="fine"), Message(body="x" * 2000)])
    assert broker.stats("orders").enqueued == 1


@pytest.mark.parametrize("name", ["", "a..b", "bad{tag}", "a b", "queue://", "*.x"])
def test_a_malformed_destination_name_is_refused(broker, name):
    with pytest.raises(InvalidDestination):
        broker.send(name, Message(body="x"))


def test_an_invalid_selector_names_the_position_and_registers_nothing(broker):
    with pytest.raises(InvalidSelector, match="position"):
        consumer(broker, selector="color = = 'red'")
    with pytest.raises(Exception):  # noqa: B017 - the destination was never created
        broker.stats("orders")


@pytest.mark.parametrize(
    ("kw", "text"),
    [({"prefetch": -1}, "prefetch"), ({"priority": 200}, "priority"),
     ({"ack_mode": "sometimes"}, "ack mode")],
)
def test_invalid_consumer_settings_are_refused(broker, kw, text):
    with pytest.raises(InvalidConsumer, match=text):
        consumer(broker, **kw)


def test_unknown_consumers_are_refused_by_every_operation(broker):
    broker.send("orders", Message(body="x"))
    ghost = ConsumerRef(broker.add_consumer("orders").destination, "ghost")
    for call in (lambda: broker.receive(ghost), lambda: broker.ack(ghost, "ID:x"),
                 lambda: broker.close_consumer(ghost)):
        with pytest.raises(UnknownConsumer, match="ghost"):
            call()


def test_a_duplicate_consumer_id_is_refused(broker):
    consumer(broker, consumer_id="A")
    with pytest.raises(InvalidConsumer, match="already registered"):
        consumer(broker, consumer_id="A")


def test_too_many_properties_name_the_limit_and_nothing_is_stored(broker, policy):
    broker.send("orders", Message(body="ok"))
    policy("orders", maxPropertyCount=3)
    with pytest.raises(InvalidMessage, match="maxPropertyCount=3"):
        broker.send("orders", [Message(body="fine"),
                               Message(body="x", properties={f"p{i}": i for i in range(4)})])
    assert broker.stats("orders").enqueued == 1
