"""WebSocket consumers of the gateway. PingConsumer proves the ASGI server and channel layer work."""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer


class PingConsumer(AsyncWebsocketConsumer):
    """Echoes every frame back, routed through the channel layer first.

    The detour is the point: a reply proves the Redis channel layer delivers to this process,
    which is how broker dispatch will wake the gateway process that owns a consumer.
    """

    async def connect(self) -> None:
        await self.accept()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
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
