"""The metrics computed in plain Python, event by event, from the definitions in docs/analytics.md.
The Spark jobs must give exactly these numbers on the same events."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

COUNTED = {"enqueue": "enqueued", "dispatch": "dispatched", "ack": "acked", "expire": "expired",
           "deadletter": "dead_lettered", "discard": "discarded", "evict": "evicted", "lost": "lost"}
NAMES = ("enqueued", "dispatched", "acked", "redelivered", "expired", "expired_on_arrival", "dead_lettered",
         "discarded", "evicted", "lost")


def _ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["destination"], r["event_ms"], r["event_seq"]))


def per_minute(rows):
    out: dict[tuple[str, int], dict[str, int]] = {}
    for r in rows:
        if r["type"] not in COUNTED:
            continue
        key = (r["destination"], r["ts"] - r["ts"] % 60_000)
        counts = out.setdefault(key, dict.fromkeys(NAMES, 0))
        name = COUNTED[r["type"]]
        attrs = dict(r["attrs"] or [])
        if name == "expired" and attrs.get("on_arrival") == "1":
            name = "expired_on_arrival"
            if attrs.get("counted") == "1":  # counted in `expired` too (a topic's, a send that waited)
                counts["expired"] += 1
        counts[name] += r["count"] if r["type"] == "lost" else 1  # (a loss row: `count` events)
        if r["type"] == "dispatch" and (r["redeliveries"] or 0) > 0:
            counts["redelivered"] += 1
    return out


def lives(rows):
    """(destination, msg, life) -> sent, first dispatch (ts, consumer), ack (ts, consumer, delivered ts),
    max redeliveries."""
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    life: Counter = Counter()
    delivered: dict[tuple[str, str], int] = {}
    for r in _ordered(rows):
        if r["type"] not in ("enqueue", "dispatch", "ack") or r["msg"] is None:
            continue
        key = (r["destination"], r["msg"])
        if r["type"] == "enqueue":
            life[key] += 1
        if r["type"] == "dispatch":
            delivered[key] = r["ts"]
        if life[key] == 0:
            continue
        entry = out.setdefault((*key, life[key]), {"sent": None, "first_dispatch": None, "ack": None,
                                                     "max_redeliveries": None})
        if r["type"] == "enqueue" and entry["sent"] is None:
            entry["sent"] = r["ts"]
        elif r["type"] == "dispatch":
            if entry["first_dispatch"] is None:
                entry["first_dispatch"] = (r["ts"], r["consumer"])
            entry["max_redeliveries"] = max(entry["max_redeliveries"] or 0, r["redeliveries"])
        elif r["type"] == "ack" and entry["ack"] is None:
            entry["ack"] = (r["ts"], r["consumer"], delivered.get(key))
    return out


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    position = p * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def latency(rows):
    """(destination, consumer or None, metric) -> (count, p50, p95, p99)."""
    samples: dict[tuple[str, str | None, str], list[int]] = defaultdict(list)

    def add(dest, consumer, metric, value):
        samples[(dest, None, metric)].append(value)
        if consumer is not None:
            samples[(dest, consumer, metric)].append(value)

    for (dest, _msg, _life), e in lives(rows).items():
        if e["first_dispatch"] is not None:
            add(dest, e["first_dispatch"][1], "send_to_dispatch", e["first_dispatch"][0] - e["sent"])
        if e["ack"] is not None:
            ack_ts, consumer, delivered = e["ack"]
            if delivered is not None:
                add(dest, consumer, "dispatch_to_ack", ack_ts - delivered)
            add(dest, consumer, "send_to_ack", ack_ts - e["sent"])
    return {k: (len(v), *(percentile(v, p) for p in (0.5, 0.95, 0.99))) for k, v in samples.items()}


def assert_latency_matches(frame, rows) -> dict:
    """jobs.latency's rows equal `latency(rows)` (counts exactly, percentiles approximately); returns
    them keyed as `latency` keys its answer."""
    import pytest

    got = {(r["destination"], r["consumer"], r["metric"]): (r["count"], r["p50"], r["p95"], r["p99"])
           for r in frame.collect()}
    expected = latency(rows)
    assert got.keys() == expected.keys()
    for key, (count, *quantiles) in expected.items():
        assert got[key][0] == count, key
        assert got[key][1:] == pytest.approx(quantiles), key
    return got


def redeliveries(rows):
    out: Counter = Counter()
    for (dest, _m, _l), e in lives(rows).items():
        if e["max_redeliveries"] is not None:
            out[(dest, e["max_redeliveries"])] += 1
    return dict(out)


def dead_letters(rows):
    out: Counter = Counter()
    for r in rows:
        if r["type"] in ("deadletter", "discard"):
            out[(r["destination"], r["type"], r["cause"], r["target"])] += 1
    return dict(out)


def groups(rows):
    """(destination, group) -> (messages, assignments, owner changes, owner at the end or None)."""
    messages: Counter = Counter()
    assigns: dict[tuple[str, str], list[str]] = defaultdict(list)
    owner: dict[tuple[str, str], str | None] = {}
    for r in _ordered(rows):
        dest = r["destination"]
        if r["type"] == "enqueue" and r["group"]:
            messages[(dest, r["group"])] += 1
        elif r["type"] == "group_assign":
            assigns[(dest, r["group"])].append(r["consumer"])
            owner[(dest, r["group"])] = r["consumer"]
        elif r["type"] in ("group_close", "group_evict", "group_reset") and r["group"] != "*":
            owner[(dest, r["group"])] = None
        elif r["type"] == "group_reset":
            for key in owner:
                if key[0] == dest:
                    owner[key] = None
        elif r["type"] == "consumer_remove":
            for key, o in owner.items():
                if key[0] == dest and o == r["consumer"]:
                    owner[key] = None
    out = {}
    for key in set(messages) | set(assigns):
        seq = assigns.get(key, [])
        changes = sum(1 for a, b in zip(seq, seq[1:], strict=False) if a != b)
        out[key] = (messages.get(key, 0), len(seq), changes, owner.get(key))
    return out


def group_consumers(rows):
    group_of = {(r["destination"], r["msg"]): r["group"]
                for r in rows if r["type"] == "enqueue" and r["group"]}
    seen: dict[tuple[str, str], tuple[set, set]] = defaultdict(lambda: (set(), set()))
    for r in rows:
        if r["type"] == "dispatch" and (r["destination"], r["msg"]) in group_of:
            gs, ms = seen[(r["destination"], r["consumer"])]
            gs.add(group_of[(r["destination"], r["msg"])])
            ms.add(r["msg"])
    return {k: (len(gs), len(ms)) for k, (gs, ms) in seen.items()}


def active_consumers(rows):
    state: dict[tuple[str, str], bool] = {}
    for r in _ordered(rows):
        if r["consumer"] is None or r["type"] not in ("consumer_add", "dispatch", "ack", "group_assign",
                                                      "consumer_remove"):
            continue
        key = (r["destination"], r["consumer"])
        if r["type"] == "consumer_remove":
            state[key] = False
        elif r["type"] == "consumer_add":
            state[key] = True
        else:
            state.setdefault(key, True)
    return {k for k, alive in state.items() if alive}


def slow_episodes(rows, gap_ms=60_000):
    marks: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (r["ts"], r["event_ms"], r["event_seq"])):
        if r["type"] in ("slow", "slow_consumer") and r["consumer"]:
            marks[(r["destination"], r["consumer"])].append(r["ts"])
    out = []
    for (dest, consumer), times in marks.items():
        start = previous = times[0]
        signals = 1
        for t in times[1:]:
            if t - previous >= gap_ms:
                out.append((dest, consumer, start, previous, signals))
                start, signals = t, 0
            previous = t
            signals += 1
        out.append((dest, consumer, start, previous, signals))
    return sorted(out)
