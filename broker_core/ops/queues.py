"""The queue operations, each a generator of effects (broker_core/effects.py): what runs the queue scripts
on one home (keys.Home: a queue, or one subscription of a topic, which the queue scripts run unchanged
under its own key prefix). Topic-level operations (ops/topics.py) call these on each subscription; the
router (ops/router.py) calls them for queues.

An operation yields `Eval` (run a Lua script) or `Command` (a plain Redis command) or `Policy` (resolve
a destination's policy), receives the reply, and finally returns its result; what a script leaves for
other destinations (its outbox records) and a destination's creation on first use are yielded as
`Forward` and `Create` (ops/context.py), which the router runs.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import msgpack

from ..destinations import Destination, require_concrete
from ..effects import Command, Op
from ..errors import (
    BrokerError,
    InvalidConsumer,
    NotInFlight,
    OperationRefused,
    UnknownDestination,
    UnknownMessage,
)
from ..keys import Home
from ..model import (
    AckRequest,
    Consumer,
    ConsumerRef,
    ConsumerSpec,
    ConsumerStats,
    DestinationStats,
    DispatchResult,
    GroupInfo,
    SentId,
    SweepResult,
)
from ..replies import bound_stats, forward_stats, memory_stats
from ..resp import reply_text as _str
from ..scripts import calls
from ..scripts.calls import Closing, Sent
from ..selector import parse_selector
from . import flow, virtual
from .context import Context

# No ':' so that a consumer's key names never collide with another consumer's (…:c:<id>:inflight).
_CONSUMER_ID = re.compile(r"[A-Za-z0-9._@-]{1,128}")
MAX_RECEIVE = 1_000
REMOVE_PAGE = 200  # messages remove_matching removes per call (by id, after a browse page finds them)
BROWSE_EXAMINE = 400  # messages a browse call looks at, matching or not (100,000 unmatched: 250 calls)
TRANSFER_EXAMINE = 500  # messages a move/copy call looks at
PURGE_EXAMINE = 500  # messages a purge call looks at
# A batch sent in one call of the API goes to Redis in parts of at most this many messages and bytes (one
# message at least): every part's limits are checked first, then the parts are stored in order, each atomic.
SEND_PART = 100
SEND_PART_BYTES = 1 << 20
GROUPS_PAGE = 200  # message groups per group_list call
ACK_PART = 100  # ids per ack call: a larger individual ack is checked whole, then applied in parts
CUMULATIVE_MOST = 1_000  # messages one cumulative ack call takes (scripts/lua/ack.lua says the same)


# -- producing -----------------------------------------------------------------------------------------


def send_packed(ops: Context, dest: Destination, packed: list[tuple[str, bytes]], now: int,
                also: tuple[Destination, ...] = ()) -> Op:
    """`send` to a queue of messages packed already (Message.pack: id, bytes). A limit the script
    checks (size, properties) refuses all of them before anything is stored."""
    origin = yield from virtual.origin(ops, dest, "producer", also)

    def finish(sent: Sent) -> Op:
        tail = sent.tail
        if tail.pushed and ops.local_push is not None:  # pushed to this process's consumers
            for payload in tail.pushed:
                ops.local_push(payload)
        if tail.flags:  # (nothing to finish, the usual case)
            yield from ops.continue_dispatch(Home(dest), now, tail.flags, tail.hold_until)
        return sent.statuses

    return (yield from send_parts(ops, dest, now, calls.Send, origin, packed, finish))


def send_parts(ops: Context, dest: Destination, now: int, sending: type[calls.Send] | type[calls.TopicSend],
               origin: Any, records: list[tuple], finish: Callable[[Sent], Op]) -> Op:
    """Run a send script (calls.Send, calls.TopicSend) over messages (`records`: each one's arguments, id
    and packed message first) in parts of SEND_PART messages and SEND_PART_BYTES, so no call grows with
    the batch. Every part's size and property limits are checked before the first part is stored (a
    refusal changes nothing); the parts then go in order, each atomic, each waiting for space as its
    own send (flow.py). A part refused after others were stored (a memory limit that fails the send)
    raises with `details["sent"]`, how many messages went before it: their ids are stored, so sending
    the same batch again (the same message ids) stores only the rest. `finish(sent)` completes a
    part's call and returns its statuses. Returns a SentId per message."""
    parts, part, size = [], [], 0
    for record in records:
        if part and (len(part) == SEND_PART or size + len(record[1]) > SEND_PART_BYTES):
            parts.append(part)
            part, size = [], 0
        part.append(record)
        size += len(record[1])
    parts.append(part)
    if len(parts) > 1:
        for part in parts:
            yield from ops.eval(Home(dest), now, sending.call(ops.prefix(dest), now, 0, "check", part))
    statuses: list[str] = []
    # the send names this process's wake-up channel: its own consumers' pushes come back in the reply
    budget = f"0~{ops.local_channel}" if sending is calls.Send and ops.local_channel else 0
    for part in parts:
        try:
            sent = yield from flow.send_when_space(ops, dest, now, sending, budget, origin, part)
        except BrokerError as exc:
            if statuses:
                exc.message = (f"{exc.message} (after {len(statuses)} of the batch's {len(records)} "
                               "messages were sent: send it again with the same message ids to send "
                               "the rest)")
                exc.args = (exc.message,)
                exc.details["sent"] = len(statuses)
            raise
        statuses += yield from finish(sent)
    return [SentId(r[0], status) for r, status in zip(records, statuses, strict=True)]


# -- consuming -----------------------------------------------------------------------------------------


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
        "selector_text": spec.selector if selector else None,
        "nolocal": spec.no_local,
        "conn": spec.connection_id,
        "client": spec.client_id,
        "ack": spec.ack_mode,
        "notify": spec.notify,
        "lease": spec.lease_ms,
    }
    packed = msgpack.packb({k: v for k, v in definition.items() if v is not None})
    return cid, packed, selector.compiled if selector else None


def add_consumer(ops: Context, dest: Destination, spec: ConsumerSpec, now: int, cid: str,
                 packed: bytes) -> Op:
    """A queue consumer (`consumer_definition` made `cid` and `packed`)."""
    if spec.subscription_name is not None or spec.retroactive:
        raise InvalidConsumer("durable subscriptions and retroactive consumers are for topics only",
                              field="subscription_name")
    require_concrete(dest, "subscribe to")  # wildcard queues: not supported
    requested = -1 if spec.prefetch is None else spec.prefetch
    call = calls.ConsumerAdd.call(ops.prefix(dest), now, cid, packed, spec.lease_ms, requested)
    added = calls.ConsumerAdd.parse((yield from ops.eval(Home(dest), now, call)))
    if isinstance(added, Closing):  # the id of a closed consumer whose messages are still going back
        yield from return_owed(ops, Home(dest), now)
        added = calls.ConsumerAdd.parse((yield from ops.eval(Home(dest), now, call)))
    assert not isinstance(added, Closing)  # (return_owed returned everything)
    result = yield from ops.continue_dispatch(Home(dest), now, added.tail.flags, added.tail.hold_until)
    return Consumer(dest, cid, spec.ack_mode, prefetch=added.prefetch, hold_until=result.hold_until)


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


def receive_turn(ops: Context, consumer: ConsumerRef, now: int, turn_ms: int) -> Op:
    """The ActiveMQ-compatible GET of a queue consumer (broker_core/turns.py): take the consumer's turn for
    `turn_ms` and, in the same script call, receive one message unless messages are left in flight.
    Returns a calls.Turn."""
    home = Home(consumer.destination)
    call = calls.Receive.turn(ops.home_prefix(home), now, consumer.consumer_id, turn_ms)
    turn = calls.Receive.parse_turn((yield from ops.eval(home, now, call)), consumer.destination.uri,
                                    consumer.consumer_id)
    if turn.received is not None and turn.received.tail.flags:
        tail = turn.received.tail
        yield from ops.continue_dispatch(home, now, tail.flags, tail.hold_until)
    return turn


def cancel_pull(ops: Context, consumer: ConsumerRef, now: int) -> Op:
    home = yield from ops.home(consumer)
    yield from ops.eval(home, now, calls.CancelPull.call(ops.home_prefix(home), now, consumer.consumer_id))


def ack(ops: Context, consumer: ConsumerRef, message_ids: list[str], mode: str, now: int,
        receive: int = 0) -> Op:
    """mode: 'individual', 'cumulative' or 'delivered' (see scripts/lua/ack.lua). Returns how many were
    acknowledged and, when `receive` > 0, up to that many next messages for the consumer."""
    if not message_ids:
        raise NotInFlight("no message id given to acknowledge")
    # (a queue consumer's home is its queue: no generator for that, the usual case)
    home = (yield from ops.home(consumer)) if consumer.destination.is_topic else Home(consumer.destination)
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


def sweep_expired(ops: Context, home: Home, now: int) -> Op:
    """One page of the expiry sweep (scripts/lua/sweep.lua); call again until `done`."""
    swept = calls.Sweep.parse((yield from ops.eval(home, now, calls.Sweep.call(ops.home_prefix(home),
                                                                                 now))))
    yield from ops.continue_dispatch(home, now, swept.tail.flags, swept.tail.hold_until)
    return SweepResult(examined=swept.examined, expired=swept.expired, done=swept.done)


def release(ops: Context, consumer: ConsumerRef, message_ids: list[str], now: int) -> Op:
    home = yield from ops.home(consumer)
    released = calls.Release.parse((yield from ops.eval(home, now, calls.Release.call(
        ops.home_prefix(home), now, consumer.consumer_id, message_ids))))
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


def dispatch(ops: Context, home: Home, now: int) -> Op:
    tail = calls.Dispatch.parse((yield calls.Dispatch.call(ops.home_prefix(home), now)))
    rest = yield from ops.continue_dispatch(home, now, tail.flags, tail.hold_until)
    return DispatchResult(tail.dispatched + rest.dispatched, rest.hold_until or tail.hold_until)


# -- administration ------------------------------------------------------------------------------------


def pause(ops: Context, dest: Destination, paused: bool, now: int) -> Op:
    tail = calls.Pause.parse((yield from ops.eval(Home(dest), now, calls.Pause.call(ops.prefix(dest), now,
                                                                                paused))))
    yield from ops.continue_dispatch(Home(dest), now, tail.flags, tail.hold_until)


def remove_message_groups(ops: Context, dest: Destination, group_id: str | None, now: int) -> Op:
    """removeMessageGroup(group_id), or removeAllMessageGroups() when group_id is None."""
    reset = calls.GroupReset.parse((yield from ops.eval(Home(dest), now, calls.GroupReset.call(
        ops.prefix(dest), now, group_id))))
    yield from ops.continue_dispatch(Home(dest), now, reset.tail.flags, reset.tail.hold_until)
    return reset.count


def message_groups(ops: Context, dest: Destination, now: int) -> Op:
    """Every message group (a page of GROUPS_PAGE a call, message_groups_page)."""
    cursor: str | None = None
    groups: list[GroupInfo] = []
    while True:
        page = yield from message_groups_page(ops, dest, now, cursor, GROUPS_PAGE)
        groups += page.groups
        cursor = page.next_cursor
        if cursor is None:
            return groups


def message_groups_page(ops: Context, dest: Destination, now: int, cursor: str | None, limit: int) -> Op:
    """About `limit` message groups (Redis's HSCAN decides: a few more or fewer) and the cursor of the
    next page (None at the end). A group assigned or removed meanwhile may be listed or not; none
    present throughout is missed."""
    if not 1 <= limit <= MAX_RECEIVE:
        raise InvalidConsumer(f"limit must be 1-{MAX_RECEIVE}, got {limit}", field="limit")
    if cursor is not None and not (cursor.isascii() and cursor.isdigit() and int(cursor) < 2**64):
        raise InvalidConsumer(f"cursor {cursor!r} is not one this listing gave", field="cursor")
    return calls.GroupList.parse((yield calls.GroupList.call(ops.prefix(dest), now, cursor or "0",
                                                             limit)))


def group_counts(ops: Context, dest: Destination, now: int, pending_limit: int, in_flight_limit: int) -> Op:
    """Pending (among the first `pending_limit`) and in-flight messages per group (the console)."""
    return calls.GroupCounts.parse((yield calls.GroupCounts.call(ops.prefix(dest), now, pending_limit,
                                                                 in_flight_limit)))


def summary(ops: Context, dest: Destination, now: int, oldest: bool = False) -> Op:
    """The main counters only (console index); None when the destination does not exist."""
    (found,) = calls.SummaryMany.parse((yield calls.SummaryMany.call((ops.prefix(dest),), now, oldest)),
                                       (dest.uri,))
    return found


def stats(ops: Context, home: Home, now: int) -> Op:
    """The statistics of a queue, or of one subscription (topics.stats adds a topic's up)."""
    read = calls.Stats.parse((yield calls.Stats.call(ops.home_prefix(home), now)))
    meta = read.meta
    if "uri" not in meta:
        raise UnknownDestination(f"no destination {home.uri}", destination=home.uri)
    owner = meta.get("owner") or None
    consumers = []
    for one in read.consumers:
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
        deadlettered=count("deadlettered"), discarded=count("discarded"), parked=read.parked,
        forwarding=read.forwarding, purged=count("purged"), moved=count("moved"),
        cancelled=count("cancelled"),
        duplicates=count("duplicates"), skipped=count("skipped"),
        last_pass_skipped=count("last_pass_skipped"), consumer_count=len(consumers),
        group_count=read.groups, paused=meta.get("paused") == "1", exclusive_owner=owner,
        consumers=consumers, **memory_stats(meta, read.memory_limit, read.broker_memory_limit),
        **forward_stats(meta), selector_errors=count("selector_errors"),
        **bound_stats(meta, read.events, read.audit_size),
    )


# -- the operator's message operations (spec §14.3) -------------------------------------------------------


def browse(ops: Context, dest: Destination, selector: str | None, cursor: str | None, limit: int,
           now: int) -> Op:
    """One page of messages, never changing state: pending in dispatch order, then parked, then in
    flight. Returns BrowsePage; pass its next_cursor to continue (None when done)."""
    if not 1 <= limit <= MAX_RECEIVE:
        raise InvalidConsumer(f"limit must be 1-{MAX_RECEIVE}, got {limit}", field="limit")
    compiled = parse_selector(selector).compiled if selector and selector.strip() else ""
    return calls.Browse.parse((yield calls.Browse.call(ops.prefix(dest), now, cursor or "", limit,
                                                       BROWSE_EXAMINE, compiled)), dest.uri)


def get_message(ops: Context, dest: Destination, message_id: str, now: int) -> Op:
    found = calls.MessageGet.parse((yield calls.MessageGet.call(ops.prefix(dest), now, message_id)),
                                   dest.uri, message_id)
    if found is None:
        raise UnknownMessage(f"no message {message_id} on {dest.uri}", message_id=message_id)
    return found


def parked_times(ops: Context, dest: Destination, message_ids: list[str]) -> Op:
    """When each parked message (scheduled, delayed, waiting for a redelivery delay) is due, and a
    repeating job's period and repeats left: id -> {"due", "period", "repeats_left"} (None where
    not parked / not repeating). Two reads of at most len(message_ids) fields (callers page them)."""
    if not message_ids:
        return {}
    prefix = ops.prefix(dest)
    scores = yield Command(("ZMSCORE", f"{prefix}:parked", *message_ids))
    jobs = yield Command(("HMGET", f"{prefix}:sched", *message_ids))
    out: dict[str, dict[str, int | None]] = {}
    for message_id, score, job in zip(message_ids, scores, jobs, strict=True):
        # a job: [packed message, period, repeats left, fired, routing plan] (lifecycle.lua)
        period, left = (msgpack.unpackb(job, raw=True)[1:3] if job else (None, None))
        out[message_id] = {"due": int(float(score)) if score is not None else None,
                           "period": period, "repeats_left": left}
    return out


def remove(ops: Context, dest: Destination, message_ids: list[str], now: int) -> Op:
    """Remove messages by id (in flight too, as ActiveMQ's removeMessage); returns how many."""
    call = calls.Remove.call(ops.prefix(dest), now, message_ids)
    removed = calls.Remove.parse((yield from ops.eval(Home(dest), now, call)))
    yield from ops.continue_dispatch(Home(dest), now, removed.tail.flags, removed.tail.hold_until)
    return removed.removed


def remove_matching(ops: Context, dest: Destination, selector: str | None, limit: int | None, now: int,
                    progress: Callable[[int, int], None] | None = None) -> Op:
    """Remove every message a selector matches, wherever it is (pending, parked, in flight: as
    removeMessage and ActiveMQ's removeMatchingMessages), walking the queue once with browse's
    cursor and removing each page by id: every call bounded (BROWSE_EXAMINE examined, at most
    REMOVE_PAGE removed). At most `limit`, or what the queue held at the start, so a producer
    sending matching messages cannot keep it going. `progress(removed, total)` after each page."""
    st = yield from stats(ops, Home(dest), now)
    total = st.queue_size + st.parked
    cap = min(limit, total) if limit is not None else total
    removed, cursor = 0, None
    while removed < cap:
        page = yield from browse(ops, dest, selector, cursor, min(REMOVE_PAGE, cap - removed), now)
        ids = [b.message.message_id for b in page.messages]
        if ids:
            removed += yield from remove(ops, dest, ids, now)
        if progress:
            progress(removed, cap)
        cursor = page.next_cursor
        if not cursor:
            break
    return removed


def purge(ops: Context, dest: Destination, now: int, total: int,
          progress: Callable[[int, int], None] | None = None) -> Op:
    """Remove every message there when the purge starts (broker sequence up to the mark the first call
    takes; later sends stay), wherever it is, in calls of at most PURGE_EXAMINE examined messages
    (scripts/lua/purge.lua): producers and consumers go on between them. `progress(removed, total)` is
    told after each call (`total`: what the queue held at the start). Interrupted, run it again."""
    removed, mark, cursor = 0, "", ""
    while True:
        purged = calls.Purge.parse((yield from ops.eval(Home(dest), now, calls.Purge.call(
            ops.prefix(dest), now, mark, cursor, PURGE_EXAMINE))))
        yield from ops.continue_dispatch(Home(dest), now, purged.tail.flags, purged.tail.hold_until)
        removed += purged.count
        cursor, mark = purged.cursor, purged.mark
        if progress:
            progress(removed, total)
        if not cursor:
            return removed


def transfer(ops: Context, dest: Destination, mode: str, target: Destination | None, message_ids: list[str],
             selector: str | None, limit: int | None, now: int) -> Op:
    """Move, copy or retry (to each message's original destination) messages by id or all pending
    messages a selector matches, in bounded calls. Returns how many."""
    if target is not None:
        if target == dest:
            raise OperationRefused(f"cannot {mode} messages of {dest.uri} to itself", target=target.uri)
        known = yield Command(("ZSCORE", ops.registry_key, target.uri))
        if known is None:
            raise UnknownDestination(f"no destination {target.uri} to {mode} messages to",
                                     destination=target.uri)
    compiled = parse_selector(selector).compiled if selector and selector.strip() else ""
    remaining = limit if limit is not None else 2**62
    taken, cursor = 0, ""
    while remaining > 0:
        moved = calls.Move.parse((yield from ops.eval(Home(dest), now, calls.Move.call(
            ops.prefix(dest), now, mode, target.uri if target else "", cursor, TRANSFER_EXAMINE,
            min(remaining, TRANSFER_EXAMINE), compiled, message_ids))))
        yield from ops.continue_dispatch(Home(dest), now, moved.tail.flags, moved.tail.hold_until)
        taken += moved.count
        remaining -= moved.count
        cursor = moved.cursor
        if message_ids or not cursor:
            break
    return taken
