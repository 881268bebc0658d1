"""Where the console finds the last summary: `<ns>:analytics:summary` in Redis (no Spark imported here,
so web processes can read it cheaply)."""

from __future__ import annotations

import json
from typing import Any


def summary_key(namespace: str) -> str:
    return f"{namespace}:analytics:summary"


def write_summary(redis_client: Any, namespace: str, text: str) -> None:
    redis_client.set(summary_key(namespace), text)


def read_summary(redis_client: Any, namespace: str) -> dict[str, Any] | None:
    raw = redis_client.get(summary_key(namespace))
    return json.loads(raw) if raw else None
