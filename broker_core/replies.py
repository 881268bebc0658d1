"""The parts of DestinationStats that a queue's and a topic's statistics share, read from the meta hash and
the limits and sizes beside it (a queue's from stats.lua, through scripts/calls.py; a topic's from plain
commands, topic_ops.stats)."""

from __future__ import annotations

from .config.system_usage import DEFAULT_MEMORY_LIMIT
from .model import EnqueueTimes, MessageSizes, percent


def memory_stats(meta: dict[str, str], own_limit: str, broker_limit: str) -> dict[str, int]:
    """DestinationStats' memory fields from the meta hash and the limits in force: the destination's
    memoryLimit ('0' or '': none) and the broker's ('': unset)."""
    own = int(own_limit or 0)
    limit = own if own > 0 else (int(broker_limit) if broker_limit else DEFAULT_MEMORY_LIMIT)
    used = int(meta.get("mem", 0))
    return {"memory_usage": used, "memory_limit": limit, "memory_percent_usage": percent(used, limit),
            "blocked_sends": int(meta.get("blocked_sends", 0)),
            "total_blocked_time": int(meta.get("blocked_ms", 0))}


def bound_stats(meta: dict[str, str], events: int, audit_size: int) -> dict[str, int]:
    """DestinationStats' sizes of the bounded structures: the events the event stream holds, the audit's
    size."""
    return {"events": events, "events_trimmed": int(meta.get("events_trimmed", 0)), "audit_size": audit_size}


def forward_stats(meta: dict[str, str]) -> dict[str, int]:
    """DestinationStats' virtual destination copy counters from the meta hash (includes/virtual.lua)."""
    return {"forward_refused": int(meta.get("forward_refused", 0)),
            "forward_dropped": int(meta.get("forward_dropped", 0))}


def tallies(meta: dict[str, str]) -> dict[str, MessageSizes | EnqueueTimes]:
    """DestinationStats' message sizes and enqueue times from the meta hash (includes/message.lua
    size_note, times_added)."""
    return {"message_sizes": MessageSizes.parse(meta.get("msgsize")),
            "enqueue_times": EnqueueTimes.parse(meta.get("enqtime"))}
