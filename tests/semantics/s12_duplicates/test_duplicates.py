"""Duplicate detection (spec §12): the duplicate audit enqueues a repeated message id once and says so, and
forgets ids beyond its window (maxQueueAuditDepth). (Moved from test_redelivery.py unchanged.)"""

from __future__ import annotations

from broker_core.messages import Message

from ...helpers.broker import consumer, drain


def test_a_repeated_producer_id_is_enqueued_once_and_says_so(broker):
    c = consumer(broker, ack_mode="client-individual")
    (first,) = broker.send("orders", Message(body="a", message_id="order-17"))
    (d,) = drain(broker, c)
    broker.ack(c, d.message_id)
    (again,) = broker.send("orders", Message(body="a", message_id="order-17"))  # a retry after the ack
    assert (first.status, again.status) == ("ok", "duplicate")
    assert drain(broker, c) == []
    assert broker.stats("orders").duplicates == 1


def test_duplicates_are_forgotten_beyond_the_audit_window(broker, policy):
    policy("orders", maxQueueAuditDepth=64)
    c = consumer(broker, prefetch=1000, ack_mode="client")
    broker.send("orders", Message(body="first", message_id="X"))
    broker.send("orders", [Message(body=str(i)) for i in range(200)])
    got = drain(broker, c)
    broker.ack(c, got[-1].message_id)
    (again,) = broker.send("orders", Message(body="again", message_id="X"))
    assert again.status == "ok"
