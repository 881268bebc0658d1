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

from .config.system_usage import DEFAULT_MEMORY_LIMIT, SystemUsage
from .destinations import Destination
from .effects import Command
from .errors import BrokerError
from .replies import percent
from .resp import reply_text as _text

MAX_SEND_WAIT_MS = 60_000  # the longest a send waits when the policy says "until there is space"
FIRST_POLL_MS, MAX_POLL_MS = 10, 250  # re-try a waiting send after 10 ms, doubling up to 250 ms
RETRY_AFTER_S = 1.0  # what adapters tell a refused producer (HTTP Retry-After)
FLOW_DOC = "See http://activemq.apache.org/producer-flow-control.html for more info"


@dataclass(frozen=True)
class Sleep:
    """A request to the driver (drivers/loop.py): wait `ms` milliseconds, reply with the clock's time."""

    ms: int


class ResourceAllocationError(BrokerError):
    """A send refused by producer flow control (ActiveMQ's ResourceAllocationException). `details` name
    the destination, which limit (`scope` "destination" or "broker"), the limit and usage in bytes, what
    the send needed, how long it waited, and `retry_after` (seconds) for the adapters (HTTP 503)."""

    code = "resource_limit"

    @property
    def retry_after(self) -> float:
        return float(self.details.get("retry_after", RETRY_AFTER_S))


class RedisMaxMemory(ResourceAllocationError):
    """Redis itself refused the call's first write: its used memory is over its `maxmemory`, and with
    `maxmemory-policy noeviction` (the embedded server's, signalbox/embedded_redis.py) it refuses writes
    rather than evict a key. The backstop behind the limits above, which count message bytes only: the
    call changed nothing (a script is refused before its first write), nothing stored is lost, and
    consumers can still drain what is there."""

    code = "redis_maxmemory"


REDIS_MAXMEMORY_TEXT = (
    "Redis is at its maxmemory (maxmemory-policy noeviction): the call was refused and stored nothing; "
    "nothing already stored is lost. Consume or purge messages, or give Redis more memory "
    "(SIGNALBOX_REDIS_MAXMEMORY for the embedded server)")


def is_redis_maxmemory(text: str) -> bool:
    """Whether a Redis error reply is its maxmemory refusal (a command's, or a script's first write's). The
    reply starts "OOM command not allowed when used memory > 'maxmemory'"; redis-py's OutOfMemoryError
    keeps the text without its "OOM" code, so the words after it are what is looked for."""
    return "command not allowed when used memory" in text


def usage_key(namespace: str) -> str:
    """The broker-wide usage hash the scripts keep (includes/flow.lua)."""
    return f"{namespace}:usage"


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


# -- used by operations.py ------------------------------------------------------------------------------

def is_full(reply: list[Any]) -> bool:
    return len(reply) > 1 and reply[0] == b"" and reply[1] == b"full"


def _need(reply: list[Any]) -> int:
    """What the refused check needed: with a routing plan, against the broker's limit, the message times
    every place it will be stored (flow.lua), so "can never fit" compares that, not one copy."""
    return int(reply[9]) if len(reply) > 9 and reply[9] not in (None, b"", "") else int(reply[7])


def _limit_text(scope: str, used: int, limit: int, need: int) -> str:
    which = "destination memoryLimit" if scope == "destination" else "broker memory limit (systemUsage)"
    return f"{which} {limit} bytes, {used} used, this send needs {need}"


def refusal_error(dest: Destination, reply: list[Any], waited_ms: int,
                  capped: bool) -> ResourceAllocationError:
    scope, used, limit, need = _text(reply[2]), int(reply[3]), int(reply[4]), _need(reply)
    # A virtual destination's target may be the full one (its copy would not fit): name it.
    full = _text(reply[8]) if len(reply) > 8 and reply[8] else dest.uri
    details: dict[str, Any] = {"destination": full, "scope": scope, "limit": limit, "usage": used,
                               "need": need, "waited_ms": waited_ms, "retry_after": RETRY_AFTER_S}
    where = full if full == dest.uri else f"{full} (a copy of a send to {dest.uri})"
    if full != dest.uri:
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


def send_when_space(ops: Any, dest: Destination, now: int, args: list[Any], script: str = "send") -> Any:
    """Run the send script (`send`, or `topic_send`; args as the operation builds them, origin at args[1]);
    while the send does not fit, wait and re-run it or raise, per the policy. Returns the script's reply
    once the messages are stored."""
    reply = yield from ops._eval(script, dest, now, *args)
    waited, pause = 0, FIRST_POLL_MS
    if is_full(reply):
        yield from ops.forward(dest, now)  # the FULL advisory the refusal may have recorded (advisory.py)
    while is_full(reply):
        fail_now, timeout, need, limit = int(reply[5]), int(reply[6]), _need(reply), int(reply[4])
        capped = timeout <= 0
        deadline = MAX_SEND_WAIT_MS if capped else timeout
        if _drops_copies(reply) and (need > limit or waited >= deadline):
            # the full one is a virtual topic's consumer queue with dropOnResourceLimit: where ActiveMQ's
            # copy would fail (VirtualTopicInterceptor swallows the ResourceAllocationException), the
            # send goes on without the copies for full such queues (dropped and counted, virtual.lua).
            args = [args[0], _dropping(args[1]), *args[2:]]
            reply = yield from ops._eval(script, dest, now, *args)
            continue
        if fail_now or need > limit or waited >= deadline:
            if waited:
                yield from _record_blocked(ops, dest, waited)
            raise refusal_error(dest, reply, waited, capped)
        step = min(pause, deadline - waited)
        now = yield Sleep(step)
        waited += step
        pause = min(pause * 2, MAX_POLL_MS)
        args = [args[0], _retry(args[1]), *args[2:]]
        reply = yield from ops._eval(script, dest, now, *args)
    if waited:
        yield from _record_blocked(ops, dest, waited)
    return reply


def _retry(origin: str | bytes) -> str | bytes:
    """The origin of a send re-run after waiting: 'producer' becomes 'retry' (its routing plan kept)."""
    if isinstance(origin, bytes) and origin.startswith(b"producer"):
        return b"retry" + origin[len(b"producer"):]
    return "retry" if origin == "producer" else origin


def _drops_copies(reply: list[Any]) -> bool:
    """Whether the full destination of a refusal drops its copies instead (flow.lua flow.memory_refusal)."""
    return len(reply) > 10 and reply[10] in (1, b"1", "1")


def _dropping(origin: str | bytes) -> str | bytes:
    """The origin of a send re-run to drop the copies full dropOnResourceLimit queues would fail:
    'drop' (includes/virtual.lua split_origin), its routing plan kept."""
    text = origin if isinstance(origin, bytes) else origin.encode()
    _, plus, plan = text.partition(b"+")
    return b"drop" + plus + plan


def _record_blocked(ops: Any, dest: Destination, waited: int) -> Any:
    yield Command(("HINCRBY", f"{ops.prefix(dest)}:meta", "blocked_ms", waited))
