"""ActiveMQ.Advisory.Connection from the gateway (spec §11): a STOMP or JSON WebSocket connection is
advised with a ConnectionInfo once it is established and a RemoveInfo when it ends, on DISCONNECT or when
the socket just closes."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from broker_core.model import ConsumerSpec
from broker_core.ops import advisory
from gateway import runtime
from tests.helpers.channels import receive_json, send_json, websocket
from tests.helpers.stomp_client import RawStomp


def advised(broker, watcher, connection_id: str, n: int, timeout: float = 5) -> list[dict]:
    """The first n Connection advisories about `connection_id` (other tests' connections are skipped)."""
    out: list[dict] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        for d in broker.receive(watcher, 100):
            body = json.loads(d.body)
            info = body.get("ConnectionInfo") or {}
            if connection_id in (info.get("connectionId"), body.get("RemoveInfo", {}).get("objectId")):
                out.append(body)
        time.sleep(0.02)
    return out


@pytest.fixture
def watcher(broker):
    sub = broker.add_consumer(advisory.CONNECTION_TOPIC, ConsumerSpec(ack_mode="auto", lease_ms=60_000))
    yield sub
    broker.close_consumer(sub)


def test_a_stomp_connection_is_advised_when_connected_and_when_it_disconnects(gateway, broker, watcher):
    client_id = f"app-{uuid.uuid4().hex[:8]}"
    raw = RawStomp(gateway.stomp_url)
    connection_id = raw.connect(client_id=client_id).get("session")
    raw.send("DISCONNECT", {"receipt": "bye"})
    raw.expect("RECEIPT")
    raw.close()
    added, removed = advised(broker, watcher, connection_id, 2)
    info = added["ConnectionInfo"]
    assert (info["clientId"], info["userName"], info["password"], info["protocol"]) == (
        client_id, "alice", "", "stomp")
    assert info["clientIp"].startswith("ws://")
    assert removed["RemoveInfo"] == {"objectId": connection_id, "reason": "DISCONNECT"}


def test_a_stomp_connection_whose_socket_just_closes_is_advised_as_removed(gateway, broker, watcher):
    raw = RawStomp(gateway.stomp_url)
    connection_id = raw.connect().get("session")
    raw.close()  # no DISCONNECT
    added, removed = advised(broker, watcher, connection_id, 2)
    assert added["ConnectionInfo"]["clientId"] is None
    assert removed["RemoveInfo"]["objectId"] == connection_id


def test_a_refused_client_id_is_not_advised(gateway, broker, watcher):
    """ActiveMQ advises a connection only once addConnection succeeded (InvalidClientIDException first)."""
    client_id = f"dup-{uuid.uuid4().hex[:8]}"
    first = RawStomp(gateway.stomp_url)
    first.connect(client_id=client_id)
    second = RawStomp(gateway.stomp_url)
    second.send("CONNECT", {"accept-version": "1.2", "host": "localhost", "login": "alice",
                            "passcode": "secret", "client-id": client_id})
    second.expect("ERROR")
    second.close()
    first.close()
    got = []
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        got += [json.loads(d.body) for d in broker.receive(watcher, 100)]
        time.sleep(0.02)
    ids = [b.get("ConnectionInfo", {}).get("clientId") for b in got]
    assert ids.count(client_id) == 1  # the first connection's only


@pytest.mark.usefixtures("ws_runtime", "stomp_user")
async def test_a_json_connection_is_advised_when_connected_and_when_it_closes():
    aio = runtime.async_broker()
    watcher = await aio.add_consumer(advisory.CONNECTION_TOPIC, ConsumerSpec(ack_mode="auto"))
    async with websocket("/ws/v1") as ws:
        await send_json(ws, {"type": "connect", "id": "c", "login": "alice", "passcode": "secret"})
        answer = await receive_json(ws)
        connection_id = answer["connection"]
    bodies: list[dict] = []
    for _ in range(100):
        bodies += [json.loads(d.body) for d in await aio.receive(watcher, 10)]
        if len(bodies) >= 2:
            break
        await asyncio.sleep(0.02)
    added, removed = bodies
    assert added["ConnectionInfo"]["connectionId"] == connection_id
    assert (added["ConnectionInfo"]["protocol"], added["ConnectionInfo"]["userName"]) == ("json", "alice")
    assert removed["RemoveInfo"] == {"objectId": connection_id, "reason": "connection lost"}
    await aio.close_consumer(watcher)
