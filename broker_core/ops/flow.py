"""Producer flow control and memory usage (spec §9): the broker-wide limit, waiting for space, the error.

The counting is done by the scripts (scripts/lua/includes/flow.lua): a destination's usage is the bytes its
stored messages take (packed size, at least `minimumMessageSize`), the broker's usage the sum over all
destinations, in `<ns>:usage`. A send that would take either past its limit stores nothing; this module
then waits for space (re-running the send) or raises `ResourceAllocationError`, as the policy says:

- `producerFlowControl = false`: no limit applies to that destination's producers;
- `sendFailIfNoSpace = true` (policy, else the broker's setting): fail at once;
- otherwise wait, up to `sendFailIfNoSpaceAfterTimeout` ms (policy, else the broker's; 0 means ActiveMQ's
  "wait until there is space", which here is bounded by `MAX_SEND_WAIT_MS` so no caller hangs for ever).

Forwards (dead letters, moves, virtual destination copies) are exempt once recorded, as ActiveMQ exempts
its DLQ sends; a producer's send that makes virtual destination copies counts them up front, against the
broker's limit and each target's own limit (scripts/lua/includes/flow.lua).

A producer's batch, to a queue or a topic, goes in parts (`send_parts`), each waiting for space as its own
send: the queue and topic sends (ops/queues.py, ops/topics.py) share it from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config.system_usage import DEFAULT_MEMORY_LIMIT, SystemUsage
from ..destinations import Destination
from ..effects import Command, Forward, Op, Sleep
from ..errors import RETRY_AFTER_S, BrokerError, ResourceAllocationError
from ..keys import Home, usage_key
from ..model import SentId, percent
from ..scripts.calls import Full, Send, Sent, TopicSend
from .context import Context

MAX_SEND_WAIT_MS = 60_000  # the longest a send waits when the policy says "until there is space"
FIRST_POLL_MS, MAX_POLL_MS = 10, 250  # re-try a waiting send after 10 ms, doubling up to 250 ms
FLOW_DOC = "See http://activemq.apache.org/producer-flow-control.html for more info"
# A batch sent in one call of the API goes to Redis in parts of at most this many messages and bytes (one
# message at least): every part's limits are checked first, then the parts are stored in order, each atomic.
SEND_PART = 100
SEND_PART_BYTES = 1 << 20


def configure(broker: Any, usage: SystemUsage) -> None:
    """Apply broker-wide settings; every process sees them at its next send (they live in Redis)."""
    broker.redis.hset(usage_key(broker.namespace), mapping={
        "limit": usage.memory_limit,
        "sendFailIfNoSpace": "1" if usage.send_fail_if_no_space else "0",
        "sendFailIfNoSpaceAfterTimeout": usage.send_fail_if_no_space_after_timeout,
    })


@dataclass(frozen=True)
class MemoryUsage:
    """Bytes held against a limit; `percent_usage` as ActiveMQ's Usage reports it (floor, may pass 100)."""

    used: int
    limit: int

    @property
    def percent_usage(self) -> int:
        return percent(self.used, self.limit)


def memory_usage(used: Any, limit: Any) -> MemoryUsage:
    """The usage hash's `used` and `limit` as read (HMGET, sync or async client), absent ones defaulted."""
    return MemoryUsage(int(used or 0), int(limit) if limit is not None else DEFAULT_MEMORY_LIMIT)


# -- used by the send operations ----------------------------------------------------------------------------


def _limit_text(scope: str, used: int, limit: int, need: int) -> str:
    which = "destination memoryLimit" if scope == "destination" else "broker memory limit (systemUsage)"
    return f"{which} {limit} bytes, {used} used, this send needs {need}"


def refusal_error(dest: Destination, full: Full, waited_ms: int, capped: bool) -> ResourceAllocationError:
    scope, used, limit, need = full.scope, full.used, full.limit, full.need
    # A virtual destination's target may be the full one (its copy would not fit): name it.
    where_full = full.full_destination or dest.uri
    details: dict[str, Any] = {"destination": where_full, "scope": scope, "limit": limit, "usage": used,
                               "need": need, "waited_ms": waited_ms, "retry_after": RETRY_AFTER_S}
    where = where_full if where_full == dest.uri else f"{where_full} (a copy of a send to {dest.uri})"
    if where_full != dest.uri:
        details["sent_to"] = dest.uri
    usage = _limit_text(scope, used, limit, need)
    if need > limit:
        which = "destination memoryLimit" if scope == "destination" else "broker memory limit"
        text = (f"Usage Manager Memory Limit reached on {where}: the send needs {need} bytes, more than "
                f"the {which} of {limit}; it can never fit. {FLOW_DOC}")
    elif waited_ms:
        bound = " (the longest Signalbox waits)" if capped else " (sendFailIfNoSpaceAfterTimeout)"
        text = (f"Usage Manager Memory Limit Wait Timeout. Stopping producer to prevent flooding {where}: "
                f"waited {waited_ms} ms{bound}; {usage}. {FLOW_DOC}")
    else:
        text = f"Usage Manager Memory Limit reached on {where}: {usage}. {FLOW_DOC}"
    return ResourceAllocationError(text, **details)


def send_when_space(ops: Context, dest: Destination, now: int, sending: type[Send] | type[TopicSend],
                    budget: int | str, origin: Any, records: list[tuple]) -> Op:
    """Run the send script (calls.Send, or calls.TopicSend; its budget, origin and records); while the send
    does not fit, wait and re-run it or raise, per the policy. Returns its `Sent` once the messages are
    stored."""

    home, prefix = Home(dest), ops.prefix(dest)
    # (each attempt written out, not a generator of its own: one generator fewer to pass every reply
    # through on each send)
    sent = sending.parse((yield from ops.eval(home, now, sending.call(prefix, now, budget, origin, records))))
    waited, pause = 0, FIRST_POLL_MS
    if isinstance(sent, Full):
        yield Forward(dest, now)  # the FULL advisory the refusal may have recorded (advisory.py)
    while isinstance(sent, Full):
        capped = sent.timeout_ms <= 0
        deadline = MAX_SEND_WAIT_MS if capped else sent.timeout_ms
        if sent.drops_copies and (sent.need > sent.limit or waited >= deadline):
            # the full one is a virtual topic's consumer queue with dropOnResourceLimit: where ActiveMQ's
            # copy would fail (VirtualTopicInterceptor swallows the ResourceAllocationException), the
            # send goes on without the copies for full such queues (dropped and counted, virtual.lua).
            origin = _dropping(origin)
            sent = sending.parse((yield from ops.eval(home, now, sending.call(prefix, now, budget, origin,
                                                                              records))))
            continue
        if sent.fail_now or sent.need > sent.limit or waited >= deadline:
            if waited:
                yield from _record_blocked(ops, dest, waited)
            raise refusal_error(dest, sent, waited, capped)
        step = min(pause, deadline - waited)
        now = yield Sleep(step)
        waited += step
        pause = min(pause * 2, MAX_POLL_MS)
        origin = _retry(origin)
        sent = sending.parse((yield from ops.eval(home, now, sending.call(prefix, now, budget, origin,
                                                                          records))))
    if waited:
        yield from _record_blocked(ops, dest, waited)
    return sent


def send_parts(ops: Context, dest: Destination, now: int, sending: type[Send] | type[TopicSend],
               origin: Any, records: list[tuple], finish: Callable[[Sent], Op]) -> Op:
    """Run a send script (calls.Send, calls.TopicSend) over messages (`records`: each one's arguments, id
    and packed message first) in parts of SEND_PART messages and SEND_PART_BYTES, so no call grows with
    the batch. Every part's size and property limits are checked before the first part is stored (a
    refusal changes nothing); the parts then go in order, each atomic, each waiting for space as its
    own send (send_when_space). A part refused after others were stored (a memory limit that fails the send)
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
            yield from ops.eval(Home(dest), now, sending.check(ops.prefix(dest), now, part))
    statuses: list[str] = []
    # the send names this process's wake-up channel: its own consumers' pushes come back in the reply
    budget = f"0~{ops.local_channel}" if sending is Send and ops.local_channel else 0
    for part in parts:
        try:
            sent = yield from send_when_space(ops, dest, now, sending, budget, origin, part)
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


def _retry(origin: str | bytes) -> str | bytes:
    """The origin of a send re-run after waiting: 'producer' becomes 'retry' (its routing plan kept)."""
    if isinstance(origin, bytes) and origin.startswith(b"producer"):
        return b"retry" + origin[len(b"producer"):]
    return "retry" if origin == "producer" else origin


def _dropping(origin: str | bytes) -> str | bytes:
    """The origin of a send re-run to drop the copies full dropOnResourceLimit queues would fail:
    'drop' (includes/virtual.lua split_origin), its routing plan kept."""
    text = origin if isinstance(origin, bytes) else origin.encode()
    _, plus, plan = text.partition(b"+")
    return b"drop" + plus + plan


def _record_blocked(ops: Context, dest: Destination, waited: int) -> Op:
    yield Command(("HINCRBY", f"{ops.prefix(dest)}:meta", "blocked_ms", waited))
