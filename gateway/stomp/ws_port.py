"""STOMP over WebSocket on a port of its own: ActiveMQ's ws:// connector (ws://0.0.0.0:61614 in the
configuration it ships), served by the STOMP listener beside STOMP over TCP.

A client written for ActiveMQ's ws:// port (stomp.js and the like) connects here by changing only the host.
Every frame is handled by the one `StompSession` (gateway/stomp/protocol.py), as on /stomp over the web
server's WebSocket and on STOMP over TCP; this module only turns WebSocket messages into the session's
input and its output into WebSocket messages, with websockets' sans-I/O protocol (the library uvicorn's
/stomp uses too). What /stomp costs on top (uvicorn's ASGI queue, a dict per message, reading paused and
resumed around every message, a coroutine per send) is not here: a message read goes from the event
loop's callback into the session's parser (`Connection.feed`), as a TCP read does.

What it shares with /stomp: the subprotocols (v12.stomp, v11.stomp, v10.stomp, stomp, or none:
`choose_subprotocol`), one or more frames per message and no frame across messages, text messages unless
a frame is not UTF-8 (then binary), and the largest message before and after CONNECT
(gateway/ws/message_limits.py).
What it shares with STOMP over TCP: the login (CONNECT's login and passcode, or a token; no browser
session: no cookie is ever read, so no page of another origin can borrow a login, and no Origin check is
needed, as ActiveMQ's connector makes none), the connection limit, TLS (wss) with the same certificate,
and a killed listener losing nothing (the consumers' leases). Any path is accepted, as ActiveMQ's servlet
is mapped at "/". A client that has not finished its handshake within SIGNALBOX_STOMP_CONNECT_TIMEOUT is
cut off (then the session's own timer waits for its CONNECT).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from gateway.stomp.protocol import StompSettings, choose_subprotocol
from gateway.stomp.tcp import Connection, StompServer, StreamTransport
from gateway.ws.message_limits import MAX_MESSAGE, MAX_MESSAGE_BEFORE_LOGIN

# websockets' own lines, one or two per connection: at DEBUG only (signalbox/logs.py CHATTY)
connections_logger = logging.getLogger(f"{__name__}.connections")


def _select_subprotocol(_protocol: ServerProtocol, offered: Sequence[str]) -> str | None:
    return choose_subprotocol(list(offered))


class WsConnection(Connection):
    """One client socket speaking WebSocket: the handshake, then each message's bytes to the session."""

    schemes = ("ws", "wss")
    peer_schemes = ("ws", "wss")

    def __init__(self, server: StompServer) -> None:
        super().__init__(server)
        self.ws = ServerProtocol(select_subprotocol=_select_subprotocol, max_size=MAX_MESSAGE_BEFORE_LOGIN,
                                 logger=connections_logger)
        self._fragments: list[bytes] = []  # a message sent in several frames, until its last
        self._handshake_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._handshake_timer = asyncio.get_running_loop().call_later(
            StompSettings.from_django().connect_timeout, transport.close)

    def data_received(self, data: bytes) -> None:
        ws = self.ws
        # (websockets takes a frame's limit when its first byte is read: lifted before these bytes go in)
        if ws.max_message_size != MAX_MESSAGE and self.session is not None and self.session.established:
            ws.max_message_size = MAX_MESSAGE
        ws.receive_data(data)
        for event in ws.events_received():
            if isinstance(event, Request):
                self._handshake(event)
            elif event.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
                self._frame(event)
            # (a ping's pong, a close's reply: websockets has queued them; written below)
        self.send_out()

    def _handshake(self, request: Request) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        response = self.ws.accept(request)  # (a request that is no WebSocket upgrade: 400 or 426, then EOF)
        self.ws.send_response(response)
        if response.status_code == 101:
            self.send_out()  # (the handshake's answer before anything the session writes)
            self.session = self.server.open_session(self, WsTransport(self), stream=False)

    def _frame(self, frame: Frame) -> None:
        if not frame.fin:
            self._fragments.append(bytes(frame.data))
            return
        if self._fragments:  # (websockets bounds the whole message by max_size)
            data = b"".join([*self._fragments, bytes(frame.data)])
            self._fragments.clear()
        else:
            data = bytes(frame.data)
        self.feed(data)

    def send_out(self) -> None:
        """Write what websockets has queued; its end-of-data marker (b"", after the close handshake or a
        refused upgrade) closes the socket."""
        chunks = self.ws.data_to_send()
        if not chunks:
            return
        assert self.transport is not None
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if data:
            self.transport.write(data)
        if not chunks[-1]:
            self.transport.close()

    def eof_received(self) -> bool:
        self.ws.receive_eof()
        self.send_out()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        super().connection_lost(exc)


class WsTransport(StreamTransport):
    """The session's output as WebSocket messages: a text message when the bytes are UTF-8, else binary.
    The session hands over bytes (`text` False, as on a stream), and this tells text from binary itself,
    without the decoding into a str and encoding back a str would cost. What is still in this process and
    waiting for it: as over TCP."""

    connection: WsConnection

    def _send(self, payload: bytes | str) -> None:
        ws = self.connection.ws
        if ws.state is not State.OPEN:
            raise ConnectionResetError("the WebSocket is closing")
        data = payload.encode("utf-8") if isinstance(payload, str) else payload
        if data.isascii() or _is_utf8(data):
            ws.send_text(data)
        else:
            ws.send_binary(data)
        self.connection.send_out()

    async def write(self, payload: bytes | str) -> None:
        self._send(payload)
        await self.connection.drain()

    def write_nowait(self, payload: bytes | str) -> bool:  # type: ignore[override]
        transport = self.transport
        if (transport.is_closing() or transport.get_write_buffer_size()
                or self.connection.ws.state is not State.OPEN):
            return False
        self._send(payload)
        return True

    async def close(self) -> None:
        """The close handshake's first frame, then the socket's close (the client's answer is not awaited:
        the session is over either way)."""
        if self.connection.ws.state is State.OPEN:
            self.connection.ws.send_close(1000)
            self.connection.send_out()
        await super().close()


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
