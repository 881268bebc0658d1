"""The queue operations, each a generator of effects (broker_core/effects.py): what is specific to queue
destinations (a producer's send, a queue consumer, an ActiveMQ-compatible GET's turn, message groups,
pausing, and the operator's browse, remove, purge, move and copy). What works on any home (keys.Home: a
queue, or one subscription of a topic) is in ops/homes.py, which this module and ops/topics.py share.

An operation yields `Eval` (run a Lua script) or `Command` (a plain Redis command) or `Policy` (resolve
a destination's policy), receives the reply, and finally returns its result; what a script leaves for
other destinations (its outbox records) and a destination's creation on first use are yielded as
`Forward` and `Create` (ops/context.py), which the router runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgpack

from ..config.entry import PolicyEntry
from ..destinations import Destination, require_concrete
from ..effects import Command, Op, Policy
from ..errors import InvalidConsumer, OperationRefused, TooManyConsumers, UnknownDestination, UnknownMessage
from ..keys import Home
from ..model import BrowserInfo, Consumer, ConsumerRef, ConsumerSpec, GroupInfo
from ..resp import reply_text
from ..scripts import calls
from ..scripts.calls import Closing, Sent
from ..selector import parse_selector
from . import flow, homes, virtual
from .context import Context
from .homes import MAX_RECEIVE

REMOVE_PAGE = 200  # messages remove_matching removes per call (by id, after a browse page finds them)
BROWSE_EXAMINE = 400  # messages a browse call looks at, matching or not (100,000 unmatched: 250 calls)
# The cursors browse.lua gives: '<phase>:<score>|<last id>' in the pending (p) and parked (k) zsets, as
# Redis prints a score; 'i:<HSCAN cursor>' in the in-flight hash, or 'i:<HSCAN cursor>|<last id>' inside
# one HSCAN page (a page stopped at its limit or the call's byte budget). Anything else is refused by name:
# the script would fail on a score or HSCAN cursor Redis cannot read (a 500), or read an unknown phase as
# "done" (an empty last page, telling the client it has seen every message).
# (h: the messages held for transactions, browse.lua: 'h:' their start)
_BROWSE_CURSOR = re.compile(r"[pkh]:[-+]?(?:inf|[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)\|.+|h:"
                            r"|i:[1-9][0-9]{0,19}|i:[0-9]{1,20}\|.+", re.DOTALL)
# the scheduled listing's cursors: its walk over the parked messages only (browse.lua, mode 's')
_SCHEDULED_CURSOR = re.compile(r"k:[-+]?(?:inf|[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)\|.+", re.DOTALL)
TRANSFER_EXAMINE = 500  # messages a move/copy call looks at
PURGE_EXAMINE = 500  # messages a purge call looks at
GROUPS_PAGE = 200  # message groups per group_list call


# -- producing -----------------------------------------------------------------------------------------


def send_packed(ops: Context, dest: Destination, packed: list[tuple[str, bytes]], now: int,
                also: tuple[Destination, ...] = (), kind: str = "producer") -> Op:
    """`send` to a queue of messages packed already (Message.pack: id, bytes). A limit the script
    checks (size, properties) refuses all of them before anything is stored. `kind` "exempt": the
    broker's own send, without producer flow control (a BROWSE's replies after its first: broker.py
    _BrowseReplies)."""
    origin = yield from virtual.origin(ops, dest, kind, also)

    def finish(sent: Sent) -> Op:
        tail = sent.tail
        if tail.pushed and ops.local_push is not None:  # pushed to this process's consumers
            for payload in tail.pushed:
                ops.local_push(payload)
        if tail.flags:  # (nothing to finish, the usual case)
            yield from ops.continue_dispatch(Home(dest), now, tail.flags, tail.hold_until)
        return sent.statuses

    return (yield from flow.send_parts(ops, dest, now, calls.Send, origin, packed, finish))


# -- consuming -----------------------------------------------------------------------------------------


def add_consumer(ops: Context, dest: Destination, spec: ConsumerSpec, now: int, cid: str,
                 packed: bytes) -> Op:
    """A queue consumer (`homes.consumer_definition` made `cid` and `packed`)."""
    if spec.subscription_name is not None or spec.retroactive:
        raise InvalidConsumer("durable subscriptions and retroactive consumers are for topics only",
                              field="subscription_name")
    require_concrete(dest, "subscribe to")  # wildcard queues: not supported
    requested = -1 if spec.prefetch is None else spec.prefetch
    call = calls.ConsumerAdd.call(ops.prefix(dest), now, cid, packed, spec.lease_ms, requested,
                                  ops.max_consumers)
    try:
        added = calls.ConsumerAdd.parse((yield from ops.eval(Home(dest), now, call)))
        if isinstance(added, Closing):  # the id of a closed consumer whose messages are still going back
            yield from homes.return_owed(ops, Home(dest), now)
            added = calls.ConsumerAdd.parse((yield from ops.eval(Home(dest), now, call)))
    except TooManyConsumers as exc:  # (the script's refusal, either call's, with what a caller may act on)
        raise TooManyConsumers(f"too many consumers: {dest.uri} has {exc.message}; one must close before "
                               "another is added", setting="SIGNALBOX_MAX_CONSUMERS", limit=ops.max_consumers,
                               destination=dest.uri) from None
    assert not isinstance(added, Closing)  # (return_owed returned everything)
    result = yield from ops.continue_dispatch(Home(dest), now, added.tail.flags, added.tail.hold_until)
    return Consumer(dest, cid, spec.ack_mode, prefetch=added.prefetch, hold_until=result.hold_until)


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


# -- the operator's message operations (spec §14.3) -------------------------------------------------------


def browse(ops: Context, dest: Destination, selector: str | None, cursor: str | None, limit: int,
           now: int, parked: bool = True, examine: int = BROWSE_EXAMINE) -> Op:
    """One page of messages, never changing state: pending in dispatch order, then parked (unless
    `parked` is False), then in flight, looking at no more than `examine` messages (at most
    BROWSE_EXAMINE). Returns BrowsePage; pass its next_cursor to continue (None when done)."""
    if not 1 <= limit <= MAX_RECEIVE:
        raise InvalidConsumer(f"limit must be 1-{MAX_RECEIVE}, got {limit}", field="limit")
    if cursor and not (_BROWSE_CURSOR.fullmatch(cursor)
                       and (cursor[0] != "i" or int(cursor[2:].partition("|")[0]) < 2**64)):
        raise InvalidConsumer(f"cursor {cursor[:100]!r} is not one this listing gave", field="cursor")
    compiled = parse_selector(selector).compiled if selector and selector.strip() else ""
    examine = max(1, min(examine, BROWSE_EXAMINE))
    return calls.Browse.parse((yield calls.Browse.call(ops.prefix(dest), now, cursor or "", limit,
                                                       examine, compiled, parked)), dest.uri)


def browser_limit(ops: Context, dest: Destination) -> Op:
    """How many messages a queue browser is given at most: the policy's maxBrowsePageSize (ActiveMQ's
    QueueBrowserSubscription sees only what one page-in holds, spec §1.6)."""
    entry: PolicyEntry = yield Policy(dest)
    return entry.max_browse_page_size


def open_browser(ops: Context, dest: Destination, browser_id: str, lease_ms: int, prefetch: int,
                 selector: str | None, now: int) -> Op:
    """Count a queue browser among the queue's consumers while its lease lasts (scripts/lua/browsers.lua);
    its adapter renews the lease (`renew_browsers`) and closes it (`close_browsers`). It takes no part in
    dispatch. Creates the queue, as a consumer does."""
    yield from _browsers(ops, dest, now, (yield from ops.eval(Home(dest), now, calls.Browsers.open(
        ops.prefix(dest), now, lease_ms, browser_id, prefetch, selector))))


def renew_browsers(ops: Context, dest: Destination, browser_ids: list[str], lease_ms: int, now: int) -> Op:
    """Renew browsers' leases; returns the ids that are not open (closed, or lapsed and removed)."""
    call = calls.Browsers.renew(ops.prefix(dest), now, lease_ms, browser_ids)
    missing = yield from _browsers(ops, dest, now, (yield call))
    return [reply_text(m) for m in missing]


def close_browsers(ops: Context, dest: Destination, browser_ids: list[str], reason: str, now: int) -> Op:
    """No longer count these browsers; returns how many were open."""
    call = calls.Browsers.close(ops.prefix(dest), now, reason, browser_ids)
    closed = yield from _browsers(ops, dest, now, (yield call))
    return int(closed[0])


def browsers(ops: Context, dest: Destination, most: int, now: int) -> Op:
    """At most `most` of the queue's open browsers, those whose lease ends first first."""
    flat = yield from _browsers(ops, dest, now, (yield calls.Browsers.list(ops.prefix(dest), now, most)))
    return [BrowserInfo(reply_text(flat[i]), int(flat[i + 1] or 0), reply_text(flat[i + 2]) or None)
            for i in range(0, len(flat), 3)]


def _browsers(ops: Context, dest: Destination, now: int, reply: list[Any]) -> Op:
    """A browsers.lua reply's values, once the advisories it recorded (consumer added or removed) are sent."""
    values, tail = calls.Browsers.parse(reply)
    yield from ops.continue_dispatch(Home(dest), now, tail.flags, tail.hold_until)
    return values


def get_message(ops: Context, dest: Destination, message_id: str, now: int) -> Op:
    found = calls.MessageGet.parse((yield calls.MessageGet.call(ops.prefix(dest), now, message_id)),
                                   dest.uri, message_id)
    if found is None:
        raise UnknownMessage(f"no message {message_id} on {dest.uri}", message_id=message_id)
    return found


def parked_times(ops: Context, dest: Destination, message_ids: list[str]) -> Op:
    """When each parked message (scheduled, delayed, waiting for a redelivery delay) is due, a
    repeating job's period and repeats left (a cron job's: those of each run its times start), a cron
    job's expression: id -> {"due", "period", "repeats_left", "cron"} (None where not parked / not
    repeating / no cron). Two reads of at most len(message_ids) fields (callers page them)."""
    if not message_ids:
        return {}
    prefix = ops.prefix(dest)
    scores = yield Command(("ZMSCORE", f"{prefix}:parked", *message_ids))
    jobs = yield Command(("HMGET", f"{prefix}:sched", *message_ids))
    out: dict[str, dict[str, int | None]] = {}
    for message_id, score, job in zip(message_ids, scores, jobs, strict=True):
        # a job: [packed message, period, repeats left, fired, routing plan, retain, retained, cron form,
        # ...] (lifecycle.lua); period 0: a topic's delayed message, one firing, not a repeating job
        fields = msgpack.unpackb(job, raw=True) if job else [None] * 3
        period, left = fields[1:3]
        form = fields[7] if len(fields) > 7 else None
        if not period:
            period, left = None, None
        out[message_id] = {"due": int(float(score)) if score is not None else None,
                           "period": period, "repeats_left": left, "cron": form[0].decode() if form else None}
    return out


def remove(ops: Context, dest: Destination, message_ids: list[str], now: int) -> Op:
    """Remove messages by id (in flight too, as ActiveMQ's removeMessage); returns how many."""
    call = calls.Remove.call(ops.prefix(dest), now, message_ids)
    removed = calls.Remove.parse((yield from ops.eval(Home(dest), now, call)))
    yield from ops.continue_dispatch(Home(dest), now, removed.tail.flags, removed.tail.hold_until)
    return removed.removed


def scheduled_page(ops: Context, dest: Destination, cursor: str | None, start: int | None, end: int | None,
                   limit: int, now: int) -> Op:
    """A page of the destination's scheduled jobs (delayed messages, repeating jobs, a topic's), due from
    `start` to `end` when given, in due order: browse.lua's parked walk, BROWSE_EXAMINE examined a call
    at most. Returns ScheduledPage; pass its next_cursor to continue (another cursor is refused by name)."""
    if cursor and not _SCHEDULED_CURSOR.fullmatch(cursor):
        raise InvalidConsumer(f"cursor {cursor[:100]!r} is not one this listing gave", field="cursor")
    return calls.Browse.parse_scheduled((yield calls.Browse.scheduled_call(
        ops.prefix(dest), now, cursor or "", limit, BROWSE_EXAMINE, start, end)), dest.uri)


def with_parked(ops: Context, dests: list[Destination]) -> Op:
    """Those of `dests` that have anything parked (a scheduled job, a delayed message, a redelivery delay):
    one MULTI/EXEC of a ZCARD (O(1)) each, so a walk over every destination (scheduler management) asks the
    few that may have jobs instead of each in turn. Callers pass a bounded chunk."""
    if not dests:
        return []
    counts = yield [("ZCARD", f"{ops.prefix(dest)}:parked") for dest in dests]
    return [dest for dest, count in zip(dests, counts, strict=True) if count]


def cancel_scheduled(ops: Context, dest: Destination, job_ids: list[str], now: int) -> Op:
    """Cancel scheduled jobs by id, each counted `cancelled` (as remove); an id that is not a job of
    this destination now (unknown, or a message that has arrived) is left. Returns how many. An id not
    parked here at all costs one read, no script call (a REMOVE asks every destination in turn)."""
    parked = yield Command(("HMGET", f"{ops.prefix(dest)}:parkinfo", *job_ids))
    job_ids = [job_id for job_id, info in zip(job_ids, parked, strict=True) if info is not None]
    if not job_ids:
        return 0
    call = calls.Remove.call(ops.prefix(dest), now, job_ids, scheduled_only=True)
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
    st = yield from homes.stats(ops, Home(dest), now)
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
          progress: Callable[[int, int], None] | None = None, tally: str = "") -> Op:
    """Remove every message there when the purge starts (broker sequence up to the mark the first call
    takes; later sends stay), wherever it is, in calls of at most PURGE_EXAMINE examined messages
    (scripts/lua/purge.lua): producers and consumers go on between them. `progress(removed, total)` is
    told after each call (`total`: what the queue held at the start). Interrupted, run it again.
    `tally`: a hash whose `messages` each call adds what it removed to (a temporary queue's deletion)."""
    removed, mark, cursor = 0, "", ""
    while True:
        purged = calls.Purge.parse((yield from ops.eval(Home(dest), now, calls.Purge.call(
            ops.prefix(dest), now, mark, cursor, PURGE_EXAMINE, tally))))
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
