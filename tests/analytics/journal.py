"""Small generated journals: lifecycle event streams as the broker's scripts write them (field names and
order from docs/broker_core.md), random but reproducible, for comparing Spark's metrics with plain Python."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

START_MS = 1_795_000_000_000  # 2026-11-18, an arbitrary fixed day


@dataclass
class Journal:
    """Stream entries per destination URI: (stream id, fields), in stream order."""

    entries: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    _seq: dict[str, tuple[int, int]] = field(default_factory=dict)

    def add(self, destination: str, ts: int, kind: str, stream_id: tuple[int, int] | None = None,
            **fields: Any) -> None:
        """Append an event; its stream id follows the last one, or is `stream_id` (ms, seq) when given
        (an id whose ms differs from the event's ts, or a sequence too large to pack)."""
        if stream_id is None:
            last_ms, last_seq = self._seq.get(destination, (0, -1))
            ms = max(ts, last_ms)
            stream_id = (ms, last_seq + 1 if ms == last_ms else 0)
        ms, seq = stream_id
        self._seq[destination] = (ms, seq)
        entry = {"type": kind, "ts": str(ts), **{k: str(v) for k, v in fields.items()}}
        self.entries.setdefault(destination, []).append((f"{ms}-{seq}", entry))

    def rows(self) -> list[dict[str, Any]]:
        """Every event as (destination, ts, type, fields...) for the plain-Python reference."""
        from analytics.events import event_rows

        out = []
        for destination, entries in self.entries.items():
            for stream_id, fields in entries:
                out += [{"destination": destination, **row} for row in event_rows(stream_id, fields)]
        return out


def generate(seed: int, messages: int = 300, destinations: tuple[str, ...] = ("queue://orders", "queue://audit"),
             span_ms: int = 20 * 60_000) -> Journal:
    """Traffic on each destination: grouped and ungrouped messages, three consumers (one joins late, one
    is removed), nacks with redeliveries up to a dead letter, expiries, slow consumers and an abort."""
    rng = random.Random(seed)
    journal = Journal()
    for d_index, dest in enumerate(destinations):
        consumers = ["c1", "c2"]
        t = START_MS + d_index * 7
        for c in consumers:
            journal.add(dest, t, "consumer_add", consumer=c, priority=0, exclusive=0, prefetch=10,
                        selector="")
        owners: dict[str, str] = {}
        removed = False
        for i in range(messages):
            t += rng.randint(0, span_ms // messages * 2)
            if i == messages // 3:
                consumers.append("c3")
                journal.add(dest, t, "consumer_add", consumer="c3", priority=0, exclusive=0, prefetch=10,
                            selector="")
            if i == messages // 2 and dest.endswith("orders"):
                journal.add(dest, t, "group_reset", group="*", removed=len(owners))
                owners.clear()
            if i == 2 * messages // 3 and not removed:
                removed = True
                gone = consumers.pop(0)
                journal.add(dest, t, "consumer_remove", consumer=gone, reason="closed", returned=0)
                owners = {g: o for g, o in owners.items() if o != gone}
            msg = f"m{d_index}-{i}"
            group = rng.choice(["", "", "g1", "g2", "g3", "g4", "g5"])
            journal.add(dest, t, "enqueue", msg=msg, priority=rng.randint(0, 9), group=group,
                        size=rng.randint(10, 500))
            if rng.random() < 0.05:
                t += rng.randint(1, 50)
                journal.add(dest, t, "expire", msg=msg, expiration=t - 1)
                if rng.random() < 0.5:
                    journal.add(dest, t, "deadletter", msg=msg, target="queue://ActiveMQ.DLQ",
                                cause="expired", detail=str(t - 1))
                continue
            if rng.random() < 0.1:
                journal.add(dest, t, "slow", consumer=rng.choice(consumers))
            redeliveries = 0
            failing = rng.random() < 0.04  # fails every delivery until it is dead-lettered
            while True:
                t += rng.randint(0, 400)
                if group:
                    if group not in owners:
                        owners[group] = rng.choice(consumers)
                        journal.add(dest, t, "group_assign", group=group, consumer=owners[group])
                    consumer = owners[group]
                else:
                    consumer = rng.choice(consumers)
                journal.add(dest, t, "dispatch", msg=msg, consumer=consumer, redeliveries=redeliveries)
                t += rng.randint(1, 900)
                if failing or rng.random() < 0.2:
                    redeliveries += 1
                    if redeliveries > 6:
                        journal.add(dest, t, "deadletter", msg=msg, target=f"queue://ActiveMQ.DLQ.Queue.{d_index}",
                                    cause="redelivery", detail="Delivery[7] exceeds redelivery policy limit")
                        break
                    journal.add(dest, t, "redeliver", msg=msg, consumer=consumer, redeliveries=redeliveries,
                                delay=0)
                    continue
                if rng.random() < 0.02:
                    journal.add(dest, t, "deadletter", msg=msg, target="queue://ActiveMQ.DLQ", cause="poison",
                                detail="")
                    break
                journal.add(dest, t, "ack", msg=msg, consumer=consumer)
                break
            if rng.random() < 0.03 and group in owners:
                journal.add(dest, t, "group_close", group=group, consumer=owners.pop(group))
        slowpoke = consumers[-1]
        for k in range(4):
            journal.add(dest, t + k * 1000, "slow_consumer", consumer=slowpoke, strategy="abortSlowConsumer",
                        detail="maxSlowCount")
        journal.add(dest, t + 200_000, "slow", consumer=slowpoke)
        journal.add(dest, t + 201_000, "abort", consumer=slowpoke, reason="slow consumer", abort_connection=0,
                    strategy="abortSlowConsumer")
    return journal
