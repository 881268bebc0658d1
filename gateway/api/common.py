"""Pieces the views share: destination parsing from the URL, query
parameters, idempotency records and the reaper nudge."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from typing import Any

import redis
from django.conf import settings
from django.core.signals import setting_changed
from rest_framework import parsers
from rest_framework.request import Request

from broker_core import errors
from broker_core.broker import AsyncBroker
from broker_core.destinations import Destination, parse_composite, parse_destination
from gateway import runtime
from gateway.api import json_input
from gateway.api.errors import Problem, topics_not_supported

KINDS = {"queues": "queue", "topics": "topic"}

# the longest a piece of work holds the event loop before letting the process's other clients run (a bulk
# of Jolokia pattern searches over 1,000 long names, never letting go, kept a version request waiting 0.6 s;
# a waited-for build of the statistics index of 10,000 destinations held every client of its process 40 ms).
# A task that yields is run again after the callbacks ready then: another task may wait up to two slices.
SLICE_SECONDS = 0.001


class LoopShare:
    """Long work on the event loop, given back to the loop's other tasks whenever it has held it for
    SLICE_SECONDS: the work calls `pause` between its steps (each step small)."""

    def __init__(self) -> None:
        self._resumed = time.monotonic()

    async def pause(self) -> None:
        if time.monotonic() - self._resumed > SLICE_SECONDS:
            await asyncio.sleep(0)
            self._resumed = time.monotonic()

# Settings the per-request paths read, remembered: Django's settings object resolves each read through
# LazyObject (about 1 µs), and a name settings.py does not define raises and catches AttributeError
# (about 5 µs) on every read. Settings change only through override_settings (the tests' `settings`
# fixture), which sends setting_changed: everything remembered is forgotten then.
_settings_read: dict[str, Any] = {}


_DEFINED = object()  # (setting's default for a name settings.py defines)


def setting(name: str, default: Any = _DEFINED) -> Any:
    """settings.<name>, or `default` when it is not set (each name always read with the same default).
    Without a default the name is one signalbox/settings.py defines, with its default: the only one."""
    try:
        return _settings_read[name]
    except KeyError:
        value = getattr(settings, name) if default is _DEFINED else getattr(settings, name, default)
        _settings_read[name] = value
        return value


def _forget_settings(**_kwargs: Any) -> None:
    _settings_read.clear()


setting_changed.connect(_forget_settings, dispatch_uid="gateway-api-settings-read")


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


# A decimal integer as Java's Long.parseLong reads one: Python's int() also takes "1_0", " 10 " and other
# scripts' digits, which would name a number the client did not write.
_DECIMAL = re.compile(r"[+-]?[0-9]+")


def decimal_integer(text: str) -> int:
    """`text` as a decimal integer (ASCII digits, an optional sign); ValueError otherwise."""
    if not _DECIMAL.fullmatch(text):
        raise ValueError(f"not a decimal integer: {text!r}")
    return int(text)


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = _raw_param(request, name)
    if raw is None or raw == "":
        return default
    try:
        if isinstance(raw, str):
            value = decimal_integer(raw)
        elif isinstance(raw, int):  # (a JSON body's number; a bool is refused below)
            value = raw
        else:  # (a JSON float, list, ...: int() would cut 2.5 to 2)
            raise TypeError(name)
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
    return float(setting("SIGNALBOX_MAX_RECEIVE_WAIT", 20.0))


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
IDEMPOTENCY_EXPIRED_PER_CALL = 100  # expired index entries a new key clears away (each call bounded)

# The records are plain keys with their own expiry; beside them, an index of every live record
# (<ns>:gw:idem:index, "<user>:<digest>" -> when it expires) and a count per user (<ns>:gw:idem:users),
# so the store is bounded per user and its size is known without a SCAN. A new key: clear a few expired
# index entries, then refuse if the user is at the bound, else write the pending record and count it.
# Returns 1 (go ahead), 0 (a record exists: read it) or -1 (the user is at the bound).
_BEGIN_SCRIPT = """
local index, users, now = KEYS[2], KEYS[3], tonumber(ARGV[1])
local gone = redis.call('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, tonumber(ARGV[6]))
for _, member in ipairs(gone) do
  redis.call('ZREM', index, member)
  local user = string.match(member, '^(.*):[^:]*$')
  if redis.call('HINCRBY', users, user, -1) <= 0 then redis.call('HDEL', users, user) end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local member = ARGV[2] .. ':' .. ARGV[3]
if not redis.call('ZSCORE', index, member) then
  if tonumber(redis.call('HGET', users, ARGV[2]) or '0') >= tonumber(ARGV[5]) then return -1 end
  redis.call('HINCRBY', users, ARGV[2], 1)
end
redis.call('ZADD', index, now + tonumber(ARGV[4]), member)
redis.call('SET', KEYS[1], ARGV[7], 'PX', ARGV[4])
return 1
"""


def idempotency_keys_count(redis_client: Any) -> Any:
    """How many Idempotency-Key records the gateway holds (awaitable with an asyncio client)."""
    return redis_client.zcard(f"{settings.SIGNALBOX_NAMESPACE}:gw:idem:index")


class Idempotency:
    """`Idempotency-Key` for sends: the first request with a key runs and its response is kept for a
    day; a retry with the same key and the same request gets that response again (header
    `Idempotent-Replayed: true`) and sends nothing. The message ids are derived from the key, so even a
    retry after a crash between the send and the record is dropped by the broker's duplicate check
    while the first copy is still queued.

    A user holds at most SIGNALBOX_IDEMPOTENCY_KEYS_PER_USER records at once; a request with a new key
    past that is refused (429 `idempotency_keys_full`, sending nothing) rather than forgetting an older
    key early, which would let a retry of that key within its day send its messages again."""

    def __init__(self, request: Request, key: str, fingerprint: str) -> None:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        namespace = settings.SIGNALBOX_NAMESPACE
        self.user = str(request.user.pk)
        self.digest = digest
        self.key = f"{namespace}:gw:idem:{self.user}:{digest}"
        self.index = f"{namespace}:gw:idem:index"
        self.users = f"{namespace}:gw:idem:users"
        self.fingerprint = hashlib.sha256(fingerprint.encode()).hexdigest()[:32]
        self.id_prefix = f"ID:idem-{hashlib.sha256(f'{request.user.pk}|{key}'.encode()).hexdigest()[:24]}"
        self.client = runtime.async_redis()  # the gateway's own records, not broker state

    async def begin(self) -> dict[str, Any] | None:
        """None: go ahead. A dict: the stored response to replay."""
        pending = json.dumps({"pending": True, "fp": self.fingerprint})
        limit = settings.SIGNALBOX_IDEMPOTENCY_KEYS_PER_USER
        try:
            started = await self.client.eval(
                _BEGIN_SCRIPT, 3, self.key, self.index, self.users, int(time.time() * 1000), self.user,
                self.digest, PENDING_TTL_MS, limit, IDEMPOTENCY_EXPIRED_PER_CALL, pending)
        except redis.ResponseError as exc:  # Redis at its maxmemory: refused by name, as a send would be
            if errors.is_redis_maxmemory(str(exc)):
                raise errors.RedisMaxMemory(errors.REDIS_MAXMEMORY_TEXT, scope="redis", limit="maxmemory",
                                            retry_after=errors.RETRY_AFTER_S) from None
            raise
        if int(started) == 1:
            return None
        if int(started) == -1:
            raise Problem(429, "idempotency_keys_full", "Too many idempotency keys",
                          f"this user holds {limit} Idempotency-Key records "
                          "(SIGNALBOX_IDEMPOTENCY_KEYS_PER_USER), each kept 24 h; the request was not sent. "
                          "Send it without a key, with a key used before, or later", limit=limit)
        raw = await self.client.get(self.key)
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
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self.key, record, px=IDEMPOTENCY_TTL_MS)
        pipe.zadd(self.index, {f"{self.user}:{self.digest}": int(time.time() * 1000) + IDEMPOTENCY_TTL_MS})
        await pipe.execute()

    async def abandon(self) -> None:
        # (its index entry stays until it expires with the pending record's time, counted till then)
        await self.client.delete(self.key)


def message_ids_for(prefix: str, count: int) -> list[str]:
    """The ids of a batch sent with an Idempotency-Key, sorting in the batch's order: jobs due in the
    same millisecond fire in id order (docs/broker_core.md "Scheduled delivery"). An index of two or more
    digits has a letter for its length before it ('a' two, 'b' three: after every digit), so the first
    ten are as they always were and a retry across an upgrade is still a duplicate."""
    return [f"{prefix}-{i}" if i < 10 else f"{prefix}-{chr(95 + len(str(i)))}{i}" for i in range(count)]
