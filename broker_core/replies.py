"""Reading what scripts reply: the flags next to a dispatch count, and the parts of DestinationStats that a
queue's and a topic's statistics share (stats.lua, topic_stats.lua)."""

from __future__ import annotations

from typing import Any

from .config.system_usage import DEFAULT_MEMORY_LIMIT
from .resp import reply_text

# Flags scripts return next to their dispatch count (scripts/lua/includes/dispatch.lua).
PASS_HAS_MORE, FORWARDS_WAITING = 1, 2


def percent(used: int, limit: int) -> int:
    """ActiveMQ's MemoryPercentUsage: whole percent of the limit used (0 when there is no limit)."""
    return used * 100 // limit if limit > 0 else 0


def pairs(flat: list[Any]) -> dict[str, str]:
    return {reply_text(flat[i]): reply_text(flat[i + 1]) for i in range(0, len(flat), 2)}


def memory_stats(meta: dict[str, str], limits: list[Any]) -> dict[str, int]:
    """DestinationStats' memory fields from the meta hash and stats.lua's limits."""
    own, broker = int(reply_text(limits[0]) or 0), reply_text(limits[1])
    limit = own if own > 0 else (int(broker) if broker else DEFAULT_MEMORY_LIMIT)
    used = int(meta.get("mem", 0))
    return {"memory_usage": used, "memory_limit": limit, "memory_percent_usage": percent(used, limit),
            "blocked_sends": int(meta.get("blocked_sends", 0)),
            "total_blocked_time": int(meta.get("blocked_ms", 0))}


def bound_stats(meta: dict[str, str], sizes: list[Any]) -> dict[str, int]:
    """DestinationStats' sizes of the bounded structures: [stream length, audit size] and the meta hash."""
    return {"events": int(sizes[0]), "events_trimmed": int(meta.get("events_trimmed", 0)),
            "audit_size": int(sizes[1])}


def forward_stats(meta: dict[str, str]) -> dict[str, int]:
    """DestinationStats' virtual destination copy counters from the meta hash (includes/virtual.lua)."""
    return {"forward_refused": int(meta.get("forward_refused", 0)),
            "forward_dropped": int(meta.get("forward_dropped", 0))}
