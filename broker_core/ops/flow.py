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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config.system_usage import DEFAULT_MEMORY_LIMIT, SystemUsage
from ..destinations import Destination
from ..effects import Command, Forward, Op, Sleep
from ..errors import RETRY_AFTER_S, ResourceAllocationError
from ..keys import Home, usage_key
from ..replies import percent
from ..scripts.calls import Full, Send, TopicSend
from .context import Context

MAX_SEND_WAIT_MS = 60_000  # the longest a send waits when the policy says "until there is space"
FIRST_POLL_MS, MAX_POLL_MS = 10, 250  # re-try a waiting send after 10 ms, doubling up to 250 ms
FLOW_DOC = "See http://activemq.apache.org/producer-flow-control.html for more info"


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


def broker_memory(broker: Any) -> MemoryUsage:
    """The broker-wide memory usage (BrokerView's MemoryPercentUsage, MemoryLimit)."""
    return memory_usage(*broker.redis.hmget(usage_key(broker.namespace), "used", "limit"))


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

    home = Home(dest)

    def attempt(now: int, origin: Any) -> Op:
        call = sending.call(ops.prefix(dest), now, budget, origin, records)
        return sending.parse((yield from ops.eval(home, now, call)))

    sent = yield from attempt(now, origin)
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
            sent = yield from attempt(now, origin)
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
        sent = yield from attempt(now, origin)
    if waited:
        yield from _record_blocked(ops, dest, waited)
    return sent


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
