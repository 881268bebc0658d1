"""The operations on a home (keys.Home): a queue, or one subscription of a topic, which the queue scripts
run unchanged under its own key prefix. A subscription's home is queue-like storage, so what works on any
home is here once, below both kinds: the queue operations (ops/queues.py) run it on a queue, the topic
operations (ops/topics.py) on each subscription, transactions (ops/transactions.py) on the home of the
consumer that acknowledges; the router (ops/router.py) resolves a consumer's home and calls these for
consumers of either kind.

What is here: a consumer's definition, receiving, acknowledging (whole, in parts, negatively),
releasing, closing a consumer and returning what closed consumers owe, leases and reaping, a dispatch
pass, an expiry sweep, and a home's statistics. Each is a generator of effects (broker_core/effects.py),
as every operation (ops/queues.py says how).
"""

from __future__ import annotations

import re
import uuid

import msgpack

from ..effects import Command, Op
from ..errors import BrokerError, InvalidConsumer, NotInFlight, UnknownDestination
from ..keys import Home
from ..model import (
    AckRequest,
    ConsumerRef,
    ConsumerSpec,
    ConsumerStats,
    DestinationStats,
    DispatchResult,
    SweepResult,
    discard_counts,
)
from ..replies import bound_stats, forward_stats, memory_stats, tallies
from ..resp import reply_text as _str
from ..scripts import calls
from ..selector import CONVERT_STRING_EXPRESSIONS_PREFIX, parse_selector
from .context import Context

# No ':' so that a consumer's key names never collide with another consumer's (…:c:<id>:inflight).
_CONSUMER_ID = re.compile(r"[A-Za-z0-9._@-]{1,128}")
MAX_RECEIVE = 1_000  # messages one receive call takes (and the largest page a listing gives)
ACK_PART = 100  # ids per ack call: a larger individual ack is checked whole, then applied in parts
CUMULATIVE_MOST = 1_000  # messages one cumulative ack call takes (scripts/lua/ack.lua says the same)


# -- consuming -----------------------------------------------------------------------------------------


def selector_text(spec: ConsumerSpec) -> str | None:
    """A consumer's selector as ActiveMQ's ConsumerInfo holds it, which its advisories and management views
    show: a STOMP subscription's with the `convert_string_expressions:` prefix (its ProtocolConverter adds
    it); None without one."""
    if not (spec.selector and spec.selector.strip()):
        return None
    return f"{CONVERT_STRING_EXPRESSIONS_PREFIX}{spec.selector}" if spec.stomp_selector else spec.selector


def consumer_definition(spec: ConsumerSpec, consumer_id: str | None) -> tuple[str, bytes, str | None]:
    """A new consumer's id, its packed definition (what consumer_add.lua and topic_subscribe.lua store),
    and its compiled selector (None without one), after checking the spec."""
    spec.validate()
    selector = None
    if spec.selector and spec.selector.strip():
        selector = parse_selector(spec.selector, convert_string_expressions=spec.stomp_selector)
    cid = consumer_id or f"c-{uuid.uuid4().hex[:12]}"
    if not _CONSUMER_ID.fullmatch(cid):
        raise InvalidConsumer(
            f"consumer id {cid!r} must be 1-128 characters of letters, digits and . _ - @",
            field="consumer_id")
    definition = {
        "priority": spec.priority,
        "exclusive": spec.exclusive,
        "selector": selector.compiled if selector else None,
        "selector_text": selector_text(spec),
        "nolocal": spec.no_local,
        "conn": spec.connection_id,
        "client": spec.client_id,
        "ack": spec.ack_mode,
        "notify": spec.notify,
        "lease": spec.lease_ms,
    }
    packed = msgpack.packb({k: v for k, v in definition.items() if v is not None})
    return cid, packed, selector.compiled if selector else None


def receive(ops: Context, consumer: ConsumerRef, max_messages: int, now: int, lease_ms: int) -> Op:
    if not 1 <= max_messages <= MAX_RECEIVE:
        raise InvalidConsumer(f"max_messages must be 1-{MAX_RECEIVE}, got {max_messages}",
                              field="max_messages")
    home = (yield from ops.home(consumer)) if consumer.destination.is_topic else Home(consumer.destination)
    call = calls.Receive.call(ops.home_prefix(home), now, consumer.consumer_id, max_messages, lease_ms)
    reply = yield from ops.eval(home, now, call)
    got = calls.Receive.parse(reply, consumer.destination.uri, consumer.consumer_id)
    if got.tail.flags:
        yield from ops.continue_dispatch(home, now, got.tail.flags, got.tail.hold_until)
    return got.deliveries


def receive_after(ops: Context, consumer: ConsumerRef, after: int, max_messages: int, push: int, now: int,
                  lease_ms: int) -> Op:
    """`receive` for an adapter taking pushed deliveries: what was handed over after dispatch sequence
    `after` (pushed, lost or still on its way) first, then the outbox; when that leaves the outbox empty,
    up to `push` messages are pushed to the consumer from then on. Returns (deliveries, the dispatch
    sequence of the last one handed over: the next call's `after`)."""
    if not 1 <= max_messages <= MAX_RECEIVE:
        raise InvalidConsumer(f"max_messages must be 1-{MAX_RECEIVE}, got {max_messages}",
                              field="max_messages")
    home = (yield from ops.home(consumer)) if consumer.destination.is_topic else Home(consumer.destination)
    call = calls.Receive.after(ops.home_prefix(home), now, consumer.consumer_id, max_messages, lease_ms,
                               after, push)
    reply = yield from ops.eval(home, now, call)
    got = calls.Receive.parse_after(reply, consumer.destination.uri, consumer.consumer_id)
    if got.tail.flags:
        yield from ops.continue_dispatch(home, now, got.tail.flags, got.tail.hold_until)
    return got.deliveries, got.last


def cancel_pull(ops: Context, consumer: ConsumerRef, now: int) -> Op:
    home = yield from ops.home(consumer)
    yield from ops.eval(home, now, calls.CancelPull.call(ops.home_prefix(home), now, consumer.consumer_id))


def ack(ops: Context, consumer: ConsumerRef, message_ids: list[str], mode: str, now: int,
        receive: int = 0, home: Home | None = None) -> Op:
    """mode: 'individual', 'cumulative' or 'delivered' (see scripts/lua/ack.lua). Returns
    how many were acknowledged and, when `receive` > 0, up to that many next messages for the consumer.
    `home`: the consumer's, when the caller has it."""
    if not message_ids:
        raise NotInFlight("no message id given to acknowledge")
    if home is None and consumer.destination.is_topic:
        home = yield from ops.home(consumer)
    elif home is None:  # (a queue consumer's home is its queue: no generator for that, the usual case)
        home = Home(consumer.destination)
    return (yield from ack_many(ops, home, [(consumer, message_ids, mode, receive)], now))[0]


def ack_many(ops: Context, home: Home, requests: list[AckRequest], now: int) -> Op:
    """`ack` of several consumers of `home` (its home: a queue, or one subscription), each named once
    and with message ids, in one script call: all are checked before any is applied. Returns (acked,
    next messages) per request, in order. One consumer's ack of more than ACK_PART ids is checked
    whole, then applied in parts (ack_in_parts)."""
    if len(requests) == 1 and len(requests[0][1]) > ACK_PART and requests[0][2] != "cumulative":
        return [(yield from ack_in_parts(ops, home, requests[0], now))]
    call = calls.Ack.call(ops.home_prefix(home), now, [(consumer.consumer_id, mode, receive, message_ids)
                                                   for consumer, message_ids, mode, receive in requests])
    early = [0] * len(requests)  # acknowledged before the call (_ack_oldest)
    try:
        reply = yield from ops.eval(home, now, call)
    except Exception as exc:  # noqa: BLE001 - only the one below is handled
        if not str(exc).startswith("ACK_TOO_LARGE"):
            raise
        # a cumulative ack over more than CUMULATIVE_MOST messages, refused before any change
        for n, (consumer, message_ids, mode, _) in enumerate(requests):
            if mode == "cumulative":
                early[n] = yield from _ack_oldest(ops, home, consumer, message_ids[0], now)
        reply = yield from ops.eval(home, now, call)
    acked = calls.Ack.parse(reply, [(consumer.destination.uri, consumer.consumer_id)
                                    for consumer, *_ in requests])
    if acked.tail.flags:  # (nothing to finish, the usual case)
        yield from ops.continue_dispatch(home, now, acked.tail.flags, acked.tail.hold_until)
    return [(before + count, deliveries)
            for (count, deliveries), before in zip(acked.results, early, strict=True)]


def covered_when_over(ops: Context, home: Home, consumer_id: str, message_id: str) -> Op:
    """The messages a cumulative ack of `message_id` covers, oldest first, when they are more than one
    call takes (CUMULATIVE_MOST); None when one call takes them (or the message is not in flight: the
    ack's own check says so)."""
    window = f"{ops.home_prefix(home)}:c:{consumer_id}:inflight"  # (K_CINF, includes/base.lua)
    seq = yield Command(("ZSCORE", window, message_id))
    if seq is None or (yield Command(("ZCOUNT", window, "-inf", repr(seq)))) <= CUMULATIVE_MOST:
        return None
    return [_str(i) for i in (yield Command(("ZRANGEBYSCORE", window, "-inf", repr(seq))))]


def _ack_oldest(ops: Context, home: Home, consumer: ConsumerRef, message_id: str, now: int) -> Op:
    """A cumulative ack over more than CUMULATIVE_MOST messages (which ack.lua refuses, as more than a
    bounded call) is made a bounded one: the consumer's oldest messages up to `message_id` are
    acknowledged individually, ACK_PART a call, until CUMULATIVE_MOST are left for the cumulative ack's
    own call. Returns how many that acknowledged. (A cumulative ack acknowledges each of them; a crash
    half-way leaves the rest in flight, as a client's own acks would.)"""
    window = f"{ops.home_prefix(home)}:c:{consumer.consumer_id}:inflight"  # (K_CINF, includes/base.lua)
    seq = yield Command(("ZSCORE", window, message_id))
    acked = 0
    while seq is not None and (yield Command(("ZCOUNT", window, "-inf", repr(seq)))) > CUMULATIVE_MOST:
        oldest = [_str(i) for i in (yield Command(("ZRANGE", window, 0, ACK_PART - 1)))]
        ((count, _),) = yield from ack_many(ops, home, [(consumer, oldest, "individual", 0)], now)
        acked += count
    return acked


def ack_in_parts(ops: Context, home: Home, request: AckRequest, now: int) -> Op:
    """An individual (or delivered) ack of many ids: every id is checked in flight with the consumer
    (ack.lua's 'check', ACK_PART ids a call) before any is acknowledged, so a wrong id refuses the
    whole ack; then ACK_PART ids a call, the next messages handed over with the last part. A part
    refused after others were applied (a message that left meanwhile: the lease lapsed, an operator
    removed it) raises with `details["acked"]`."""
    consumer, message_ids, mode, receive = request
    ids = list(dict.fromkeys(message_ids))  # an id named twice is acknowledged once
    parts = [ids[i:i + ACK_PART] for i in range(0, len(ids), ACK_PART)]
    for part in parts:
        yield from ops.eval(home, now, calls.Ack.check(ops.home_prefix(home), now, consumer.consumer_id,
                                                         mode, part))
    acked = 0
    for n, part in enumerate(parts):
        last = n == len(parts) - 1
        try:
            ((count, deliveries),) = yield from ack_many(ops,
                home, [(consumer, part, mode, receive if last else 0)], now)
        except BrokerError as exc:
            if acked:
                exc.message = (f"{exc.message} (after {acked} of the {len(ids)} messages were "
                               "acknowledged)")
                exc.args = (exc.message,)
                exc.details["acked"] = acked
            raise
        acked += count
    return acked, deliveries


def nack(ops: Context, consumer: ConsumerRef, message_ids: list[str], poison: bool, now: int,
         jitter: float) -> Op:
    """Negative acknowledgement (scripts/lua/nack.lua): redelivery after the policy's delay, or the
    dead-letter queue (poison, or past maximumRedeliveries). Returns (dead-lettered, redelivered)."""
    if not message_ids:
        raise NotInFlight("no message id given to acknowledge negatively")
    home = yield from ops.home(consumer)
    nacked = calls.Nack.parse((yield from ops.eval(home, now, calls.Nack.call(
        ops.home_prefix(home), now, consumer.consumer_id, poison, jitter, message_ids))))
    yield from ops.continue_dispatch(home, now, nacked.tail.flags, nacked.tail.hold_until)
    return nacked.dead_lettered, nacked.redelivered


def release(ops: Context, consumer: ConsumerRef, message_ids: list[str], now: int, tx_key: str = "",
            keep: bool = False) -> Op:
    """In-flight messages back for redelivery; with `tx_key` (a rollback) those held for that transaction
    too, the consumer closed since; with `keep`, those still in flight stay delivered (release.lua)."""
    home = yield from ops.home(consumer)
    released = calls.Release.parse((yield from ops.eval(home, now, calls.Release.call(
        ops.home_prefix(home), now, consumer.consumer_id, message_ids, tx_key, keep))))
    yield from ops.continue_dispatch(home, now, released.tail.flags, released.tail.hold_until)
    return released.count


def close_consumer(ops: Context, consumer: ConsumerRef, now: int, reason: str,
                   written: int | None = None) -> Op:
    """The consumer leaves dispatch in the first call; its messages go back `return_chunk` per call.
    `written`: the dispatch sequence of the last message the adapter wrote, when it knows that what was
    pushed after it never reached the client (those go back as not received)."""
    home = yield from ops.home(consumer)
    closed = calls.ConsumerClose.parse((yield from ops.eval(home, now, calls.ConsumerClose.call(
        ops.home_prefix(home), now, consumer.consumer_id, reason, ops.return_chunk, written))))
    result = yield from ops.continue_dispatch(home, now, closed.tail.flags, closed.tail.hold_until)
    if not closed.owed:
        return result
    rest = yield from return_owed(ops, home, now)
    return DispatchResult(result.dispatched + rest.dispatched, rest.hold_until)


def return_owed(ops: Context, home: Home, now: int) -> Op:
    """Return what closed consumers of `home` (a queue, or one subscription) still hold, and release
    what ended subscriptions of its topic held, `return_chunk` messages per script call, each followed
    by its dispatch, until nothing is owed. Safe to run from several processes at once: each call takes
    messages no other call has."""
    dispatched, hold = 0, 0
    while True:
        returned = calls.ReturnOwed.parse(
            (yield calls.ReturnOwed.call(ops.home_prefix(home), now, max(1, ops.return_chunk))))
        tail = returned.tail
        result = yield from ops.continue_dispatch(home, now, tail.flags, tail.hold_until)
        dispatched += tail.dispatched + result.dispatched
        hold = result.hold_until or tail.hold_until
        if not returned.owed:
            return DispatchResult(dispatched, hold)


def renew(ops: Context, home: Home, consumer_ids: list[str], lease_ms: int, now: int) -> Op:
    """Renew leases; returns the ids that are no longer registered (closed or reaped)."""
    return calls.Renew.parse((yield calls.Renew.call(ops.home_prefix(home), now, lease_ms, consumer_ids)))


def reap(ops: Context, home: Home, now: int, limit: int) -> Op:
    """Close consumers whose lease lapsed; returns their ids."""
    reaped = calls.Reap.parse((yield calls.Reap.call(ops.home_prefix(home), now, limit, ops.return_chunk)))
    yield from ops.continue_dispatch(home, now, reaped.tail.flags, reaped.tail.hold_until)
    if reaped.owed:
        yield from return_owed(ops, home, now)
    return reaped.closed


# -- a home's passes and statistics ---------------------------------------------------------------


def dispatch(ops: Context, home: Home, now: int) -> Op:
    tail = calls.Dispatch.parse((yield calls.Dispatch.call(ops.home_prefix(home), now)))
    rest = yield from ops.continue_dispatch(home, now, tail.flags, tail.hold_until)
    return DispatchResult(tail.dispatched + rest.dispatched, rest.hold_until or tail.hold_until)


def sweep_expired(ops: Context, home: Home, now: int) -> Op:
    """One page of the expiry sweep (scripts/lua/sweep.lua); call again until `done`."""
    swept = calls.Sweep.parse((yield from ops.eval(home, now, calls.Sweep.call(ops.home_prefix(home),
                                                                                 now))))
    yield from ops.continue_dispatch(home, now, swept.tail.flags, swept.tail.hold_until)
    return SweepResult(examined=swept.examined, expired=swept.expired, done=swept.done)


def parked_counts(parked: int, scheduled: int) -> dict[str, int]:
    """`parked` told apart from the meta's 'scheduled' (includes/lifecycle.lua set_parkinfo keeps it as
    parked entries come and go): scheduled jobs, the rest waiting for a redelivery delay. (Bounded to
    `parked`. Jobs parked before the count was kept are in it once maintenance has visited the destination:
    maintenance.lua recount_scheduled.)"""
    scheduled = min(max(scheduled, 0), parked)
    return {"scheduled": scheduled, "redelivery_delayed": parked - scheduled}


def stats(ops: Context, home: Home, now: int) -> Op:
    """The statistics of a queue, or of one subscription (topics.stats adds a topic's up)."""
    prefix, token = ops.home_prefix(home), uuid.uuid4().hex
    read = calls.Stats.parse((yield calls.Stats.call(prefix, now, token)))
    meta = read.meta
    if "uri" not in meta:
        raise UnknownDestination(f"no destination {home.uri}", destination=home.uri)
    owner = meta.get("owner") or None
    # Past the first page the consumers are read a page a call (nothing limits a queue's consumers): each as
    # it is at its page's call, in the dispatch order of the first; one closed in between is left out.
    stored = list(read.consumers)
    for start in range(calls.STATS_PAGE, read.order_size, calls.STATS_PAGE):
        stored += calls.Stats.parse_page((yield calls.Stats.page(prefix, now, token, start)))
    consumers = []
    for one in stored:
        cid = one.consumer_id
        definition = msgpack.unpackb(one.definition, raw=False) if one.definition else {}
        counters = one.counters
        lease = one.lease
        consumers.append(ConsumerStats(
            consumer_id=cid,
            client_id=definition.get("client"),
            connection_id=definition.get("conn"),
            selector=definition.get("selector_text"),
            priority=int(definition.get("priority", 0)),
            exclusive=bool(definition.get("exclusive", False)),
            ack_mode=definition.get("ack", "client"),
            prefetch=int(counters.get("prefetch", 0)),
            prefetch_extension=int(counters.get("ext", 0)),
            in_flight=int(counters.get("n", 0)),
            undelivered=one.undelivered,
            dispatched=int(counters.get("dispatched", 0)),
            acked=int(counters.get("acked", 0)),
            groups=int(counters.get("groups", 0)),
            lease_expires=int(float(lease)) if lease else None,
            added=int(counters.get("added", 0)),
            last_ack=int(counters["last_ack"]) if "last_ack" in counters else None,
            slow_since=int(counters["slow_since"]) if "slow_since" in counters else None,
            is_exclusive_owner=cid == owner,
        ))
    pending, in_flight = read.pending, read.in_flight

    def count(name: str) -> int:
        return int(meta.get(name, 0))

    return DestinationStats(
        destination=home.uri, queue_size=pending + in_flight, pending=pending, in_flight=in_flight,
        enqueued=count("enqueued"), dequeued=count("dequeued"), dispatched=count("dispatched"),
        expired=count("expired"), expired_on_arrival=count("expired_on_arrival"),
        deadlettered=count("deadlettered"), parked=read.parked,
        **parked_counts(read.parked, count("scheduled")),
        **discard_counts(count("evicted"), count("dropped"), count("discarded")),
        forwarding=read.forwarding, purged=count("purged"), moved=count("moved"),
        cancelled=count("cancelled"),
        duplicates=count("duplicates"), skipped=count("skipped"),
        # (open queue browsers count, as in ActiveMQ's ConsumerCount: they are not in `consumers`)
        last_pass_skipped=count("last_pass_skipped"), consumer_count=len(consumers) + read.browsers,
        browsers=read.browsers,
        group_count=read.groups, paused=meta.get("paused") == "1", exclusive_owner=owner,
        consumers=consumers, **memory_stats(meta, read.memory_limit, read.broker_memory_limit),
        **tallies(meta),
        **forward_stats(meta), selector_errors=count("selector_errors"),
        **bound_stats(meta, read.events, read.audit_size),
    )
