"""The JSON the API, the console and its live feed show for a destination's and a consumer's statistics."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from django.conf import settings

from broker_core.destinations import parse_destination
from broker_core.model import ConsumerStats, DestinationStats


def consumer_json(consumer: ConsumerStats, now_ms: int | None = None) -> dict[str, Any]:
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    out = dataclasses.asdict(consumer)
    window = consumer.prefetch + consumer.prefetch_extension
    full = consumer.prefetch > 0 and consumer.in_flight >= window
    out["full"] = full
    if hasattr(consumer, "slow"):
        out["slow"] = bool(consumer.slow)
    else:
        # Full, and no ack for SIGNALBOX_CONSOLE_SLOW_SECONDS (broker_core's slow_since is set again at
        # every dispatch that finds a busy consumer full, e.g. after each of its acks).
        last = consumer.last_ack or consumer.added
        out["slow"] = full and now_ms - last > settings.SIGNALBOX_CONSOLE_SLOW_SECONDS * 1000
    return out


def destination_json(stats: DestinationStats) -> dict[str, Any]:
    out = dataclasses.asdict(stats)
    out.pop("consumers", None)
    destination = parse_destination(stats.destination)
    out["kind"], out["name"] = destination.kind, destination.name
    out["temporary"] = destination.is_temporary
    return out
