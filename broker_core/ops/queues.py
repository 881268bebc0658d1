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
from ..effects import Command, Eval, Op
from ..errors import (
    BrokerError,
    InvalidConsumer,
    NotInFlight,
    OperationRefused,
    UnknownDestination,
    UnknownMessage,
)
from ..keys import Home
from ..messages import Delivery, unpack_delivery
from ..model import (
    AckRequest,
    Browsed,
    BrowsePage,
    Consumer,
    ConsumerRef,
    ConsumerSpec,
    ConsumerStats,
    DestinationStats,
    DispatchResult,
    GroupCounts,
    GroupInfo,
    GroupPage,
    SentId,
    SweepResult,
    summary_from,
)
from ..replies import bound_stats, forward_stats, memory_stats, pairs
from ..resp import reply_text as _str
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


def _deliveries(consumer: ConsumerRef, reply: list[Any], start: int) -> list[Delivery]:
    """Messages a script handed over: groups of (id, packed message, redeliveries, group first)."""
    return [unpack_delivery(_str(reply[i]), consumer.destination.uri, consumer.consumer_id, reply[i + 1],
                            int(reply[i + 2]), bool(int(reply[i + 3])))
            for i in range(start, len(reply), 4)]


# -- producing -----------------------------------------------------------------------------------------

def send_packed(ops: Context, dest: Destination, packed: list[tuple[str, bytes]], now: int,
                also: tuple[Destination, ...] = ()) -> Op:
    """`send` to a queue of messages packed already (Message.pack: id, bytes). A limit the script
    checks (size, properties) refuses all of them before anything is stored."""
    origin = yield from virtual.origin(ops, dest, "producer", also)
    home = Home(dest)

    def finish(reply: list[Any]) -> Op:
        split = reply.index(b"")
        if len(reply) > split + 4 and ops.local_push is not None:  # pushed to this process's consumers
            for payload in reply[split + 4:]:
                ops.local_push(payload)
        if int(reply[split + 2]):  # (nothing to finish, the usual case)
            yield from ops.continue_dispatch(home, now, int(reply[split + 2]), int(reply[split + 3]))
        return reply[:split]

    return (yield from send_parts(ops, dest, now, "send", origin, packed, finish))


def send_parts(ops: Context, dest: Destination, now: int, script: str, origin: Any, records: list[tuple],
               finish: Callable[[list[Any]], Op]) -> Op:
    """Run a send script (`send`, `topic_send`) over messages (`records`: each one's arguments, id and
    packed message first) in parts of SEND_PART messages and SEND_PART_BYTES, so no call grows with
    the batch. Every part's size and property limits are checked before the first part is stored (a
    refusal changes nothing); the parts then go in order, each atomic, each waiting for space as its
    own send (flow.py). A part refused after others were stored (a memory limit that fails the send)
    raises with `details["sent"]`, how many messages went before it: their ids are stored, so sending
    the same batch again (the same message ids) stores only the rest. `finish(reply)` completes a
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
            yield from ops.eval(script, Home(dest), now, 0, "check", *(a for r in part for a in r))
    statuses: list[Any] = []
    # the send names this process's wake-up channel: its own consumers' pushes come back in the reply
    budget = f"0~{ops.local_channel}" if script == "send" and ops.local_channel else 0
    for part in parts:
        args = [budget, origin, *(a for r in part for a in r)]
        try:
            reply = yield from flow.send_when_space(ops, dest, now, args, script=script)
        except BrokerError as exc:
            if statuses:
                exc.message = (f"{exc.message} (after {len(statuses)} of the batch's {len(records)} "
                               "messages were sent: send it again with the same message ids to send "
                               "the rest)")
                exc.args = (exc.message,)
                exc.details["sent"] = len(statuses)
            raise
        statuses += yield from finish(reply)
    return [SentId(r[0], _str(status)) for r, status in zip(records, statuses, strict=True)]


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
    home = Home(dest)
    reply = yield from ops.eval("consumer_add", home, now, 0, cid, packed, spec.lease_ms, requested)
    if reply[0] == b"closing":  # the id of a closed consumer whose messages are still going back
        yield from return_owed(ops, home, now)
        reply = yield from ops.eval("consumer_add", home, now, 0, cid, packed, spec.lease_ms, requested)
    result = yield from ops.continue_dispatch(home, now, int(reply[1]), int(reply[2]))
    return Consumer(dest, cid, spec.ack_mode, prefetch=int(reply[4]), hold_until=result.hold_until)


def receive(ops: Context, consumer: ConsumerRef, max_messages: int, now: int, lease_ms: int) -> Op:
    if not 1 <= max_messages <= MAX_RECEIVE:
        raise InvalidConsumer(f"max_messages must be 1-{MAX_RECEIVE}, got {max_messages}",
                              field="max_messages")
    home = (yield from ops.home(consumer)) if consumer.destination.is_topic else Home(consumer.destination)
    reply = yield from ops.eval("receive", home, now, 0, consumer.consumer_id, max_messages, lease_ms)
    if int(reply[1]):
        yield from ops.continue_dispatch(home, now, int(reply[1]), int(reply[2]))
    return _deliveries(consumer, reply, 3)


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
    reply = yield from ops.eval("receive", home, now, 0, consumer.consumer_id, max_messages, lease_ms,
                                after, push)
    if int(reply[1]):
        yield from ops.continue_dispatch(home, now, int(reply[1]), int(reply[2]))
    return _deliveries(consumer, reply, 4), int(reply[3])


def cancel_pull(ops: Context, consumer: ConsumerRef, now: int) -> Op:
    yield from ops.eval("cancel_pull", (yield from ops.home(consumer)), now, consumer.consumer_id)


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
    """`ack` of several consumers of one home (a queue, or one subscription), each named once
    and with message ids, in one script call: all are checked before any is applied. Returns (acked,
    next messages) per request, in order. One consumer's ack of more than ACK_PART ids is checked
    whole, then applied in parts (ack_in_parts)."""
    if len(requests) == 1 and len(requests[0][1]) > ACK_PART and requests[0][2] != "cumulative":
        return [(yield from ack_in_parts(ops, home, requests[0], now))]
    args: list[Any] = [0]
    for consumer, message_ids, mode, receive in requests:
        args += [consumer.consumer_id, mode, receive, len(message_ids), *message_ids]
    early = [0] * len(requests)  # acknowledged before the call (_ack_oldest)
    try:
        reply = yield from ops.eval("ack", home, now, *args)
    except Exception as exc:  # noqa: BLE001 - only the one below is handled
        if not str(exc).startswith("ACK_TOO_LARGE"):
            raise
        # a cumulative ack over more than CUMULATIVE_MOST messages, refused before any change
        for n, (consumer, message_ids, mode, _) in enumerate(requests):
            if mode == "cumulative":
                early[n] = yield from _ack_oldest(ops, home, consumer, message_ids[0], now)
        reply = yield from ops.eval("ack", home, now, *args)
    if int(reply[1]):  # (nothing to finish, the usual case)
        yield from ops.continue_dispatch(home, now, int(reply[1]), int(reply[2]))
    out, at = [], 3
    for (consumer, *_), before in zip(requests, early, strict=True):
        acked, received = int(reply[at]), int(reply[at + 1])
        out.append((before + acked, _deliveries(consumer, reply[at + 2:at + 2 + 4 * received], 0)))
        at += 2 + 4 * received
    return out


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
        yield from ops.eval("ack", home, now, "check", consumer.consumer_id, mode, 0, len(part), *part)
    acked = 0
    for n, part in enumerate(parts):
        last = n == len(parts) - 1
        try:
            ((count, deliveries),) = yield from ack_many(
                ops, home, [(consumer, part, mode, receive if last else 0)], now)
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
    reply = yield from ops.eval("nack", home, now, 0, consumer.consumer_id, "1" if poison else "0",
                                repr(jitter), *message_ids)
    yield from ops.continue_dispatch(home, now, int(reply[3]), int(reply[4]))
    return int(reply[0]), int(reply[1])


def sweep_expired(ops: Context, home: Home, now: int) -> Op:
    """One page of the expiry sweep (scripts/lua/sweep.lua); call again until `done`."""
    reply = yield from ops.eval("sweep", home, now)
    yield from ops.continue_dispatch(home, now, int(reply[3]), int(reply[4]))
    return SweepResult(examined=int(reply[0]), expired=int(reply[1]), done=bool(int(reply[2])))


def release(ops: Context, consumer: ConsumerRef, message_ids: list[str], now: int) -> Op:
    home = yield from ops.home(consumer)
    reply = yield from ops.eval("release", home, now, 0, consumer.consumer_id, *message_ids)
    yield from ops.continue_dispatch(home, now, int(reply[2]), int(reply[3]))
    return int(reply[0])


def close_consumer(ops: Context, consumer: ConsumerRef, now: int, reason: str,
                   written: int | None = None) -> Op:
    """The consumer leaves dispatch in the first call; its messages go back `return_chunk` per call.
    `written`: the dispatch sequence of the last message the adapter wrote, when it knows that what was
    pushed after it never reached the client (those go back as not received)."""
    home = yield from ops.home(consumer)
    extra = () if written is None else (written,)
    reply = yield from ops.eval("consumer_close", home, now, 0, consumer.consumer_id, reason,
                                ops.return_chunk, *extra)
    result = yield from ops.continue_dispatch(home, now, int(reply[1]), int(reply[2]))
    if not int(reply[3]):
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
        reply = yield Eval("return_owed", (ops.home_prefix(home),), (now, 0, max(1, ops.return_chunk)))
        result = yield from ops.continue_dispatch(home, now, int(reply[1]), int(reply[2]))
        dispatched += int(reply[0]) + result.dispatched
        hold = result.hold_until or int(reply[2])
        if not int(reply[3]):
            return DispatchResult(dispatched, hold)


def renew(ops: Context, home: Home, consumer_ids: list[str], lease_ms: int, now: int) -> Op:
    """Renew leases; returns the ids that are no longer registered (closed or reaped)."""
    reply = yield Eval("renew", (ops.home_prefix(home),), (now, lease_ms, *consumer_ids))
    return [_str(x) for x in reply]


def reap(ops: Context, home: Home, now: int, limit: int) -> Op:
    """Close consumers whose lease lapsed; returns their ids."""
    reply = yield Eval("reap", (ops.home_prefix(home),), (now, 0, limit, ops.return_chunk))
    split = reply.index(b"")
    yield from ops.continue_dispatch(home, now, int(reply[split + 2]), int(reply[split + 3]))
    if int(reply[split + 4]):
        yield from return_owed(ops, home, now)
    return [_str(x) for x in reply[:split]]


def dispatch(ops: Context, home: Home, now: int) -> Op:
    """Run the home's dispatch pass to its end (each chunk a bounded call)."""
    reply = yield Eval("dispatch", (ops.home_prefix(home),), (now, 0))
    rest = yield from ops.continue_dispatch(home, now, int(reply[1]), int(reply[2]))
    return DispatchResult(int(reply[0]) + rest.dispatched, rest.hold_until or int(reply[2]))


# -- administration ------------------------------------------------------------------------------------


def pause(ops: Context, dest: Destination, paused: bool, now: int) -> Op:
    home = Home(dest)
    reply = yield from ops.eval("pause", home, now, 0, "1" if paused else "0")
    yield from ops.continue_dispatch(home, now, int(reply[1]), int(reply[2]))


def remove_message_groups(ops: Context, dest: Destination, group_id: str | None, now: int) -> Op:
    """removeMessageGroup(group_id), or removeAllMessageGroups() when group_id is None."""
    args = ("", "all") if group_id is None else (group_id, "")
    home = Home(dest)
    reply = yield from ops.eval("group_reset", home, now, 0, *args)
    yield from ops.continue_dispatch(home, now, int(reply[2]), int(reply[3]))
    return int(reply[0])


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
    reply = yield Eval("group_list", (ops.prefix(dest),), (now, cursor or "0", limit))
    groups = [GroupInfo(_str(reply[i]), _str(reply[i + 1]), int(reply[i + 2]))
              for i in range(1, len(reply), 3)]
    following = _str(reply[0])
    return GroupPage(groups, None if following == "0" else following)


def group_counts(ops: Context, dest: Destination, now: int, pending_limit: int, in_flight_limit: int) -> Op:
    """Pending (among the first `pending_limit`) and in-flight messages per group (the console)."""
    reply = yield Eval("group_counts", (ops.prefix(dest),), (now, pending_limit, in_flight_limit))
    groups = {_str(reply[i]): (int(reply[i + 1]), int(reply[i + 2])) for i in range(4, len(reply), 3)}
    return GroupCounts(groups, int(reply[0]), bool(int(reply[1])), int(reply[2]), bool(int(reply[3])))


def summary(ops: Context, dest: Destination, now: int, oldest: bool = False) -> Op:
    """The main counters only (console index); None when the destination does not exist."""
    return summary_from((yield Eval("summary_many", (ops.prefix(dest),), (now, int(oldest)))), dest.uri)


def stats(ops: Context, home: Home, now: int) -> Op:
    """The statistics of a queue, or of one subscription (topics.stats adds a topic's up)."""
    reply = yield Eval("stats", (ops.home_prefix(home),), (now,))
    meta = pairs(reply[0])
    if "uri" not in meta:
        raise UnknownDestination(f"no destination {home.uri}", destination=home.uri)
    owner = meta.get("owner") or None
    consumers = []
    flat = reply[6]
    for i in range(0, len(flat), 5):
        cid = _str(flat[i])
        definition = msgpack.unpackb(flat[i + 1], raw=False) if flat[i + 1] else {}
        counters = pairs(flat[i + 2])
        lease = _str(flat[i + 3])
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
            undelivered=int(flat[i + 4]),
            dispatched=int(counters.get("dispatched", 0)),
            acked=int(counters.get("acked", 0)),
            groups=int(counters.get("groups", 0)),
            lease_expires=int(float(lease)) if lease else None,
            added=int(counters.get("added", 0)),
            last_ack=int(counters["last_ack"]) if "last_ack" in counters else None,
            slow_since=int(counters["slow_since"]) if "slow_since" in counters else None,
            is_exclusive_owner=cid == owner,
        ))
    pending, in_flight = int(reply[1]), int(reply[2])

    def count(name: str) -> int:
        return int(meta.get(name, 0))

    return DestinationStats(
        destination=home.uri, queue_size=pending + in_flight, pending=pending, in_flight=in_flight,
        enqueued=count("enqueued"), dequeued=count("dequeued"), dispatched=count("dispatched"),
        expired=count("expired"), expired_on_arrival=count("expired_on_arrival"),
        deadlettered=count("deadlettered"), discarded=count("discarded"), parked=int(reply[4]),
        forwarding=int(reply[5]), purged=count("purged"), moved=count("moved"),
        cancelled=count("cancelled"),
        duplicates=count("duplicates"), skipped=count("skipped"),
        last_pass_skipped=count("last_pass_skipped"), consumer_count=len(consumers),
        group_count=int(reply[3]), paused=meta.get("paused") == "1", exclusive_owner=owner,
        consumers=consumers, **memory_stats(meta, reply[7]), **forward_stats(meta),
        selector_errors=count("selector_errors"), **bound_stats(meta, reply[8]),
    )


# -- the operator's message operations (spec §14.3) -------------------------------------------------------


def browse(ops: Context, dest: Destination, selector: str | None, cursor: str | None, limit: int,
           now: int) -> Op:
    """One page of messages, never changing state: pending in dispatch order, then parked, then in
    flight. Returns BrowsePage; pass its next_cursor to continue (None when done)."""
    if not 1 <= limit <= MAX_RECEIVE:
        raise InvalidConsumer(f"limit must be 1-{MAX_RECEIVE}, got {limit}", field="limit")
    compiled = parse_selector(selector).compiled if selector and selector.strip() else ""
    reply = yield Eval("browse", (ops.prefix(dest),),
                       (now, cursor or "", limit, BROWSE_EXAMINE, compiled))
    messages = [
        Browsed(unpack_delivery(_str(reply[i]), dest.uri, _str(reply[i + 3]), reply[i + 1],
                                int(reply[i + 4]), False), _str(reply[i + 2]))
        for i in range(1, len(reply), 5)
    ]
    return BrowsePage(messages, _str(reply[0]) or None)


def get_message(ops: Context, dest: Destination, message_id: str, now: int) -> Op:
    reply = yield Eval("message_get", (ops.prefix(dest),), (now, message_id))
    if not reply:
        raise UnknownMessage(f"no message {message_id} on {dest.uri}", message_id=message_id)
    return Browsed(unpack_delivery(message_id, dest.uri, _str(reply[2]), reply[0], int(reply[3]), False),
                   _str(reply[1]))


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
    home = Home(dest)
    reply = yield from ops.eval("remove", home, now, 0, 0, *message_ids)
    yield from ops.continue_dispatch(home, now, int(reply[2]), int(reply[3]))
    return int(reply[0])


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
    home = Home(dest)
    removed, mark, cursor = 0, "", ""
    while True:
        reply = yield from ops.eval("purge", home, now, 0, mark, cursor, PURGE_EXAMINE)
        yield from ops.continue_dispatch(home, now, int(reply[3]), int(reply[4]))
        removed += int(reply[0])
        cursor, mark = _str(reply[1]), _str(reply[2])
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
    taken, cursor, home = 0, "", Home(dest)
    while remaining > 0:
        reply = yield from ops.eval("move", home, now, 0, mode, target.uri if target else "", cursor,
                                    TRANSFER_EXAMINE, min(remaining, TRANSFER_EXAMINE), compiled,
                                    *message_ids)
        yield from ops.continue_dispatch(home, now, int(reply[2]), int(reply[3]))
        taken += int(reply[0])
        remaining -= int(reply[0])
        cursor = _str(reply[1])
        if message_ids or not cursor:
            break
    return taken
