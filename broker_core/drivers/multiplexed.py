"""One Redis connection per event loop that every script call of an AsyncBroker shares.

redis.asyncio takes a connection from its pool for each command, packs it through several layers and
waits on a stream reader: about 65-80 µs of CPU per call on the 2-core machine, twice a bare round trip
(docs/benchmarks.md, "Session 4"). The gateway makes one script call per request or frame, so that
overhead was a large part of each one. Here a call packs its command into one buffer, writes it at
once and waits for its reply; replies come back in the order the commands went out (Redis answers a
connection's commands in order), so each one completes the oldest waiting call. Calls made while
others wait simply follow them on the wire: concurrent requests share the connection's round trips.

A MULTI/EXEC block is written as one buffer, so no other call's command can land inside it.

A call made under `hold(seconds)` (the first of that context only) may wait that long before it is
written, and goes out with the next call's write if one comes sooner, ahead of it. Redis runs the
commands of one read in one turn of its event loop and, with `appendfsync always`, syncs its AOF once
for all of them before replying: a held auto ack that rides with the next send costs no sync of its own
on the send's way (docs/broker_core.md, "The delivery path"). Held calls keep their order: a later call
never overtakes one.

Only the script calls and transactions of broker.AsyncBroker use this; every other command (INFO, pub/sub,
the operators' plain commands) keeps redis-py. `for_client` returns None for a client it cannot mirror
(TLS, RESP3, decoded responses, a credential provider); AsyncBroker then stays on redis-py.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import socket
from collections.abc import Awaitable
from typing import Any

import hiredis
import redis
import redis.asyncio

from ..resp import connect_settings, pack, reply_error, setup_commands, transaction_result

_PLAIN = {redis.asyncio.Connection, redis.asyncio.UnixDomainSocketConnection}


class _Hold:
    """How long the next call of a context may wait for another write; spent by that call."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


_HOLD: contextvars.ContextVar[_Hold | None] = contextvars.ContextVar("signalbox_hold", default=None)


def hold(seconds: float) -> contextvars.Token[_Hold | None]:
    """Let the current context's next call wait up to `seconds` to share the next write (module
    docstring); `_HOLD.reset(token)` when done. The calls after that one go at once."""
    return _HOLD.set(_Hold(seconds))


def release_hold(token: contextvars.Token[_Hold | None]) -> None:
    _HOLD.reset(token)


class _Call:
    """A command (or MULTI/EXEC block) on the wire: how many replies it still has to come, and the
    errors its block's queued commands got. `single`: one command whose future is its reply itself (an
    error reply raised), where the others' is (reply, errors)."""

    __slots__ = ("future", "replies", "sent", "errors", "single")

    def __init__(self, future: asyncio.Future[Any], replies: int, sent: float, single: bool = False) -> None:
        self.future, self.replies, self.sent, self.single = future, replies, sent, single
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
            future = call.future
            if future.done():  # (its caller gave up waiting)
                continue
            if not call.single:
                future.set_result((reply, call.errors))
            elif isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

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
        self._held: list[tuple[bytes, _Call]] = []  # calls waiting to share the next write
        self._release: asyncio.TimerHandle | None = None

    @classmethod
    def for_client(cls, client: redis.asyncio.Redis) -> MultiplexedConnection | None:
        settings = connect_settings(client.connection_pool, _PLAIN)
        return None if settings is None else cls(settings, settings["socket_timeout"])

    def _ready(self) -> bool:
        if self.transport is None or self.transport.is_closing():
            return False
        if self.loop is not asyncio.get_running_loop():  # the client moved to another event loop
            self._leave_loop()
            return False
        return True

    def _leave_loop(self) -> None:
        """Start afresh on another event loop. The old loop's calls, held or waiting, fail there (their
        replies can no longer reach them: they would wait for ever) and its connection closes; its timers
        go (a watchdog still set kept every call on the new loop from getting one)."""
        old, transports = self.loop, (self.transport, self.opening)
        calls = [call for _, call in self._held] + list(self.waiting)
        timers = (self._release, self._watchdog)
        self.transport = self.opening = None
        self.waiting = collections.deque()
        self._held, self._release, self._watchdog = [], None, None
        if old is None or old.is_closed():
            return
        exc = redis.ConnectionError("the connection to Redis moved to another event loop")

        def end() -> None:  # (on the old loop: futures and transports are not thread-safe)
            for timer in timers:
                if timer is not None:
                    timer.cancel()
            for call in calls:
                if not call.future.done():
                    call.future.set_exception(exc)
            for transport in transports:
                if transport is not None:
                    transport.abort()

        with contextlib.suppress(RuntimeError):  # closed meanwhile
            old.call_soon_threadsafe(end)

    async def call(self, *args: Any) -> Any:
        """One command's reply; an error reply is raised as redis-py raises it."""
        return await self.request(args)

    def request(self, args: tuple) -> Awaitable[Any]:
        """`call(*args)`, written now when the connection is open (else once it is): the future of its
        reply, which AsyncBroker's driver awaits with no coroutine of this module's around it (each one
        was a frame to make and to resume on every script call)."""
        if not self._ready():
            return self._call_once_open(args)
        held = _HOLD.get()
        if held is not None and held.seconds > 0:
            seconds, held.seconds = held.seconds, 0.0
            return self._hold(pack(args), seconds)
        return self._write(self.transport, pack(args), 1, True)

    async def _call_once_open(self, args: tuple) -> Any:
        await self._connect()
        return await self.request(args)

    async def transaction(self, commands: list[tuple]) -> list[Any]:
        """MULTI, the commands, EXEC in one write: each command's reply or its error (as redis-py's
        pipeline(transaction=True).execute(raise_on_error=False))."""
        if not self._ready():
            await self._connect()
        buffer = pack(("MULTI",)) + b"".join(pack(c) for c in commands) + pack(("EXEC",))
        reply, queued_errors = await self._write(self.transport, buffer, len(commands) + 2)
        return transaction_result(reply, queued_errors)

    def _write(self, transport: asyncio.Transport | None, buffer: bytes, replies: int,
               single: bool = False) -> asyncio.Future[Any]:
        assert self.loop is not None and transport is not None
        future = self.loop.create_future()
        now = self.loop.time()
        if self._held and transport is self.transport:  # the held calls first, in one write with this one
            buffer = self._take_held(now) + buffer
        self.waiting.append(_Call(future, replies, now, single))
        transport.write(buffer)
        if self.timeout and self._watchdog is None:
            self._watchdog = self.loop.call_later(self.timeout, self._check)
        return future

    def _hold(self, buffer: bytes, seconds: float) -> asyncio.Future[Any]:
        """A call written with the next call's write, or after `seconds` if none comes."""
        assert self.loop is not None
        future = self.loop.create_future()
        self._held.append((buffer, _Call(future, 1, 0.0, True)))
        if self._release is None:
            self._release = self.loop.call_later(seconds, self._write_held)
        return future

    def _take_held(self, now: float) -> bytes:
        """The held calls' commands, now waiting for their replies (a cancelled one is dropped)."""
        held, self._held = self._held, []
        if self._release is not None:
            self._release.cancel()
            self._release = None
        out = []
        for buffer, call in held:
            if call.future.cancelled():
                continue
            call.sent = now
            self.waiting.append(call)
            out.append(buffer)
        return b"".join(out)

    def _write_held(self) -> None:
        """No other call came in time: the held calls go on their own."""
        self._release = None
        if not self._held or self.loop is None:
            return
        if self.transport is None or self.transport.is_closing():
            self._fail_held(redis.ConnectionError("connection to Redis lost"))
            return
        buffer = self._take_held(self.loop.time())
        if buffer:
            self.transport.write(buffer)
            if self.timeout and self._watchdog is None:
                self._watchdog = self.loop.call_later(self.timeout, self._check)

    def _fail_held(self, exc: Exception) -> None:
        held, self._held = self._held, []
        if self._release is not None:
            self._release.cancel()
            self._release = None
        for _, call in held:
            if not call.future.done():
                call.future.set_exception(exc)

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
        self._fail_held(exc)
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
