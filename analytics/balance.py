"""Message-group balance and the removeAllMessageGroups recommendation, from per-group aggregates.

Input: per group its messages in the range and its current owner (jobs.groups), and the active consumers
(jobs.active_consumers): small tables, one row per group, never raw events. Pure Python, so the tests and
the console compute it the same way.

Imbalance = the busiest active consumer's grouped messages / the mean over active consumers (1.0 is
even; with 4 consumers, 4.0 means one consumer carries everything). After removeAllMessageGroups every
group is free; the next message of each group binds it to the consumer that owns the fewest groups
(ActiveMQ's dispatch order, spec §1.4), so the projection hands the groups out in that way, heaviest
first, and assumes each group keeps its message rate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

# Recommend a reset only when it brings the imbalance down by at least this much and below this ratio.
MIN_IMPROVEMENT = 0.25
MIN_IMBALANCE = 1.25


@dataclass(frozen=True)
class Balance:
    consumers: int
    groups: int
    grouped_messages: int
    imbalance: float | None
    busiest_consumer: str | None
    busiest_share: float | None  # of the grouped messages, 0..1
    projected_imbalance: float | None
    projected_busiest_share: float | None
    groups_to_move: int
    recommend_reset: bool
    recommendation: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _imbalance(load: Mapping[str, int]) -> float | None:
    total = sum(load.values())
    if not load or total == 0:
        return None
    return max(load.values()) / (total / len(load))


def _project(group_messages: Mapping[str, int], consumers: list[str]) -> dict[str, str]:
    owned = {c: 0 for c in consumers}
    carried = {c: 0 for c in consumers}
    projected = {}
    for group, messages in sorted(group_messages.items(), key=lambda item: (-item[1], item[0])):
        target = min(consumers, key=lambda c: (owned[c], carried[c], c))
        projected[group] = target
        owned[target] += 1
        carried[target] += messages
    return projected


def balance(destination: str, groups: Iterable[tuple[str, int, str | None]], consumers: Iterable[str]
            ) -> Balance:
    """groups: (group, messages, owner or None); consumers: the active consumers."""
    active = sorted(set(consumers))
    rows = [(g, int(m), o) for g, m, o in groups]
    group_messages = {g: m for g, m, _ in rows}
    total = sum(group_messages.values())
    load = {c: 0 for c in active}
    for _group, messages, owner in rows:
        if owner in load:
            load[owner] += messages
    current = _imbalance(load) if len(active) > 1 else None
    busiest = max(active, key=lambda c: (load[c], c)) if active and total else None
    if len(active) < 2 or not total:
        why = ("fewer than two active consumers" if len(active) < 2 else "no grouped messages in the range")
        return Balance(len(active), len(rows), total, current, busiest,
                       load[busiest] / total if busiest else None, None, None, 0, False,
                       f"No reset needed on {destination}: {why}.")
    projected_owner = _project(group_messages, active)
    projected_load = {c: 0 for c in active}
    for group, target in projected_owner.items():
        projected_load[target] += group_messages[group]
    projected = _imbalance(projected_load)
    moved = sum(1 for g, _m, owner in rows if owner != projected_owner[g])
    share, projected_share = load[busiest] / total, max(projected_load.values()) / total
    assert current is not None and projected is not None
    recommend = current >= MIN_IMBALANCE and current - projected >= MIN_IMPROVEMENT
    if recommend:
        text = (f"Remove all message groups on {destination}: {moved} of {len(rows)} groups would move; the "
                f"busiest consumer ({busiest}) carries {share:.0%} of grouped messages now and about "
                f"{projected_share:.0%} after (imbalance {current:.2f} -> {projected:.2f}). Messages of a "
                f"group still in flight finish on the old owner while the new one starts.")
    else:
        text = (f"No reset needed on {destination}: imbalance {current:.2f}, about {projected:.2f} after "
                f"removeAllMessageGroups, not enough to gain.")
    return Balance(len(active), len(rows), total, current, busiest, share, projected, projected_share,
                   moved, recommend, text)
