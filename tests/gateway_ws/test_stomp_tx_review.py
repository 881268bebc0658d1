"""A hostile review of STOMP transactions as the link implements them (gateway/ws/link.py `ack`, `nack`,
`commit`, `abort`, `close`), over real sockets to a STOMP listener: each test here failed before the fix
its docstring names (the durable subscription's one, by broker_core's holding a durable subscription's
transacted acks for their transaction: ops/transactions.py `ack`)."""

from __future__ import annotations

import uuid

import pytest

from tests.gateway_ws import test_stomp_tcp as tcp

pytestmark = pytest.mark.e2e

raw = tcp.raw  # the fixture: hand-driven STOMP 1.2 connections to the session's listener


def _q() -> str:
    return f"/queue/txr{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("ack", ["client", "client-individual"])
def test_an_ack_in_a_transaction_named_by_the_empty_string_is_in_it(raw, stomp_listener, redis_client, ack):
    """`transaction:` with an empty value names a transaction as any other name does (ActiveMQ's
    ProtocolConverter looks up whatever the header holds; BEGIN, SEND, COMMIT and ABORT here did too). The
    link took the empty name for none: such an ACK acknowledged its message at once, which the ABORT then
    did not give back (consumed, though the client aborted), and such a NACK dead-lettered its message
    inside the transaction (ActiveMQ: "Poison ack cannot be transacted")."""
    from broker_core.broker import Broker

    name = _q()
    conn, (m1, m2) = tcp._subscribed(raw, name, ack, [b"m1", b"m2"])
    conn.send("ACK", {"id": m1.get("ack"), "transaction": "", "receipt": "none"})  # never begun
    error = conn.expect("ERROR")
    assert (error.get("message"), error.get("receipt-id")) == ("Invalid transaction id: ", "none")
    conn.send("BEGIN", {"transaction": "", "receipt": "b"})
    assert conn.expect("RECEIPT").get("receipt-id") == "b"
    conn.send("ACK", {"id": m1.get("ack"), "transaction": "", "receipt": "a"})
    assert conn.expect("RECEIPT").get("receipt-id") == "a"
    conn.send("NACK", {"id": m2.get("ack"), "transaction": "", "receipt": "n"})
    error = conn.expect("ERROR")
    assert (error.get("message"), error.get("receipt-id")) == ("Poison ack cannot be transacted", "n")
    broker = Broker(redis_client, stomp_listener.namespace)
    stats = broker.stats(name.removeprefix("/queue/"))
    assert (stats.in_flight, stats.dequeued) == (2, 0), stats
    conn.send("ABORT", {"transaction": "", "receipt": "ab"})
    assert conn.expect("RECEIPT").get("receipt-id") == "ab"
    stats = broker.stats(name.removeprefix("/queue/"))
    assert (stats.in_flight, stats.dequeued) == (2, 0), stats  # the ABORT gave m1 back to the subscription
    conn.send("ACK", {"id": m1.get("ack"), "receipt": "again"})  # its ack id valid again
    assert conn.expect("RECEIPT").get("receipt-id") == "again"


def test_a_committed_transacted_ack_of_a_durable_subscription_unsubscribed_before_the_commit_consumes(
        raw, stomp_listener, redis_client):
    """A durable subscription's message ACKed (client-individual) in a transaction, then the subscription's
    consumer UNSUBSCRIBEd (the durable subscription stays), then the COMMIT, which succeeds: the message
    was acknowledged by a committed transaction, so the durable subscription must not deliver it again
    (ActiveMQ's individual ack goes to its broker at the ACK, and the commit removes the message from the
    subscription's store). On a queue the broker holds it for the transaction; here the consumer's close
    gave it back to the subscription and the COMMIT skipped the ack of a consumer gone: delivered twice."""
    topic = f"/topic/txr{uuid.uuid4().hex[:10]}"
    conn = raw()
    conn.connect(**{"client-id": f"c{uuid.uuid4().hex[:8]}"})
    durable = {"destination": topic, "id": "s", "ack": "client-individual", "activemq.subscriptionName": "d"}
    conn.send("SUBSCRIBE", {**durable, "receipt": "sub"})
    conn.expect("RECEIPT")
    conn.send("SEND", {"destination": topic, "persistent": "true"}, b"m1")
    m1 = conn.expect("MESSAGE")
    conn.send("BEGIN", {"transaction": "t"})
    conn.send("ACK", {"id": m1.get("ack"), "transaction": "t", "receipt": "a"})
    assert conn.expect("RECEIPT").get("receipt-id") == "a"
    conn.send("UNSUBSCRIBE", {"id": "s", "receipt": "u"})
    assert conn.expect("RECEIPT").get("receipt-id") == "u"
    conn.send("COMMIT", {"transaction": "t", "receipt": "c"})
    assert conn.expect("RECEIPT").get("receipt-id") == "c"
    conn.send("SUBSCRIBE", {**durable, "receipt": "again"})
    assert conn.expect("RECEIPT").get("receipt-id") == "again"
    with pytest.raises(TimeoutError):
        frame = conn.receive(0.5)
        pytest.fail(f"delivered again after the COMMIT of its ACK: {frame}")


def test_a_delayed_send_committed_after_its_delay_comes_its_delay_after_the_commit(raw):
    """A SEND with AMQ_SCHEDULED_DELAY in a transaction is scheduled by its COMMIT (ActiveMQ's
    SchedulerBroker schedules it after the commit, the delay counted from there; send.lua parks it so).
    The process that sent it arms a timer for its destination at the SEND (broker_core/due.py), which
    fired before a COMMIT that came later than the delay, with nothing parked yet: the committed message
    then waited for the maintenance tick (here, with no tick running, about 9 s) instead of its delay."""
    import time

    name = _q()
    conn = raw()
    conn.connect()
    conn.send("SUBSCRIBE", {"destination": name, "id": "s", "receipt": "sub"})
    conn.expect("RECEIPT")
    conn.send("BEGIN", {"transaction": "t"})
    conn.send("SEND", {"destination": name, "transaction": "t", "AMQ_SCHEDULED_DELAY": "300", "receipt": "s"},
              b"later")
    conn.expect("RECEIPT")
    time.sleep(0.6)  # the delay has passed since the SEND
    conn.send("COMMIT", {"transaction": "t", "receipt": "c"})
    assert conn.expect("RECEIPT").get("receipt-id") == "c"
    committed = time.monotonic()
    assert conn.expect("MESSAGE", 3).body == b"later"
    assert 0.25 <= time.monotonic() - committed < 2.5
