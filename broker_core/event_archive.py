"""A destination's lifecycle event stream (`<prefix>:events`, which every script appends to) as the event
archive (analytics/archive.py) drains it: a range of entries read, entries trimmed once archived, Redis's
clock (the stream ids are its milliseconds), and the archive's checkpoint hash beside the stream
(`<prefix>:archive`, in the destination's hash tag). The archive decides what to read and when to trim;
these are the reads and writes of broker_core's keys it needs, so no adapter names them (issue #22).
Blocking, over the Broker's redis-py client, as maintenance.py's jobs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .destinations import Destination
from .effects import single
from .scripts import calls

if TYPE_CHECKING:
    from .broker import Broker


def events_key(broker: Broker, dest: Destination) -> str:
    return broker.ops.events_key(dest)


def checkpoint_key(broker: Broker, dest: Destination) -> str:
    return f"{broker.ops.prefix(dest)}:archive"


def read_range(broker: Broker, dest: Destination, first: str, last: str, count: int) -> list[tuple[Any, Any]]:
    """Up to `count` entries from `first` to `last` (XRANGE bounds): (id, fields) pairs."""
    return broker.redis.xrange(events_key(broker, dest), first, last, count=count)


TRIM_STEP = 100  # entries per script call: each holds up to 100 events (base.lua EVENTS_PER_ENTRY)


def trim(broker: Broker, dest: Destination, min_id: str) -> int:
    """Drop the entries with ids below `min_id`, TRIM_STEP a script call (events_trim.lua, which keeps the
    stream's count of events exact); returns how many events went."""
    gone = 0
    while True:
        entries, events = calls.EventsTrim.parse(broker._run(single(calls.EventsTrim.call(
            broker.ops.prefix(dest), min_id, TRIM_STEP))))
        gone += events
        if entries < TRIM_STEP:
            return gone


def server_time_ms(broker: Broker) -> int:
    """Redis's clock (TIME), in milliseconds: the clock of the stream ids."""
    seconds, micros = broker.redis.time()
    return seconds * 1000 + micros // 1000


def checkpoint(broker: Broker, dest: Destination) -> dict[bytes, bytes]:
    """The archive's checkpoint hash, as stored."""
    return broker.redis.hgetall(checkpoint_key(broker, dest))


def checkpoint_fields(broker: Broker, dest: Destination, *fields: str) -> list[Any]:
    return broker.redis.hmget(checkpoint_key(broker, dest), *fields)


def begin_batch(broker: Broker, dest: Destination, first_id: str, last_id: str) -> tuple[str | None, int]:
    """Record the batch about to be written (`pending`), so a run after a crash writes the same one. In the
    same MULTI: the batch's oldest entry still in the stream (None: none is) and the stream's count of events
    its cap dropped before the archive read them (`events_lost` in the owner's meta hash: base.lua
    write_stream), which from here on no longer counts this batch's entries."""
    key = checkpoint_key(broker, dest)
    pipe = broker.redis.pipeline(transaction=True)
    pipe.hset(key, "pending", f"{first_id} {last_id}")
    pipe.xrange(events_key(broker, dest), first_id, last_id, count=1)
    pipe.hget(f"{broker.ops.prefix(dest)}:meta", "events_lost")
    _, oldest, lost = pipe.execute()
    return (oldest[0][0] if oldest else None), int(lost or 0)


def record_loss(broker: Broker, dest: Destination, lost: int, lost_seen: int) -> None:
    """The pending batch's loss (the events dropped unread before it) and the `events_lost` count it
    accounts up to, kept with `pending` so that a run after a crash writes the same loss."""
    broker.redis.hset(checkpoint_key(broker, dest), mapping={"pending_lost": lost, "pending_seen": lost_seen})


def end_batch(broker: Broker, dest: Destination, last_id: str, now_ms: int, archived: int,
              lost: int = 0, lost_seen: int | None = None) -> None:
    """The batch is written: `last` moves to its last id, `lost` and `lost_seen` (the `events_lost` count
    accounted for) follow, and `pending` goes, in one MULTI."""
    key = checkpoint_key(broker, dest)
    pipe = broker.redis.pipeline(transaction=True)
    pipe.hset(key, mapping={"last": last_id, "last_run_ms": now_ms,
                            **({} if lost_seen is None else {"lost_seen": lost_seen})})
    pipe.hdel(key, "pending", "pending_lost", "pending_seen")
    pipe.hincrby(key, "archived", archived)
    pipe.hincrby(key, "lost", lost)
    pipe.execute()
