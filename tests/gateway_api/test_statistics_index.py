"""The statistics index's refresh lock (gateway/api/destination_index.py): one process refreshes at a time,
and a process killed while refreshing holds the others back only until its lock expires, never for good.
A full run once failed here: a gateway killed by a console test left a 60 s lock, and the overview's totals
stayed stale past the 20 s another test waited."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from broker_core.messages import Message
from gateway import runtime
from gateway.api import destination_index

pytestmark = pytest.mark.django_db(transaction=True)


def _waiting_for(event: asyncio.Event):
    """A build that does nothing but wait for `event` (as a process that died in the middle of one)."""

    async def build(broker, client) -> None:
        await asyncio.wait_for(event.wait(), 30)

    return build


async def test_a_refresh_whose_process_died_holds_the_next_back_only_until_its_lock_expires(
        api_namespace, monkeypatch):
    monkeypatch.setattr(destination_index, "INDEX_MAX_AGE", 0.2)
    monkeypatch.setattr(destination_index, "REFRESH_LOCK_SECONDS", 1.0)
    broker, client = runtime.async_broker(), runtime.async_redis()
    lock = f"{api_namespace}:console:index:refresh"
    first = await destination_index.index(broker)  # none yet: built at once, without the lock
    assert first is not None and "queue://late" not in first.rows
    await broker.send("late", [Message(body="x")])

    # The first refresh hangs, as in a process that died in the middle of it: it never releases the lock.
    hung = asyncio.Event()
    real_build = destination_index._build
    monkeypatch.setattr(destination_index, "_build", _waiting_for(hung))
    await asyncio.sleep(0.3)  # the index is stale now
    await destination_index.index(broker)
    ttl = await client.pttl(lock)
    assert 0 < ttl <= 1000, ttl  # the lock is held, and only for REFRESH_LOCK_SECONDS

    hung_refresh = destination_index._caches[api_namespace].refreshing

    # Another process asks while the lock is held: it gets the stale index and starts no build.
    monkeypatch.setattr(destination_index, "_build", real_build)
    destination_index._caches.clear()  # as if it were another process
    assert "queue://late" not in (await destination_index.index(broker)).rows
    assert destination_index._caches[api_namespace].refreshing is None

    # Once the lock has expired, the next request refreshes.
    await asyncio.sleep(1.1)
    assert await client.exists(lock) == 0
    await destination_index.index(broker)  # takes the lock and builds in the background
    refreshing = destination_index._caches[api_namespace].refreshing
    assert refreshing is not None
    await refreshing
    assert "queue://late" in (await destination_index.index(broker)).rows

    # A third refresh holds the lock when the hung one finally ends: the hung one's release (of a lock it
    # no longer holds) must leave the newer holder's alone.
    third = asyncio.Event()
    monkeypatch.setattr(destination_index, "_build", _waiting_for(third))
    await asyncio.sleep(0.3)
    await destination_index.index(broker)
    holder = await client.get(lock)
    assert holder is not None
    hung.set()
    await hung_refresh
    assert await client.get(lock) == holder
    third.set()
    await destination_index._caches[api_namespace].refreshing
    assert await client.exists(lock) == 0  # its own holder released it


async def test_a_listing_sorted_by_name_refreshes_the_rates_it_lends(api_namespace, monkeypatch):
    """A name-sorted listing reads no statistics of its own, only the index's rates: it must still refresh
    a stale index (in the background), or the rates it shows stay those of the last refresh that something
    else started, for as long as nothing else does (the CLI's `stat` lists by name)."""
    monkeypatch.setattr(destination_index, "INDEX_MAX_AGE", 0.2)
    broker = runtime.async_broker()

    async def listed_rate() -> float:
        _, rows, _ = await destination_index.list_destinations(broker, None, None, "rated", "name", 10, 0)
        return rows[0]["enqueue_rate"]

    await broker.send("rated", [Message(body="x")])
    assert await listed_rate() == 0.0  # no index yet: this listing starts its build and does not wait
    first = destination_index._caches[api_namespace].refreshing
    assert first is not None
    await first
    await broker.send("rated", [Message(body="x") for _ in range(50)])
    await asyncio.sleep(1.1)  # stale now, and far enough from the first for a rate (at least 1 s)
    await listed_rate()  # starts the refresh, answers with the stale index
    refreshing = destination_index._caches[api_namespace].refreshing
    assert refreshing is not first and refreshing is not None
    await refreshing
    assert await listed_rate() > 0.0


async def test_an_index_much_older_than_its_refresh_period_is_rebuilt_before_it_is_served(api_namespace):
    """Nobody watched the overview for ten minutes (or a script polls GET /console/overview once a minute):
    the index is that old. It was served as it was while its refresh ran in the background, so each such
    reading gave the totals of minutes ago (and the overview page showed them, under "Live", until the
    feed's second message)."""
    import msgpack

    broker, client = runtime.async_broker(), runtime.async_redis()
    await destination_index.index(broker)  # built
    await broker.send("later", [Message(body="x")] * 3)
    key = f"{api_namespace}:console:index"
    data = msgpack.unpackb(await client.get(key), raw=False)
    data["at"] -= 600_000  # ten minutes old
    await client.set(key, msgpack.packb(data))
    await client.set(f"{key}:at", data["at"])
    destination_index._caches.clear()  # (as another process would find it)
    totals = await destination_index.totals(broker, None)
    assert totals["index_age_ms"] < 5_000, totals["index_age_ms"]
    assert (await destination_index.index(broker)).rows["queue://later"][0] == 3  # its queue_size


async def _longest_hold_ms(work) -> float:
    """Await `work` while a probe sleeps 1 ms at a time on the same event loop: the longest the process
    spent on anything else meanwhile, past the probe's 1 ms (CPU time: what every other client of the
    process waited for; a machine busy with other processes does not add to it, as it would to the wall
    time)."""
    holds: list[float] = []
    done = False

    async def probe() -> None:
        while not done:
            before = time.process_time()
            await asyncio.sleep(0.001)
            holds.append(time.process_time() - before - 0.001)

    watcher = asyncio.ensure_future(probe())
    await asyncio.sleep(0.005)
    holds.clear()
    try:
        await work
    finally:
        done = True
        await watcher
    return max(holds, default=0.0) * 1000


@pytest.fixture
def no_collector():
    """The cyclic collector off while the loop is watched: what is measured is the longest step of the
    index's code. A full collection is the process's, whatever allocated last (signalbox/collector.py): with
    the 10,000 queues' objects alive one took 6-10 ms here, falling in whichever step it fell in."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


async def test_building_and_reading_the_index_of_10_000_queues_leaves_the_event_loop_to_the_others(
        api_namespace, monkeypatch, no_collector):
    """The index's build (the first, waited for, and each refresh in the background), its unpacking in each
    process and the totals read from it give the event loop back every SLICE_SECONDS: at 10,000 queues a
    build waited for held it 40-80 ms at a time, the totals 6-14 ms (and a refresh in a worker thread about
    5 ms: its GIL), and every STOMP, WebSocket and HTTP client of the process waited that long."""
    sync = runtime.broker()
    for n in range(10_000):
        sync.ensure_destination(f"many.q{n:05d}")
    broker = runtime.async_broker()
    await broker.summaries(["queue://many.q00000"])  # (the scripts loaded, as in any running gateway)
    holds = {"first build": await _longest_hold_ms(destination_index.index(broker))}
    monkeypatch.setattr(destination_index, "INDEX_MAX_AGE", 0.0)
    await asyncio.sleep(0.01)

    async def refresh() -> None:
        await destination_index.index(broker)  # stale: served, and refreshed in the background
        await destination_index._caches[api_namespace].refreshing

    holds["refresh"] = await _longest_hold_ms(refresh())
    destination_index._caches.clear()  # another process: unpacks the index it finds
    monkeypatch.setattr(destination_index, "INDEX_MAX_AGE", 60.0)
    holds["unpacking"] = await _longest_hold_ms(destination_index.index(broker))
    holds["totals"] = await _longest_hold_ms(destination_index.totals(broker, None))
    assert (await destination_index.totals(broker, None))["queues"] == 10_000
    # (slices of 1 ms; a step waits for at most two; the bound leaves room for a busy machine)
    assert max(holds.values()) < 10, holds
