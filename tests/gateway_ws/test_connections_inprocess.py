"""The connection registry in-process (Channels' WebsocketCommunicator, real Redis, one event loop per
test): a session registers at CONNECT under its loop's process name, a close request addressed there ends
it with STOMP's ERROR, and its entry is dropped when the connection ends."""

from __future__ import annotations

import asyncio

import pytest

from gateway import connections, runtime
from tests.helpers.stomp_channels import stomp

pytestmark = pytest.mark.usefixtures("ws_runtime", "stomp_user")


async def _entry(connection_id: str, present: bool = True, timeout: float = 3.0):
    broker = runtime.async_broker()
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        info = await broker.connection_get(connection_id)
        if (info is not None) == present:
            return info
        assert asyncio.get_running_loop().time() < deadline, f"entry {connection_id} present={info}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("run", [1, 2])  # two event loops in one process: each addresses its own closes
async def test_register_touch_close_and_unregister(run):
    async with stomp() as client:
        connected = await client.connect(client_id=f"inproc-{run}")
        cid = connected.get("session")
        info = await _entry(cid)
        assert (info.protocol, info.client_id, info.user) == ("stomp+ws", f"inproc-{run}", "alice")
        assert info.process == connections.for_loop().process
        await client.send("SUBSCRIBE", {"destination": "/queue/inproc", "id": "s", "ack": "client",
                                        "receipt": "r"})
        await client.expect("RECEIPT")
        await client.send("SEND", {"destination": "/queue/inproc.out", "receipt": "r2"}, b"x")
        await client.expect("RECEIPT")
        broker = runtime.async_broker()
        for _ in range(60):
            info = await broker.connection_get(cid)
            if info.subscriptions and info.producers:
                break
            await asyncio.sleep(0.05)
        assert [s["key"] for s in info.subscriptions] == ["s"]
        assert info.producers[0]["destination"] == "queue://inproc.out"
        assert await broker.connection_close(cid, "test") == (connections.for_loop().process, "stomp+ws")
        error = await client.expect("ERROR", timeout=5)
        assert error.get("message") == "Connection closed by an administrator"
        await client.expect_closed()
    await _entry(cid, present=False)
