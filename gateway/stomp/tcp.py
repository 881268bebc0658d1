"""STOMP over plain TCP (and TLS): a byte-stream transport for the one STOMP session.

Every frame is handled by `StompSession` (gateway/stomp/protocol.py), exactly as on /stomp over
WebSocket; this module only moves bytes. The differences a stream makes: a frame may span reads and one
read may hold many frames (the parser keeps what it has not finished; `stream=True` tells the session no
message boundary closes a frame), and the socket's own flow control applies (a write waits for `drain`,
and a client that stops reading is cut off by the session's send buffer, as on WebSocket).

Bytes read go from the event loop's callback straight into the session's parser and inbox (`feed`): no
reader task in between, which was one more task wake-up and turn of the loop for every request. While
the inbox is full the socket is not read (`pause_reading`), so a client that sends faster than its
frames are handled waits in its own send buffer, as it did for the reader task.

Several listener processes may serve one Redis, on one port (SO_REUSEPORT) or on several hosts: a
connection's consumers hold leases, so a listener that dies loses nothing; its clients reconnect.

The listener here (`Listener`, `StompServer`) serves STOMP over WebSocket on a port of its own as well: a
`Listener` names its kind of connection, and gateway/stomp/ws_port.py's `WsConnection` is this module's
`Connection` with a WebSocket's handshake and framing in front of the same `feed`.
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


class Connection(asyncio.Protocol):
    """One client socket: what it reads goes to the session (`StompSession.feed`), what the session writes
    goes to the transport, and `drain` waits while the kernel's send buffer is full. The session is made
    at once (a WebSocket's, gateway/stomp/ws_port.py, once its handshake is done)."""

    # plain, with TLS: what a listener of these connections serves, and a client's address as the connection
    # registry lists it (ActiveMQ's remote addresses)
    schemes = ("stomp", "stomp+ssl")
    peer_schemes = ("tcp", "ssl")

    def __init__(self, server: StompServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.session: StompSession | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._writable: asyncio.Future[None] | None = None  # set while the transport asks writers to wait
        # while reading is paused: the task that resumes it once the inbox has room
        self.paused_reading: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's is no asyncio.Transport subclass)
        self.session = self.server.open_session(self, StreamTransport(self), stream=True)

    def data_received(self, data: bytes) -> None:
        self.feed(data)

    def feed(self, data: bytes) -> None:
        """Hand what was read (a stream's read; a WebSocket's message) to the session; while its inbox is
        full nothing more is read."""
        session = self.session
        if session is not None and not session.feed(data) and self.paused_reading is None:
            assert self.transport is not None
            self.transport.pause_reading()
            self.paused_reading = asyncio.get_running_loop().create_task(self._read_when_room(session))

    async def _read_when_room(self, session: StompSession) -> None:
        await session.inbox_room()
        self.paused_reading = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        return False  # the client closed its side: close ours too (STOMP has no half-open connection)

    def connection_lost(self, exc: Exception | None) -> None:
        self.resume_writing()  # a writer waiting for room learns of the end from `drain`
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    async def drain(self) -> None:
        """Return once the transport takes more (at once unless its buffer is over the high-water mark);
        ConnectionResetError once the connection is lost."""
        if self._writable is not None:
            await asyncio.shield(self._writable)
        if self.closed.done():
            raise ConnectionResetError("the client's connection was lost")


class StreamTransport(Transport):
    text = False  # the session hands over bytes

    def __init__(self, connection: Connection) -> None:
        assert connection.transport is not None
        self.connection = connection
        self.transport = connection.transport
        # drain (in `write` and `flush`) waits until asyncio's write buffer is empty, not just under 16 KiB:
        # a write it returned from has left the process (SendBuffer counts it written, and auto acks it),
        # so a listener killed then has lost nothing its client was not given
        self.transport.set_write_buffer_limits(high=0)

    async def write(self, payload: bytes | str) -> None:
        self.transport.write(payload.encode("utf-8") if isinstance(payload, str) else payload)
        await self.connection.drain()

    def write_nowait(self, payload: bytes | str) -> bool:  # type: ignore[override]
        """Write at once when the socket took everything written before (so `drain` would not wait);
        else False, and the send buffer's writer writes it and waits for the client."""
        transport = self.transport
        if transport.is_closing() or transport.get_write_buffer_size():
            return False
        transport.write(payload.encode("utf-8") if isinstance(payload, str) else payload)
        return True

    def unsent(self) -> int:  # type: ignore[override]
        """Bytes written that asyncio still holds (the socket's buffer was full)."""
        return self.transport.get_write_buffer_size()

    async def flush(self) -> bool:  # type: ignore[override]
        """Wait until asyncio holds none of the bytes written; False when the connection is gone first."""
        try:
            await self.connection.drain()
        except ConnectionError:
            return False
        return not self.transport.get_write_buffer_size()

    async def close(self) -> None:
        self.transport.close()
        # Shielded: every waiter shares one "closed" future, and a session task cancelled while it waits
        # here (the session's end cancels its tasks) would cancel that future under the connection's task.
        with contextlib.suppress(Exception):
            await asyncio.shield(self.connection.closed)


@dataclass(frozen=True)
class Listener:
    """Where to listen: host, port (0 picks one), TLS context or None, how many connections at once, and
    what a connection is (`Connection`: STOMP over the byte stream; or gateway/stomp/ws_port.py's)."""

    host: str
    port: int
    tls: ssl.SSLContext | None = None
    max_connections: int = 1000
    connection: type[Connection] = Connection

    @property
    def scheme(self) -> str:
        return self.connection.schemes[self.tls is not None]

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


class StompServer:
    """One listener's connections; `serve` runs until cancelled."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.sessions: set[StompSession] = set()
        self.tasks: set[asyncio.Task[None]] = set()  # one per connection, awaited when the listener stops
        self.server: asyncio.Server | None = None

    async def start(self) -> asyncio.Server:
        connection = self.listener.connection
        self.server = await asyncio.get_running_loop().create_server(
            lambda: connection(self), self.listener.host, self.listener.port, ssl=self.listener.tls,
            reuse_port=True)
        return self.server

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

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

    def open_session(self, connection: Connection, transport: Transport, stream: bool) -> StompSession | None:
        """A client connected (over a WebSocket: its handshake is done): its session, served by a task of
        its own until the socket closes; None when the listener is full (one ERROR frame naming the limit,
        then the close)."""
        socket_transport = connection.transport
        assert socket_transport is not None
        sock = socket_transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # a frame goes out when written, not after the client's delayed ACK of the one before (asyncio
            # and uvloop set this already; said here, the latency does not depend on the loop)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self.sessions) >= self.listener.max_connections:
            body = f"this listener serves at most {self.listener.max_connections} connections"
            assert transport.write_nowait is not None
            transport.write_nowait(b"ERROR\nmessage:Too many connections (SIGNALBOX_STOMP_MAX_CONNECTIONS)\n"
                                   b"content-type:text/plain\ncontent-length:%d\n\n%s\x00"
                                   % (len(body), body.encode()))
            socket_transport.close()  # (after what was written is sent)
            return None
        peer = socket_transport.get_extra_info("peername") or ("unknown", 0)
        scheme = self.listener.connection.peer_schemes[self.listener.tls is not None]
        session = StompSession(transport, broker=runtime.async_broker(), hub=runtime.wakeups(),
                               remote_address=f"{scheme}://{peer[0]}:{peer[1]}", stream=stream)
        self.sessions.add(session)
        task = asyncio.get_running_loop().create_task(self._serve(connection, session))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return session

    async def _serve(self, connection: Connection, session: StompSession) -> None:
        """Start the session (frames read meanwhile wait in its inbox), wait for the socket to close (the
        client went away, or the session closed it), then release the session's broker side."""
        try:
            await session.start()
            await asyncio.shield(connection.closed)
        finally:
            self.sessions.discard(session)
            if connection.paused_reading is not None:  # reading was paused: nothing more is read
                connection.paused_reading.cancel()
            await session.connection_lost()
            assert connection.transport is not None
            connection.transport.close()


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
        listener = server.listener
        logger.info("STOMP listening on %s://%s:%d", listener.scheme, listener.host, server.port)
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        for server in servers:
            await server.stop()
