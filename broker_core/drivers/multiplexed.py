"""One Redis connection per event loop that every script call of an AsyncBroker shares.

redis.asyncio takes a connection from its pool for each command, packs it through several layers and
waits on a stream reader: about 65-80 µs of CPU per call on the 2-core machine, twice a bare round trip
(docs/benchmarks.md, "Session 4"). The gateway makes one script call per request or frame, so that
overhead was a large part of each one. Here a call packs its command into one buffer, writes it at
once and waits for its reply; replies come back in the order the commands went out (Redis answers a
connection's commands in order), so each one completes the oldest waiting call. Calls made while
others wait simply follow them on the wire: concurrent requests share the connection's round trips.

A MULTI/EXEC block is written as one buffer, so no other call's command can land inside it.

Only the script calls and transactions of broker.AsyncBroker use this; every other command (INFO, pub/sub,
the operators' plain commands) keeps redis-py. `for_client` returns None for a client it cannot mirror
(TLS, RESP3, decoded responses, a credential provider); AsyncBroker then stays on redis-py.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
from typing import Any

import hiredis
import redis
import redis.asyncio

from ..resp import connect_settings, pack, reply_error, setup_commands, transaction_result

_PLAIN = {redis.asyncio.Connection, redis.asyncio.UnixDomainSocketConnection}


class _Call:
    """A command (or MULTI/EXEC block) on the wire: how many replies it still has to come, and the
    errors its block's queued commands got."""

    __slots__ = ("future", "replies", "sent", "errors")

    def __init__(self, future: asyncio.Future[Any], replies: int, sent: float) -> None:
        self.future, self.replies, self.sent = future, replies, sent
        self.errors: list[Exception] = []


class _Protocol(asyncio.Protocol):
    def __init__(self, owner: MultiplexedConnection) -> None:
        self.owner = owner
        self.reader = hiredis.Reader(replyError=reply_error)
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        owner = self.owner
        if owner.transport is not self.transport and owner.opening is not self.transport:
            return  # a connection already given up
        reader, waiting = self.reader, owner.waiting
        reader.feed(data)
        while (reply := reader.gets()) is not False:
            if not waiting:  # a reply nobody asked for: the stream is out of step, start again
                owner.abort(redis.ConnectionError("unexpected reply from Redis"))
                return
            call = waiting[0]
            if call.replies > 1:  # MULTI's and each QUEUED reply before the EXEC's own
                call.replies -= 1
                if isinstance(reply, Exception):
                    call.errors.append(reply)
                continue
            waiting.popleft()
            if not call.future.done():
                call.future.set_result((reply, call.errors))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.owner.transport is self.transport or self.owner.opening is self.transport:
            reason = exc or "closed by the server"
            self.owner.abort(redis.ConnectionError(f"connection to Redis lost: {reason}"))


class MultiplexedConnection:
    """Script calls of one event loop over one connection (module docstring)."""

    def __init__(self, connect: dict[str, Any], timeout: float | None) -> None:
        self.connect_args = connect
        self.timeout = timeout
        self.transport: asyncio.Transport | None = None  # ready for calls
        self.opening: asyncio.Transport | None = None  # connected, still authenticating
        self.waiting: collections.deque[_Call] = collections.deque()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._watchdog: asyncio.TimerHandle | None = None

    @classmethod
    def for_client(cls, client: redis.asyncio.Redis) -> MultiplexedConnection | None:
        settings = connect_settings(client.connection_pool, _PLAIN)
        return None if settings is None else cls(settings, settings["socket_timeout"])

    def _ready(self) -> bool:
        if self.transport is None or self.transport.is_closing():
            return False
        if self.loop is not asyncio.get_running_loop():  # the client moved to another event loop
            self.transport = self.opening = None
            self.waiting = collections.deque()
            return False
        return True

    async def call(self, *args: Any) -> Any:
        """One command's reply; an error reply is raised as redis-py raises it."""
        if not self._ready():
            await self._connect()
        reply, _errors = await self._write(self.transport, pack(args), 1)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def transaction(self, commands: list[tuple]) -> list[Any]:
        """MULTI, the commands, EXEC in one write: each command's reply or its error (as redis-py's
        pipeline(transaction=True).execute(raise_on_error=False))."""
        if not self._ready():
            await self._connect()
        buffer = pack(("MULTI",)) + b"".join(pack(c) for c in commands) + pack(("EXEC",))
        reply, queued_errors = await self._write(self.transport, buffer, len(commands) + 2)
        return transaction_result(reply, queued_errors)

    def _write(self, transport: asyncio.Transport | None, buffer: bytes, replies: int) -> asyncio.Future[Any]:
        assert self.loop is not None and transport is not None
        future = self.loop.create_future()
        self.waiting.append(_Call(future, replies, self.loop.time()))
        transport.write(buffer)
        if self.timeout and self._watchdog is None:
            self._watchdog = self.loop.call_later(self.timeout, self._check)
        return future

    async def _connect(self) -> None:
        """Open the connection and authenticate, once however many calls wait for it."""
        if self._connecting is not None:
            await asyncio.shield(self._connecting)
            return
        loop = self.loop = asyncio.get_running_loop()
        self._connecting = connecting = loop.create_future()
        try:
            args = self.connect_args
            timeout = args.get("socket_connect_timeout") or self.timeout
            if args["path"] is not None:
                opening = loop.create_unix_connection(lambda: _Protocol(self), args["path"])
            else:
                opening = loop.create_connection(lambda: _Protocol(self), args["host"], args["port"])
            try:
                transport, _ = await asyncio.wait_for(opening, timeout)
            except (TimeoutError, OSError) as exc:
                raise redis.ConnectionError(f"cannot connect to Redis: {exc}") from exc
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.opening = transport  # type: ignore[assignment]
            # Calls wait until these are answered, so none of them runs before AUTH or SELECT.
            for command in setup_commands(args):
                reply, _errors = await self._write(transport, pack(command), 1)  # type: ignore[arg-type]
                if isinstance(reply, Exception):
                    raise redis.ConnectionError(f"Redis refused {command[0]}: {reply}")
            self.opening, self.transport = None, transport  # type: ignore[assignment]
            connecting.set_result(None)
        except BaseException as exc:
            if self.opening is not None:
                self.abort(exc if isinstance(exc, Exception) else redis.ConnectionError("connect cancelled"))
            connecting.set_exception(exc)
            connecting.exception()  # retrieved: no warning when no other call was waiting for it
            raise
        finally:
            self._connecting = None

    def _check(self) -> None:
        """Close the connection when its oldest call waited longer than the socket timeout (as redis-py
        drops a connection that timed out): the replies after it could no longer be matched."""
        self._watchdog = None
        if not self.waiting or self.loop is None or not self.timeout:
            return
        age = self.loop.time() - self.waiting[0].sent
        if age >= self.timeout:
            self.abort(redis.TimeoutError(f"no reply from Redis in {self.timeout} s"))
        else:
            self._watchdog = self.loop.call_later(self.timeout - age, self._check)

    def abort(self, exc: Exception) -> None:
        """Fail every waiting call and drop the connection; the next call opens a new one."""
        transports = (self.transport, self.opening)
        self.transport = self.opening = None
        waiting, self.waiting = self.waiting, collections.deque()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for call in waiting:
            if not call.future.done():
                call.future.set_exception(exc)
        for transport in transports:
            if transport is not None:
                with contextlib.suppress(RuntimeError):  # its event loop is already closed
                    transport.abort()

    def close(self) -> None:
        self.abort(redis.ConnectionError("connection closed"))
