"""Concurrent calls to one queue share a script call (AsyncBroker's group commit).

The gateways serve many producers and consumers through one AsyncBroker, most of them sending or
acknowledging one message per call. A script call costs much the same fixed work whatever it carries
(reading the destination's state, the consumers, a dispatch chunk), so while a call of one kind to a queue
is under way, the calls of that kind to that queue that arrive meanwhile wait for it and then go
together, in arrival order, as one script call: one atomic transition, each caller getting its own
result. A call that finds nothing under way goes at once, so a lone caller waits for nobody. AsyncBroker
groups sends (one `send` of all their messages) and acks of different consumers (one `ack` naming each
consumer once; two acks of one consumer never share a call, so each sees the other done or not begun).

What each caller would have seen on its own is kept: a group the script refuses at once, before changing
anything (a send over a size or property limit, or over a memory limit it fails at once or can never fit
in; an ack of a message not in flight), is run again one caller at a time, so only the call at fault
fails, or waits. Any other failure is every member's, as it would be for a single call that failed
half-way; so is a memory limit the group waited for in vain (each member waited as long as its own send
would have).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from ..destinations import Destination

Item = TypeVar("Item")
Result = TypeVar("Result")

# At most this much in one grouped call (what a batched send carries in the benchmarks).
GROUP_LIMIT = 100


class Coalescer(Generic[Item, Result]):
    """`run(dest, item)` through `store(dest, items)`, one script call returning each item's result in
    order, grouping the items for a queue that arrive while a call for it is under way. `refused(error)`:
    whether `store` raised it before changing anything, so each item can be tried on its own. `size`:
    what an item counts towards GROUP_LIMIT. `tag`: items with the same tag (not None) never share a
    call."""

    def __init__(self, store: Callable[[Destination, list[Item]], Awaitable[list[Result]]],
                 refused: Callable[[Exception], bool], size: Callable[[Item], int] = lambda item: 1,
                 tag: Callable[[Item], Hashable | None] = lambda item: None) -> None:
        self._store, self._refused, self._size, self._tag = store, refused, size, tag
        # by event loop and queue uri (a broker may serve one loop after another: each has its own calls;
        # the uri, a string, keeps its hash where a Destination works it out each time)
        self._waiting: dict[tuple[Any, str], list[tuple[Item, asyncio.Future[Result]]]] = {}
        self._busy: set[tuple[Any, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # running groups (asyncio keeps only weak references)

    async def run(self, dest: Destination, item: Item) -> Result:
        loop = asyncio.get_running_loop()
        key = (loop, dest.uri)
        if key not in self._busy:  # nothing under way: this call goes at once
            self._busy.add(key)
            try:
                return (await self._store(dest, [item]))[0]
            finally:
                if self._waiting.get(key):
                    self._next(key, dest)
                else:  # (nobody came meanwhile, the usual case: _next's other branch, a call fewer)
                    self._busy.discard(key)
        future: asyncio.Future[Result] = loop.create_future()
        self._waiting.setdefault(key, []).append((item, future))
        return await future

    def _next(self, key: tuple[Any, str], dest: Destination) -> None:
        """The call under way is done: the calls that waited for it go next, together, else the queue is
        free for the next call to go at once."""
        if self._waiting.get(key):
            task = key[0].create_task(self._flush(key, dest))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._busy.discard(key)

    async def _flush(self, key: tuple[Any, str], dest: Destination) -> None:
        waiting = [(item, future) for item, future in self._waiting.pop(key) if not future.cancelled()]
        try:
            while waiting:
                group, later, size, tags = [], [], 0, set()
                for item, future in waiting:
                    tag = self._tag(item)
                    if (group and size + self._size(item) > GROUP_LIMIT) or later or tag in tags:
                        later.append((item, future))  # (arrival order kept: what follows waits too)
                        continue
                    group.append((item, future))
                    size += self._size(item)
                    if tag is not None:
                        tags.add(tag)
                waiting = later
                await self._run_group(dest, group)
        finally:
            if waiting:  # this task was cancelled before their turn: they go first in the next call
                self._waiting[key] = waiting + self._waiting.get(key, [])
            self._next(key, dest)

    async def _run_group(self, dest: Destination, group: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        try:
            results = await self._store(dest, [item for item, _ in group])
        except Exception as exc:  # noqa: BLE001 - handed to the callers, raised in their calls
            if len(group) > 1 and self._refused(exc):
                for item, future in group:  # nothing changed: each call on its own, as it would have gone
                    try:
                        (result,) = await self._store(dest, [item])
                    except Exception as own:  # noqa: BLE001 - the caller's own outcome
                        _settle(future, error=own)
                    else:
                        _settle(future, result)
                return
            for _, future in group:
                _settle(future, error=exc)
            return
        except BaseException as exc:  # cancelled, or the process ends: the callers are told, then it goes on
            for _, future in group:
                _settle(future, error=exc)
            raise
        for (_, future), result in zip(group, results, strict=True):
            _settle(future, result)


def _settle(future: asyncio.Future[Any], result: Any = None, error: BaseException | None = None) -> None:
    if future.done():  # its caller gave up waiting (cancelled)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
