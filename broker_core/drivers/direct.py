"""The script calls of a blocking Broker over bare sockets: a small pool of connections, each used by one
call at a time.

redis-py's blocking client spends about 52 µs of CPU on each command on the 2-core machine (pool
checkout, observability hooks, several parser layers), against about 19 µs for one socket write and a
hiredis read, most of that the two system calls (docs/benchmarks.md, "Session 5"). A one-message send
or ack is one script call, so that overhead was about half of a producer's or consumer's CPU per
message (119 → 64 µs per send, 79 → 40 µs per ack_and_receive).
Here a call takes an idle connection (or opens one), writes its packed command at once, reads its
reply and gives the connection back. Threads share a Broker, so the idle list is guarded by a lock; a
call holds its connection alone. A forked child opens its own: sockets inherited from the parent are
forgotten, never written.

A connection that fails (closed, reset, timed out) is dropped, so a late reply can never be taken for
the next call's. An idle connection is looked at before it is reused: one the server closed meanwhile
(a restart, its idle timeout) is readable, and is replaced by a fresh one before anything is written.
A call whose connection fails after its command was written is never repeated here (the script may
have run): it raises redis-py's ConnectionError or TimeoutError, and the caller decides (a producer
repeating a send with the same message id is told `duplicate`).

Only Broker's script calls and transactions use this (`for_client` returns None for a client it cannot
mirror: resp.connect_settings); every other command keeps redis-py.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import threading
from typing import Any

import hiredis
import redis

from ..resp import connect_settings, pack, reply_error, setup_commands, transaction_result

_PLAIN = {redis.Connection, redis.UnixDomainSocketConnection}

# Counts the forks this process is a child of: a pool made before a fork is not the child's to use. (Read
# on every call, where os.getpid() would be a system call.)
_FORKS = [0]
os.register_at_fork(after_in_child=lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))


class _Link:
    """One open connection and its reply reader."""

    __slots__ = ("sock", "reader", "poll", "timeout")

    def __init__(self, settings: dict[str, Any]) -> None:
        timeout = settings["socket_connect_timeout"] or settings["socket_timeout"]
        try:
            if settings["path"] is not None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(timeout)
                    sock.connect(settings["path"])
                except OSError:
                    sock.close()
                    raise
            else:
                sock = socket.create_connection((settings["host"], settings["port"]), timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if settings["socket_keepalive"]:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        except OSError as exc:
            raise redis.ConnectionError(f"cannot connect to Redis: {exc}") from exc
        # A blocking socket whose timeout the kernel keeps (SO_RCVTIMEO, SO_SNDTIMEO): with Python's own
        # timeout every send and receive first waits in poll(), two more system calls per script call, each
        # dear on a virtual machine (docs/benchmarks.md, "Session 9").
        sock.settimeout(None)
        self.timeout = settings["socket_timeout"]
        if self.timeout:
            seconds = int(self.timeout)
            limit = struct.pack("ll", seconds, int((self.timeout - seconds) * 1_000_000))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
        self.sock, self.reader = sock, hiredis.Reader(replyError=reply_error)
        self.poll = select.poll()
        self.poll.register(sock, select.POLLIN)
        try:
            for command in setup_commands(settings):
                reply, _errors = self.exchange(pack(command), 1)
                if isinstance(reply, Exception):
                    raise redis.ConnectionError(f"Redis refused {command[0]}: {reply}")
        except BaseException:
            self.close()
            raise

    def exchange(self, buffer: bytes, replies: int) -> tuple[Any, list[Exception]]:
        """Write a command (or MULTI/EXEC block) and read its `replies` replies: the last one, and the
        error replies before it (a block's commands refused while queueing)."""
        sock, reader = self.sock, self.reader
        try:
            sock.sendall(buffer)
            errors: list[Exception] = []
            while True:
                reply = reader.gets()
                if reply is False:
                    data = sock.recv(65536)
                    if not data:
                        raise redis.ConnectionError("connection to Redis lost: closed by the server")
                    reader.feed(data)
                    continue
                replies -= 1
                if not replies:
                    return reply, errors
                if isinstance(reply, Exception):
                    errors.append(reply)
        except OSError as exc:
            if isinstance(exc, TimeoutError) or exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                raise redis.TimeoutError(f"no reply from Redis in {self.timeout} s") from exc
            raise redis.ConnectionError(f"connection to Redis lost: {exc}") from exc

    def still_open(self) -> bool:
        """Whether an idle connection can take a call: nothing to read (a closed one reads as its end)."""
        return not self.poll.poll(0)

    def close(self) -> None:
        self.sock.close()


class DirectConnections:
    """Script calls of one Broker over its own connections (module docstring)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self._idle: list[_Link] = []
        self._lock = threading.Lock()
        self._forks = _FORKS[0]

    @classmethod
    def for_client(cls, client: redis.Redis) -> DirectConnections | None:
        settings = connect_settings(client.connection_pool, _PLAIN)
        return None if settings is None else cls(settings)

    def call(self, *args: Any) -> Any:
        """One command's reply; an error reply is raised as redis-py raises it."""
        reply, _errors = self._exchange(pack(args), 1)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def transaction(self, commands: list[tuple]) -> list[Any]:
        """MULTI, the commands, EXEC in one write: each command's reply or its error."""
        buffer = pack(("MULTI",)) + b"".join(pack(c) for c in commands) + pack(("EXEC",))
        return transaction_result(*self._exchange(buffer, len(commands) + 2))

    def _exchange(self, buffer: bytes, replies: int) -> tuple[Any, list[Exception]]:
        link = self._take()
        try:
            result = link.exchange(buffer, replies)
        except BaseException:  # failed or interrupted half-way: a reply could still come, never reuse it
            link.close()
            raise
        with self._lock:
            self._idle.append(link)
        return result

    def _take(self) -> _Link:
        while True:
            with self._lock:
                if self._forks != _FORKS[0]:  # a forked child: the parent's sockets are not ours to use
                    self._idle, self._forks = [], _FORKS[0]
                if not self._idle:
                    break
                link = self._idle.pop()
            if link.still_open():
                return link
            link.close()
        return _Link(self.settings)

    def close(self) -> None:
        """Close the idle connections (a call under way closes or returns its own)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for link in idle:
            link.close()
