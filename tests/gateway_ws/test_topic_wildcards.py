"""Wildcard topic subscriptions over WebSockets (issue #5): SUBSCRIBE to /topic/<name>.> gets what is sent
to every matching topic, each MESSAGE naming the topic it was sent to; sending to a wildcard and
subscribing to a wildcard queue get an ERROR saying why. stomp.py and a WebSocket client against the live
gateway process."""

from __future__ import annotations

import json
import uuid

import pytest


@pytest.fixture
def topic() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def test_a_wildcard_subscriber_gets_every_matching_topic_with_its_real_destination(clients, topic):
    sub = clients()
    sub.receipt(sub.conn.subscribe, f"/topic/{topic}.>", id="all", ack="client-individual")
    sub.receipt(sub.conn.subscribe, f"/topic/{topic}.*", id="one", ack="auto")
    producer = clients()
    producer.receipt(producer.conn.send, f"/topic/{topic}.eu", "a")
    producer.receipt(producer.conn.send, f"/topic/{topic}.us.west", "b")
    producer.receipt(producer.conn.send, f"/topic/other{topic}.eu", "c")  # matches neither
    got = sub.messages(3)
    by_sub: dict[str, list[tuple[bytes, str]]] = {}
    for m in got:
        by_sub.setdefault(m.headers["subscription"], []).append((m.body, m.headers["destination"]))
    assert by_sub == {
        "all": [(b"a", f"/topic/{topic}.eu"), (b"b", f"/topic/{topic}.us.west")],
        "one": [(b"a", f"/topic/{topic}.eu")],
    }
    for m in got:
        if m.headers["subscription"] == "all":
            sub.receipt(sub.conn.ack, m.headers["ack"])
    assert sub.silent(0.3)


def test_sending_to_a_wildcard_is_an_error_naming_why(clients, topic):
    # refused when the SEND is parsed (only subscriptions take patterns); broker_core refuses it too
    producer = clients()
    producer.conn.send(f"/topic/{topic}.>", "x", receipt="r1")
    error = producer.expect("ERROR")
    assert "wildcard '>' is only allowed in patterns" in error.body.decode()


def test_a_wildcard_queue_subscription_is_an_error_naming_why(clients, topic):
    consumer = clients()
    consumer.conn.subscribe(f"/queue/{topic}.>", id="q", receipt="r1")
    error = consumer.expect("ERROR")
    assert "wildcard queue destinations are not supported" in (
        error.headers.get("message", "") + error.body.decode())


def test_json_protocol_subscribes_to_a_wildcard(gateway, topic):
    from websockets.sync.client import connect

    def call(ws, **fields):
        ws.send(json.dumps(fields))
        return json.loads(ws.recv(5))

    with connect(f"ws://127.0.0.1:{gateway.port}/ws/v1") as ws:
        assert call(ws, type="connect", login="alice", passcode="secret", id=1)["type"] == "ok"
        assert call(ws, type="subscribe", id=2, subscription="w", destination=f"topic://{topic}.>",
                    ack_mode="auto")["type"] == "ok"
        ws.send(json.dumps({"type": "send", "id": 3, "destination": f"topic://{topic}.eu",
                            "message": {"body": "hi"}}))
        # the push may come before the send's answer
        answers = {a["type"]: a for a in (json.loads(ws.recv(5)), json.loads(ws.recv(5)))}
        assert answers["ok"]["id"] == 3
        pushed = answers["message"]
        assert (pushed["type"], pushed["subscription"]) == ("message", "w")
        assert (pushed["message"]["body"], pushed["message"]["destination"]) == ("hi", f"topic://{topic}.eu")


def test_a_composite_of_partly_overlapping_wildcards_delivers_each_message_once(clients, topic):
    """`a.*.c` and `a.b.*` both match `a.b.c`: the subscription gets it once, as ActiveMQ's one consumer on
    the composite (tests/differential 22_destinations). The other part's copy is acknowledged at once, so
    with a prefetch of 1 it does not hold that part's next message back."""
    sub = clients()
    sub.receipt(sub.conn.subscribe, f"/topic/{topic}.*.c,/topic/{topic}.b.*", id="w",
                ack="client-individual", **{"activemq.prefetchSize": "1"})
    producer = clients()
    producer.receipt(producer.conn.send, f"/topic/{topic}.b.c", "m1")
    producer.receipt(producer.conn.send, f"/topic/{topic}.b.c", "m2")
    for body in (b"m1", b"m2"):
        (message,) = sub.messages(1)
        assert (message.body, message.headers["destination"]) == (body, f"/topic/{topic}.b.c")
        sub.conn.ack(message.headers["ack"])  # (the next MESSAGE may come before a RECEIPT would)
    assert sub.silent(0.5)
