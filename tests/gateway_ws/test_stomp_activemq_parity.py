"""Issue 24: behaviours pinned to ActiveMQ 5.17.2's, each observed over STOMP on the real broker (the same
frames are recorded as golden facts by tools/differential/record.py; tests/differential replays them).
Frames stomp.py will not send go through the raw WebSocket client."""

from __future__ import annotations

import json
from xml.etree import ElementTree

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


# -- item 2: ACK in a transaction, then ABORT: the message stays delivered, not redelivered ----------------

def test_an_aborted_transactional_ack_keeps_the_message_delivered_until_the_connection_ends(
        clients, queue_name, broker):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s", ack="client-individual",
                   headers={"activemq.prefetchSize": "1"})
    producer = clients()
    producer.receipt(producer.conn.send, q(queue_name), "first")
    message = client.expect("MESSAGE")
    tx = client.conn.begin()
    client.conn.ack(message.headers["ack"], transaction=tx)
    client.receipt(client.conn.abort, tx)
    assert client.silent(0.5)  # not handed to the same live subscription again
    stats = broker.stats(f"queue://{queue_name}")
    assert (stats.queue_size, stats.in_flight, stats.dequeued) == (1, 1, 0)
    client.close()  # the connection ends: the message returns to the queue, redelivered
    other = clients()
    other.receipt(other.conn.subscribe, q(queue_name), id="s", ack="client-individual")
    again = other.expect("MESSAGE")
    assert (again.body, again.headers.get("redelivered")) == (b"first", "true")


def test_after_an_aborted_transactional_ack_the_ack_id_is_valid_again(clients, queue_name, broker):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s", ack="client",
                   headers={"activemq.prefetchSize": "2"})
    producer = clients()
    producer.receipt(producer.conn.send, q(queue_name), "m1")
    producer.receipt(producer.conn.send, q(queue_name), "m2")
    m1, m2 = client.messages(2)
    tx = client.conn.begin()
    client.conn.ack(m2.headers["ack"], transaction=tx)  # cumulative: m1 and m2
    client.receipt(client.conn.abort, tx)
    client.receipt(client.conn.ack, m1.headers["ack"])  # both ack ids are back, in order
    stats = broker.stats(f"queue://{queue_name}")
    assert (stats.queue_size, stats.dequeued) == (1, 1)
    client.receipt(client.conn.ack, m2.headers["ack"])
    assert broker.stats(f"queue://{queue_name}").queue_size == 0


# -- item 8: advisory MESSAGE frames as ActiveMQ's STOMP writes them -------------------------------

def test_advisory_messages_have_activemqs_stomp_headers(clients, queue_name):
    watcher = clients()
    watcher.receipt(watcher.conn.subscribe, f"/topic/ActiveMQ.Advisory.Consumer.Queue.{queue_name}", id="adv")
    consumer = clients()
    consumer.receipt(consumer.conn.subscribe, q(queue_name), id="s")
    advised = watcher.expect("MESSAGE")
    h = advised.headers
    assert (h["priority"], h["timestamp"], h["transformation"], h["type"]) == (
        "0", "0", "jms-advisory-json", "Advisory")
    assert h["originBrokerId"] and h["originBrokerURL"] and h["consumerCount"] == "1"
    assert "content-type" not in h


# -- item 6: a composite SEND is one message, one id, the composite as original-destination -----------------

def test_a_composite_send_is_one_message_with_one_id_and_the_composite_as_original_destination(
        clients, queue_name):
    client = clients()
    client.receipt(client.conn.subscribe, q(f"{queue_name}a"), id="a")
    client.receipt(client.conn.subscribe, q(f"{queue_name}b"), id="b")
    client.receipt(client.conn.subscribe, f"/topic/{queue_name}t", id="t")
    producer = clients()
    producer.receipt(producer.conn.send, f"/queue/{queue_name}a, /queue/{queue_name}b,/topic/{queue_name}t",
                     "one")
    got = {m.headers["subscription"]: m.headers for m in client.messages(3)}
    assert len({h["message-id"] for h in got.values()}) == 1
    assert {h["original-destination"] for h in got.values()} == {
        f"/queue/{queue_name}a,queue://{queue_name}b,topic://{queue_name}t"}
    assert got["a"]["destination"] == q(f"{queue_name}a")
    assert got["t"]["destination"] == f"/topic/{queue_name}t"
    tx = producer.conn.begin()  # in a transaction too
    producer.conn.send(f"/queue/{queue_name}a,/queue/{queue_name}b", "two", transaction=tx)
    producer.receipt(producer.conn.commit, tx)
    assert len({m.headers["message-id"] for m in client.messages(2)}) == 1


# -- item 9: a new advisory subscriber hears about the present -----------------------------------------------

def test_a_new_consumer_advisory_subscriber_gets_one_consumer_info_per_existing_consumer(clients, queue_name):
    consumer = clients()
    consumer.receipt(consumer.conn.subscribe, q(queue_name), id="s1")
    consumer.receipt(consumer.conn.subscribe, q(queue_name), id="s2", headers={"selector": "x = 1"})
    watcher = clients()
    watcher.receipt(watcher.conn.subscribe, f"/topic/ActiveMQ.Advisory.Consumer.Queue.{queue_name}", id="adv",
                    ack="client-individual")
    replayed = watcher.messages(2)
    assert [m.headers["consumerCount"] for m in replayed] == ["2", "2"]
    infos = [json.loads(m.body)["ConsumerInfo"] for m in replayed]
    # (a STOMP selector as ActiveMQ 5.17.2 holds it in its ConsumerInfo: prefixed)
    assert sorted(str(i["selector"]) for i in infos) == ["None", "convert_string_expressions:x = 1"]
    assert all(i["destination"] == f"queue://{queue_name}" for i in infos)
    watcher.receipt(watcher.conn.ack, replayed[0].headers["ack"])  # acknowledging one is no error
    assert watcher.silent(0.3)


def test_a_new_queue_advisory_subscriber_gets_a_destination_info_per_existing_queue(clients, queue_name):
    producer = clients()
    producer.receipt(producer.conn.send, q(queue_name), "makes the queue")
    watcher = clients()
    watcher.receipt(watcher.conn.subscribe, "/topic/ActiveMQ.Advisory.Queue", id="adv",
                    headers={"selector": "1 = 1"})
    seen = []
    for _ in range(1000):  # the session's other tests made queues too; this one is among them
        info = json.loads(watcher.expect("MESSAGE").body)["DestinationInfo"]
        assert info["operationType"] == 0
        seen.append(info["destination"])
        if info["destination"] == f"queue://{queue_name}":
            break
    assert f"queue://{queue_name}" in seen and all(d.startswith("queue://") for d in seen)


def test_an_advisory_subscription_asking_for_xml_gets_the_document_as_xml(clients, queue_name):
    """transformation jms-xml (or jms-advisory-xml) on the SUBSCRIBE: ActiveMQ writes advisories as XML,
    with transformation:jms-advisory-xml; the replayed ones (consumers that existed before) too."""
    first = clients()
    first.receipt(first.conn.subscribe, q(queue_name), id="s")
    watcher = clients()
    watcher.receipt(watcher.conn.subscribe, f"/topic/ActiveMQ.Advisory.Consumer.Queue.{queue_name}", id="adv",
                    headers={"transformation": "jms-xml"})
    second = clients()
    second.receipt(second.conn.subscribe, q(queue_name), id="s", headers={"selector": "a < 1"})
    replayed, added = watcher.expect("MESSAGE"), watcher.expect("MESSAGE")
    for advised, count in ((replayed, "1"), (added, "2")):
        assert (advised.headers["transformation"], advised.headers["consumerCount"]) == (
            "jms-advisory-xml", count)
        root = ElementTree.fromstring(advised.body)
        assert (root.tag, root.findtext("destination")) == ("ConsumerInfo", f"queue://{queue_name}")
    # escaped, read back (prefixed, as ActiveMQ's ConsumerInfo holds a STOMP selector)
    assert ElementTree.fromstring(added.body).findtext("selector") == "convert_string_expressions:a < 1"
