"""Concurrent sends to one queue share a script call (AsyncBroker's group commit).

The gateways serve many producers through one AsyncBroker, most of them sending one message per call. A
script call costs the same fixed work whatever it carries (reading the destination's state, the
consumers, the dispatch pass), so while a send to a queue is under way, the sends to that queue that
arrive meanwhile wait for it and then go together, in arrival order, as one `send` of all their messages:
one atomic transition, each caller getting the ids and statuses of its own messages. A send that finds
nothing under way goes at once, so a lone producer waits for nobody.

What each caller would have seen on its own is kept: a message that fails validation fails its own send
before anything is grouped (Message.pack), and a group the script refuses before storing anything (a
size or property limit, producer flow control) is sent again one caller at a time, so each gets its own
outcome. Any other failure is every member's, as it would be for a single call that failed half-way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from .destinations import Destination
from .errors import InvalidMessage
from .flow import ResourceAllocationError

# Refusals the send script makes before it stores anything: the group is retried caller by caller.
REFUSED_WHOLE = (InvalidMessage, ResourceAllocationError)
# At most this many messages in one grouped call (what a batched send carries in the benchmarks).
GROUP_MESSAGES = 100

Packed = list[tuple[str, bytes]]


class SendCoalescer:
    """`send(dest, packed)` through `store(dest, packed)` (one send script call, returning the sent ids),
    grouping the sends to a queue that arrive while one to it is under way."""

    def __init__(self, store: Callable[[Destination, Packed], Awaitable[list[Any]]]) -> None:
        self._store = store
        # by event loop and queue (a broker may serve one loop after another: each has its own calls)
        self._waiting: dict[tuple[Any, Destination], list[tuple[Packed, asyncio.Future[list[Any]]]]] = {}
        self._busy: set[tuple[Any, Destination]] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # running groups (asyncio keeps only weak references)

    async def send(self, dest: Destination, packed: Packed) -> list[Any]:
        loop = asyncio.get_running_loop()
        key = (loop, dest)
        if key not in self._busy:  # nothing under way: this send goes at once
            self._busy.add(key)
            try:
                return await self._store(dest, packed)
            finally:
                self._next(key)
        future: asyncio.Future[list[Any]] = loop.create_future()
        self._waiting.setdefault(key, []).append((packed, future))
        return await future

    def _next(self, key: tuple[Any, Destination]) -> None:
        """The call under way is done: the sends that waited for it go next, together, else the queue is
        free for the next send to go at once."""
        if self._waiting.get(key):
            task = key[0].create_task(self._flush(key))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._busy.discard(key)

    async def _flush(self, key: tuple[Any, Destination]) -> None:
        dest = key[1]
        waiting = [(packed, future) for packed, future in self._waiting.pop(key) if not future.cancelled()]
        try:
            group: list[tuple[Packed, asyncio.Future[list[Any]]]] = []
            size = 0
            for packed, future in waiting:
                if group and size + len(packed) > GROUP_MESSAGES:
                    await self._send_group(dest, group)
                    group, size = [], 0
                group.append((packed, future))
                size += len(packed)
            if group:
                await self._send_group(dest, group)
        finally:
            self._next(key)

    async def _send_group(self, dest: Destination,
                          group: list[tuple[Packed, asyncio.Future[list[Any]]]]) -> None:
        try:
            sent = await self._store(dest, [message for packed, _ in group for message in packed])
        except REFUSED_WHOLE as exc:
            if len(group) == 1:
                _settle(group[0][1], error=exc)
                return
            for packed, future in group:  # nothing was stored: each send on its own, as it would have gone
                try:
                    _settle(future, await self._store(dest, packed))
                except Exception as own:  # noqa: BLE001 - the caller's own outcome, raised in its send
                    _settle(future, error=own)
            return
        except BaseException as exc:
            for _, future in group:
                _settle(future, error=exc)
            if not isinstance(exc, Exception):
                raise
            return
        start = 0
        for packed, future in group:
            _settle(future, sent[start:start + len(packed)])
            start += len(packed)


def _settle(future: asyncio.Future[list[Any]], result: list[Any] | None = None,
            error: BaseException | None = None) -> None:
    if future.done():  # its caller gave up waiting (cancelled)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result or [])
