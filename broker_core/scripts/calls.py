"""One typed call per script (lua/<name>.lua): how to call it and what its reply says.

Each script has one class here, named after it: its classmethods build the `Eval` (keys and arguments in
the order the script reads them) from typed arguments, and `parse` (or one parser per operation of a
script with several) turns the raw reply into a typed value. This is the only module that knows where a
value sits in a script's reply; the operations read names.

Every script that can leave work behind for its caller ends its reply with the same tail
(`dispatch.add_tail` in lua/includes/dispatch.lua), read by `split` into a `Tail`: how many messages the
call dispatched, the flags saying what is left (a pass that has more, forwards waiting, a topic's unfinished
fan-out), when a parked message or a delayed start comes due, and, when there are any, the subscriptions
whose pass has more (a topic's scripts) and the deliveries pushed to the calling process's own consumers
(send.lua, lua/includes/outbox.lua, its push_* functions).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, ClassVar

from .. import model
from ..effects import Eval
from ..messages import Delivery, schedule_of, unpack_delivery, without_body
from ..model import (
    Browsed,
    BrowsePage,
    DestinationSummary,
    EnqueueTimes,
    GroupInfo,
    GroupPage,
    MessageSizes,
    ScheduledPage,
)
from ..resp import reply_text as _text

# The tail's flags (lua/includes/dispatch.lua, forward.lua, topic_send.lua); EXTRAS is the tail's own: the
# subscription keys and the pushes come before its three values, flat, then their two counts.
PASS_HAS_MORE, FORWARDS_WAITING, FANOUT_UNFINISHED, EXTRAS = 1, 2, 4, 8


# Tail, Sent and Acked come from most script calls, a few on every message's path. A frozen dataclass's
# generated __init__ sets each field with its own object.__setattr__ call (about 1,500 instructions a
# field); their own __init__ writes the fields into the instance's dict, which the frozen __setattr__ does
# not guard (so no slots), in half the instructions. Equality, hashing, repr and immutability are the
# dataclass's own.


@dataclass(frozen=True, init=False)
class Tail:
    """What a call left for its caller to finish (see the module's docstring)."""

    dispatched: int
    flags: int
    hold_until: int
    more: tuple[str, ...] = ()  # subscription keys whose pass has more (a topic's scripts)
    pushed: tuple[bytes, ...] = ()  # push payloads for this process's consumers (outbox.lua)

    def __init__(self, dispatched: int, flags: int, hold_until: int, more: tuple[str, ...] = (),
                 pushed: tuple[bytes, ...] = ()) -> None:
        fields = self.__dict__
        fields["dispatched"], fields["flags"], fields["hold_until"] = dispatched, flags, hold_until
        fields["more"], fields["pushed"] = more, pushed


NO_WORK = Tail(0, 0, 0)


def split(reply: list[Any]) -> tuple[list[Any], Tail]:
    """A reply's own values and the tail it ends with (dispatch.add_tail): dispatched, flags, hold_until
    last, and before them, with flag EXTRAS, the subscription keys whose pass has more and the pushes,
    flat, then their two counts."""
    flags = int(reply[-2])
    if not flags & EXTRAS:  # (the usual tail; with nothing in it, the one NO_WORK)
        dispatched, hold_until = int(reply[-3]), int(reply[-1])
        tail = Tail(dispatched, flags, hold_until) if dispatched or flags or hold_until else NO_WORK
        return reply[:-3], tail
    pushes_end = len(reply) - 5
    pushes_start = pushes_end - int(reply[-4])
    keys_start = pushes_start - int(reply[-5])
    return reply[:keys_start], Tail(int(reply[-3]), flags & ~EXTRAS, int(reply[-1]),
                                    tuple(_text(k) for k in reply[keys_start:pushes_start]),
                                    tuple(reply[pushes_start:pushes_end]))


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    """A flat field/value list (HGETALL's) as a dict."""
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}


def _deliveries(flat: Sequence[Any], start: int, end: int, uri: str, consumer_id: str) -> list[Delivery]:
    """Messages a script handed over: groups of (id, packed message, redeliveries, group first)."""
    return [unpack_delivery(_text(flat[i]), uri, consumer_id, flat[i + 1], int(flat[i + 2]),
                            bool(int(flat[i + 3])))
            for i in range(start, end, 4)]


def _flag(value: bool) -> str:
    return "1" if value else "0"


def step_of(call: Eval, tx_key: str) -> Eval:
    """`call` as a step of the commit of the transaction whose key is `tx_key`: it runs only while that
    transaction is open and no step before it was refused, and a refusal makes every later step not
    apply (lua/includes/base.lua begin_call)."""
    return call._replace(keys=(*call.keys, tx_key))


class ScriptCall:
    """The typed call of the script named `script` (lua/<script>.lua)."""

    script: ClassVar[str]


# -- the replies --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Closing:
    """consumer_add, topic_subscribe: the consumer id is a closed consumer's whose messages are still going
    back (return_owed.lua); nothing changed."""


@dataclass(frozen=True, slots=True)
class Full:
    """send, topic_send: the messages do not fit a memory limit (lua/includes/flow.lua); nothing stored."""

    scope: str  # 'destination' or 'broker'
    used: int
    limit: int
    fail_now: bool  # sendFailIfNoSpace
    timeout_ms: int  # sendFailIfNoSpaceAfterTimeout (0: wait until there is space)
    need: int  # what the refused check needed (with a routing plan: every place it will be stored)
    full_destination: str  # the full one when it is another (a virtual destination's target), else ''
    drops_copies: bool  # the full one drops its copies instead (dropOnResourceLimit)


@dataclass(frozen=True, init=False)
class Sent:
    """send, topic_send: a status per message ('ok', 'duplicate', 'expired', 'forwarded'); for 'check' and
    'probe', none and NO_WORK."""

    statuses: tuple[str, ...]
    tail: Tail

    def __init__(self, statuses: tuple[str, ...], tail: Tail) -> None:  # (as Tail's)
        fields = self.__dict__
        fields["statuses"], fields["tail"] = statuses, tail


def _sent(reply: list[Any]) -> Sent | Full:
    if reply and reply[0] == b"":
        if len(reply) > 1 and reply[1] == b"full":
            plan_need = reply[9] if len(reply) > 9 else None
            need = int(plan_need) if plan_need not in (None, b"", "") else int(reply[7])
            full = _text(reply[8]) if len(reply) > 8 and reply[8] else ""
            return Full(_text(reply[2]), int(reply[3]), int(reply[4]), bool(int(reply[5])), int(reply[6]),
                        need, full, len(reply) > 10 and reply[10] in (1, b"1", "1"))
        return Sent((), NO_WORK)  # 'check', 'probe'
    statuses, end = split(reply)
    return Sent(tuple(map(_text, statuses)), end)


# -- the scripts, alphabetically -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Aborted:
    ran: bool  # False: not due (checkPeriod)
    tracked: int  # consumers the strategy tracks as slow
    aborted: tuple[str, ...]  # their messages are all owed (return_owed.lua)
    tail: Tail


class Abort(ScriptCall):
    """abort.lua: one run of a slow-consumer strategy, or an operator's abort."""

    script = "abort"

    @classmethod
    def check(cls, prefix: str, now: int, tombstones_max: int, tombstone_ms: int, strategy: str,
              check_period: int, max_slow_duration: int, max_slow_count: int, abort_connection: bool,
              max_time_since_last_ack: int, ignore_idle_consumers: bool) -> Eval:
        return Eval(cls.script, (prefix,), (
            now, 0, tombstones_max, tombstone_ms, "check", strategy, check_period, max_slow_duration,
            max_slow_count, _flag(abort_connection), max_time_since_last_ack, _flag(ignore_idle_consumers)))

    @classmethod
    def abort(cls, prefix: str, now: int, tombstones_max: int, tombstone_ms: int, consumer_id: str,
              reason: str, abort_connection: bool) -> Eval:
        return Eval(cls.script, (prefix,), (now, 0, tombstones_max, tombstone_ms, "abort", consumer_id,
                                            reason, _flag(abort_connection)))

    @staticmethod
    def parse(reply: list[Any]) -> Aborted:
        own, end = split(reply)
        return Aborted(bool(int(own[0])), int(own[1]), tuple(_text(x) for x in own[2:]), end)


@dataclass(frozen=True, init=False)
class Acked:
    """Per request, in order: how many were acknowledged and the next messages handed over."""

    results: list[tuple[int, list[Delivery]]]
    tail: Tail

    def __init__(self, results: list[tuple[int, list[Delivery]]], tail: Tail) -> None:  # (as Tail's)
        fields = self.__dict__
        fields["results"], fields["tail"] = results, tail


class Ack(ScriptCall):
    """ack.lua: acknowledgements of one or more consumers of a destination, checked before any applies."""

    script = "ack"

    @classmethod
    def call(cls, prefix: str, now: int, requests: Iterable[tuple[str, str, int, Sequence[str]]]) -> Eval:
        """`requests`: (consumer id, mode, messages to receive after, message ids) each."""
        args: list[Any] = [now, 0]
        for consumer_id, mode, receive, message_ids in requests:
            args += [consumer_id, mode, receive, len(message_ids), *message_ids]
        return Eval(cls.script, (prefix,), tuple(args))

    @classmethod
    def check(cls, prefix: str, now: int, consumer_id: str, mode: str, message_ids: Sequence[str]) -> Eval:
        """The checks only, nothing changed (a large ack is checked whole, then sent in parts)."""
        return Eval(cls.script, (prefix,),
                    (now, "check", consumer_id, mode, 0, len(message_ids), *message_ids))

    @classmethod
    def commit(cls, prefix: str, now: int, consumer_id: str, mode: str, message_ids: Sequence[str]) -> Eval:
        """A step of a transaction's commit, checked (`check`) earlier in its MULTI/EXEC: a message no
        longer in flight was acknowledged by an earlier step of the same commit, and is skipped."""
        return Eval(cls.script, (prefix,),
                    (now, "commit", consumer_id, mode, 0, len(message_ids), *message_ids))

    @staticmethod
    def parse(reply: list[Any], consumers: Sequence[tuple[str, str]]) -> Acked:
        """`consumers`: (destination uri, consumer id) per request, in order."""
        own, end = split(reply)
        results, at = [], 0
        for uri, consumer_id in consumers:
            acked, received = int(own[at]), int(own[at + 1])
            after = at + 2 + 4 * received
            results.append((acked, _deliveries(own, at + 2, after, uri, consumer_id)))
            at = after
        return Acked(results, end)


class Browse(ScriptCall):
    """browse.lua: one page of a queue's messages, never changing state."""

    script = "browse"

    @classmethod
    def call(cls, prefix: str, now: int, cursor: str, limit: int, examine: int,
             compiled_selector: str, parked: bool = True) -> Eval:
        return Eval(cls.script, (prefix,), (now, cursor, limit, examine, compiled_selector,
                                            "1" if parked else "0"))

    @staticmethod
    def parse(reply: list[Any], uri: str) -> BrowsePage:
        messages = [Browsed(unpack_delivery(_text(reply[i]), uri, _text(reply[i + 3]), reply[i + 1],
                                            int(reply[i + 4]), False), _text(reply[i + 2]))
                    for i in range(1, len(reply) - 1, 5)]
        return BrowsePage(messages, _text(reply[0]) or None, int(reply[-1]))

    @classmethod
    def scheduled_call(cls, prefix: str, now: int, cursor: str, limit: int, examine: int,
                       start: int | None, end: int | None) -> Eval:
        """The scheduled parked messages alone (jobs, delayed messages), in due order, due from `start` to
        `end` (inclusive; None: no bound): scheduler management's BROWSE and REMOVEALL."""
        if not cursor and start is not None:
            cursor = f"k:{start}|"  # (from that due time on; browse.lua)
        return Eval(cls.script, (prefix,), (now, cursor, limit, examine, "", "s", "" if end is None else end))

    @staticmethod
    def parse_scheduled(reply: list[Any], uri: str) -> ScheduledPage:
        jobs = [(unpack_delivery(_text(reply[i]), uri, "", reply[i + 1], 0, False), schedule_of(reply[i + 1]))
                for i in range(1, len(reply) - 1, 5)]  # (the last: how many it examined)
        return ScheduledPage(jobs, _text(reply[0]) or None)


class CancelPull(ScriptCall):
    """cancel_pull.lua: withdraw a timed-out pull request."""

    script = "cancel_pull"

    @classmethod
    def call(cls, prefix: str, now: int, consumer_id: str) -> Eval:
        return Eval(cls.script, (prefix,), (now, consumer_id))


@dataclass(frozen=True, slots=True)
class ConnectionEntry:
    """A registered connection as connections.lua reads it: its fields, and per subscription key its JSON,
    per destination it sent to "<count>|<last send ms>" (with `get`; a listing gives their numbers)."""

    connection_id: str
    fields: dict[str, str]
    subscription_count: int
    producer_count: int
    subscriptions: dict[str, str]
    producers: dict[str, str]
    destinations: tuple[str, ...] = ()  # (a listing's, when asked)


@dataclass(frozen=True, slots=True)
class ConnectionPage:
    entries: list[ConnectionEntry]
    cursor: str  # '' when the listing is done
    examined: int


class Connections(ScriptCall):
    """connections.lua: the connection registry (connections.py), one operation a call."""

    script = "connections"

    @classmethod
    def _call(cls, prefix: str, now: int, *args: Any) -> Eval:
        return Eval(cls.script, (prefix,), (now, *args))

    @classmethod
    def put(cls, prefix: str, now: int, payload: dict[str, Any]) -> Eval:
        return cls._call(prefix, now, "put", json.dumps(payload))

    @staticmethod
    def parse_put(reply: Any) -> bool:
        """False when the entry had lapsed: the caller writes it again whole."""
        return int(reply) != 2

    @classmethod
    def renew(cls, prefix: str, now: int, lease_ms: int, connection_ids: Sequence[str]) -> Eval:
        return cls._call(prefix, now, "renew", lease_ms, *connection_ids)

    @staticmethod
    def parse_renew(reply: list[Any]) -> list[str]:
        """The ids the registry no longer has."""
        return [_text(m) for m in reply]

    @classmethod
    def drop(cls, prefix: str, now: int, connection_ids: Sequence[str]) -> Eval:
        return cls._call(prefix, now, "drop", *connection_ids)

    @staticmethod
    def parse_drop(reply: Any) -> int:
        return int(reply)

    @classmethod
    def list_page(cls, prefix: str, now: int, cursor: str, count: int, filters: dict[str, Any]) -> Eval:
        return cls._call(prefix, now, "list", cursor, count, json.dumps(filters))

    @staticmethod
    def parse_list_page(reply: list[Any]) -> ConnectionPage:
        entries = [ConnectionEntry(_text(row[0]), _pairs(row[1]), int(row[2]), int(row[3]), {}, {},
                                   tuple(_text(d) for d in row[4]) if len(row) > 4 else ())
                   for row in reply[2:]]
        return ConnectionPage(entries, _text(reply[0]), int(reply[1]))

    @classmethod
    def get(cls, prefix: str, now: int, connection_id: str) -> Eval:
        return cls._call(prefix, now, "get", connection_id)

    @staticmethod
    def parse_get(reply: Any, connection_id: str) -> ConnectionEntry | None:
        if not reply:
            return None
        flat, subs, prods = reply
        return ConnectionEntry(connection_id, _pairs(flat), len(subs) // 2, len(prods) // 2, _pairs(subs),
                               _pairs(prods))

    @classmethod
    def close(cls, prefix: str, now: int, connection_id: str, reason: str) -> Eval:
        return cls._call(prefix, now, "close", connection_id, reason)

    @staticmethod
    def parse_close(reply: Any) -> tuple[str, str] | None:
        """(process, protocol) of the connection, or None when none is registered."""
        return (_text(reply[0]), _text(reply[1])) if reply else None

    @classmethod
    def take(cls, prefix: str, now: int, process: str, most: int) -> Eval:
        return cls._call(prefix, now, "take", process, most)

    @staticmethod
    def parse_take(reply: Any) -> list[tuple[str, str]]:
        """(connection id, reason) per close request."""
        return [(_text(row[0]), _text(row[1])) for row in reply or []]


class CommitEnd(ScriptCall):
    """commit_end.lua: the last call of a transaction's commit; ends the transaction when every step
    applied (1), else leaves it as it was and replies with an error (NOT_COMMITTED, NO_TRANSACTION)."""

    script = "commit_end"

    @classmethod
    def call(cls, tx_key: str) -> Eval:
        return Eval(cls.script, (tx_key,), ())


class TxRecord(ScriptCall):
    """tx_record.lua: records added to an open transaction if its tally is still the one read (1; 0: it
    changed meanwhile; -1: no open transaction)."""

    script = "tx_record"

    @classmethod
    def call(cls, tx_key: str, tally: bytes, new_tally: bytes, records: list[bytes]) -> Eval:
        return Eval(cls.script, (tx_key,), (tally, new_tally, *records))


@dataclass(frozen=True, slots=True)
class ConsumerAdded:
    owner: str  # the exclusive owner ('' when none)
    prefetch: int  # in force
    tail: Tail


class ConsumerAdd(ScriptCall):
    """consumer_add.lua: register a queue consumer."""

    script = "consumer_add"

    @classmethod
    def call(cls, prefix: str, now: int, consumer_id: str, definition: bytes, lease_ms: int,
             prefetch: int, max_consumers: int) -> Eval:
        """`prefetch`: the one asked for, -1 for the policy's default; `max_consumers`: the consumers the
        queue may have with this one (SIGNALBOX_MAX_CONSUMERS; 0: no limit)."""
        return Eval(cls.script, (prefix,),
                    (now, 0, consumer_id, definition, lease_ms, prefetch, max_consumers))

    @staticmethod
    def parse(reply: list[Any]) -> ConsumerAdded | Closing:
        if reply[0] == b"closing":
            return Closing()
        own, end = split(reply)
        return ConsumerAdded(_text(own[0]), int(own[1]), end)


@dataclass(frozen=True, slots=True)
class Owed:
    """consumer_close, return_owed: messages closed consumers of the destination still hold (0: none)."""

    owed: int
    tail: Tail


class ConsumerClose(ScriptCall):
    """consumer_close.lua: a consumer leaves; the first `chunk` of its messages go back now."""

    script = "consumer_close"

    @classmethod
    def call(cls, prefix: str, now: int, consumer_id: str, reason: str, chunk: int,
             written: int | None = None) -> Eval:
        extra = () if written is None else (written,)
        return Eval(cls.script, (prefix,), (now, 0, consumer_id, reason, chunk, *extra))

    @staticmethod
    def parse(reply: list[Any]) -> Owed:
        own, end = split(reply)
        return Owed(int(own[0]), end)


class DestinationDelete(ScriptCall):
    """destination_delete.lua: a destination's keys, all of them, its large parts drained first."""

    script = "destination_delete"
    DRAINING = "draining"  # parse: this call drained `chunk` entries and more are left; call again

    @classmethod
    def call(cls, prefix: str, now: int, registry: str, uri: str, tally: str, chunk: int,
             deletions: str) -> Eval:
        """`registry`: the destination registry, whose `uri` entry goes in the same step; `tally`: a hash
        counting the deletion (destinations, messages) in the same step ('' for none); `chunk`: the
        entries of its large parts (forward records, consumers, ...) drained at most per call;
        `deletions`: the records of deletions under way (keys.deletions_key), whose `uri` entry goes in
        the last step."""
        return Eval(cls.script, (prefix,), (now, registry, uri, tally, chunk, deletions))

    @classmethod
    def parse(cls, reply: Any) -> tuple[int, bool] | str | None:
        """(how many messages it held, whether the registry listed it); DRAINING when it drained a chunk
        and deleted nothing yet; None when nothing was deleted: a topic that has a subscription."""
        if not isinstance(reply, list):
            return None
        if len(reply) == 1:
            return cls.DRAINING
        return int(reply[0]), bool(int(reply[1]))


class Dispatch(ScriptCall):
    """dispatch.lua: one bounded chunk of the dispatch pass."""

    script = "dispatch"

    @classmethod
    def call(cls, prefix: str, now: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, 0))

    @staticmethod
    def parse(reply: list[Any]) -> Tail:
        return split(reply)[1]


class EventsTrim(ScriptCall):
    """events_trim.lua: the event archive drops what it archived from a destination's event stream."""

    script = "events_trim"

    @classmethod
    def call(cls, prefix: str, below: str, limit: int) -> Eval:
        return Eval(cls.script, (prefix,), (below, limit))

    @staticmethod
    def parse(reply: Any) -> tuple[int, int]:
        """(entries dropped, events they held)."""
        return int(reply[0]), int(reply[1])


class FlowRelease(ScriptCall):
    """flow_release.lua: a transaction's reserved space given back."""

    script = "flow_release"

    @classmethod
    def call(cls, prefix: str, now: int, transaction: str) -> Eval:
        return Eval(cls.script, (prefix,), (now, transaction))


class ForwardDone(ScriptCall):
    """forward_done.lua: one forward finished (delivered, or refused for good)."""

    script = "forward_done"

    @classmethod
    def done(cls, prefix: str, now: int, record: Any, target_meta_key: str, charge: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, "done", record, target_meta_key, charge))

    @classmethod
    def refused(cls, prefix: str, now: int, record: Any, target: str, reason: str) -> Eval:
        return Eval(cls.script, (prefix,), (now, "refused", record, "", 0, target, reason))


class GroupCounts(ScriptCall):
    """group_counts.lua: messages per group (the console)."""

    script = "group_counts"

    @classmethod
    def call(cls, prefix: str, now: int, pending_limit: int, in_flight_limit: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, pending_limit, in_flight_limit))

    @staticmethod
    def parse(reply: list[Any]) -> model.GroupCounts:
        groups = {_text(reply[i]): (int(reply[i + 1]), int(reply[i + 2])) for i in range(4, len(reply), 3)}
        return model.GroupCounts(groups, int(reply[0]), bool(int(reply[1])), int(reply[2]),
                                 bool(int(reply[3])))


class GroupList(ScriptCall):
    """group_list.lua: a page of message groups with their owners."""

    script = "group_list"

    @classmethod
    def call(cls, prefix: str, now: int, cursor: str, limit: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, cursor, limit))

    @staticmethod
    def parse(reply: list[Any]) -> GroupPage:
        groups = [GroupInfo(_text(reply[i]), _text(reply[i + 1]), int(reply[i + 2]))
                  for i in range(1, len(reply), 3)]
        following = _text(reply[0])
        return GroupPage(groups, None if following == "0" else following)


@dataclass(frozen=True, slots=True)
class Counted:
    """group_reset, release: how many (groups removed, messages returned)."""

    count: int
    tail: Tail


class GroupReset(ScriptCall):
    """group_reset.lua: removeMessageGroup, or every group (group None)."""

    script = "group_reset"

    @classmethod
    def call(cls, prefix: str, now: int, group_id: str | None) -> Eval:
        return Eval(cls.script, (prefix,), (now, 0, *(("", "all") if group_id is None else (group_id, ""))))

    @staticmethod
    def parse(reply: list[Any]) -> Counted:
        own, end = split(reply)
        return Counted(int(own[0]), end)


@dataclass(frozen=True, slots=True)
class Probe:
    """maintenance.lua 'recover' (and the first part of 'visit')."""

    held: bool  # the 'recover' lease was taken: something to do
    lapsed: int  # consumers whose lease lapsed
    forwards: int  # forwards waiting past the grace time
    due: int  # next dispatch time (0: none)
    owed: int  # closed consumers' messages still owed, ended subscriptions', unfinished fan-outs


@dataclass(frozen=True, slots=True)
class Visit:
    """maintenance.lua 'visit'."""

    probe: Probe
    sweep_due: int  # 0, 1, or 2: a sweep of nothing, done by the visit itself
    slow_due: bool
    offline_due: bool
    scheduled: bool  # the index entries are set; else the caller calls `schedule` after the work


class Maintenance(ScriptCall):
    """maintenance.lua: the maintenance jobs' leases, the recovery probe, the tick's visit."""

    script = "maintenance"

    @classmethod
    def acquire(cls, prefix: str, now: int, job: str, token: str, ttl_ms: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, "acquire", job, token, ttl_ms))

    @classmethod
    def release(cls, prefix: str, now: int, job: str, token: str) -> Eval:
        return Eval(cls.script, (prefix,), (now, "release", job, token))

    @staticmethod
    def parse_held(reply: Any) -> bool:
        """acquire: the caller holds the lease now; release: it held it."""
        return bool(int(reply))

    @classmethod
    def recover(cls, prefix: str, now: int, token: str, ttl_ms: int, grace_ms: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, "recover", token, ttl_ms, grace_ms))

    @staticmethod
    def parse_recover(reply: list[Any]) -> Probe:
        held, lapsed, forwards, due, owed = (int(x) for x in reply[:5])
        return Probe(bool(held), lapsed, forwards, due, owed)

    @classmethod
    def visit(cls, prefix: str, now: int, token: str, ttl_ms: int, grace_ms: int, sweep_period: int,
              slow_period: int, offline_schedule: int, keep_ms: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, "visit", token, ttl_ms, grace_ms, sweep_period, slow_period,
                                            offline_schedule, keep_ms))

    @classmethod
    def parse_visit(cls, reply: list[Any]) -> Visit:
        sweep_due, slow_due, offline_due, scheduled = (int(x) for x in reply[5:9])
        return Visit(cls.parse_recover(reply), sweep_due, bool(slow_due), bool(offline_due), bool(scheduled))

    @classmethod
    def schedule(cls, prefix: str, now: int, grace_ms: int, sweep_period: int, slow_period: int,
                 offline_schedule: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, "schedule", grace_ms, sweep_period, slow_period,
                                            offline_schedule))


class MessageGet(ScriptCall):
    """message_get.lua: one message with where it is."""

    script = "message_get"

    @classmethod
    def call(cls, prefix: str, now: int, message_id: str) -> Eval:
        return Eval(cls.script, (prefix,), (now, message_id))

    @staticmethod
    def parse(reply: list[Any], uri: str, message_id: str) -> Browsed | None:
        if not reply:
            return None
        return Browsed(unpack_delivery(message_id, uri, _text(reply[2]), reply[0], int(reply[3]), False),
                       _text(reply[1]))


@dataclass(frozen=True, slots=True)
class Taken:
    """move, purge: how many messages, and where the next call goes on ('' when done)."""

    count: int
    cursor: str
    tail: Tail
    mark: str = ""  # purge: the broker sequence up to which messages go (the first call takes it)


class Move(ScriptCall):
    """move.lua: move, copy or retry messages, by id or by selector."""

    script = "move"

    @classmethod
    def call(cls, prefix: str, now: int, mode: str, target: str, cursor: str, examine: int, most: int,
             compiled_selector: str, message_ids: Sequence[str]) -> Eval:
        return Eval(cls.script, (prefix,), (now, 0, mode, target, cursor, examine, most, compiled_selector,
                                            *message_ids))

    @staticmethod
    def parse(reply: list[Any]) -> Taken:
        own, end = split(reply)
        return Taken(int(own[0]), _text(own[1]), end)


@dataclass(frozen=True, slots=True)
class Nacked:
    dead_lettered: int
    redelivered: int
    tail: Tail


class Nack(ScriptCall):
    """nack.lua: negative acknowledgement."""

    script = "nack"

    @classmethod
    def call(cls, prefix: str, now: int, consumer_id: str, poison: bool, jitter: float,
             message_ids: Sequence[str]) -> Eval:
        return Eval(cls.script, (prefix,), (now, 0, consumer_id, _flag(poison), repr(jitter), *message_ids))

    @staticmethod
    def parse(reply: list[Any]) -> Nacked:
        own, end = split(reply)
        return Nacked(int(own[0]), int(own[1]), end)


class Pause(ScriptCall):
    """pause.lua: pause or resume dispatch."""

    script = "pause"

    @classmethod
    def call(cls, prefix: str, now: int, paused: bool) -> Eval:
        return Eval(cls.script, (prefix,), (now, 0, _flag(paused)))

    @staticmethod
    def parse(reply: list[Any]) -> Tail:
        return split(reply)[1]


class Purge(ScriptCall):
    """purge.lua: one bounded call of a purge."""

    script = "purge"

    @classmethod
    def call(cls, prefix: str, now: int, mark: str, cursor: str, examine: int, tally: str = "") -> Eval:
        """`tally`: a hash whose `messages` counts what the call removes, in the same step."""
        return Eval(cls.script, (prefix,), (now, 0, mark, cursor, examine, *((tally,) if tally else ())))

    @staticmethod
    def parse(reply: list[Any]) -> Taken:
        own, end = split(reply)
        return Taken(int(own[0]), _text(own[1]), end, _text(own[2]))


@dataclass(frozen=True, slots=True)
class RateSampled:
    """What a rate_sample call did: how many of its destinations exist (`sampled`), how many it finished
    (`done`); when a topic did not fit (the destination at `done`), where its subscriptions go on
    (`start`), the one read last (`last`) and the sums read so far (`carry`), for the next call."""

    sampled: int
    done: int
    start: int = 0
    last: str = ""
    carry: str = ""


class RateSample(ScriptCall):
    """rate_sample.lua: the rate history's sampler over a few destinations."""

    script = "rate_sample"

    @classmethod
    def call(cls, rates_key: str, prefixes: Sequence[str], now: int, kinds: str, pass_span: int, keep_ms: int,
             budget: int, start: int = 0, last: str = "", carry: str = "") -> Eval:
        return Eval(cls.script, (rates_key, *prefixes),
                    (now, kinds, pass_span, keep_ms, budget, start, last, carry))

    @staticmethod
    def parse(reply: Any) -> RateSampled:
        if len(reply) == 2:
            return RateSampled(int(reply[0]), int(reply[1]))
        return RateSampled(int(reply[0]), int(reply[1]), int(reply[2]), _text(reply[3]), _text(reply[4]))


@dataclass(frozen=True, slots=True)
class Reaped:
    closed: list[str]
    owed: int
    tail: Tail


class Reap(ScriptCall):
    """reap.lua: close the consumers whose lease lapsed."""

    script = "reap"

    @classmethod
    def call(cls, prefix: str, now: int, most: int, chunk: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, 0, most, chunk))

    @staticmethod
    def parse(reply: list[Any]) -> Reaped:
        own, end = split(reply)
        return Reaped([_text(x) for x in own[:-1]], int(own[-1]), end)


@dataclass(frozen=True, slots=True)
class Received:
    deliveries: list[Delivery]
    last: int  # (with `after`) the dispatch sequence of the last message handed over
    tail: Tail


class Receive(ScriptCall):
    """receive.lua: hand over a consumer's dispatched messages."""

    script = "receive"

    @classmethod
    def call(cls, prefix: str, now: int, consumer_id: str, most: int, lease_ms: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, 0, consumer_id, most, lease_ms))

    @classmethod
    def after(cls, prefix: str, now: int, consumer_id: str, most: int, lease_ms: int, after: int,
              push: int) -> Eval:
        """For an adapter taking pushed deliveries: what was handed over after `after` first."""
        return Eval(cls.script, (prefix,), (now, 0, consumer_id, most, lease_ms, after, push))

    @staticmethod
    def parse(reply: list[Any], uri: str, consumer_id: str) -> Received:
        own, end = split(reply)
        return Received(_deliveries(own, 0, len(own), uri, consumer_id), 0, end)

    @staticmethod
    def parse_after(reply: list[Any], uri: str, consumer_id: str) -> Received:
        own, end = split(reply)
        return Received(_deliveries(own, 1, len(own), uri, consumer_id), int(own[0]), end)

    @classmethod
    def turn(cls, prefix: str, now: int, consumer_id: str, turn_ms: int) -> Eval:
        """Take the consumer's turn (broker_core/turns.py, the ActiveMQ-compatible GET) for `turn_ms` and
        receive one message in the same call (`after` and `push` empty; lease 0: the consumer's own)."""
        return Eval(cls.script, (prefix,), (now, 0, consumer_id, 1, 0, "", "", turn_ms))

    @staticmethod
    def parse_turn(reply: list[Any], uri: str, consumer_id: str) -> Turn:
        if len(reply) < 3:  # {-1}: another request has the turn; {-2, left}: taken, messages left in flight
            return Turn(int(reply[0]) == -1, int(reply[1]) if len(reply) > 1 else 0, None)
        return Turn(False, 0, Receive.parse(reply, uri, consumer_id))


@dataclass(frozen=True, slots=True)
class Turn:
    """A turn asked for with a receive (Receive.turn)."""

    busy: bool  # another request has it: nothing was done
    left: int  # the turn is taken and nothing received: messages a request that died in its turn left
    received: Received | None  # the turn is taken and this handed over (None with `busy` or `left`)


class Release(ScriptCall):
    """release.lua: return in-flight messages at once (rollback, recover)."""

    script = "release"

    @classmethod
    def call(cls, prefix: str, now: int, consumer_id: str, message_ids: Sequence[str],
             tx_key: str = "", keep: bool = False) -> Eval:
        """`tx_key`: the rolled back transaction's key, whose held messages (the consumer closed since its
        ack) go back too. `keep`: those still in flight with the consumer stay delivered to it, only the
        window their transacted acks opened closing again (release.lua)."""
        return Eval(cls.script, (prefix,), (now, 0, consumer_id, tx_key, int(keep), *message_ids))

    @staticmethod
    def parse(reply: list[Any]) -> Counted:
        own, end = split(reply)
        return Counted(int(own[0]), end)


@dataclass(frozen=True, slots=True)
class Removed:
    removed: int
    left: int  # pending, in flight and parked after it
    tail: Tail


class Remove(ScriptCall):
    """remove.lua: remove messages by id."""

    script = "remove"

    @classmethod
    def call(cls, prefix: str, now: int, message_ids: Sequence[str], scheduled_only: bool = False) -> Eval:
        return Eval(cls.script, (prefix,), (now, 0, 1 if scheduled_only else 0, *message_ids))

    @staticmethod
    def parse(reply: list[Any]) -> Removed:
        own, end = split(reply)
        return Removed(int(own[0]), int(own[1]), end)


class Renew(ScriptCall):
    """renew.lua: renew consumers' leases."""

    script = "renew"

    @classmethod
    def call(cls, prefix: str, now: int, lease_ms: int, consumer_ids: Sequence[str]) -> Eval:
        return Eval(cls.script, (prefix,), (now, lease_ms, *consumer_ids))

    @staticmethod
    def parse(reply: list[Any]) -> list[str]:
        """The ids that are not registered."""
        return [_text(x) for x in reply]


class Browsers(ScriptCall):
    """browsers.lua: a queue's open browsers, counted among its consumers while their leases last."""

    script = "browsers"

    @classmethod
    def open(cls, prefix: str, now: int, lease_ms: int, browser_id: str, prefetch: int,
             selector: str | None) -> Eval:
        return Eval(cls.script, (prefix,), (now, "open", lease_ms, browser_id, prefetch, selector or ""))

    @classmethod
    def renew(cls, prefix: str, now: int, lease_ms: int, browser_ids: Sequence[str]) -> Eval:
        return Eval(cls.script, (prefix,), (now, "renew", lease_ms, *browser_ids))

    @classmethod
    def close(cls, prefix: str, now: int, reason: str, browser_ids: Sequence[str]) -> Eval:
        return Eval(cls.script, (prefix,), (now, "close", reason, *browser_ids))

    @classmethod
    def list(cls, prefix: str, now: int, most: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, "list", most))

    @staticmethod
    def parse(reply: list[Any]) -> tuple[list[Any], Tail]:
        """The op's values (renew: the ids that are not open, closed or lapsed and removed; close: how
        many were open; list: id, prefetch, selector of each open one) and the tail (advisories waiting)."""
        return split(reply)


class ReturnOwed(ScriptCall):
    """return_owed.lua: the next chunk of what closed consumers still hold."""

    script = "return_owed"

    @classmethod
    def call(cls, prefix: str, now: int, chunk: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, 0, chunk))

    @staticmethod
    def parse(reply: list[Any]) -> Owed:
        own, end = split(reply)
        return Owed(int(own[0]), end)


class SelectorMatch(ScriptCall):
    """selector_match.lua: one selector against one message (keyless)."""

    script = "selector_match"
    RESULTS: ClassVar[dict[str, bool | None]] = {"TRUE": True, "FALSE": False, "NULL": None}

    @classmethod
    def call(cls, compiled_selector: str, message_json: str) -> Eval:
        return Eval(cls.script, (), (compiled_selector, message_json))

    @classmethod
    def parse(cls, reply: Any) -> bool | None:
        return cls.RESULTS[_text(reply)]


class _Checks:
    """A send script's check call (origin 'check'): the messages' size and property limits checked as any
    send checks them, nothing stored. Each message goes as (id, packed size, packed without its body),
    not as `call` gives it: the step after the check carries the body (a transaction's commit checks
    every part in its one MULTI/EXEC before any is stored, and each body Redis is given costs it a copy
    or two a byte while every client waits)."""

    script: ClassVar[str]

    @classmethod
    def check(cls, prefix: str, now: int, records: Iterable[Sequence[Any]]) -> Eval:
        """`records` as the class's `call` takes them."""
        return Eval(cls.script, (prefix,), (now, 0, "check", *chain.from_iterable(
            (record[0], len(record[1]), without_body(record[1])) for record in records)))


class Send(ScriptCall, _Checks):
    """send.lua: enqueue messages on a queue. `budget` may carry the calling process's wake-up channel
    ('0~<channel>': pushes to its consumers come back in the tail); `origin` 'producer', 'retry', 'commit',
    'forward', 'check' or 'probe', with a routing plan (virtual.py)."""

    script = "send"

    @classmethod
    def call(cls, prefix: str, now: int, budget: int | str, origin: Any,
             records: Iterable[Sequence[Any]]) -> Eval:
        """`records`: (id, packed message) each."""
        return Eval(cls.script, (prefix,), (now, budget, origin, *chain.from_iterable(records)))

    @staticmethod
    def parse(reply: list[Any]) -> Sent | Full:
        return _sent(reply)


# The most consumers one stats.lua call reads (its five keys each: about 20 us a consumer on this project's
# 2-CPU VM, so 200 a call stay a few ms; docs/benchmarks.md, "Session 32").
STATS_PAGE = 200


@dataclass(frozen=True, slots=True)
class QueueConsumer:
    """stats.lua: one consumer as it is stored."""

    consumer_id: str
    definition: bytes  # packed (msgpack), b'' when unknown
    counters: dict[str, str]
    lease: str  # its expiry ('' when none)
    undelivered: int  # in its outbox


@dataclass(frozen=True, slots=True)
class QueueStats:
    """stats.lua's first call: a consistent snapshot of a queue (or subscription) and its first consumers."""

    meta: dict[str, str]
    pending: int
    in_flight: int
    groups: int
    parked: int
    forwarding: int
    consumers: list[QueueConsumer]
    memory_limit: str  # the destination's memoryLimit ('0': none)
    broker_memory_limit: str  # the broker's ('' when unset)
    events: int  # the events the event stream holds (a packed entry holds several: base.end_call)
    audit_size: int
    browsers: int  # open queue browsers, lease not lapsed (browsers.lua)
    order_size: int  # the order's consumers when more than STATS_PAGE (Stats.page reads the rest), else 0


class Stats(ScriptCall):
    """stats.lua: the counters and the first STATS_PAGE consumers, then a page of the rest a call."""

    script = "stats"

    @classmethod
    def call(cls, prefix: str, now: int, token: str) -> Eval:
        """`token`: names this read's copy of the order (unique to the read)."""
        return Eval(cls.script, (prefix,), (now, STATS_PAGE, token))

    @classmethod
    def page(cls, prefix: str, now: int, token: str, start: int) -> Eval:
        """The consumers of the order from index `start` (a multiple of STATS_PAGE, below
        QueueStats.order_size) as the first call copied it, those still registered."""
        return Eval(cls.script, (prefix,), (now, STATS_PAGE, token, "consumers", start))

    @staticmethod
    def parse(reply: list[Any]) -> QueueStats:
        limits, sizes = reply[7], reply[8]
        return QueueStats(_pairs(reply[0]), int(reply[1]), int(reply[2]), int(reply[3]), int(reply[4]),
                          int(reply[5]), Stats.parse_page(reply[6]), _text(limits[0]), _text(limits[1]),
                          int(sizes[0]), int(sizes[1]), int(reply[9]), int(reply[10]))

    @staticmethod
    def parse_page(flat: list[Any]) -> list[QueueConsumer]:
        return [QueueConsumer(_text(flat[i]), flat[i + 1] or b"", _pairs(flat[i + 2]), _text(flat[i + 3]),
                              int(flat[i + 4]))
                for i in range(0, len(flat), 5)]


SUMMARY_WIDTH = 17  # values per queue in summary_many.lua's reply


class SummaryMany(ScriptCall):
    """summary_many.lua: the main counters of many queues in one call."""

    script = "summary_many"

    @classmethod
    def call(cls, prefixes: Sequence[str], now: int, oldest: bool) -> Eval:
        return Eval(cls.script, tuple(prefixes), (now, int(oldest)))

    @staticmethod
    def parse(reply: list[Any], uris: Sequence[str]) -> list[DestinationSummary | None]:
        """Per queue (None: it does not exist)."""
        return [_summary(reply[SUMMARY_WIDTH * i:SUMMARY_WIDTH * (i + 1)], uri) for i, uri in enumerate(uris)]


def _summary(r: list[Any], uri: str) -> DestinationSummary | None:
    if not int(r[0]):
        return None
    n = [int(v) if v else 0 for v in r[6:11]]
    oldest = int(r[13]) if r[13] else None
    return DestinationSummary(uri, int(r[1]) + int(r[2]), int(r[1]), int(r[2]), int(r[3]), int(r[4]),
                              int(r[5]), n[0], n[1], n[2], n[3], n[4], r[11] in (b"1", "1"),
                              int(r[12]) if r[12] else 0, None if oldest == -1 else oldest, oldest == -1,
                              int(r[14]), MessageSizes.parse(r[15]), EnqueueTimes.parse(r[16]))


@dataclass(frozen=True, slots=True)
class Swept:
    examined: int
    expired: int
    done: bool  # the walk reached the end
    tail: Tail


class Sweep(ScriptCall):
    """sweep.lua: one page of the expiry sweep."""

    script = "sweep"

    @classmethod
    def call(cls, prefix: str, now: int) -> Eval:
        return Eval(cls.script, (prefix,), (now,))

    @staticmethod
    def parse(reply: list[Any]) -> Swept:
        own, end = split(reply)
        return Swept(int(own[0]), int(own[1]), bool(int(own[2])), end)


class TopicAdmin(ScriptCall):
    """topic_admin.lua: durable subscriptions' administration, one operation a call."""

    script = "topic_admin"

    @classmethod
    def unsubscribe(cls, prefix: str, now: int, key: str, client_id: str, subscription_name: str) -> Eval:
        return Eval(cls.script, (prefix,), (now, "unsubscribe", key, client_id, subscription_name))

    @classmethod
    def release(cls, prefix: str, now: int, key: str, field: str, uri: str) -> Eval:
        return Eval(cls.script, (prefix,), (now, "release", key, field, uri))

    @staticmethod
    def parse_dropped(reply: Any) -> int:
        """unsubscribe, release: the messages dropped with the subscription."""
        return int(reply)

    @classmethod
    def expire_offline(cls, prefix: str, now: int, timeout_ms: int, start: int, looks: int, removals: int
                       ) -> Eval:
        return Eval(cls.script, (prefix,), (now, "expire_offline", timeout_ms, start, looks, removals))

    @staticmethod
    def parse_expired(reply: list[Any]) -> tuple[int, list[str]]:
        """(where the next call starts in the topic's subscriptions, -1 when done; the keys of the
        subscriptions removed)."""
        return int(reply[0]), [_text(k) for k in reply[1:]]

    @classmethod
    def delete(cls, prefix: str, now: int, budget: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, "delete", budget))

    @staticmethod
    def parse_delete(reply: list[Any]) -> tuple[int, int]:
        """delete: (messages the removed subscriptions held, subscriptions left)."""
        return int(reply[0]), int(reply[1])

    @classmethod
    def limits(cls, prefix: str, now: int, start: int, count: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, "limits", start, count))

    @staticmethod
    def parse_limits(reply: list[Any]) -> tuple[int, dict[str, int]]:
        """(where the next call starts in the topic's subscriptions, -1 when done; subscription key -> the
        pending-message limit in force)."""
        return int(reply[0]), {_text(reply[i]): int(reply[i + 1]) for i in range(1, len(reply), 2)}

    @classmethod
    def drop_idle(cls, prefix: str, now: int, jobs: Sequence[str]) -> Eval:
        return Eval(cls.script, (prefix,), (now, "drop_idle", *jobs))

    @staticmethod
    def parse_drop_idle(reply: Any) -> bool:
        """The idle pattern's keys went."""
        return bool(int(reply))


@dataclass(frozen=True, slots=True)
class FannedOut:
    finished: int  # fan-outs finished in this call
    left: int  # fan-outs still unfinished
    tail: Tail


class TopicFanout(ScriptCall):
    """topic_fanout.lua: go on with a topic's unfinished fan-outs."""

    script = "topic_fanout"

    @classmethod
    def call(cls, prefix: str, now: int) -> Eval:
        return Eval(cls.script, (prefix,), (now, 0))

    @staticmethod
    def parse(reply: list[Any]) -> FannedOut:
        own, end = split(reply)
        return FannedOut(int(own[0]), int(own[1]), end)


class TopicSend(ScriptCall, _Checks):
    """topic_send.lua: publish messages on a topic; `origin` as Send's."""

    script = "topic_send"

    @classmethod
    def call(cls, prefix: str, now: int, budget: int | str, origin: Any,
             records: Iterable[Sequence[Any]]) -> Eval:
        """`records`: (id, packed message, retain, retained copy) each (topics.pack_for_topic)."""
        return Eval(cls.script, (prefix,), (now, budget, origin, *chain.from_iterable(records)))

    @staticmethod
    def parse(reply: list[Any]) -> Sent | Full:
        return _sent(reply)


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """topic_subscribe: the durable key is registered on another topic; nothing changed."""

    uri: str


@dataclass(frozen=True, slots=True)
class CatchingUp:
    """topic_subscribe: the durable subscription's retroactive catch-up is still under way
    (topic_catchup.lua); nothing changed."""


@dataclass(frozen=True, slots=True)
class Subscribed:
    prefetch: int  # in force
    recovered: int  # messages a retroactive consumer got
    changed: bool  # a durable subscription replaced (selector or noLocal changed): its messages released
    tail: Tail
    catching_up: bool = False  # a new retroactive durable's catch-up goes on (topic_catchup.lua)


class TopicSubscribe(ScriptCall):
    """topic_subscribe.lua: subscribe a consumer to a topic."""

    script = "topic_subscribe"

    @classmethod
    def call(cls, prefix: str, now: int, consumer_id: str, definition: bytes, lease_ms: int, prefetch: int,
             key: str, subscription: bytes, retroactive: bool, client_id: str, subscription_name: str,
             registry_field: str, uri: str, checks: int) -> Eval:
        """`checks`: what a new retroactive durable's catch-up may check in this call (TopicCatchup)."""
        return Eval(cls.script, (prefix,), (now, 0, consumer_id, definition, lease_ms, prefetch, key,
                                            subscription, _flag(retroactive), client_id, subscription_name,
                                            registry_field, uri, checks))

    @staticmethod
    def parse(reply: list[Any]) -> Subscribed | Elsewhere | Closing | CatchingUp:
        if reply[0] == b"closing":
            return Closing()
        if reply[0] == b"catchup":
            return CatchingUp()
        if reply[0] == b"elsewhere":
            return Elsewhere(_text(reply[1]))
        own, end = split(reply)
        return Subscribed(int(own[0]), int(own[1]), own[2] == b"changed", end, int(own[3]) == 1)


@dataclass(frozen=True, slots=True)
class CaughtUp:
    more: bool  # the catch-up goes on
    recovered: int  # messages it replayed in this call
    tail: Tail


class TopicCatchup(ScriptCall):
    """topic_catchup.lua: the next slice of a new retroactive durable subscription's catch-up."""

    script = "topic_catchup"

    @classmethod
    def call(cls, prefix: str, now: int, key: str, checks: int) -> Eval:
        """`checks`: (stored message, other durable subscription) checks at most (one message at least)."""
        return Eval(cls.script, (prefix,), (now, 0, key, checks))

    @staticmethod
    def parse(reply: list[Any]) -> CaughtUp:
        own, end = split(reply)
        return CaughtUp(int(own[0]) == 1, int(own[1]), end)


@dataclass(frozen=True, slots=True)
class TopicSummaryPart:
    """topic_summary_many.lua: one topic's counters as far as a call read them."""

    exists: bool
    subscriptions: int
    next: int  # 0: the topic is complete; else where its subscriptions continue (in the next call)
    pending: int
    in_flight: int
    parked: int
    enqueued: int
    dequeued: int
    dispatched: int
    expired: int
    deadlettered: int
    memory: int
    memory_limit: int  # in force: the topic's memoryLimit, else the broker's
    message_sizes: MessageSizes  # the topic's own
    enqueue_times: EnqueueTimes  # the topic's own (whichever subscription dispatched)

    def continued_by(self, part: TopicSummaryPart) -> TopicSummaryPart:
        """This topic's parts so far and the next one: the sums over subscriptions grow."""
        return TopicSummaryPart(
            self.exists, self.subscriptions, part.next, self.pending + part.pending,
            self.in_flight + part.in_flight, self.parked + part.parked, self.enqueued,
            self.dequeued + part.dequeued, self.dispatched + part.dispatched, self.expired + part.expired,
            self.deadlettered + part.deadlettered, self.memory, self.memory_limit, self.message_sizes,
            self.enqueue_times)


TOPIC_SUMMARY_WIDTH = 15  # values per topic in topic_summary_many.lua's reply


class TopicSummaryMany(ScriptCall):
    """topic_summary_many.lua: the main counters of topics, as topic_ops.stats adds them up."""

    script = "topic_summary_many"

    @classmethod
    def call(cls, prefixes: Sequence[str], now: int, start: int, budget: int) -> Eval:
        return Eval(cls.script, tuple(prefixes), (now, start, budget))

    @staticmethod
    def parse(reply: list[Any]) -> list[TopicSummaryPart]:
        parts = []
        for i in range(0, len(reply), TOPIC_SUMMARY_WIDTH):
            last = i + TOPIC_SUMMARY_WIDTH - 2  # (the sizes and the times: texts)
            v = [int(x) for x in reply[i:last]]
            parts.append(TopicSummaryPart(bool(v[0]), *v[1:], MessageSizes.parse(reply[last]),
                                          EnqueueTimes.parse(reply[last + 1])))
        return parts
