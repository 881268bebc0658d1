"""The destination list at scale: filter, sort and page 10,000 destinations in well under 300 ms.

Names come from broker_core's registry (one ZRANGE). Sorting by name needs no statistics: only the
page's rows are read, in one pipelined round trip (`AsyncBroker.stats_many`). Sorting by a statistic,
the overview's totals and the message rates use the **statistics index**: every destination's main
counters (`AsyncBroker.summaries`) packed into one Redis key, `<ns>:console:index`, with the rates
between it and the previous one. Any gateway process that finds it older than `INDEX_MAX_AGE` seconds
refreshes it — one process at a time (a Redis lock), in the background, while the stale index is served.
Only a missing index, and one older than INDEX_SERVE_STALE that this process rebuilds, are waited for. The
rows a page shows are always read fresh; only their order and the totals may be a few seconds old.

Building, unpacking and totalling the index run on the event loop in steps of one destination, giving it
back every SLICE_SECONDS (`LoopShare`): at 10,000 destinations (an index of some 450 kB) a build waited
for held every STOMP, WebSocket and HTTP client of the process 40-45 ms at a time, the totals 6-13 ms, and
a refresh in a worker thread about 5 ms (its GIL, given up every 5 ms when asked). Packing and unpacking go
row by row (msgpack's streaming Packer and Unpacker: the same bytes as one packb of {"at", "rows"}).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import msgpack
import redis.asyncio
import redis.exceptions

from broker_core.broker import AsyncBroker
from broker_core.destinations import Destination
from broker_core.destinations import parse_destination as _parse_destination
from broker_core.model import NO_SIZES, DestinationSummary, MessageSizes
from gateway import permissions, runtime
from gateway.api.common import LoopShare

INDEX_MAX_AGE = 5.0  # seconds
# An index older than this is not served while this process rebuilds it: it is waited for (a listing
# that need not wait, wait=False, still gets it at once)
INDEX_SERVE_STALE = 15.0  # seconds
# How long one process may hold the refresh to itself. A process killed while refreshing leaves its lock
# behind, and no index is built until it expires: it bounds how stale a kill -9 can leave the index. A build
# that outlasts it lets a second one start, which costs work but is harmless (both write the same kind of
# index; the later one wins).
REFRESH_LOCK_SECONDS = 10.0
# Destinations whose summaries are asked for at once while building: what is done for them before the first
# script call (parsing their names, each one's properties worked out the first time: ~1.2 us) is one hold
# of the event loop, 12 ms for 10,000.
SUMMARIES_AT_ONCE = 500
# The counters kept per destination, in this order (DestinationSummary's names).
FIELDS = ("queue_size", "pending", "in_flight", "parked", "group_count", "consumer_count", "enqueued",
          "dequeued", "dispatched", "expired", "deadlettered")
# the message sizes (DestinationSummary.message_sizes), whose sums, smallest and largest make the broker's
SIZES = ("size_count", "size_total", "size_smallest", "size_largest")
RATES = ("enqueue_rate", "dequeue_rate")
# `messages`, the list's Pending column, is derived rather than stored: pending + in flight. A queue's is its
# QueueSize; a topic's (whose QueueSize is 0, as in ActiveMQ) is the backlog of all its subscriptions.
DERIVED = ("messages",)

# Parsing a name costs ~30 us: 0.3 s for 10,000 on every listing. Destinations are immutable values.
parse_destination = functools.lru_cache(maxsize=100_000)(_parse_destination)


@dataclasses.dataclass
class Index:
    at_ms: int
    rows: dict[str, list[float]]  # uri -> FIELDS values, then SIZES, then RATES

    def rates(self, uri: str) -> tuple[float, float]:
        row = self.rows.get(uri)
        return (row[-2], row[-1]) if row else (0.0, 0.0)


def _row(s: DestinationSummary) -> list[int]:
    """A destination's counters in the index: FIELDS, then SIZES."""
    sizes = s.message_sizes
    return [*(int(getattr(s, f)) for f in FIELDS), sizes.count, sizes.total, sizes.smallest, sizes.largest]


def _key(namespace: str) -> str:
    return f"{namespace}:console:index"


async def _build(broker: AsyncBroker, client: redis.asyncio.Redis) -> None:
    """Read every destination's counters (through the broker) and pack them with the rates since the index
    stored with `client` (the gateway's own key, derived from broker state: not broker state); this
    process's cache then holds it."""
    share = LoopShare()
    uris = await broker.destinations()
    summaries: list[Any] = []
    for start in range(0, len(uris), SUMMARIES_AT_ONCE):
        destinations = []
        for uri in uris[start:start + SUMMARIES_AT_ONCE]:
            await share.pause()
            destinations.append(parse_destination(uri))  # (cached; ~30 us the first time)
        summaries += await broker.summaries(destinations)
    now = broker.clock.now_ms()
    cache = _caches.setdefault(broker.namespace, _Cache())
    previous = None
    at = await client.get(f"{_key(broker.namespace)}:at")
    if at is not None and cache.index is not None and int(at) == cache.index.at_ms:
        previous = cache.index  # already unpacked here
    elif at is not None:
        previous_raw = await client.get(_key(broker.namespace))
        previous = await _unpack(previous_raw, share) if previous_raw else None
    rows: dict[str, list[float]] = {}
    elapsed = (now - previous.at_ms) / 1000 if previous else 0
    for uri, s in zip(uris, summaries, strict=True):
        await share.pause()
        if s is None:
            continue
        row = _row(s)
        enqueue_rate = dequeue_rate = 0.0
        before = previous.rows.get(uri) if previous else None
        if before is not None and elapsed >= 1:
            enqueue_rate = round(max(0, row[6] - before[6]) / elapsed, 2)
            dequeue_rate = round(max(0, row[7] - before[7]) / elapsed, 2)
        elif before is not None:  # too close for a meaningful rate: keep the last ones
            enqueue_rate, dequeue_rate = before[-2], before[-1]
        rows[uri] = [*row, enqueue_rate, dequeue_rate]
    built = Index(now, rows)
    packed = await _pack(built, share)
    pipe = client.pipeline(transaction=True)
    pipe.set(_key(broker.namespace), packed)
    pipe.set(f"{_key(broker.namespace)}:at", now)  # readers check this first, not the whole index
    await pipe.execute()
    cache.raw, cache.index = packed, built  # (no need to unpack what was just packed)


async def _pack(index: Index, share: LoopShare) -> bytes:
    """msgpack.packb({"at": ..., "rows": ...}), row by row."""
    packer = msgpack.Packer()
    parts = [packer.pack_map_header(2), packer.pack("at"), packer.pack(index.at_ms), packer.pack("rows"),
             packer.pack_map_header(len(index.rows))]
    for uri, values in index.rows.items():
        await share.pause()
        parts += (packer.pack(uri), packer.pack(values))
    return b"".join(parts)


async def _unpack(raw: bytes, share: LoopShare) -> Index:
    """The Index in `raw` (a map of "at" and "rows", in either order), row by row."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(raw))
    unpacker.feed(raw)
    at_ms, rows = 0, {}
    for _ in range(unpacker.read_map_header()):
        if unpacker.unpack() != "rows":
            at_ms = unpacker.unpack()
            continue
        for _ in range(unpacker.read_map_header()):
            await share.pause()
            uri = unpacker.unpack()
            rows[uri] = unpacker.unpack()
    return Index(at_ms, rows)


class _Cache:
    """The last index this process unpacked or built, and its refresh in progress."""

    def __init__(self) -> None:
        self.raw: bytes | None = None
        self.index: Index | None = None
        self.refreshing: asyncio.Future[None] | None = None

    async def decode(self, raw: bytes) -> Index:
        if raw != self.raw:
            index = await _unpack(raw, LoopShare())
            self.raw, self.index = raw, index
        assert self.index is not None
        return self.index


_caches: dict[str, _Cache] = {}


async def index(broker: AsyncBroker, wait: bool = True) -> Index | None:
    """The statistics index; a stale one starts a refresh in the background and is returned at once. A
    missing one is built and waited for, or, with wait=False, built in the background while None is
    returned (a name-sorted listing, which only lends the index's rates, need not wait for a first build)."""
    cache = _caches.setdefault(broker.namespace, _Cache())
    client = runtime.async_redis()  # (the broker's own loop's: index() is called with runtime.async_broker())
    at = await client.get(f"{_key(broker.namespace)}:at")
    if at is not None and cache.index is not None and int(at) == cache.index.at_ms:
        current = cache.index  # unchanged: no need to fetch and unpack ~60 bytes per destination
    else:
        raw = await client.get(_key(broker.namespace))
        if raw is None:
            if wait:
                await _build(broker, client)
                assert cache.index is not None
                return cache.index
            await _refresh_in_background(broker, cache, client)
            return None
        current = await cache.decode(raw)
    age_ms = broker.clock.now_ms() - current.at_ms
    if age_ms > INDEX_MAX_AGE * 1000:
        await _refresh_in_background(broker, cache, client)
        if wait and age_ms > INDEX_SERVE_STALE * 1000 and cache.refreshing is not None:
            # Far older than a refresh period (nothing read it for a while: the first look after a quiet
            # spell, a script polling once a minute): served as it was, every such reading gave the totals of
            # minutes ago. This process's refresh is waited for (another's lock: served as it is).
            with contextlib.suppress(Exception):  # (a failed build: the stale index, as before)
                await asyncio.shield(cache.refreshing)
                raw = await client.get(_key(broker.namespace))
                if raw is not None:
                    current = await cache.decode(raw)
    return current


async def _refresh_in_background(broker: AsyncBroker, cache: _Cache, client: redis.asyncio.Redis) -> None:
    """Build the index in a task of its own, unless this process builds it already or another one holds the
    refresh lock."""
    if cache.refreshing is not None and not cache.refreshing.done():
        return
    # redis-py's lock: released only by its holder (a token), so a build that outlasted the lock does
    # not release the next holder's
    lock = client.lock(f"{_key(broker.namespace)}:refresh", timeout=REFRESH_LOCK_SECONDS,
                       blocking=False, thread_local=False)
    if not await lock.acquire():
        return

    async def refresh() -> None:
        try:
            await _build(broker, client)
        finally:
            # a build that outlasted the lock: it expired, and another process may hold it now
            with contextlib.suppress(redis.exceptions.LockNotOwnedError):
                await lock.release()

    cache.refreshing = asyncio.ensure_future(refresh())


def subscription_label(sub: Any, consumers: list[Any]) -> str:
    """A topic subscription as people name it: client id / subscription name, else its consumer's client
    or connection id (the consumer id when it has neither)."""
    if sub.durable:
        return f"{sub.client_id} / {sub.subscription_name}"
    c = next((c for c in consumers if c.consumer_id == sub.consumer_id), None)
    return f"non-durable {(c and (c.client_id or c.connection_id)) or sub.consumer_id or sub.key}"


def largest_subscription(stats: Any) -> dict[str, Any] | None:
    """The topic's subscription with the most messages (pending + in flight); None without any."""
    subs = getattr(stats, "subscriptions", None) or []
    if not subs:
        return None
    top = max(subs, key=lambda s: (s.pending + s.in_flight, s.key))
    return {"key": top.key, "label": subscription_label(top, stats.consumers),
            "messages": top.pending + top.in_flight,
            "active": top.active}


def row(stats: Any, idx: Index | None) -> dict[str, Any]:
    """A destination as the list shows it: every statistic, plus kind, name, `temporary`, `messages`
    (DERIVED), a topic's largest subscription and the message rates."""
    out = dataclasses.asdict(stats)
    out.pop("consumers", None)
    destination = parse_destination(stats.destination)
    out["kind"], out["name"] = destination.kind, destination.name
    out["temporary"] = destination.is_temporary
    out["messages"] = stats.pending + stats.in_flight
    if destination.kind == "topic":
        out["largest_subscription"] = largest_subscription(stats)
    out["enqueue_rate"], out["dequeue_rate"] = idx.rates(stats.destination) if idx else (0.0, 0.0)
    return out


def is_dead_letter_queue(name: str) -> bool:
    """A queue name the default and usual dead-letter strategies give (ActiveMQ.DLQ, ActiveMQ.DLQ.Queue.x,
    DLQ.x, x.DLQ): a test on the name alone, so it costs nothing per destination."""
    return name == "ActiveMQ.DLQ" or name.startswith(("ActiveMQ.DLQ.", "DLQ.")) or ".DLQ" in name


@dataclasses.dataclass(frozen=True)
class Filters:
    """The destination list's filters beyond kind and name; None lets both kinds through."""

    non_empty: bool | None = None  # messages (pending + in flight) > 0
    has_consumers: bool | None = None  # consumer_count > 0
    dlq: bool | None = None  # a dead-letter queue (is_dead_letter_queue; a topic never is)

    def on_statistics(self) -> bool:
        return self.non_empty is not None or self.has_consumers is not None


async def _counters(broker: AsyncBroker, idx: Index, uris: list[str]) -> dict[str, list[float]]:
    """The index's row of each destination; one created since the index was built is read now (its
    summary) rather than taken as all zeros."""
    rows = {uri: idx.rows[uri] for uri in uris if uri in idx.rows}
    missing = [uri for uri in uris if uri not in rows]
    if missing:
        for s in await broker.summaries(missing):
            if s is not None:
                rows[s.destination] = [*_row(s), 0.0, 0.0]
    return rows


def _value(counters: dict[str, list[float]], key: str) -> Callable[[Destination], float]:
    """A destination's `key` (a FIELDS, RATES or DERIVED name) from its row of counters (0 without one)."""
    if key == "messages":
        pending, in_flight = FIELDS.index("pending"), FIELDS.index("in_flight")
        return lambda d: (r[pending] + r[in_flight]) if (r := counters.get(d.uri)) else 0
    position = (FIELDS + SIZES + RATES).index(key)
    return lambda d: r[position] if (r := counters.get(d.uri)) else 0


async def list_destinations(broker: AsyncBroker, patterns: list[Destination] | None, kind: str | None,
                            search: str, ordering: str, limit: int,
                            offset: int, where: Filters = Filters()) -> tuple[int, list[dict[str, Any]], int]:
    """(how many match, the rows of the page, how many of the kind asked for the user may not read).
    `patterns` from permissions.readable_patterns. The hidden count is a number, no names, so someone
    with partial rights knows the list is not all there is; it comes from the same pass over the names.

    Name, kind and dead-letter filters test the names; the others, and sorting by a statistic, read the
    statistics index held in this process (no Redis call per destination): the work is one pass over the
    names whatever the filters, plus the page's rows read fresh."""
    chosen: list[Destination] = []
    hidden = 0
    for uri in await broker.destinations():
        destination = parse_destination(uri)
        if kind and destination.kind != kind:
            continue
        if not permissions.visible(patterns, destination):
            hidden += 1
            continue
        if search and search not in destination.name.lower():
            continue
        if where.dlq is not None and where.dlq != (destination.kind == "queue"
                                                   and is_dead_letter_queue(destination.name)):
            continue
        chosen.append(destination)
    key = ordering.lstrip("-")
    reverse = ordering.startswith("-")
    if key == "name" and not where.on_statistics():  # needs no statistics: the index only lends its rates
        idx = await index(broker, wait=False)
        chosen.sort(key=lambda d: (d.name, d.kind), reverse=reverse)
    else:
        idx = await index(broker)
        assert idx is not None
        counters = await _counters(broker, idx, [d.uri for d in chosen])
        if where.non_empty is not None:
            messages = _value(counters, "messages")
            chosen = [d for d in chosen if (messages(d) > 0) == where.non_empty]
        if where.has_consumers is not None:
            consumers = _value(counters, "consumer_count")
            chosen = [d for d in chosen if (consumers(d) > 0) == where.has_consumers]
        if key == "name":
            chosen.sort(key=lambda d: (d.name, d.kind), reverse=reverse)
        else:
            chosen.sort(key=lambda d: d.name)
            # stable: ties stay in name order
            chosen.sort(key=_value(counters, key), reverse=reverse)
    page = chosen[offset:offset + limit]
    fresh = await broker.stats_many([d.uri for d in page])
    return len(chosen), [row(s, idx) for s in fresh if s is not None], hidden


async def totals(broker: AsyncBroker, patterns: list[Destination] | None,
                 idx: Index | None = None) -> dict[str, Any]:
    """Broker totals over the destinations the user may read (ActiveMQ's BrokerView totals), from `idx`
    (the statistics index, read now when not given: a caller that also uses it passes the one it read)."""
    if idx is None:
        idx = await index(broker)
    assert idx is not None
    everything = patterns is None  # the same for every user who may read everything: computed once
    if everything and _totals_memo.get(broker.namespace, (None,))[0] == idx.at_ms:
        out = dict(_totals_memo[broker.namespace][1])
        out["index_age_ms"] = broker.clock.now_ms() - idx.at_ms
        return out
    names = ("queue_size", "pending", "in_flight", "enqueued", "dequeued", "expired", "deadlettered",
             "parked")
    positions = [FIELDS.index(n) for n in names]
    out: dict[str, Any] = {"destinations": 0, "queues": 0, "topics": 0, "consumers": 0,
                           **{n: 0 for n in names}, "enqueue_rate": 0.0, "dequeue_rate": 0.0,
                           "messages": 0, "topic_messages": 0, "largest": None}
    consumers = FIELDS.index("consumer_count")
    pending, in_flight = FIELDS.index("pending"), FIELDS.index("in_flight")
    largest = (0, "")
    sizes = NO_SIZES
    size_at = len(FIELDS)
    share = LoopShare()
    for uri, values in idx.rows.items():
        await share.pause()
        if patterns is not None:
            destination = parse_destination(uri)
            if not permissions.visible(patterns, destination):
                continue
        out["destinations"] += 1
        is_topic = uri.startswith("topic://")
        out["topics" if is_topic else "queues"] += 1
        messages = values[pending] + values[in_flight]
        out["messages"] += messages
        if is_topic:
            out["topic_messages"] += messages
        largest = max(largest, (messages, uri))
        for n, i in zip(names, positions, strict=True):
            out[n] += values[i]
        out["consumers"] += values[consumers]
        if len(values) > size_at + len(RATES):  # (an index built before SIZES has none)
            sizes = sizes.combined(MessageSizes(*(int(v) for v in values[size_at:size_at + len(SIZES)])))
        out["enqueue_rate"] += values[-2]
        out["dequeue_rate"] += values[-1]
    out["enqueue_rate"] = round(out["enqueue_rate"], 2)
    out["dequeue_rate"] = round(out["dequeue_rate"], 2)
    # ActiveMQ's broker view: every destination's sizes added to the broker's as they come
    out["message_sizes"] = {"count": sizes.count, "total": sizes.total, "smallest": sizes.smallest,
                            "largest": sizes.largest, "average": sizes.average}
    if largest[0] > 0:  # the destination with the most messages (the overview names it)
        out["largest"] = {"destination": largest[1], "messages": largest[0]}
    if everything:
        _totals_memo[broker.namespace] = (idx.at_ms, dict(out))
    out["index_age_ms"] = broker.clock.now_ms() - idx.at_ms
    return out


_totals_memo: dict[str, tuple[int, dict[str, Any]]] = {}
