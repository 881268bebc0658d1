"""STOMP over plain TCP (and TLS): a byte-stream transport for the one STOMP session.

Every frame is handled by `StompSession` (gateway/stomp/protocol.py), exactly as on /stomp over
WebSocket; this module only moves bytes. The differences a stream makes: a frame may span reads and one
read may hold many frames (the parser keeps what it has not finished; `stream=True` tells the session no
message boundary closes a frame), and the socket's own flow control applies (a write waits for `drain`,
and a client that stops reading is cut off by the session's send buffer, as on WebSocket).

Several listener processes may serve one Redis, on one port (SO_REUSEPORT) or on several hosts: a
connection's consumers hold leases, so a listener that dies loses nothing; its clients reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from dataclasses import dataclass

from gateway import runtime
from gateway.stomp.protocol import StompSession, Transport

logger = logging.getLogger(__name__)

READ_BYTES = 64 * 1024  # one read; the session's inbox bounds what is buffered beyond it


class _StreamTransport(Transport):
    text = False  # the session hands over bytes

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        # drain (in `write` and `flush`) waits until asyncio's write buffer is empty, not just under 16 KiB:
        # a write it returned from has left the process (SendBuffer counts it written, and auto acks it),
        # so a listener killed then has lost nothing its client was not given
        writer.transport.set_write_buffer_limits(high=0)

    async def write(self, payload: bytes | str) -> None:
        self.writer.write(payload.encode("utf-8") if isinstance(payload, str) else payload)
        await self.writer.drain()

    def write_nowait(self, payload: bytes | str) -> bool:  # type: ignore[override]
        """Write at once when the socket took everything written before (so `drain` would not wait);
        else False, and the send buffer's writer writes it and waits for the client."""
        transport = self.writer.transport
        if transport.is_closing() or transport.get_write_buffer_size():
            return False
        transport.write(payload.encode("utf-8") if isinstance(payload, str) else payload)
        return True

    def unsent(self) -> int:
        """Bytes written that asyncio still holds (the socket's buffer was full)."""
        return self.writer.transport.get_write_buffer_size()

    async def flush(self) -> bool:
        """Wait until asyncio holds none of the bytes written; False when the connection is gone first."""
        try:
            await self.writer.drain()
        except (ConnectionError, RuntimeError):
            return False
        return not self.writer.transport.get_write_buffer_size()

    async def close(self) -> None:
        self.writer.close()
        # Shielded: every waiter shares one "closed" future, and a session task cancelled while it waits
        # here (the session's end cancels its tasks) would cancel that future under the connection's task.
        with contextlib.suppress(Exception):
            await asyncio.shield(self.writer.wait_closed())


@dataclass(frozen=True)
class Listener:
    """Where to listen: host, port (0 picks one), TLS context or None, and how many connections at once."""

    host: str
    port: int
    tls: ssl.SSLContext | None = None
    max_connections: int = 1000


class StompServer:
    """One listener's connections; `serve` runs until cancelled."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.sessions: set[StompSession] = set()
        self.tasks: set[asyncio.Task[None]] = set()  # one per connection, awaited when the listener stops
        self.server: asyncio.Server | None = None

    @property
    def scheme(self) -> str:
        return "stomp+ssl" if self.listener.tls is not None else "stomp"

    async def start(self) -> asyncio.Server:
        self.server = await asyncio.start_server(
            self._connection, self.listener.host, self.listener.port, ssl=self.listener.tls,
            reuse_port=True, limit=READ_BYTES)
        return self.server

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await self._serve_connection(reader, writer)
        finally:
            self.tasks.discard(task)

    async def stop(self) -> None:
        """Stop listening, end every connection as DISCONNECT would (subscriptions closed, unacknowledged
        messages back at once; a killed listener leaves that to the consumers' leases), and wait for the
        connections' tasks, so none is cancelled half-way through its clean-up."""
        if self.server is not None:
            self.server.close()
        for session in list(self.sessions):
            await session.shutdown("the listener is stopping")
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=10)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("unknown", 0)
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # a frame goes out when written, not after the client's delayed ACK of the one before (asyncio
            # and uvloop set this already; said here, the latency does not depend on the loop)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self.sessions) >= self.listener.max_connections:
            # Refused before any session exists: one ERROR frame naming the limit, then the close.
            body = f"this listener serves at most {self.listener.max_connections} connections"
            writer.write(b"ERROR\nmessage:Too many connections (SIGNALBOX_STOMP_MAX_CONNECTIONS)\n"
                         b"content-type:text/plain\ncontent-length:%d\n\n%s\x00"
                         % (len(body), body.encode()))
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()
            return
        session = StompSession(_StreamTransport(writer), broker=runtime.async_broker(), hub=runtime.wakeups(),
                               remote_address=f"{'tcp' if self.listener.tls is None else 'ssl'}://"
                                              f"{peer[0]}:{peer[1]}",
                               stream=True)
        self.sessions.add(session)
        try:
            await session.start()
            while not session.closing:
                data = await reader.read(READ_BYTES)
                if not data:
                    break
                await session.data_received(data)
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass  # the client went away; the session releases below
        finally:
            self.sessions.discard(session)
            await session.connection_lost()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server context for stomp+ssl from a PEM certificate (chain) and key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


async def serve(listeners: list[Listener], ready: asyncio.Event | None = None) -> None:
    """Listen on every listener until cancelled."""
    servers = [StompServer(listener) for listener in listeners]
    for server in servers:
        await server.start()
        logger.info("STOMP listening on %s://%s:%d", server.scheme, server.listener.host, server.port)
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        for server in servers:
            await server.stop()
