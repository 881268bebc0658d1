"""Topics over WebSockets (ActiveMQ's STOMP mapping): every subscriber of /topic/X gets every message;
a durable subscription (client-id + activemq.subscriptionName) keeps messages while it is offline and is
removed by UNSUBSCRIBE with activemq.subscriptionName; the JSON protocol likewise. stomp.py and a
WebSocket client against the live gateway process."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.helpers.stomp_client import Client


@pytest.fixture
def topic() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def test_every_subscriber_of_a_topic_gets_every_message(clients, topic):
    subscribers = [clients(), clients()]
    for n, sub in enumerate(subscribers):
        sub.receipt(sub.conn.subscribe, f"/topic/{topic}", id=f"s{n}", ack="client-individual")
    producer = clients()
    for i in range(3):
        producer.conn.send(f"/topic/{topic}", f"m{i}", headers={"persistent": "true", "region": "eu"})
    for n, sub in enumerate(subscribers):
        got = sub.messages(3)
        assert [m.body for m in got] == [b"m0", b"m1", b"m2"]
        assert {m.headers["destination"] for m in got} == {f"/topic/{topic}"}
        assert {m.headers["subscription"] for m in got} == {f"s{n}"}
        assert got[0].headers["region"] == "eu"
        for m in got:
            sub.receipt(sub.conn.ack, m.headers["ack"])


def test_a_topic_subscriber_with_a_selector_and_noLocal_gets_only_what_matches_from_others(clients, topic):
    sub = clients()
    sub.receipt(sub.conn.subscribe, f"/topic/{topic}", id="s", ack="auto",
                headers={"selector": "price > 10", "activemq.noLocal": "true"})
    sub.receipt(sub.conn.send, f"/topic/{topic}", "own", headers={"price": "20"})
    other = clients()
    other.conn.send(f"/topic/{topic}", "cheap", headers={"price": "5"})
    other.conn.send(f"/topic/{topic}", "dear", headers={"price": "20"})
    assert [m.body for m in sub.messages(1)] == [b"dear"]
    assert sub.silent(0.3)


def test_a_durable_subscription_keeps_messages_while_offline_until_unsubscribed(gateway, topic, broker):
    client_id = f"app-{uuid.uuid4().hex[:8]}"
    durable = {"activemq.subscriptionName": "audit"}
    first = Client(gateway.port).connect(**{"client-id": client_id})
    first.receipt(first.conn.subscribe, f"/topic/{topic}", id="d", ack="client-individual", headers=durable)
    first.close()  # offline now: it keeps collecting

    producer = Client(gateway.port).connect()
    try:
        for i in range(2):
            producer.receipt(producer.conn.send, f"/topic/{topic}", f"while away {i}")
    finally:
        producer.close()
    (offline,) = broker.subscriptions(f"topic://{topic}")
    assert (offline.durable, offline.active, offline.client_id, offline.subscription_name) == (
        True, False, client_id, "audit")
    assert offline.pending == 2

    again = Client(gateway.port).connect(**{"client-id": client_id})
    try:
        again.receipt(again.conn.subscribe, f"/topic/{topic}", id="d", ack="client-individual",
                      headers=durable)
        got = again.messages(2)
        assert [m.body for m in got] == [b"while away 0", b"while away 1"]
        for m in got:
            again.receipt(again.conn.ack, m.headers["ack"])
        # UNSUBSCRIBE with the name while this connection's own consumer holds it: in use, kept
        # (ActiveMQ's answer; the ERROR closes this connection, which leaves the subscription offline)
        again.conn.unsubscribe("d", headers=durable, receipt="r-in-use")
        error = again.expect("ERROR")
        assert (error.headers["message"], error.headers["receipt-id"]) == ("Durable consumer is in use",
                                                                           "r-in-use")
        assert [s.subscription_name for s in broker.subscriptions(f"topic://{topic}")] == ["audit"]
        again.close()
        again = Client(gateway.port).connect(**{"client-id": client_id})
        # after UNSUBSCRIBE of the id, the name removes the durable subscription
        again.receipt(again.conn.subscribe, f"/topic/{topic}", id="d", headers=durable)
        again.receipt(again.conn.unsubscribe, "d")
        again.receipt(again.conn.unsubscribe, "d", headers=durable)
        assert broker.subscriptions(f"topic://{topic}") == []
        # a second time there is none: ActiveMQ's text, and the connection closes
        again.conn.unsubscribe("d", headers=durable, receipt="r-again")
        error = again.expect("ERROR")
        assert error.headers["message"] == (f"No durable subscription exists for clientID: {client_id} and "
                                            "subscriptionName: audit")
    finally:
        again.close()


def test_a_durable_subscription_another_connection_consumes_from_is_in_use(gateway, topic):
    client_id = f"app-{uuid.uuid4().hex[:8]}"
    holder = Client(gateway.port).connect(**{"client-id": client_id})
    try:
        holder.receipt(holder.conn.subscribe, f"/topic/{topic}", id="d",
                       headers={"activemq.subscriptionName": "audit"})
        # the same client id cannot connect twice, so the other consumer would have to be this one: a
        # second SUBSCRIBE of the same durable name on the same connection is refused by the broker
        holder.conn.subscribe(f"/topic/{topic}", id="d2", headers={"activemq.subscriptionName": "audit"},
                              receipt="r-dup")
        error = holder.expect("ERROR")
        assert error.headers["message"] == (f"Durable consumer is in use for client: {client_id} and "
                                            "subscriptionName: audit")
    finally:
        holder.close()


def test_json_protocol_subscribes_to_topics_durably_and_removes_the_subscription(gateway, topic, broker):
    from websockets.sync.client import connect

    def call(ws, **fields):
        ws.send(json.dumps(fields))
        return json.loads(ws.recv(5))

    url = f"ws://127.0.0.1:{gateway.port}/ws/v1"
    with connect(url) as ws:
        assert call(ws, type="connect", login="alice", passcode="secret", id=1)["type"] == "ok"
        answer = call(ws, type="subscribe", id=2, subscription="d", destination=f"topic://{topic}",
                      client_id="json-app", subscription_name="audit", ack_mode="auto")
        assert answer["type"] == "ok"
        assert call(ws, type="unsubscribe", id=3, subscription="d") == {"type": "ok", "id": 3}
    with connect(url) as ws:
        call(ws, type="connect", login="alice", passcode="secret", id=1)
        assert call(ws, type="send", id=2, destination=f"topic://{topic}",
                    message={"body": "kept"})["type"] == "ok"
        assert broker.subscriptions(f"topic://{topic}")[0].pending == 1
        removed = call(ws, type="unsubscribe", id=3, client_id="json-app", subscription_name="audit")
        assert removed == {"type": "ok", "id": 3, "removed": 1}
        assert broker.subscriptions(f"topic://{topic}") == []


def test_a_delayed_topic_message_reaches_the_subscribers_of_its_due_time(clients, topic, broker):
    """AMQ_SCHEDULED_DELAY on a topic (ActiveMQ's SchedulerBroker sends it to the topic when due): a
    subscriber that joined during the delay gets it, one that left does not; the topic counts it as
    scheduled (parked) until then. The test fires it as the maintenance tick would (broker.dispatch)."""
    leaving = clients()
    leaving.receipt(leaving.conn.subscribe, f"/topic/{topic}", id="s", ack="auto")
    producer = clients()
    producer.receipt(producer.conn.send, f"/topic/{topic}", "later", headers={"AMQ_SCHEDULED_DELAY": "400"})
    assert broker.stats(f"topic://{topic}").parked == 1
    joining = clients()
    joining.receipt(joining.conn.subscribe, f"/topic/{topic}", id="s", ack="auto")
    leaving.receipt(leaving.conn.unsubscribe, "s")
    time.sleep(0.5)
    broker.dispatch(f"topic://{topic}")
    (got,) = joining.messages(1)
    assert got.body == b"later" and "AMQ_SCHEDULED_DELAY" not in got.headers
    assert leaving.silent(0.3)
    st = broker.stats(f"topic://{topic}")
    assert (st.parked, st.enqueued) == (0, 1)
