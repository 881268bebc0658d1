"""Pieces the views share: destination parsing from the URL, query
parameters, idempotency records and the reaper nudge."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.request import Request

from broker_core.broker import AsyncBroker
from broker_core.destinations import Destination, parse_composite, parse_destination
from gateway import runtime
from gateway.api import json_input
from gateway.api.errors import Problem, topics_not_supported

KINDS = {"queues": "queue", "topics": "topic"}


def topics_supported() -> bool:
    """Whether broker_core has topics (issue 5: its topic API includes `subscriptions`); without them,
    topic destinations answer 501 instead of failing."""
    return hasattr(AsyncBroker, "subscriptions")


def destination_from_url(kind: str, name: str) -> Destination:
    # a wildcard (topics/orders.>) is what a wildcard subscription's consumer is created on; broker_core
    # refuses sends to one and consumers on wildcard queues (destinations.require_concrete)
    destination = parse_destination(name, KINDS.get(kind, kind), allow_wildcards=True)  # type: ignore[arg-type]
    if destination.is_topic and not topics_supported():
        raise topics_not_supported(destination.uri)
    return destination


def composite(text: str) -> list[Destination]:
    destinations = parse_composite(text)
    topics = [d.uri for d in destinations if d.is_topic]
    if topics and not topics_supported():
        raise topics_not_supported(", ".join(topics))
    return destinations


def _raw_param(request: Request, name: str) -> Any:
    """A parameter from the query string, else from the JSON body already parsed."""
    raw = request.query_params.get(name)
    if raw is None and isinstance(getattr(request, "_json", None), dict):
        raw = request._json.get(name)  # type: ignore[attr-defined]
    return raw


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = _raw_param(request, name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise Problem(400, "invalid_parameter", "Invalid parameter",
                      f"{name} must be an integer {low}..{high}, got {raw!r}", parameter=name) from None
    if isinstance(raw, bool) or not low <= value <= high:
        raise Problem(400, "invalid_parameter", "Invalid parameter",
                      f"{name} must be an integer {low}..{high}, got {raw!r}", parameter=name)
    return value


def float_param(request: Request, name: str, default: float, low: float, high: float) -> float:
    """A float clamped into [low, high] (a long-poll wait is capped, not refused)."""
    raw = _raw_param(request, name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise Problem(400, "invalid_parameter", "Invalid parameter",
                      f"{name} must be a number of seconds, got {raw!r}", parameter=name) from None
    if value != value:  # NaN
        raise Problem(400, "invalid_parameter", "Invalid parameter", f"{name} must be a number",
                      parameter=name)
    return min(max(value, low), high)


def json_body(request: Request, *, required: bool = False) -> dict[str, Any]:
    """The request body as a JSON object ({} when empty and not required)."""
    raw = request._request.body
    if not raw.strip():
        if required:
            raise Problem(400, "invalid_body", "Invalid body", "this request needs a JSON body")
        return {}
    content_type = request.content_type.split(";")[0].strip().lower()
    if content_type and content_type != "application/json" and not content_type.endswith("+json"):
        raise Problem(415, "unsupported_media_type", "Unsupported media type",
                      f"send application/json, not {content_type}")
    try:
        data = json_input.loads(raw)
    except json_input.InvalidJSON as exc:
        raise invalid_json(f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise Problem(400, "invalid_body", "Invalid body", "the body must be a JSON object")
    request._json = data  # type: ignore[attr-defined]
    return data


def invalid_json(detail: str) -> Problem:
    return Problem(400, "invalid_json", "Invalid JSON", detail)


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser with json_input's limits (the views that read `request.data`)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return json_input.loads(stream.read())
        except json_input.InvalidJSON as exc:
            raise invalid_json(f"the body is not valid JSON: {exc}") from None


def max_wait() -> float:
    return float(getattr(settings, "SIGNALBOX_MAX_RECEIVE_WAIT", 20.0))


# -- the reaper nudge: waiting receivers close their lapsed peers, at most once a second per queue ----

_last_reap: dict[str, float] = {}


async def reap_now_and_then(destination: Destination) -> None:
    now = time.monotonic()
    if now - _last_reap.get(destination.uri, 0.0) < 1.0:
        return
    _last_reap[destination.uri] = now
    await runtime.async_broker().reap_lapsed(destination)


# -- idempotency keys ------------------------------------------------------------------------------

IDEMPOTENCY_TTL_MS = 24 * 3600 * 1000
PENDING_TTL_MS = 60_000


class Idempotency:
    """`Idempotency-Key` for sends: the first request with a key runs and its response is kept for a
    day; a retry with the same key and the same request gets that response again (header
    `Idempotent-Replayed: true`) and sends nothing. The message ids are derived from the key, so even a
    retry after a crash between the send and the record is dropped by the broker's duplicate check
    while the first copy is still queued."""

    def __init__(self, request: Request, key: str, fingerprint: str) -> None:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        self.key = f"{settings.SIGNALBOX_NAMESPACE}:gw:idem:{request.user.pk}:{digest}"
        self.fingerprint = hashlib.sha256(fingerprint.encode()).hexdigest()[:32]
        self.id_prefix = f"ID:idem-{hashlib.sha256(f'{request.user.pk}|{key}'.encode()).hexdigest()[:24]}"
        self.redis = runtime.async_broker().redis

    async def begin(self) -> dict[str, Any] | None:
        """None: go ahead. A dict: the stored response to replay."""
        pending = json.dumps({"pending": True, "fp": self.fingerprint})
        if await self.redis.set(self.key, pending, nx=True, px=PENDING_TTL_MS):
            return None
        raw = await self.redis.get(self.key)
        if raw is None:
            return await self.begin()
        stored = json.loads(raw)
        if stored.get("fp") != self.fingerprint:
            raise Problem(422, "idempotency_key_reused", "Idempotency key reused",
                          "this Idempotency-Key was used for a different request")
        if stored.get("pending"):
            raise Problem(409, "idempotency_in_progress", "Request in progress",
                          "a request with this Idempotency-Key is still running; retry later")
        return stored

    async def finish(self, status: int, body: dict[str, Any]) -> None:
        record = json.dumps({"fp": self.fingerprint, "status": status, "body": body})
        await self.redis.set(self.key, record, px=IDEMPOTENCY_TTL_MS)

    async def abandon(self) -> None:
        await self.redis.delete(self.key)


def message_ids_for(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(count)]
