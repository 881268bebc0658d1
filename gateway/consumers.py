"""WebSocket consumers of the gateway: thin glue between Channels and the protocol sessions.

- `PingConsumer` (/ws/ping) proves the ASGI server and channel layer work.
- `StompConsumer` (/stomp) speaks STOMP 1.0/1.1/1.2 (gateway/stomp/protocol.py).
- `JsonConsumer` (/ws/v1) speaks the JSON protocol (gateway/ws/json_protocol.py).

The broker consumers wake their connection through the process's wake-up hub (gateway/runtime.py), not
through the channel layer, so the STOMP and JSON consumers open no channel-layer channel of their own.
"""

from __future__ import annotations

from typing import Any

from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer

from gateway import runtime
from gateway.stomp.protocol import StompSession, Transport, choose_subprotocol
from gateway.ws.json_protocol import JsonSession
from gateway.ws.uvicorn_ws import MESSAGE_LIMIT, SOCKET_WRITES


class PingConsumer(AsyncWebsocketConsumer):
    """Echoes every frame back, routed through the channel layer first.

    The detour is the point: a reply proves the Redis channel layer delivers to this process. (Dispatch
    does not use the layer: it wakes a consumer's process through that process's own Redis pub/sub
    subscription, gateway/ws/link.py's hub; this echo is the layer's only user.)

    Anonymous, as /healthz: it is the WebSocket path's health probe (load balancers, the launcher's
    check) and tells nothing but that the path works. So an anonymous client cannot use it to pour
    data through Redis, a frame is at most MAX_PING_BYTES and a connection gets MAX_PINGS echoes;
    beyond either, it is closed with 1009 (too big) or 1008 (policy).
    """

    MAX_PING_BYTES = 1024
    MAX_PINGS = 100
    pings = 0

    async def connect(self) -> None:
        await self.accept()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        size = len(bytes_data) if bytes_data is not None else len((text_data or "").encode())
        if size > self.MAX_PING_BYTES:
            await self.close(1009, f"a ping is at most {self.MAX_PING_BYTES} bytes (MAX_PING_BYTES)")
            return
        self.pings += 1
        if self.pings > self.MAX_PINGS:
            await self.close(1008, f"at most {self.MAX_PINGS} pings per connection (MAX_PINGS)")
            return
        event: dict[str, Any] = {"type": "ping.echo"}
        if bytes_data is not None:
            # The channel layer serialises with msgpack, which carries bytes as they are.
            event["bytes"] = bytes_data
        else:
            event["text"] = text_data or ""
        await self.channel_layer.send(self.channel_name, event)

    async def ping_echo(self, event: dict[str, Any]) -> None:
        if "bytes" in event:
            await self.send(bytes_data=event["bytes"])
        else:
            await self.send(text_data=event["text"])


class _SocketTransport(Transport):
    def __init__(self, consumer: AsyncWebsocketConsumer) -> None:
        self.consumer = consumer
        # The server says which bytes sent are still in this process (gateway/ws/uvicorn_ws.py): then a frame
        # counts as written once they left it, as over STOMP/TCP (SendBuffer, gateway/ws/link.py).
        writes = (consumer.scope.get("extensions") or {}).get(SOCKET_WRITES)
        if writes is not None:
            self.unsent, self.flush = writes["unsent"], writes["flush"]

    async def write(self, payload: bytes | str) -> None:
        if isinstance(payload, str):
            await self.consumer.send(text_data=payload)
        else:
            await self.consumer.send(bytes_data=payload)

    async def close(self) -> None:
        await self.consumer.close()


class _SessionConsumer(AsyncWebsocketConsumer):
    channel_layer_alias = "signalbox-no-channel-layer"  # not configured: no channel per connection
    session: Any = None

    def make_session(self, transport: Transport) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Channels' loop with one source: the client's messages, awaited one after the other. Channels
        runs even a single source through await_many_dispatch, a new task and an asyncio.wait for every
        WebSocket message (two more turns of the event loop before a frame reaches the session); these
        consumers have no channel layer, so nothing else is awaited. With a layer configured under
        their alias, Channels' own loop."""
        if get_channel_layer(self.channel_layer_alias) is not None:  # pragma: no cover - not configured
            await super().__call__(scope, receive, send)
            return
        self.scope = scope
        self.channel_layer = None
        self.base_send = send
        try:
            while True:
                await self.dispatch(await receive())
        except StopConsumer:
            pass

    def subprotocol(self) -> str | None:
        return None

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels runs close_old_connections in a worker thread before every handler: a thread hop per
        # WebSocket message, the largest cost on the hot path. These sessions touch the database only
        # through database_sync_to_async (authentication), which closes old connections itself.
        if message["type"] == "websocket.receive":
            await self.websocket_receive(message)
        else:
            await super().dispatch(message)

    async def connect(self) -> None:
        limit = (self.scope.get("extensions") or {}).get(MESSAGE_LIMIT)
        if limit is not None:  # (messages up to 16 MiB once logged in: gateway/ws/message_limits.py)
            limit["logged_in"](lambda: self.session is not None and self.session.established)
        await self.accept(self.subprotocol())
        self.session = self.make_session(_SocketTransport(self))
        await self.session.start()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.session.data_received(bytes_data if bytes_data is not None else (text_data or "").encode())

    async def disconnect(self, code: int) -> None:
        if self.session is not None:
            await self.session.connection_lost()


class StompConsumer(_SessionConsumer):
    """STOMP over WebSocket at /stomp (subprotocols v12.stomp, v11.stomp, v10.stomp, stomp, or none)."""

    def subprotocol(self) -> str | None:
        return choose_subprotocol(list(self.scope.get("subprotocols") or []))

    def make_session(self, transport: Transport) -> StompSession:
        client = self.scope.get("client") or ("unknown", 0)
        return StompSession(transport, broker=runtime.async_broker(), hub=runtime.wakeups(),
                            session_user=self.scope.get("user"), remote_address=f"ws://{client[0]}:{client[1]}")


class JsonConsumer(_SessionConsumer):
    """The JSON protocol at /ws/v1: one JSON object per WebSocket message."""

    def make_session(self, transport: Transport) -> JsonSession:
        client = self.scope.get("client") or ("unknown", 0)
        session = JsonSession(transport, broker=runtime.async_broker(), hub=runtime.wakeups(),
                              session_user=self.scope.get("user"))
        session.remote_address = f"ws://{client[0]}:{client[1]}"  # listed by the connection registry
        return session
