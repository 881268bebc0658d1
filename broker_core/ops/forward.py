"""Delivering outboxes: what a script recorded in a destination's forwarding hash for other destinations
(dead letters, moves, copies and retries, virtual destinations' copies, advisories, wildcard
subscriptions' copies) goes to its target here, each delivery and the removal of its record one
MULTI/EXEC. The only place a destination's operation reaches another destination: an operation writes the
record and yields `Forward` (broker_core/effects.py), and the router runs `forward` for it.
"""

from __future__ import annotations

from typing import Any

import msgpack

from ..destinations import Destination, parse_destination
from ..effects import Command, Op
from ..errors import InvalidDestination
from ..keys import Home
from ..messages import dead_letter_copy, failure_cause, forward_copy
from ..resp import reply_text as _str
from ..scripts import calls
from ..scripts.calls import Sent
from ..topics import wildcard_copy
from . import advisory, topics, virtual
from .context import Context

# forwards that keep the message as it is (not dead letters), but for a repeating job's schedule
TRANSFERS = ("move", "copy", "retry")
# forwards that publish a copy made for the target: a virtual destination's, an advisory, a wildcard
# subscription's (scripts/lua/includes/wildcard.lua), a topic's scheduled message firing (the topic is its
# own target: scripts/lua/includes/lifecycle.lua publish_firing). With TRANSFERS, every forward that is
# not a dead letter: only a dead letter's target is marked a dead-letter queue (meta dlq=1, which retry
# requires).
COPIES = ("virtual", "advisory", "wildcard", "scheduled")


def forward(ops: Context, dest: Destination, now: int, limit: int = 1_000) -> Op:
    """Deliver the messages a script set aside for other destinations (dead letters, moves, virtual
    destination copies, advisories), each delivery and the removal of its entry in one MULTI/EXEC,
    so a crash can neither lose nor duplicate one. Safe to repeat."""
    source_policy: dict[str, str] | None = None
    done = 0
    key = f"{ops.prefix(dest)}:fwd"
    while done < limit:
        # read a batch whole and deliver it in the order it was recorded (a record's 5th
        # element, if any), so a composite's targets get a producer's messages in order.
        entries: dict[Any, Any] = {}
        cursor: Any = 0
        while True:
            cursor, found = yield Command(("HSCAN", key, cursor, "COUNT", 100))  # redis-py: a dict
            entries.update(found)
            if int(cursor) == 0 or len(entries) >= limit:
                break
        if not entries:
            return done
        records = sorted(((raw_id, *msgpack.unpackb(packed, raw=True))
                          for raw_id, packed in entries.items()), key=lambda r: r[5] if len(r) > 5 else 0)
        ensured: set[Destination] = set()
        for raw_id, target_uri, cause, argument, blob, *extra in records:
            message_id = _str(raw_id).partition("|")[0]  # copies are '<id>|<target>'
            if source_policy is None:
                raw = yield Command(("HGETALL", f"{ops.prefix(dest)}:policy"))  # a dict from redis-py
                source_policy = {_str(k): _str(v) for k, v in raw.items() if k != b"_packed"}
            kind = _str(cause)
            try:
                # (a wildcard's pseudo-topic is allowed)
                target = parse_destination(_str(target_uri), allow_wildcards=True)
            except InvalidDestination:
                # a durable subscription's own dead-letter queue (destinationPerDurableSubscriber) whose
                # client id or subscription name makes no valid name: the topic's DLQ takes it instead
                if kind in TRANSFERS or kind in COPIES or not source_policy.get(
                        "deadLetterTarget"):
                    raise
                target = parse_destination(source_policy["deadLetterTarget"])
            retain, retained = "", b""
            if kind in TRANSFERS:
                # moved, copied or retried as it is, but without the schedule it may still carry (a
                # delayed message that arrived, a repeating job's delivery: forward_copy): it reached its
                # queue already, and its target must not schedule it again; it arrives there now
                copy = forward_copy(blob, "", arrived=True, message_id=message_id, now_ms=now)
            elif kind == "scheduled":
                # a topic's job fired: published to the topic's subscriptions of now without its schedule,
                # with its ActiveMQ.Retain action (the record's argument) and retained copy
                copy = forward_copy(blob, "", arrived=True, message_id=message_id)
                retain = _str(argument)
                retained = (forward_copy(extra[2], "", arrived=True, message_id=message_id)
                            if len(extra) > 2 and extra[2] else b"")
            elif kind == "virtual":  # a virtual destination's copy (virtual.py)
                copy = forward_copy(blob, _str(argument), message_id=message_id)
            elif kind == "advisory":  # an advisory message about an event (advisory.py)
                copy = advisory.build(message_id, argument, blob, now)
            elif kind == "wildcard":  # a wildcard subscription's copy (scripts/lua/includes/wildcard.lua)
                copy = wildcard_copy(blob, _str(argument))
            else:
                text = failure_cause(kind, _str(argument), source_policy)
                copy = dead_letter_copy(blob, dest.uri, text, now,
                                        int(source_policy.get("deadLetterExpiration", "0")), message_id)
                if dest.is_wildcard:  # the dead-letter queue of the topic it was published to
                    target = yield from topics.wildcard_dead_letter_target(ops, dest, copy, target)
            if target not in ensured:  # the MULTI below must not meet a target without a policy
                yield from ops.ensure(target, now)
                ensured.add(target)
            # the target's own virtual destinations apply (ActiveMQ re-routes a copy too); a
            # wildcard's pseudo-topic is no destination of its own and has none
            origin = "forward"
            # (a topic's firing was routed by its job's plan already, lifecycle.lua fire_scheduled)
            if not target.is_wildcard and kind != "scheduled":
                origin = yield from virtual.origin(ops, target, "forward")
            # a virtual copy still on its way counts against its target ('memfwd', virtual.lua)
            charge = int(extra[1]) if kind in ("virtual", "scheduled") and len(extra) > 1 else 0
            sending = calls.TopicSend if target.is_topic else calls.Send  # a topic: its subscriptions
            record = (message_id, copy, retain, retained) if target.is_topic else (message_id, copy)
            send = sending.call(ops.prefix(target), now, 0, origin, [record])
            # the target's send and the record's removal are one MULTI/EXEC, so a crash can
            # neither lose the copy nor deliver it twice (not even after the target's audit moved on).
            done_call = calls.ForwardDone.done(ops.prefix(dest), now, raw_id,
                                               f"{ops.prefix(target)}:meta", charge)
            reply, _ = yield [send, done_call]
            if isinstance(reply, Exception):
                if _str(str(reply)).startswith("NO_DESTINATION"):  # deleted since: put the record back
                    yield Command(("HSET", key, raw_id, entries[raw_id]))
                    if charge:
                        yield Command(("HINCRBY", f"{ops.prefix(target)}:meta", "memfwd", charge))
                    ensured.discard(target)
                    return done
                # a copy its target refuses for good is counted
                # (forward_refused) and logged, not retried for ever: forwarding goes on.
                yield calls.ForwardDone.refused(ops.prefix(dest), now, raw_id, target.uri,
                                                str(reply)[:200])
            else:
                sent = sending.parse(reply)
                assert isinstance(sent, Sent)  # (a forward is never refused for space: flow.py)
                if target.is_topic:
                    yield from topics.finish_send(ops, target, now, sent.tail)
                else:
                    yield from ops.continue_dispatch(Home(target), now, sent.tail.flags, sent.tail.hold_until)
            if kind not in TRANSFERS and kind not in COPIES:
                yield Command(("HSETNX", f"{ops.prefix(target)}:meta", "dlq", "1"))
            done += 1
    return done
