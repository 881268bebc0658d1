"""Issue 24: behaviours pinned to ActiveMQ 5.17.2's, each observed over STOMP on the real broker (the same
frames are recorded as golden facts by tools/differential/record.py; tests/differential replays them).
Frames stomp.py will not send go through the raw WebSocket client."""

from __future__ import annotations

import pytest

from broker_core.errors import UnknownDestination
from tests.helpers.stomp_client import RawStomp

pytestmark = pytest.mark.e2e


@pytest.fixture(params=["ws", "tcp"])
def stomp_transport(request) -> str:
    return request.param


def q(name: str) -> str:
    return f"/queue/{name}"


# -- item 3: STOMP 1.1+ SUBSCRIBE needs an id ------------------------------------------------------------

def test_a_stomp_1_2_subscribe_without_id_is_an_error_and_subscribes_nothing(gateway, queue_name, broker):
    raw = RawStomp(gateway.stomp_url)
    try:
        raw.connect()
        raw.send("SUBSCRIBE", {"destination": q(queue_name), "receipt": "r1"})
        error = raw.expect("ERROR")
        assert (error.get("message"), error.get("receipt-id")) == (
            "SUBSCRIBE received without a subscription id!", "r1")
    finally:
        raw.close()
    with pytest.raises(UnknownDestination):  # no consumer ever made the queue
        broker.stats(f"queue://{queue_name}")


# -- item 10: ActiveMQ's error texts -----------------------------------------------------------------------

@pytest.mark.parametrize(("frames", "message"), [
    ([("ACK", {})], "ACK received without a ack id for acknowledge!"),
    ([("NACK", {})], "NACK received without an ack header to acknowledge!"),
    ([("BEGIN", {"transaction": "t1"}), ("BEGIN", {"transaction": "t1"})],
     "The transaction was already started: t1"),
    ([("BEGIN", {})], "Must specify the transaction you are beginning"),
    ([("COMMIT", {})], "Must specify the transaction you are committing"),
    ([("ABORT", {})], "Must specify the transaction you are committing"),
    ([("SEND", {})], "SEND received without a Destination specified!"),
    ([("SUBSCRIBE", {"id": "s"})], "Invalid empty or 'null' Destination header"),
    ([("SUBSCRIBE", {"id": "s", "destination": ""})], "Invalid empty or 'null' Destination header"),
    ([("UNSUBSCRIBE", {})], "UNSUBSCRIBE received without a subscription id!"),
    ([("UNSUBSCRIBE", {"id": "nope"})], "No subscription matched."),
])
def test_errors_carry_activemqs_texts_and_the_receipt_id(gateway, frames, message):
    raw = RawStomp(gateway.stomp_url)
    try:
        raw.connect()
        *before, (command, headers) = frames
        for c, h in before:
            raw.send(c, h)
        raw.send(command, {**headers, "receipt": "r-err"})
        error = raw.expect("ERROR")
        assert (error.get("message"), error.get("receipt-id")) == (message, "r-err")
    finally:
        raw.close()


def test_stomp_1_1_ack_texts_name_the_missing_header(gateway):
    for headers, message in [
            ({}, "ACK received without a message-id to acknowledge!"),
            ({"message-id": "m"}, "ACK received without a subscription id for acknowledge!")]:
        raw = RawStomp(gateway.stomp_url, version="1.1")
        try:
            raw.connect(version="1.1")
            raw.send("ACK", headers)
            assert raw.expect("ERROR").get("message") == message
        finally:
            raw.close()


# -- item 7: ActiveMQ's fallback: an unprefixed destination is a queue of that literal name ------------

def test_a_destination_without_a_known_prefix_is_a_queue_of_that_literal_name(clients, queue_name):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="plain")
    client.receipt(client.conn.subscribe, f"/foo/{queue_name}", id="slashed")
    producer = clients()
    producer.receipt(producer.conn.send, queue_name, "bare")
    producer.receipt(producer.conn.send, f"/foo/{queue_name}", "slashed")
    producer.receipt(producer.conn.send, f"{queue_name},/foo/{queue_name}", "both")
    got = {(m.headers["subscription"], m.headers["destination"], m.body) for m in client.messages(4)}
    assert got == {("plain", q(queue_name), b"bare"), ("slashed", f"/queue//foo/{queue_name}", b"slashed"),
                   ("plain", q(queue_name), b"both"), ("slashed", f"/queue//foo/{queue_name}", b"both")}


# -- item 4: NACK in client mode poisons only the message named ---------------------------------------------

def test_a_nack_in_client_mode_dead_letters_only_that_message_and_a_later_ack_covers_the_rest(
        clients, queue_name, broker):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s", ack="client")
    for body in ("m1", "m2", "m3"):
        client.conn.send(q(queue_name), body, headers={"persistent": "true"})
    m1, m2, m3 = client.messages(3)
    client.receipt(client.conn.nack, m2.headers["ack"])
    stats = broker.stats(f"queue://{queue_name}")
    assert (stats.queue_size, stats.in_flight) == (2, 2)  # m1 still held: only m2 went
    client.receipt(client.conn.ack, m3.headers["ack"])  # covers m1 and m3
    stats = broker.stats(f"queue://{queue_name}")
    assert (stats.queue_size, stats.in_flight) == (0, 0)
    client.receipt(client.conn.subscribe, "/queue/ActiveMQ.DLQ", id="dlq",
                   headers={"selector": f"JMSMessageID IN ('{m1.headers['message-id']}', "
                                        f"'{m2.headers['message-id']}', '{m3.headers['message-id']}')"})
    assert [m.body for m in client.messages(1)] == [b"m2"]
    assert client.silent(0.3)


# -- item 5: JMSReplyTo is the qualified destination; another reply-to is only a string property ------------

def test_selectors_see_jmsreplyto_as_the_qualified_destination(clients, queue_name):
    client = clients()
    for sid, suffix, selector in [("q", "", "JMSReplyTo = 'queue://replies'"),
                                  ("n", "x", "JMSReplyTo IS NULL"), ("t", "y", "JMSReplyTo = 'topic://replies'")]:
        client.receipt(client.conn.subscribe, q(queue_name + suffix), id=sid, headers={"selector": selector})
    producer = clients()
    sends = [("", "/queue/replies", "A"), ("x", "elsewhere", "B"), ("y", "/topic/replies", "C"),
             ("", "/topic/replies", "D"), ("x", "/queue/replies", "E")]
    for suffix, reply_to, body in sends:
        producer.receipt(producer.conn.send, q(queue_name + suffix), body, headers={"reply-to": reply_to})
    got = sorted((m.headers["subscription"], m.headers["reply-to"], m.body) for m in client.messages(3))
    assert got == [("n", "elsewhere", b"B"), ("q", "/queue/replies", b"A"), ("t", "/topic/replies", b"C")]
    assert client.silent(0.3)
