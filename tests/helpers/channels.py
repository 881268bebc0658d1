"""WebsocketCommunicator wrappers: drive a consumer through the real ASGI stack without a server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from channels.testing import WebsocketCommunicator


def asgi_application() -> Any:
    """The project's ASGI app (origin check, auth and URL routing included), imported lazily."""
    from signalbox.asgi import application

    return application


@asynccontextmanager
async def websocket(
    path: str,
    *,
    application: Any = None,
    headers: list[tuple[bytes, bytes]] | None = None,
    subprotocols: list[str] | None = None,
    timeout: float = 3,
) -> AsyncIterator[WebsocketCommunicator]:
    """A connected communicator for `path`; fails the test if the handshake is refused."""
    communicator = WebsocketCommunicator(
        application or asgi_application(), path, headers=headers, subprotocols=subprotocols
    )
    connected, detail = await communicator.connect(timeout)
    assert connected, f"WebSocket handshake for {path} was refused (close code {detail})"
    try:
        yield communicator
    finally:
        await communicator.disconnect()


async def connect_refused(
    path: str, *, application: Any = None, headers: list[tuple[bytes, bytes]] | None = None
) -> int | None:
    """Connect expecting refusal; returns the close code (None when the app closed without one)."""
    communicator = WebsocketCommunicator(application or asgi_application(), path, headers=headers)
    connected, code = await communicator.connect(3)
    if connected:
        await communicator.disconnect()
    assert not connected, f"WebSocket handshake for {path} was accepted, expected a refusal"
    return code


async def send_json(communicator: WebsocketCommunicator, data: Any) -> None:
    await communicator.send_to(text_data=json.dumps(data))


async def receive_json(communicator: WebsocketCommunicator, timeout: float = 3) -> Any:
    return json.loads(await communicator.receive_from(timeout))


async def assert_silent(communicator: WebsocketCommunicator, timeout: float = 0.2) -> None:
    """The consumer sends nothing more within `timeout`."""
    assert await communicator.receive_nothing(timeout), "the consumer sent an unexpected frame"


async def close_channel_layer_pools() -> None:
    """Close the Redis channel layer's connections at the end of an event loop (not flush: the
    layer's keys may belong to other sessions sharing the Redis)."""
    from channels.layers import channel_layers

    for layer in list(channel_layers.backends.values()):
        close = getattr(layer, "close_pools", None)
        if close is not None:
            await close()
