"""The topic operations (spec §7, §8.5), written like the queue operations: generators of effects.

The router (ops/router.py) hands topic destinations to these functions; the scripts are
scripts/lua/topic_*.lua, and the operations on a home (ops/homes.py: the queue scripts) run on each
subscription's home (its key prefix inside the topic's hash tag: broker_core/topics.py explains the
layout), as ops/queues.py runs them on a queue. This module does not call ops/queues.py, nor it this one.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgpack

from ..config.entry import PolicyEntry
from ..destinations import Destination
from ..effects import Command, Forward, NoDestination, Op, Policy
from ..errors import DurableSubscriptionInUse, InvalidConsumer, UnknownConsumer, UnknownDestination
from ..keys import Home, durables_key, usage_key, wildcards_key
from ..messages import Message
from ..model import (
    Consumer,
    ConsumerSpec,
    DestinationStats,
    DestinationSummary,
    DispatchResult,
    SweepResult,
    discard_counts,
)
from ..replies import bound_stats, forward_stats, memory_stats, tallies
from ..resp import reply_text as _str
from ..scripts import calls
from ..scripts.calls import (
    FANOUT_UNFINISHED,
    FORWARDS_WAITING,
    PASS_HAS_MORE,
    CatchingUp,
    Closing,
    Elsewhere,
    Sent,
    Tail,
)
from ..topics import SubscriptionStats, durable_key, durable_registry_field, non_durable_key, pack_for_topic
from . import flow, homes, virtual
from .context import Context


def idle_pattern_topics(ops: Context) -> Op:
    """The uris of the pseudo-topics whose pattern lost its last subscription while keys remain there
    (<ns>:wildcards:idle, scripts/lua/includes/wildcard.lua): maintenance delivers what waits in their
    forwarding hash (a wildcard subscription's dead letters), then `drop_idle_pattern` removes them."""
    reply = yield Command(("SMEMBERS", f"{wildcards_key(ops.namespace)}:idle"))
    return sorted(f"topic://{_str(p)}" for p in reply)


def drop_idle_pattern(ops: Context, dest: Destination, now: int, jobs: tuple[str, ...]) -> Op:
    """Remove an idle pattern's pseudo-topic keys in one step once nothing waits there and none of the
    maintenance `jobs` holds a lease on it; True if they went, False if it must wait (or is subscribed
    again, which takes it out of the idle set)."""
    return calls.TopicAdmin.parse_drop_idle((yield calls.TopicAdmin.drop_idle(ops.prefix(dest), now, jobs)))


def subscription_keys(ops: Context, topic: Destination) -> Op:
    reply = yield Command(("LRANGE", f"{ops.prefix(topic)}:sorder", 0, -1))
    return [_str(k) for k in reply]


def send(ops: Context, dest: Destination, messages: Iterable[Message], now: int,
         also: tuple[Destination, ...] = (), kind: str = "producer") -> Op:
    # `also`, a client-side composite's other parts, recorded as copies; `kind` as queues.send_packed's
    origin = yield from virtual.origin(ops, dest, kind, also)
    records = [pack_for_topic(message, now) for message in messages]

    def finish(sent: Sent) -> Op:
        yield from finish_send(ops, dest, now, sent.tail)
        return sent.statuses

    # in parts, waiting for space or raising as a queue send does (flow.send_parts)
    return (yield from flow.send_parts(ops, dest, now, calls.TopicSend, origin, records, finish))


def finish_send(ops: Context, dest: Destination, now: int, tail: Tail) -> Op:
    """After topic_send (or topic_fanout): forwards (dead letters of evictions, expiries), the passes that
    have more, and the rest of the fan-out when the send left it unfinished."""
    if tail.flags & FORWARDS_WAITING:
        yield Forward(dest, now)
    for key in tail.more:
        yield from ops.continue_dispatch(Home(dest, key), now, PASS_HAS_MORE, 0)
    if tail.flags & FANOUT_UNFINISHED:
        yield from fan_out(ops, dest, now)


def fan_out(ops: Context, dest: Destination, now: int) -> Op:
    """Go on with the topic's unfinished fan-outs (scripts/lua/topic_fanout.lua), a call's worth of selector
    work per call, until those queued when it started are done: the sender's own messages are among them
    (a fan-out is FIFO), and a stream of later sends does not keep it here. Safe from several processes at
    once (each call moves a message's index in its list past the subscriptions it matched). Returns how
    many it finished."""
    finished, owed = 0, None
    while True:
        try:
            fanned = calls.TopicFanout.parse((yield calls.TopicFanout.call(ops.prefix(dest), now)))
        except NoDestination:  # deleted meanwhile: its messages went with it
            return finished
        finished += fanned.finished
        left = fanned.left
        if owed is None:
            owed = finished + left
        yield from finish_send(ops, dest, now, fanned.tail)
        if left == 0 or finished >= owed:
            return finished


def settle(ops: Context, dest: Destination, now: int) -> Op:
    """Finish what sends to the topic started when nobody read their replies (a transaction's commit, one
    MULTI/EXEC: the router runs this for its `Settle` effect): the outbox, every subscription's pass, and
    the unfinished fan-outs."""
    yield Forward(dest, now)
    yield from dispatch(ops, dest, now)
    yield from fan_out(ops, dest, now)


ADVISORY_PREFIX = "ActiveMQ.Advisory."
MOVE_ATTEMPTS = 5  # a durable key re-subscribed elsewhere at the same moment: bounded retries


def subscribe(ops: Context, dest: Destination, spec: ConsumerSpec, now: int, cid: str,
              packed: bytes, selector_compiled: str | None) -> Op:
    durable = spec.subscription_name is not None
    client = spec.client_id or ""
    name = spec.subscription_name or ""
    if durable and dest.name.startswith(ADVISORY_PREFIX):
        # §7.4, TopicRegion.addConsumer
        raise InvalidConsumer(f"Cannot create a durable subscription for an advisory Topic ({dest.uri})",
                              field="subscription_name")
    if dest.is_wildcard and spec.retroactive:
        # ActiveMQ recovers from every matching topic; here a pattern's pseudo-topic has no recovery
        # buffer of its own and the matching topics are other hash tags (docs/broker_core.md).
        raise InvalidConsumer(f"retroactive consumers are not supported on wildcard topics ({dest.uri}): "
                              "subscribe to each topic to recover its messages", field="retroactive")
    if spec.no_local and not spec.connection_id:
        # §7.3: noLocal compares the publisher's connection id with the subscriber's; without one it
        # could never filter anything.
        raise InvalidConsumer("no_local needs the subscriber's connection_id", field="connection_id")
    key = durable_key(client, name) if durable else non_durable_key(cid)
    field = durable_registry_field(client, name) if durable else ""
    sub_def = {"selector": selector_compiled, "selector_text": homes.selector_text(spec),
               "nolocal": spec.no_local, "conn": spec.connection_id, "client": spec.client_id,
               "name": spec.subscription_name, "durable": durable, "priority": spec.priority,
               "maxpending": spec.maximum_pending_message_limit}
    sub_packed = msgpack.packb({k: v for k, v in sub_def.items() if v is not None})
    requested = -1 if spec.prefetch is None else spec.prefetch
    for _ in range(MOVE_ATTEMPTS):
        # topic_subscribe validates everything, then registers the durable key with the subscription in
        # one step; a key registered on another topic comes back as 'elsewhere' with nothing changed.
        call = calls.TopicSubscribe.call(ops.prefix(dest), now, cid, packed, spec.lease_ms, requested, key,
                                         sub_packed, spec.retroactive, client, name, field, dest.uri,
                                         ops.backlog_checks)
        subscribed = calls.TopicSubscribe.parse((yield from ops.eval(Home(dest), now, call)))
        if isinstance(subscribed, Closing):
            # the durable subscription's last consumer had this id and its messages are still going
            # back (return_owed): finish that, then subscribe
            yield from homes.return_owed(ops, Home(dest, key), now)
            continue
        if isinstance(subscribed, CatchingUp):
            # made retroactive, it has not had its whole backlog yet (its subscriber's process died while
            # catching it up): finish that, then subscribe
            yield from catch_up(ops, Home(dest, key), now)
            continue
        if not isinstance(subscribed, Elsewhere):
            break
        # Re-subscribing with another topic replaces the subscription (TopicRegion.addConsumer): the old
        # one goes (and its registry entry with it, one step), then the subscribe runs again. A crash in
        # between leaves the key free, never on two topics.
        old = Destination("topic", subscribed.uri.removeprefix("topic://"))
        try:
            yield from ops.eval(Home(old), now, calls.TopicAdmin.release(ops.prefix(old), now, key, field,
                                                                         old.uri))
            yield from homes.return_owed(ops, Home(old), now)
        except DurableSubscriptionInUse:
            raise DurableSubscriptionInUse(
                f"Durable consumer is in use for client: {client} and subscriptionName: {name}",
                client_id=client, subscription_name=name) from None
    else:
        raise DurableSubscriptionInUse(
            f"Durable subscription for client: {client} and subscriptionName: {name} is being "
            "re-subscribed elsewhere at the same time", client_id=client, subscription_name=name)
    assert isinstance(subscribed, calls.Subscribed)  # (the loop ends on one, or raises)
    result = yield from ops.continue_dispatch(Home(dest, key), now, subscribed.tail.flags,
                                              subscribed.tail.hold_until)
    if subscribed.catching_up:  # the rest of its backlog, before the consumer is handed back
        result = yield from catch_up(ops, Home(dest, key), now)
    if subscribed.changed:  # the replaced subscription's messages are released a chunk per call
        yield from homes.return_owed(ops, Home(dest), now)
    return Consumer(dest, cid, spec.ack_mode, prefetch=subscribed.prefetch, hold_until=result.hold_until,
                    subscription=key)


def catch_up(ops: Context, sub: Home, now: int) -> Op:
    """Go on with a new retroactive durable subscription's catch-up on the messages stored for the other
    durable subscriptions when it was made (scripts/lua/topic_catchup.lua, includes/topic.lua catch_up),
    `ops.backlog_checks` stored messages per call, until it is done; then its dispatch. Safe from several
    processes at once (the maintenance tick finishes one whose driver died). Returns the dispatch's
    result."""
    result = DispatchResult(0, 0)
    while True:
        try:
            caught = calls.TopicCatchup.parse((yield calls.TopicCatchup.call(
                ops.prefix(sub.destination), now, sub.key, ops.backlog_checks)))
        except NoDestination:  # deleted meanwhile: the subscription went with it
            return result
        result = yield from ops.continue_dispatch(sub, now, caught.tail.flags, caught.tail.hold_until)
        if not caught.more:
            return result


def wildcard_dead_letter_target(ops: Context, pattern: Destination, copy: bytes,
                                recorded: Destination) -> Op:
    """Where a dead letter from a wildcard subscription goes: the pattern's policy strategy applied to
    the topic the message was published to (its dead-letter copy's original destination), as ActiveMQ
    dead-letters it from that topic; `recorded` (the pattern's own target) when that is unknown."""
    published = msgpack.unpackb(copy, raw=True)[16]  # messages.py: the original destination
    if not published or not published.startswith(b"topic://"):
        return recorded
    entry: PolicyEntry = yield Policy(pattern)
    target = entry.dead_letter_destination_for(Destination("topic", published.decode().removeprefix("topic://")))
    return target if target is not None else recorded


def durable_home(ops: Context, client_id: str, subscription_name: str) -> Op:
    """The topic the durable key is registered on, or None."""
    where = yield Command(("HGET", durables_key(ops.namespace),
                           durable_registry_field(client_id, subscription_name)))
    return None if where is None else Destination("topic", _str(where).removeprefix("topic://"))


def unsubscribe(ops: Context, dest: Destination, client_id: str, subscription_name: str, now: int,
                reason: str = "unsubscribed") -> Op:
    """Delete an offline durable subscription and its messages; returns how many messages went.

    The key alone names it (ActiveMQ's RemoveSubscriptionInfo carries no destination, §7.4): the registry
    says which topic it is on; `dest` is only used for a key the registry does not know."""
    if not client_id or not subscription_name:
        raise InvalidConsumer("unsubscribe needs the client id and the subscription name",
                              field="subscription_name")
    home_topic = yield from durable_home(ops, client_id, subscription_name)
    if home_topic is not None:
        dest = home_topic
    exists = yield Command(("EXISTS", f"{ops.prefix(dest)}:policy"))
    if not exists:
        raise UnknownDestination(f"no destination {dest.uri}", destination=dest.uri)
    # topic_admin removes the subscription and its registry entry in one step.
    call = calls.TopicAdmin.unsubscribe(ops.prefix(dest), now, durable_key(client_id, subscription_name),
                                        client_id, subscription_name)
    dropped = calls.TopicAdmin.parse_dropped((yield from ops.eval(Home(dest), now, call)))
    yield from homes.return_owed(ops, Home(dest), now)  # its messages are released a chunk per call
    return dropped


# The offline-durable cleanup's script calls (topic_admin expire_offline): subscriptions looked at (one
# HMGET of its meta each), and removed (~15 commands each, as a deletion's), at most per call.
OFFLINE_LOOKS = 1_000
OFFLINE_REMOVALS = 50


def expire_offline_durables(ops: Context, dest: Destination, timeout_ms: int | None, now: int) -> Op:
    """Remove the durable subscriptions offline for `timeout_ms` (None: the policy's
    offlineDurableSubscriberTimeout) or more, with their registry entries; returns their keys. The topic's
    subscriptions are looked at OFFLINE_LOOKS a call, OFFLINE_REMOVALS removed at most."""
    if timeout_ms is None:
        entry: PolicyEntry = yield Policy(dest)
        timeout_ms = entry.offline_durable_subscriber_timeout
    if timeout_ms < 0:
        return []
    removed: list[str] = []
    start = 0
    while start >= 0:
        call = calls.TopicAdmin.expire_offline(ops.prefix(dest), now, timeout_ms, start, OFFLINE_LOOKS,
                                               OFFLINE_REMOVALS)
        start, keys = calls.TopicAdmin.parse_expired((yield from ops.eval(Home(dest), now, call)))
        removed += keys
    if removed:
        yield from homes.return_owed(ops, Home(dest), now)  # their messages are released a chunk per call
    return removed


def renew(ops: Context, dest: Destination, consumer_ids: list[str], lease_ms: int, now: int) -> Op:
    missing: list[str] = []
    for cid in consumer_ids:
        try:
            sub = yield from ops.subscription_home(dest, cid, None)
        except UnknownConsumer:
            missing.append(cid)
            continue
        missing += (yield from homes.renew(ops, sub, [cid], lease_ms, now))
    return missing


def for_each_subscription(ops: Context, dest: Destination) -> Op:
    """The homes of the topic's subscriptions, in subscription order."""
    keys = yield from subscription_keys(ops, dest)
    return [Home(dest, key) for key in keys]


def reap(ops: Context, dest: Destination, now: int, limit: int) -> Op:
    closed: list[str] = []
    for sub in (yield from for_each_subscription(ops, dest)):
        closed += (yield from homes.reap(ops, sub, now, limit - len(closed)))
        if len(closed) >= limit:
            break
    return closed


def dispatch(ops: Context, dest: Destination, now: int) -> Op:
    """Fire the topic's own jobs that are due (its scheduled messages, published to the subscriptions of
    now: lifecycle.lua fire_scheduled), then run each subscription's dispatch."""
    own = yield from homes.dispatch(ops, Home(dest), now)
    dispatched, hold = 0, own.hold_until
    for sub in (yield from for_each_subscription(ops, dest)):
        result = yield from homes.dispatch(ops, sub, now)
        dispatched += result.dispatched
        if result.hold_until and (not hold or result.hold_until < hold):
            hold = result.hold_until
    return DispatchResult(dispatched, hold)


def sweep_expired(ops: Context, dest: Destination, now: int) -> Op:
    """One page of each subscription's expiry sweep."""
    examined = expired = 0
    done = True
    for sub in (yield from for_each_subscription(ops, dest)):
        page = yield from homes.sweep_expired(ops, sub, now)
        examined += page.examined
        expired += page.expired
        done = done and page.done
    return SweepResult(examined, expired, done)


# subscriptions a topic_admin 'limits' call reads: about 3 ms (docs/benchmarks.md, "Session 30")
LIMITS_PAGE = 100


def pending_limits(ops: Context, dest: Destination, now: int) -> Op:
    """Subscription key -> the pending-message limit in force, as the send script computes it (§8.5), read
    LIMITS_PAGE subscriptions a call."""
    limits: dict[str, int] = {}
    start = 0
    while start >= 0:
        call = calls.TopicAdmin.limits(ops.prefix(dest), now, start, LIMITS_PAGE)
        start, page = calls.TopicAdmin.parse_limits((yield from ops.eval(Home(dest), now, call)))
        limits.update(page)
    return limits


def subscription_stats(ops: Context, sub: Home, now: int, limits: dict[str, int]) -> Op:
    """One subscription's SubscriptionStats and its consumers; `limits` from `pending_limits`."""
    st: DestinationStats = yield from homes.stats(ops, sub, now)
    raw = yield Command(("HGETALL", f"{ops.home_prefix(sub)}:meta"))
    meta = {_str(k): _str(v) for k, v in raw.items()}
    consumer = st.consumers[0] if st.consumers else None
    durable = meta.get("durable") == "1"

    def count(name: str) -> int:
        return int(meta.get(name, 0))

    return SubscriptionStats(
        key=sub.key, durable=durable, client_id=meta.get("client") or None,
        subscription_name=meta.get("name") or None, selector=meta.get("selector") or None,
        no_local=meta.get("nolocal") == "1", consumer_id=meta.get("active") or None,
        active=bool(meta.get("active")), offline_since=int(meta["offline_since"]) if meta.get("offline_since")
        else None, created=count("created"), pending=st.pending, in_flight=st.in_flight, parked=st.parked,
        enqueued=count("enqueued"), dispatched=count("dispatched"), dequeued=count("dequeued"),
        evicted=count("evicted"), dropped=count("dropped"), expired=count("expired"),
        deadlettered=count("deadlettered"), discarded=count("discarded"),
        prefetch=consumer.prefetch if consumer else 0, slow_since=consumer.slow_since if consumer else None,
        retroactive=meta.get("retroactive") == "1", pending_message_limit=limits.get(sub.key, -1),
    ), st.consumers


def subscriptions(ops: Context, dest: Destination, now: int) -> Op:
    out: list[SubscriptionStats] = []
    limits = yield from pending_limits(ops, dest, now)
    for sub in (yield from for_each_subscription(ops, dest)):
        stats, _ = yield from subscription_stats(ops, sub, now, limits)
        out.append(stats)
    return out


def stats(ops: Context, dest: Destination, now: int) -> Op:
    """The topic's view (§14.2): its counters, its subscriptions, and their consumers; QueueSize is 0
    for topics, as in ActiveMQ (AMQ-2586)."""
    raw = yield Command(("HGETALL", f"{ops.prefix(dest)}:meta"))
    meta = {_str(k): _str(v) for k, v in raw.items()}
    if "uri" not in meta:
        raise UnknownDestination(f"no destination {dest.uri}", destination=dest.uri)
    subs: list[SubscriptionStats] = []
    consumers = []
    limits = yield from pending_limits(ops, dest, now)
    for sub in (yield from for_each_subscription(ops, dest)):
        one, cons = yield from subscription_stats(ops, sub, now, limits)
        subs.append(one)
        consumers += cons
    fwd = yield Command(("HLEN", f"{ops.prefix(dest)}:fwd"))
    # its scheduled messages, kept on the topic until they fire (topic_send.lua): parked, as a queue's jobs;
    # its subscriptions' parked messages are only ever waiting for a redelivery delay (firings reach them
    # without a schedule)
    jobs = int((yield Command(("ZCARD", f"{ops.prefix(dest)}:parked"))))
    events = int((yield Command(("XLEN", f"{ops.prefix(dest)}:events")))) + int(meta.get("events_extra", 0))
    audit_size = int((yield Command(("ZCARD", f"{ops.prefix(dest)}:audit"))))
    # the memory limit in force (the topic's memoryLimit, else the broker's), as for queues
    own_limit = _str((yield Command(("HGET", f"{ops.prefix(dest)}:policy", "memoryLimit"))) or b"0")
    broker_limit = _str((yield Command(("HGET", usage_key(ops.namespace), "limit"))) or b"")

    def count(name: str) -> int:
        return int(meta.get(name, 0))

    def total(name: str) -> int:
        # The live subscriptions' counts plus those of ended ones (remove_subscription folds them into the
        # topic as 'ended_<name>'): a topic's counts never go down (§14.2).
        return sum(getattr(s, name) for s in subs) + count(f"ended_{name}")

    return DestinationStats(
        destination=dest.uri, queue_size=0, pending=total("pending"), in_flight=total("in_flight"),
        enqueued=count("enqueued"), dequeued=total("dequeued") + count("evict_dequeued"),
        dispatched=total("dispatched"),
        expired=count("expired") + total("expired"), expired_on_arrival=count("expired_on_arrival"),
        deadlettered=count("deadlettered") + total("deadlettered"),
        parked=total("parked") + jobs, scheduled=jobs, redelivery_delayed=total("parked"),
        forwarding=int(fwd),
        # the parts of the rate history's "discarded" series, each as rate_sample.lua reads it: the live
        # subscriptions' and the ended ones' (`total`), and for dead letters the topic's own too
        **discard_counts(total("evicted"), total("dropped"), count("discarded") + total("discarded")),
        purged=0, moved=0, cancelled=count("cancelled"), duplicates=count("duplicates"), skipped=0,
        last_pass_skipped=0,
        consumer_count=len(subs), group_count=0, paused=False, exclusive_owner=None, consumers=consumers,
        **tallies(meta), **memory_stats(meta, own_limit, broker_limit), **forward_stats(meta),
        **bound_stats(meta, events, audit_size),
        subscriptions=subs, no_subscription=count("no_subscription"),
        durable_active=sum(1 for s in subs if s.durable and s.active),
        durable_offline=sum(1 for s in subs if s.durable and not s.active),
        removed_with_subscription=count("sub_removed"),
        selector_errors=count("selector_errors"),
    )


# Work per topic_summary_many call: one unit per topic, one per subscription read (each ~5 Redis commands
# inside the script). 100 keep a call under a millisecond (bench/adversarial.py, "metrics: topic
# summaries"), below a queue page's; a page of 50 topics with a subscription each is one call, a topic with
# more subscriptions takes several.
SUMMARY_BUDGET = 100


def summaries(ops: Context, topics: list[Destination], now: int,
              budget: int = SUMMARY_BUDGET) -> Op:
    """The `DestinationSummary` of each topic (None for one that does not exist), as `stats` adds them up
    (`summary_of(stats(t))` equals it), in topic_summary_many calls of at most `budget` units of work: a
    topic whose subscriptions do not fit in one call is continued in the next. (Parts read in different
    calls are not one snapshot: a subscription made or removed between them may be missed or counted
    twice; the figure is a monitoring one.)"""
    out: list[DestinationSummary | None] = []
    acc: calls.TopicSummaryPart | None = None  # the parts read so far of a topic read over several calls
    remaining, start, budget = list(topics), 0, max(1, budget)
    while remaining:
        parts = calls.TopicSummaryMany.parse((yield calls.TopicSummaryMany.call(
            tuple(ops.prefix(t) for t in remaining), now, start, budget)))
        done = 0
        for part in parts:
            # a continued topic: the sums (pending .. parked, dequeued .. deadlettered) grow
            acc = part if acc is None else acc.continued_by(part)
            if part.next:  # the topic goes on in the next call, from there
                start = part.next
                break
            t = remaining[done]
            # (QueueSize 0 and no groups, as stats; never paused; no oldest: messages wait per
            # subscription)
            out.append(DestinationSummary(
                t.uri, 0, acc.pending, acc.in_flight, acc.parked, 0, acc.subscriptions, acc.enqueued,
                acc.dequeued, acc.dispatched, acc.expired, acc.deadlettered, False, acc.memory, None,
                memory_limit=acc.memory_limit, message_sizes=acc.message_sizes,
                enqueue_times=acc.enqueue_times) if acc.exists else None)
            acc, start, done = None, 0, done + 1
        remaining = remaining[done:]
    return out


# Subscriptions removed per topic_admin delete call: each is ~15 Redis commands inside the script (its
# keys set aside or unlinked, its registry entry), so 50 keep a call near 5 ms (2,000 in one call took
# 300 ms; tests/broker_core/test_topic_delete.py).
DELETE_SUBSCRIPTIONS = 50


def delete(ops: Context, dest: Destination, now: int, jobs: bool = True) -> Op:
    """Remove a topic's subscriptions before it is deleted: every one, durable ones included, active or not
    (its consumers learn it from UNKNOWN_CONSUMER), DELETE_SUBSCRIPTIONS per call; the topic's own keys go
    with its deletion (destination_delete.lua, which refuses while a subscription made meanwhile is
    there: Router.delete_destination calls this again, `jobs` False). Returns how many messages went:
    those its subscriptions held, each subscription's counted (the topic's Pending, and what
    unsubscribing each would report), plus (`jobs`) its scheduled messages not yet published."""
    removed = int((yield Command(("ZCARD", f"{ops.prefix(dest)}:parked")))) if jobs else 0
    while True:
        dropped, left = calls.TopicAdmin.parse_delete((yield from ops.eval(
            Home(dest), now, calls.TopicAdmin.delete(ops.prefix(dest), now, DELETE_SUBSCRIPTIONS))))
        removed += dropped
        if not left:
            break
    if dest.is_wildcard:  # its last subscription made it idle (wildcard.lua forget): nothing is left of it
        yield Command(("SREM", f"{wildcards_key(ops.namespace)}:idle", dest.name))
    return removed
