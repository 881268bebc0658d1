"""Messages stored by an earlier version stay readable: the 21st field of a packed message became a cron
schedule's compact form (session 24), where a wildcard subscription's copy kept the topic it was published
to; such a copy still in Redis after an upgrade keeps that topic as its destination, delivered and dead-
lettered."""

from __future__ import annotations

import msgpack

from broker_core.messages import Message, dead_letter_copy, unpack_delivery
from broker_core.topics import wildcard_copy


def _legacy_wildcard_copy(blob: bytes, published_to: str) -> bytes:
    """A wildcard copy as the version before cron schedules packed it: 20 fields, then the topic."""
    record = msgpack.unpackb(blob, raw=True)[:20]
    return msgpack.packb([*record, published_to], use_bin_type=False)


def test_a_wildcard_copy_of_either_layout_is_delivered_with_the_topic_it_was_published_to():
    message_id, blob = Message("hi").pack(1_000)
    for copy in (wildcard_copy(blob, "topic://orders.eu"), _legacy_wildcard_copy(blob, "topic://orders.eu")):
        delivery = unpack_delivery(message_id, "topic://orders.>", "c1", copy, 0, False)
        assert (delivery.destination, delivery.body) == ("topic://orders.eu", "hi")
        assert "scheduledJobId" not in delivery.properties
        dead = msgpack.unpackb(dead_letter_copy(copy, "topic://orders.>", "poison", 1), raw=False)
        # (no topic kept beside it; the dead letter reaches its queue at 1: messages.py ARRIVED, last)
        assert dead[16] == "topic://orders.eu" and len(dead) == 23 and dead[21:] == [None, 1]
    assert msgpack.unpackb(wildcard_copy(blob, "topic://orders.eu"))[22] == 1_000  # (kept: the message's)
    plain = unpack_delivery(message_id, "queue://q", "c1", blob, 0, False)
    assert plain.destination == "queue://q"


def test_a_cron_message_is_not_taken_for_a_legacy_copy():
    message_id, blob = Message("tick", cron="0 3 * * *").pack(1_000)
    delivery = unpack_delivery(message_id, "queue://q", "c1", blob, 0, False)
    assert delivery.destination == "queue://q" and delivery.properties["scheduledJobId"] == message_id


def test_a_topic_messages_reference_count_stored_before_durable_references_weighed_more(broker):
    """<topic>:refs counted every holder 1 before session 29 (a durable subscription's reference now weighs
    2^32, lifecycle.lua ref_weight): a message stored then, held by a durable and a non-durable
    subscription, stays stored when the durable one acknowledges it, and goes with the last holder."""
    from broker_core.model import ConsumerSpec

    topic, p = "topic://layout", f"{broker.namespace}:{{t:layout}}"
    held = broker.add_consumer(topic, ConsumerSpec(client_id="app", subscription_name="d",
                                                   ack_mode="client-individual"))
    live = broker.add_consumer(topic, ConsumerSpec(ack_mode="client-individual"))
    broker.send(topic, Message("old", message_id="m1"))
    broker.redis.hset(f"{p}:refs", "m1", 2)  # as the earlier version stored it
    broker.ack(held, broker.receive(held, 1)[0].message_id)
    assert broker.redis.hget(f"{p}:refs", "m1") == b"1" and broker.redis.hexists(f"{p}:msgs", "m1")
    assert [d.body for d in broker.receive(live, 1)] == ["old"]
    broker.ack(live, "m1")
    assert not broker.redis.hexists(f"{p}:msgs", "m1") and not broker.redis.hexists(f"{p}:refs", "m1")
