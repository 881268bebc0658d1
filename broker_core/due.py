"""Scheduled messages on time: the process that sent a delayed message dispatches its destination when the
message is due (AsyncBroker.send arms a `DueTimers` timer; a transacted send's, AsyncBroker.commit too), so
the message reaches a waiting consumer then.

The maintenance tick dispatches every destination whose parked messages are due as well (the `<ns>:due`
index, broker_core/maintenance.py), but it runs once a second, so a delay of 100 ms ended after about a
second there; ActiveMQ 5.17.2's scheduler fired 400-500 ms late in the same run (bench/scheduled_delay.py,
docs/benchmarks.md "Session 23"). These timers only bring that moment forward; the tick stays what
guarantees it (a process that dies with a timer armed, a delay on a virtual destination's copy, more
destinations than MAX_TIMERS: the tick dispatches them within its second).

One timer per destination (the earliest time asked), on the event loop of the broker that armed it. When it
fires it dispatches, and arms itself again for the next time the dispatch reports something waits for
(`DispatchResult.hold_until`: another delayed message, a repeating job's next firing), so a job's firings
are on time too while it lasts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from .destinations import Destination
from .model import DispatchResult

logger = logging.getLogger(__name__)

# Destinations one event loop keeps timers for at most; past it, the maintenance tick alone.
MAX_TIMERS = 10_000
# A dispatch that reports more due already (it hands over at most 100 parked messages a call) is run again
# this much later, at most MAX_AGAIN times in a row: the next part on time, and no endless loop of calls
# should the same thing stay due (the tick then).
AGAIN_MS = 10
MAX_AGAIN = 100


class DueTimers:
    """Timers that dispatch a destination at the time its parked messages are due (see the module)."""

    def __init__(self, dispatch: Callable[[Destination], Awaitable[DispatchResult]],
                 now_ms: Callable[[], int]) -> None:
        self._dispatch = dispatch
        self._now_ms = now_ms
        self._timers: dict[Destination, tuple[int, asyncio.TimerHandle]] = {}
        self._running: set[asyncio.Task[None]] = set()  # (a task is only weakly held by its loop)

    def __len__(self) -> int:
        return len(self._timers)

    def arm(self, destination: Destination, at_ms: int, again: int = 0) -> None:
        """Dispatch `destination` at `at_ms` (broker time), unless a timer is armed for it at that time or
        earlier (the dispatch then reports what is still to come). `again`: how many dispatches in a row
        found more due at once."""
        armed = self._timers.get(destination)
        if armed is not None:
            if armed[0] <= at_ms:
                return
            armed[1].cancel()
        elif len(self._timers) >= MAX_TIMERS:
            return
        loop = asyncio.get_running_loop()
        handle = loop.call_later(max(0, at_ms - self._now_ms()) / 1000, self._fire, destination, again)
        self._timers[destination] = (at_ms, handle)

    def _fire(self, destination: Destination, again: int) -> None:
        self._timers.pop(destination, None)
        task = asyncio.get_running_loop().create_task(self._dispatch_and_rearm(destination, again))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _dispatch_and_rearm(self, destination: Destination, again: int) -> None:
        try:
            result = await self._dispatch(destination)
        except Exception as exc:  # (the tick dispatches it within its second)
            logger.debug("dispatch of %s when due failed: %s", destination.uri, exc)
            return
        if not result.hold_until:
            return
        now = self._now_ms()
        if result.hold_until > now:
            self.arm(destination, result.hold_until)
        elif again < MAX_AGAIN:
            self.arm(destination, now + AGAIN_MS, again + 1)

    def cancel(self) -> None:
        """Forget every timer (the broker's loop is ending)."""
        for _at, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
