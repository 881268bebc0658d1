"""kill -9 of a web process (uvicorn: STOMP over WebSocket) streaming auto-acknowledged messages to a client
that reads slowly: nothing is lost. An auto ack goes once a message's bytes have left the process; bytes a
killed process still held (the ASGI server's buffers) never reach the client, so those messages must still
be in flight, and come back once the killed process's consumer lapses."""

from __future__ import annotations

import time
import uuid

import pytest

from broker_core.broker import Broker
from broker_core.messages import Message
from tests.helpers.gateway_server import spawn_gateway, wait_listening
from tests.helpers.stomp_client import RawWsSocket

pytestmark = pytest.mark.e2e

LEASE_MS = "1500"


@pytest.fixture
def gateways(gateway_data, request):
    made = []

    def start():
        data_dir, namespace = gateway_data
        server = wait_listening(spawn_gateway(data_dir, namespace, f"wskill{len(made)}",
                                              SIGNALBOX_WS_LEASE_MS=LEASE_MS))
        made.append(server)
        return server

    yield start
    for server in made:
        server.kill()


def _drain(port: int, queue: str, idle: float) -> list[str]:
    """Every message of `queue` (client-individual, each acknowledged), until none came for `idle` s: long
    enough for a killed process's consumers to lapse and their messages to come back."""
    conn = RawWsSocket(port)
    conn.connect()
    conn.send("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "d", "ack": "client-individual"})
    out = []
    while True:
        try:
            frame = conn.receive(idle)
        except TimeoutError:
            break
        if frame.command == "MESSAGE":
            out.append(frame.body.decode())
            conn.send("ACK", {"id": frame.get("ack")})
    conn.send("DISCONNECT", {"receipt": "bye"})
    while conn.receive().command != "RECEIPT":
        pass
    conn.close()
    return out


def test_a_killed_web_process_loses_no_auto_acked_message_a_slow_client_had_not_taken(gateways, gateway_data,
                                                                                      redis_client):
    """The client subscribes with ack:auto and reads nothing: its kernel's receive buffer (small), the web
    process's kernel send buffer and then the process's own buffers fill. A message acknowledged while its
    bytes were still in the process (the ASGI server's write buffer) was lost with the process."""
    broker = Broker(redis_client, gateway_data[1])
    name, total = f"wsslow{uuid.uuid4().hex[:8]}", 6000
    for start in range(0, total, 500):
        broker.send(name, [Message(body=f"m{i}:" + "x" * 1000) for i in range(start, start + 500)])
    server = gateways()
    conn = RawWsSocket(server.port, rcvbuf=65536)
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
    rest = _drain(gateways().port, name, int(LEASE_MS) / 1000 * 2.5)
    got |= {body.partition(":")[0] for body in rest}
    lost = sorted((f"m{i}" for i in range(total) if f"m{i}" not in got), key=lambda m: int(m[1:]))
    assert not lost, f"{len(lost)} acknowledged and never delivered: {lost[:5]}"
