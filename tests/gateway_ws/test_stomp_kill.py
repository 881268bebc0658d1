"""kill -9 of the STOMP listener in the middle of transactions and of an auto-ack stream, and of a STOMP
listener or a web process streaming to a client that reads slowly: nothing is lost and nothing is done
twice. Transactions move each message from one queue to another (ACK and SEND in one
transaction); a listener is killed right after a COMMIT is written, the client not waiting for its
RECEIPT, so some commits land and some do not. Afterwards every message is in exactly one of the two queues,
once, and the counters agree; an auto-ack stream's messages all arrive, those seen twice flagged
redelivered, each acknowledged once."""

from __future__ import annotations

import collections
import random
import socket
import time
import uuid
from typing import Any

import pytest

from broker_core.broker import Broker
from broker_core.messages import Message
from tests.helpers.gateway_server import spawn_gateway, spawn_stomp_listener, wait_listening
from tests.helpers.stomp_client import RawTcp, RawWsSocket

pytestmark = pytest.mark.e2e

LEASE_MS = "1500"


@pytest.fixture
def listeners(gateway_data, request):
    """start(transport): a STOMP listener (tcp) or a web process (ws: uvicorn) of the test's own, killed at
    the end."""
    made = []

    def start(transport: str = "tcp"):
        data_dir, namespace = gateway_data
        spawn = spawn_stomp_listener if transport == "tcp" else spawn_gateway
        server = wait_listening(spawn(data_dir, namespace, f"kill{len(made)}",
                                      SIGNALBOX_WS_LEASE_MS=LEASE_MS))
        server.transport = transport
        made.append(server)
        return server

    yield start
    for server in made:
        server.kill()


def _client(server, rcvbuf: int | None = None) -> RawTcp | RawWsSocket:
    """A hand-driven STOMP 1.2 client of `server`'s transport; `rcvbuf`: its socket's receive window."""
    if server.transport == "ws":
        return RawWsSocket(server.port, rcvbuf=rcvbuf)
    conn = RawTcp(server.port)
    if rcvbuf is not None:
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    return conn


def _moved_exactly_once(server: Any, src: str, dst: str, total: int, idle: float) -> list:
    """What reached `dst` of the messages m0..m<total-1> sent to `src`, having checked that each is in
    exactly one of them, once (nor lost, nor moved twice)."""
    moved, left = _drain(server, dst, idle), _drain(server, src, idle)
    counts = collections.Counter(body for body, _ in moved + left)
    assert sorted(counts) == sorted(f"m{i}" for i in range(total)), "a message lost"
    assert max(counts.values()) == 1, [b for b, n in counts.items() if n > 1]  # nor moved twice
    return moved


def _drain(server, queue: str, idle: float) -> list[tuple[str, bool]]:
    """Every message of `queue` (client-individual, each acknowledged), until none came for `idle` s: long
    enough for a killed process's consumers to lapse and their messages to come back."""
    conn = _client(server)
    conn.connect()
    conn.send("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "d", "ack": "client-individual"})
    out = []
    while True:
        try:
            frame = conn.receive(idle)
        except TimeoutError:
            break
        if frame.command == "MESSAGE":
            out.append((frame.body.decode(), frame.get("redelivered") == "true"))
            conn.send("ACK", {"id": frame.get("ack")})
    conn.send("DISCONNECT", {"receipt": "bye"})
    while conn.receive().command != "RECEIPT":
        pass
    conn.close()
    return out


def test_killed_listeners_lose_no_transaction_and_no_auto_acked_message(listeners, gateway_data,
                                                                        redis_client):
    namespace = gateway_data[1]
    broker = Broker(redis_client, namespace)
    tag = uuid.uuid4().hex[:8]
    src, dst, auto = f"src{tag}", f"dst{tag}", f"auto{tag}"
    total, streamed = 80, 400
    broker.send(src, [Message(body=f"m{i}") for i in range(total)])
    broker.send(auto, [Message(body=f"a{i}") for i in range(streamed)])
    rng = random.Random(7)
    kills = 0
    for _round in range(3):
        server = listeners()
        conn = RawTcp(server.port)
        conn.connect()
        conn.send("SUBSCRIBE", {"destination": f"/queue/{src}", "id": "s", "ack": "client-individual",
                                "activemq.prefetchSize": "3"})
        conn.send("SUBSCRIBE", {"destination": f"/queue/{auto}", "id": "a", "ack": "auto",
                                "activemq.prefetchSize": "10"})
        for n in range(rng.randint(3, 6)):
            frame = conn.receive()
            while frame.command == "RECEIPT" or frame.get("subscription") == "a":
                frame = conn.receive()  # (earlier commits' receipts, the stream's messages)
            assert frame.command == "MESSAGE", frame
            tx = f"t{n}"
            conn.send("BEGIN", {"transaction": tx})
            conn.send("ACK", {"id": frame.get("ack"), "transaction": tx})
            conn.send("SEND", {"destination": f"/queue/{dst}", "transaction": tx}, frame.body)
            conn.send("COMMIT", {"transaction": tx, "receipt": tx})
        time.sleep(rng.uniform(0, 0.01))  # the last COMMIT in flight, the stream going on
        server.kill()
        kills += 1
        conn.close()

    server = listeners()
    idle = int(LEASE_MS) / 1000 * 2.5
    moved = _moved_exactly_once(server, src, dst, total, idle)
    assert len(moved) > 0 and kills == 3
    got = _drain(server, auto, idle)  # what the stream had not handed over
    assert len({body for body, _ in got}) == len(got)
    for name, enqueued in ((src, total), (dst, len(moved)), (auto, streamed)):
        stats = broker.stats(name)
        assert (stats.enqueued, stats.dequeued, stats.in_flight, stats.queue_size) == (
            enqueued, enqueued, 0, 0), (name, stats)


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_a_killed_process_loses_no_auto_acked_message_a_slow_client_had_not_taken(listeners, gateway_data,
                                                                                   redis_client, transport):
    """Auto acks go once a message's bytes have left the process; a client that reads slowly keeps the
    socket's buffers full, so bytes wait in the process too (asyncio's write buffer; over WebSocket, the
    ASGI server's). A message acknowledged while its bytes were still there was lost with a killed STOMP
    listener, and with a killed web process (uvicorn), until each counted a frame written only once its
    bytes left (gateway/stomp/tcp.py; gateway/ws/uvicorn_ws.py)."""
    broker = Broker(redis_client, gateway_data[1])
    name, total = f"slow{uuid.uuid4().hex[:8]}", 6000
    for start in range(0, total, 500):
        broker.send(name, [Message(body=f"m{i}:" + "x" * 1000) for i in range(start, start + 500)])
    server = listeners(transport)
    conn = _client(server, rcvbuf=65536)
    conn.connect()
    conn.send("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "s", "ack": "auto",
                            "activemq.prefetchSize": "1000"})
    time.sleep(2)  # the client reads nothing: every buffer on the way fills
    server.kill()
    got = set()
    try:  # what the kernel still had (it sends a dead process's buffered bytes): received
        while True:
            frame = conn.receive(2)
            if frame.command == "MESSAGE":
                got.add(frame.body.decode().partition(":")[0])
    except (ConnectionError, TimeoutError):
        pass
    conn.close()
    acked = broker.stats(name).dequeued
    assert 0 < acked < total
    rest = _drain(listeners(transport), name, int(LEASE_MS) / 1000 * 2.5)
    got |= {body.partition(":")[0] for body, _ in rest}
    lost = sorted((f"m{i}" for i in range(total) if f"m{i}" not in got), key=lambda m: int(m[1:]))
    assert not lost, f"{len(lost)} acknowledged and never delivered: {lost[:5]}"


def test_killed_listeners_lose_no_transaction_whose_subscription_ended_before_its_commit(
        listeners, gateway_data, redis_client):
    """Each transaction moves one message (ACK and SEND) and its subscription is unsubscribed before the
    COMMIT: the broker holds the ACKed message for the transaction (the COMMIT consumes it). A listener is
    killed with transactions in every state, the held ones' left to lapse with its lease and come back at
    the maintenance tick. Afterwards every message is in exactly one of the two queues, once. (Before,
    the UNSUBSCRIBE gave the message back and the COMMIT still sent its copy: moved twice.)"""
    broker = Broker(redis_client, gateway_data[1])
    tag = uuid.uuid4().hex[:8]
    src, dst = f"usrc{tag}", f"udst{tag}"
    total = 40
    broker.send(src, [Message(body=f"m{i}") for i in range(total)])
    rng = random.Random(11)
    for _round in range(3):
        server = listeners()
        conn = RawTcp(server.port)
        conn.connect()
        for n in range(rng.randint(3, 6)):
            sub, tx = f"s{n}", f"t{n}"
            conn.send("SUBSCRIBE", {"destination": f"/queue/{src}", "id": sub, "ack": "client-individual",
                                    "activemq.prefetchSize": "2"})
            frame = conn.receive()
            while frame.command == "RECEIPT" or frame.get("subscription") != sub:
                frame = conn.receive()  # (earlier commits' receipts, what ended subscriptions had on its way)
            assert frame.command == "MESSAGE" and frame.get("subscription") == sub, frame
            conn.send("BEGIN", {"transaction": tx})
            conn.send("ACK", {"id": frame.get("ack"), "transaction": tx})
            conn.send("SEND", {"destination": f"/queue/{dst}", "transaction": tx}, frame.body)
            conn.send("UNSUBSCRIBE", {"id": sub})
            if n < 2 or rng.random() < 0.7:  # (else left open: it lapses with the killed listener)
                conn.send("COMMIT", {"transaction": tx, "receipt": tx})
        time.sleep(rng.uniform(0, 0.01))  # the last COMMIT in flight
        server.kill()
        conn.close()

    server = listeners()
    idle = int(LEASE_MS) / 1000 * 2.5
    moved = _moved_exactly_once(server, src, dst, total, idle)
    assert len(moved) > 0
    for name, enqueued in ((src, total), (dst, len(moved))):
        stats = broker.stats(name)
        assert (stats.enqueued, stats.dequeued, stats.in_flight, stats.queue_size) == (
            enqueued, enqueued, 0, 0), (name, stats)
