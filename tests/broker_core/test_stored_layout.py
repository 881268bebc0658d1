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
        assert dead[16] == "topic://orders.eu" and len(dead) == 21
    plain = unpack_delivery(message_id, "queue://q", "c1", blob, 0, False)
    assert plain.destination == "queue://q"


def test_a_cron_message_is_not_taken_for_a_legacy_copy():
    message_id, blob = Message("tick", cron="0 3 * * *").pack(1_000)
    delivery = unpack_delivery(message_id, "queue://q", "c1", blob, 0, False)
    assert delivery.destination == "queue://q" and delivery.properties["scheduledJobId"] == message_id
