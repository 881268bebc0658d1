"""STOMP over Channels' WebsocketCommunicator: send frames, read them back parsed (several frames may share
one WebSocket message)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from channels.testing import WebsocketCommunicator

from gateway.stomp.frames import Frame, FrameParser, encode
from tests.helpers.channels import asgi_application


class StompCommunicator:
    def __init__(self, communicator: WebsocketCommunicator, version: str = "1.2") -> None:
        self.ws = communicator
        self.version = version
        self.parser = FrameParser(version)
        self.pending: list[Frame] = []
        self.heart_beats = 0
        self.closed = False
        self.subprotocol: str | None = None

    async def send(self, command: str, headers: dict[str, str] | list[tuple[str, str]] | None = None,
                   body: bytes = b"", raw: bytes | None = None) -> None:
        items = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        data = raw if raw is not None else encode(command, items, body, self.version)
        await self.ws.send_to(bytes_data=data)

    async def receive(self, timeout: float = 3) -> Frame:
        while not self.pending:
            output = await self.ws.receive_output(timeout)
            if output["type"] == "websocket.close":
                self.closed = True
                raise ConnectionError("the server closed the connection")
            data = output.get("bytes") if output.get("bytes") is not None else output["text"].encode()
            if data.strip(b"\r\n") == b"":
                self.heart_beats += 1
                continue
            self.pending += self.parser.feed(data)
        return self.pending.pop(0)

    async def expect(self, command: str, timeout: float = 3) -> Frame:
        frame = await self.receive(timeout)
        assert frame.command == command, f"expected {command}, got {frame}"
        return frame

    async def expect_closed(self, timeout: float = 3) -> None:
        output = await self.ws.receive_output(timeout)
        assert output["type"] == "websocket.close", output
        self.closed = True

    async def connect(self, login: str = "alice", passcode: str = "secret", **headers: str) -> Frame:
        all_headers = {"accept-version": "1.0,1.1,1.2", "host": "localhost", "login": login,
                       "passcode": passcode, **{k.replace("_", "-"): v for k, v in headers.items()}}
        await self.send("CONNECT", all_headers)
        frame = await self.expect("CONNECTED")
        self.version = frame.get("version") or "1.0"
        self.parser.version = self.version
        return frame


@asynccontextmanager
async def stomp(path: str = "/stomp", subprotocols: list[str] | None = None,
                headers: list[tuple[bytes, bytes]] | None = None) -> AsyncIterator[StompCommunicator]:
    communicator = WebsocketCommunicator(asgi_application(), path, headers=headers, subprotocols=subprotocols)
    connected, detail = await communicator.connect(5)
    assert connected, f"handshake refused ({detail})"
    client = StompCommunicator(communicator)
    client.subprotocol = detail
    try:
        yield client
    finally:
        await communicator.disconnect()
