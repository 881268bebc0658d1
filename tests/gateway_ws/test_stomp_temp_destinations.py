"""STOMP temporary destinations as ActiveMQ 5.17 has them, against real servers (a gateway process for STOMP
over WebSocket, a STOMP-over-TCP listener, one Redis namespace): `/temp-queue/<name>` is the connection's own
temporary queue, other connections see it (reply-to, destination) as `/remote-temp-queue/<id>` and may send
to it, only its connection may subscribe, and when that connection ends (DISCONNECT, or its client killed)
the queue goes with its messages, counted; a send to it afterwards is refused; a connection's count of
them is bounded by SIGNALBOX_TEMP_DESTINATION_LIMIT."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from broker_core.broker import Broker
from tests.helpers.gateway_server import (
    ALICE_TOKEN,
    ROOT,
    own_gateway_and_listener,
)
from tests.helpers.stomp_client import RawStomp, RawTcp, goes_on

pytestmark = pytest.mark.e2e

LIMIT = 3
SETTINGS = {"SIGNALBOX_CONNECTION_LEASE_MS": "1500", "SIGNALBOX_CONNECTION_POLL_SECONDS": "0.2",
            "SIGNALBOX_TEMP_DESTINATION_LIMIT": str(LIMIT)}


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, Any]]:
    with own_gateway_and_listener(tmp_path_factory.mktemp("temps"), "temps", **SETTINGS) as running:
        yield running


@pytest.fixture
def broker(servers, redis_client) -> Broker:
    return Broker(redis_client, servers["namespace"])


def tcp(servers: dict[str, Any]) -> RawTcp:
    conn = RawTcp(servers["listener"].port)
    conn.connect()
    return conn


def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def receipt(conn: Any, command: str, headers: dict[str, str], body: bytes = b"") -> None:
    tag = uuid.uuid4().hex[:8]
    conn.send(command, {**headers, "receipt": tag}, body)
    frame = conn.receive()
    assert frame.command == "RECEIPT" and frame.get("receipt-id") == tag, frame


def remote_name(servers: dict[str, Any], owner: Any, name: str) -> str:
    """The name other connections know `owner`'s /temp-queue/<name> by: the reply-to a request carries."""
    requests = f"req{uuid.uuid4().hex[:8]}"
    receipt(owner, "SEND", {"destination": f"/queue/{requests}", "reply-to": f"/temp-queue/{name}"}, b"q")
    reader = tcp(servers)
    reader.send("SUBSCRIBE", {"destination": f"/queue/{requests}", "id": "r"})
    reply_to = reader.expect("MESSAGE").get("reply-to")
    receipt(reader, "DISCONNECT", {})
    reader.close()
    return reply_to


def test_request_reply_between_websocket_and_tcp_over_a_temp_queue(servers):
    requester = RawStomp(servers["gateway"].stomp_url)
    requester.connect()
    responder = tcp(servers)
    requests = f"req{uuid.uuid4().hex[:8]}"
    receipt(requester, "SUBSCRIBE", {"destination": "/temp-queue/replies", "id": "replies"})
    receipt(responder, "SUBSCRIBE", {"destination": f"/queue/{requests}", "id": "work"})
    requester.send("SEND", {"destination": f"/queue/{requests}", "reply-to": "/temp-queue/replies",
                            "correlation-id": "c1"}, b"2+2")
    request = responder.expect("MESSAGE")
    reply_to = request.get("reply-to")
    # another connection sees it as ActiveMQ shows a temporary queue it did not create
    assert reply_to.startswith("/remote-temp-queue/ID:"), reply_to
    responder.send("SEND", {"destination": reply_to, "correlation-id": request.get("correlation-id")}, b"4")
    reply = requester.expect("MESSAGE")
    assert reply.body == b"4" and reply.get("correlation-id") == "c1"
    assert reply.get("destination") == "/temp-queue/replies"  # its own, by the name it gave
    assert reply.get("subscription") == "replies"
    for conn in (requester, responder):
        receipt(conn, "DISCONNECT", {})
        conn.close()


def test_a_user_without_permissions_may_use_temp_destinations(servers):
    """bob may read and write only queue://bob.>: his temporary queue is his all the same (ActiveMQ without a
    tempDestinationAuthorizationEntry checks nothing for them)."""
    bob = RawTcp(servers["listener"].port, login="bob")
    bob.connect()
    receipt(bob, "SUBSCRIBE", {"destination": "/temp-queue/answers", "id": "a"})
    receipt(bob, "SEND", {"destination": "/queue/bob.requests", "reply-to": "/temp-queue/answers"}, b"?")
    alice = tcp(servers)
    alice.send("SUBSCRIBE", {"destination": "/queue/bob.requests", "id": "r"})
    receipt(alice, "SEND", {"destination": alice.expect("MESSAGE").get("reply-to")}, b"!")
    assert bob.expect("MESSAGE").body == b"!"
    for conn in (bob, alice):
        receipt(conn, "DISCONNECT", {})
        conn.close()


def test_only_the_connection_that_created_it_may_subscribe(servers):
    owner = tcp(servers)
    name = remote_name(servers, owner, "mine")
    thief = tcp(servers)
    thief.send("SUBSCRIBE", {"destination": name, "id": "steal"})
    error = thief.expect("ERROR")
    assert error.get("message") == ("Subscribing to a temporary queue created by another connection is not "
                                    "permitted"), error
    assert goes_on(thief)  # (an ERROR ActiveMQ does not end the connection for)
    thief.close()
    # the owner may, by either name
    receipt(owner, "SUBSCRIBE", {"destination": name, "id": "own"})
    receipt(owner, "SUBSCRIBE", {"destination": "/temp-queue/mine", "id": "own2"})
    # and the reserved name scheme is not reachable as a plain queue
    plain = tcp(servers)
    plain.send("SEND", {"destination": "/queue/" + name.rpartition("/")[2]}, b"x")
    assert "temporary destinations" in plain.expect("ERROR").body.decode()
    plain.close()
    receipt(owner, "DISCONNECT", {})
    owner.close()


def _fill(servers: dict[str, Any], owner: Any, name: str) -> tuple[str, RawTcp]:
    """Two messages from the owner to its own temporary queue, one from another connection to it."""
    remote = remote_name(servers, owner, name)
    receipt(owner, "SEND", {"destination": f"/temp-queue/{name}"}, b"own1")
    receipt(owner, "SEND", {"destination": f"/temp-queue/{name}"}, b"own2")
    sender = tcp(servers)
    receipt(sender, "SEND", {"destination": remote}, b"from another")
    return remote, sender


def _refused_after(sender: RawTcp, remote: str) -> None:
    sender.send("SEND", {"destination": remote, "receipt": "late"}, b"too late")
    error = sender.expect("ERROR")
    assert error.get("message") == f"temp-queue://{remote.rpartition('/')[2]}"
    assert error.body.decode().startswith("Destination does not exist")
    assert "ended" in error.body.decode() or "no temporary destination" in error.body.decode()
    sender.close()


def test_disconnect_deletes_the_temp_queue_and_counts_its_messages(servers, broker):
    owner = tcp(servers)
    remote, sender = _fill(servers, owner, "held")
    uri = "queue://" + remote.rpartition("/")[2]
    assert uri in broker.destinations() and broker.stats(uri).pending == 3
    # the REST destination list (the console's) shows it, marked temporary
    name = remote.rpartition("/")[2]
    listed = httpx.get(f"http://127.0.0.1:{servers['gateway'].port}/api/v1/destinations",
                       params={"search": name}, headers={"Authorization": f"Token {ALICE_TOKEN}"}, timeout=10)
    assert [(r["name"], r["temporary"], r["messages"]) for r in listed.json()["results"]] == [(name, True, 3)]
    before = broker.temp_tally()
    receipt(owner, "DISCONNECT", {})
    owner.close()
    after = eventually(lambda: (t := broker.temp_tally())["destinations"] > before["destinations"] and t)
    assert after == {"destinations": before["destinations"] + 1, "messages": before["messages"] + 3}
    assert uri not in broker.destinations()
    # the console's node page shows the counts
    node = httpx.get(f"http://127.0.0.1:{servers['gateway'].port}/api/v1/console/node",
                     headers={"Authorization": f"Token {ALICE_TOKEN}"}, timeout=10).json()
    node = node["temporary_destinations"]
    assert (node["deleted"], node["deleted_messages"]) >= (after["destinations"], after["messages"])
    _refused_after(sender, remote)


_KILLED_CLIENT = """
import sys, time
from tests.helpers.stomp_client import RawTcp
conn = RawTcp(int(sys.argv[1]))
conn.connect()
conn.send("SEND", {"destination": "/queue/" + sys.argv[2], "reply-to": "/temp-queue/kept", "receipt": "r"},
          b"q")
assert conn.expect("RECEIPT").get("receipt-id") == "r"
print("ready", flush=True)
time.sleep(60)
"""


def test_a_killed_client_s_temp_queue_goes_with_its_messages_counted(servers, broker):
    requests = f"req{uuid.uuid4().hex[:8]}"
    client = subprocess.Popen([sys.executable, "-c", _KILLED_CLIENT, str(servers["listener"].port), requests],
                              cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert client.stdout is not None and client.stdout.readline().strip() == b"ready"
        reader = tcp(servers)
        reader.send("SUBSCRIBE", {"destination": f"/queue/{requests}", "id": "r"})
        remote = reader.expect("MESSAGE").get("reply-to")
        for i in range(4):
            receipt(reader, "SEND", {"destination": remote}, f"reply {i}".encode())
        uri = "queue://" + remote.rpartition("/")[2]
        assert broker.stats(uri).pending == 4
        before = broker.temp_tally()
    finally:
        client.kill()  # SIGKILL: the socket closes without a DISCONNECT
        client.wait(10)
    after = eventually(lambda: (t := broker.temp_tally())["destinations"] > before["destinations"] and t)
    assert after == {"destinations": before["destinations"] + 1, "messages": before["messages"] + 4}
    assert uri not in broker.destinations()
    _refused_after(reader, remote)


def test_a_connection_s_temp_destinations_are_bounded_by_a_named_limit(servers, broker):
    conn = tcp(servers)
    for i in range(LIMIT):
        receipt(conn, "SUBSCRIBE", {"destination": f"/temp-queue/n{i}", "id": f"s{i}"})
    receipt(conn, "UNSUBSCRIBE", {"id": "s0"})
    receipt(conn, "SEND", {"destination": "/temp-queue/n0"}, b"same one: no new destination")
    conn.send("SUBSCRIBE", {"destination": "/temp-topic/one-more", "id": "over"})
    error = conn.expect("ERROR")
    assert "SIGNALBOX_TEMP_DESTINATION_LIMIT" in error.get("message") and str(LIMIT) in error.get("message")
    # the connection goes on with what it holds: one of its own again, but still no new one
    receipt(conn, "SUBSCRIBE", {"destination": "/temp-queue/n0", "id": "again"})
    conn.send("SUBSCRIBE", {"destination": "/temp-queue/another", "id": "over2"})
    assert "SIGNALBOX_TEMP_DESTINATION_LIMIT" in conn.expect("ERROR").get("message")
    conn.close()


def test_a_temp_topic_carries_replies_and_takes_no_durable_subscription(servers):
    owner = tcp(servers)
    receipt(owner, "SUBSCRIBE", {"destination": "/temp-topic/events", "id": "ev"})
    requests = f"req{uuid.uuid4().hex[:8]}"
    receipt(owner, "SEND", {"destination": f"/queue/{requests}", "reply-to": "/temp-topic/events"}, b"q")
    other = tcp(servers)
    other.send("SUBSCRIBE", {"destination": f"/queue/{requests}", "id": "r"})
    reply_to = other.expect("MESSAGE").get("reply-to")
    assert reply_to.startswith("/remote-temp-topic/ID:"), reply_to
    receipt(other, "SEND", {"destination": reply_to}, b"published")
    event = owner.expect("MESSAGE")
    assert (event.body, event.get("destination")) == (b"published", "/temp-topic/events")
    # ActiveMQ's TempTopicRegion refuses a durable subscription
    owner.send("SUBSCRIBE", {"destination": "/temp-topic/events", "id": "d",
                             "activemq.subscriptionName": "d"})
    error = owner.expect("ERROR")
    assert error.get("message") == "A durable subscription cannot be created for a temporary topic."
    owner.close()
    receipt(other, "DISCONNECT", {})
    other.close()
