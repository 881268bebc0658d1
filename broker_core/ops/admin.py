"""A destination's life: creating it on first use (what the router runs for a `Create` effect), the
registry, policy refreshes, and deleting its keys.
"""

from __future__ import annotations

from ..destinations import Destination, parse_destination
from ..effects import Command, Op
from ..keys import due_key, wildcards_key
from ..resp import reply_text as _str
from ..scripts import calls
from . import advisory, virtual
from .context import Context

DESTINATIONS_PAGE = 500  # registry entries per ZSCAN
# Entries of a destination's large parts (forward records, consumers, closed consumers, ended
# subscriptions' keys, queued fan-outs, reservations) its deletion drains per call before the last
# (destination_delete.lua): 30,000 owed copies in one call took 470 ms, 200 a call at most 3 ms of the
# server's CPU (docs/benchmarks.md, "Session 30: a destination's deletion bounded").
DELETE_CHUNK = 200


def init_destination(ops: Context, dest: Destination, now: int) -> Op:
    """Create a destination (idempotent): its resolved policy, its name, its registry entry."""
    yield from ops.write_policy(dest)
    prefix = ops.prefix(dest)
    yield Command(("HSETNX", f"{prefix}:meta", "uri", dest.uri))
    new = yield Command(("HSETNX", f"{prefix}:meta", "created", now))
    if new and dest.is_topic:
        # every reference to its messages is weighted (a durable subscription's 2^32): a new retroactive
        # durable subscription's catch-up reads the counts alone (scripts/lua/includes/topic.lua catch_up)
        yield Command(("HSETNX", f"{prefix}:meta", "weighted_after", 0))
    # into the maintenance index (broker_core/maintenance.py), due now: its first visit schedules it
    yield Command(("ZADD", f"{due_key(ops.namespace)}:periodic", "NX", now, prefix))
    if dest.is_wildcard:
        # a wildcard subscription's pseudo-topic is no destination: not listed, no advisory; maintenance
        # and policy refreshes find it in <ns>:wildcards (pattern_topics)
        return
    created = yield Command(("ZADD", ops.registry_key, "NX", now, dest.uri))
    yield from virtual.on_created(ops, dest)  # a virtual topic's consumer queue joins
    if created:  # ActiveMQ.Advisory.Queue / .Topic (advisory.py)
        yield from advisory.destination_changed(ops, dest, now, added=True)


def destinations(ops: Context) -> Op:
    """Every destination's URI, in creation order (the registry's), read DESTINATIONS_PAGE at a time
    (ZSCAN, which may repeat a name: kept once), so no call reads 10,000 destinations."""
    found: dict[str, float] = {}
    cursor = 0
    while True:
        cursor, page = yield Command(("ZSCAN", ops.registry_key, cursor, "COUNT", DESTINATIONS_PAGE))
        found.update((_str(uri), score) for uri, score in page)  # redis-py: (member, score) pairs
        if int(cursor) == 0:
            # by name, then (stable) by score: the order of a (score, name) key without a Python call per
            # name, half the time (3.7 ms at 10,000, one hold of an asyncio caller's event loop)
            return sorted(sorted(found), key=found.__getitem__)


def pattern_topics(ops: Context) -> Op:
    """The uris of the wildcard subscriptions' pseudo-topics (`topic://orders.>`): not in the destination
    registry, so maintenance and policy refreshes add these."""
    reply = yield Command(("SMEMBERS", wildcards_key(ops.namespace)))
    return sorted(f"topic://{_str(p)}" for p in reply)


def refresh_policies(ops: Context, now: int) -> Op:
    """Rewrite every destination's policy hash after the policy map changed at run time."""
    for uri in (yield from destinations(ops)) + (yield from pattern_topics(ops)):
        dest = parse_destination(uri, allow_wildcards=True)  # wildcard subscriptions' pseudo-topics too
        yield from ops.write_policy(dest)
        yield Command(("HSET", f"{ops.prefix(dest)}:meta", "dirty", "1"))


def begin_deletion(ops: Context, dest: Destination, now: int, tally: str) -> Op:
    """Record that the destination's deletion is under way (keys.deletions_key), before its first step
    (a topic's subscriptions' removal, a temporary queue's purge, the drain), so that maintenance finishes
    it if its driver dies (Router.finish_deletions); its last step removes the record. One MULTI/EXEC with
    the tally key the deletion counts in, so whoever finishes it counts it where it was meant to. A
    deletion already recorded keeps its time (and its tally)."""
    record = ("ZADD", ops.deletions_key, "NX", now, dest.uri)
    if not tally:
        yield Command(record)
        return
    yield [record, ("HSETNX", f"{ops.deletions_key}:tally", dest.uri, tally)]


def stalled_deletions(ops: Context, started_before: int, limit: int) -> Op:
    """Up to `limit` deletions under way since before `started_before` (ms), oldest first: [(uri, tally
    key or '')]."""
    uris = [_str(u) for u in (yield Command(("ZRANGE", ops.deletions_key, "-inf", started_before, "BYSCORE",
                                             "LIMIT", 0, limit)))]
    if not uris:
        return []
    tallies = yield Command(("HMGET", f"{ops.deletions_key}:tally", *uris))
    return [(uri, _str(tally) if tally else "") for uri, tally in zip(uris, tallies, strict=True)]


def take_over_deletion(ops: Context, uri: str, now: int) -> Op:
    """Take over a stalled deletion: its record's time moves to `now`, so the next ticks leave it to this
    one for the grace period; False when its record is gone (its driver finished it meanwhile)."""
    return bool((yield Command(("ZADD", ops.deletions_key, "XX", "CH", now, uri))))


def delete_destination(ops: Context, dest: Destination, now: int, tally: str = "") -> Op:
    """Delete a destination's own keys and its registry entry (a topic's subscriptions went first:
    topics.delete); returns how many messages its keys held, None (nothing deleted) for a topic that has
    a subscription again (Router._delete_topic removes it and calls again). Its deletion advisory, if
    anybody listens, goes through the advisory topic's outbox. `tally`: a hash that counts the deletion in
    the same step (a temporary destination's: Router.delete_temporary). Its large parts are drained
    DELETE_CHUNK entries a call first; the last call removes its record (begin_deletion). A deletion
    stopped between calls is finished by maintenance (Router.finish_deletions) or a repeated one."""
    while True:  # its large parts drained DELETE_CHUNK a call, then the rest deleted in the last call
        deleted = calls.DestinationDelete.parse((yield calls.DestinationDelete.call(
            ops.prefix(dest), now, ops.registry_key, dest.uri, tally, DELETE_CHUNK, ops.deletions_key)))
        if deleted != calls.DestinationDelete.DRAINING:
            break
    if deleted is None:  # a topic subscribed to since its subscriptions were removed: nothing was deleted
        return None
    assert isinstance(deleted, tuple)
    count, removed = deleted
    yield from virtual.on_deleted(ops, dest)
    if removed:
        yield from advisory.destination_changed(ops, dest, now, added=False)
    return count
