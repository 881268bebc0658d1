"""broker_core/due.py: the timers that dispatch a destination when a delayed message is due (the gateway
side of it runs in tests/differential, group 16, where no maintenance tick runs)."""

from __future__ import annotations

import asyncio
import time

from broker_core import due
from broker_core.destinations import Destination
from broker_core.model import DispatchResult

Q = Destination("queue", "orders")


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def test_one_timer_per_destination_the_earliest_and_rearmed_for_what_the_dispatch_reports():
    calls: list[int] = []
    replies = [DispatchResult(hold_until=0)]

    async def dispatch(dest: Destination) -> DispatchResult:
        calls.append(now_ms())
        return replies.pop() if replies else DispatchResult()

    async def scenario() -> None:
        timers = due.DueTimers(dispatch, now_ms)
        start = now_ms()
        timers.arm(Q, start + 300)
        timers.arm(Q, start + 50)  # earlier: replaces it
        timers.arm(Q, start + 200)  # later: the dispatch at 50 reports what is left
        assert len(timers) == 1
        replies.append(DispatchResult(hold_until=start + 150))  # (the reply of the first dispatch)
        await asyncio.sleep(0.6)
        # at 50 ms, then at 150 ms, and not at 300 ms (that timer was replaced)
        offsets = [t - start for t in calls]
        assert len(offsets) == 2 and offsets[0] >= 50 and offsets[1] >= 150, offsets
        assert len(timers) == 0

    asyncio.run(scenario())


def test_what_stays_due_is_dispatched_again_a_bounded_number_of_times(monkeypatch):
    monkeypatch.setattr(due, "MAX_AGAIN", 3)
    monkeypatch.setattr(due, "AGAIN_MS", 1)
    calls = []

    async def dispatch(dest: Destination) -> DispatchResult:
        calls.append(dest)
        return DispatchResult(hold_until=1)  # due long ago, every time

    async def scenario() -> None:
        timers = due.DueTimers(dispatch, now_ms)
        timers.arm(Q, now_ms())
        await asyncio.sleep(0.2)
        assert len(calls) == 1 + 3 and len(timers) == 0

    asyncio.run(scenario())


def test_past_max_timers_a_destination_is_left_to_the_tick(monkeypatch):
    monkeypatch.setattr(due, "MAX_TIMERS", 2)

    async def dispatch(dest: Destination) -> DispatchResult:
        return DispatchResult()

    async def scenario() -> None:
        timers = due.DueTimers(dispatch, now_ms)
        for name in ("a", "b", "c"):
            timers.arm(Destination("queue", name), now_ms() + 10_000)
        assert len(timers) == 2
        timers.cancel()
        assert len(timers) == 0

    asyncio.run(scenario())


async def test_the_delayed_sends_of_transactions_never_ended_here_are_remembered_up_to_a_bound(aio,
                                                                                              monkeypatch):
    """AsyncBroker arms a transaction's delayed destinations again at its commit; a transaction that lapses
    (its client gone, nobody commits or rolls back here) must not be remembered for ever: past
    TX_DELAYS_KEPT the oldest goes (its messages then wait for the maintenance tick)."""
    from broker_core import broker as broker_module
    from broker_core.messages import Message

    monkeypatch.setattr(broker_module, "TX_DELAYS_KEPT", 2)
    txs = [await aio.begin(60_000) for _ in range(3)]
    for tx in txs:
        await aio.send("queue://tx-delays", Message(body="later", delay_ms=60_000), tx=tx)
    assert list(aio._tx_delays) == txs[1:]
    await aio.commit(txs[2])
    await aio.rollback(txs[1])
    assert not aio._tx_delays
