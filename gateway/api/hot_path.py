"""The lean path of the gateway's hottest API endpoints (`HotPath`), served by asgi.py's handler.

POST a JSON message or batch, or a raw body (without Message-* headers or content-type parameters), to a
queue/topic URL, receive without waiting, ack (and ack-then-receive). For them Django's request object,
URL resolver, middleware chain and DRF's request wrapping cost more CPU than the broker call itself
(profiled: ~0.5 ms of Python per request). The hot path parses the ASGI scope itself and calls the same
functions the views call (views_messaging.send_parsed, receive_messages, acknowledge), with the same
checks in the same order: allowed host, token from the authentication cache, permission, rate limit.
Whenever a request is anything but the plain case (no cached token, a denied permission, an
Idempotency-Key, a malformed body, a raw body with Message-* headers, a long-poll wait, bad parameters...)
it is handed to Django unchanged (the body replayed), before anything has changed, so every refusal keeps
Django's exact answer. `SIGNALBOX_API_HOT_PATH = False` turns it off. ActiveMQ's /api/message has its own
(compat_hot.py), built on the helpers here.
"""

from __future__ import annotations

import base64
import functools
import logging
import re
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl

from django.conf import settings

from gateway import connections
from gateway.api import json_input
from gateway.paths import from_segment, path_in_url


class _Params:
    """What views_messaging's parameter helpers read from a DRF request (common.int_param)."""

    __slots__ = ("query_params", "_json")

    def __init__(self, query_string: bytes, data: dict[str, Any] | None) -> None:
        # As Django's QueryDict.get: the last value of a repeated name.
        self.query_params = dict(query_pairs(query_string, "latin-1", None)) if query_string else {}
        self._json = data


_QUERY_CACHED = 256  # longer query strings are parsed each time (the cache's memory stays small)


@functools.lru_cache(maxsize=1024)
def _query_pairs(query_string: bytes, encoding: str, max_fields: int | None) -> tuple[tuple[str, str], ...]:
    return tuple(parse_qsl(query_string.decode(encoding), keep_blank_values=True, max_num_fields=max_fields))


def query_pairs(query_string: bytes, encoding: str, max_fields: int | None) -> tuple[tuple[str, str], ...]:
    """parse_qsl of the query string (blank values kept; ValueError past `max_fields`, UnicodeError for
    text not in `encoding`), remembered for short ones: a client repeats the same few query strings
    (`?type=queue&readTimeout=5000`, `?receive=1`), and parse_qsl costs more than the rest of the lean
    path's parameter handling. A tuple: the callers build their own dict from it."""
    if len(query_string) > _QUERY_CACHED:
        return _query_pairs.__wrapped__(query_string, encoding, max_fields)
    return _query_pairs(query_string, encoding, max_fields)


def _raw_envelope(body: bytes, content_type: bytes | None, media: bytes) -> dict[str, Any] | None:
    """views_messaging._raw_envelope for a raw body sent without Message-* headers and with a content type
    that has no parameters (so no charset: UTF-8, Django's default); None for anything else (Django's
    path)."""
    if content_type is not None and (b";" in content_type or not content_type.strip()):
        return None
    try:
        kind = content_type.decode("latin-1") if content_type is not None else "application/octet-stream"
    except UnicodeError:
        return None
    envelope: dict[str, Any] = {}
    if media.startswith(b"text/") or media in (b"application/xml", b"application/javascript"):
        try:
            envelope["body"] = body.decode("utf-8")
        except UnicodeDecodeError:
            envelope["body_base64"] = base64.b64encode(body).decode()
    else:
        envelope["body_base64"] = base64.b64encode(body).decode()
    envelope["content_type"] = kind
    return envelope


class _Caller:
    """The authenticated user, for the helpers that take a request (base._throttle)."""

    __slots__ = ("user",)

    def __init__(self, user: Any) -> None:
        self.user = user


_FALLBACK = None
# The request headers HotPath reads, and those that send a request to Django (an Idempotency-Key: the
# views keep its record; a repeated Content-Type, which Django joins).
_HOT_HEADERS = frozenset({b"authorization", b"content-type", b"host"})
_NOT_HOT = frozenset({b"idempotency-key"})
_HOT_SINGLE = frozenset({b"authorization", b"content-type"})
# A raw body's envelope fields (views_messaging._raw_envelope): noted, for Django to read
_MESSAGE_HEADERS = b"message-"
_ONE_AUTHORIZATION = frozenset({b"authorization"})


def request_headers(headers: list[tuple[bytes, bytes]], wanted: frozenset[bytes],
                    refused: frozenset[bytes], single: frozenset[bytes] = _ONE_AUTHORIZATION,
                    prefix: bytes | None = None) -> dict[bytes, bytes] | None:
    """The ASGI scope's headers named in `wanted` (lower case, as ASGI gives them), for HotPath and
    compat_hot.CompatHotPath, in one walk: the last of a repeated header, but Cookie lines joined with
    "; " (as Django joins them). None when the request is not the lean path's: a second header named in
    `single` (two credentials: Django's authentication answers), or any header in `refused`. A header whose
    name starts with `prefix` is noted as found[prefix] (an empty value)."""
    found: dict[bytes, bytes] = {}
    for name, value in headers:
        if name in wanted:
            if name in found:
                if name in single:
                    return None
                if name == b"cookie":
                    value = found[name] + b"; " + value
            found[name] = value
        elif name in refused:
            return None
        elif prefix is not None and name.startswith(prefix):
            found[prefix] = b""
    return found


class HotPath:
    """Serves the hot endpoints without Django's request machinery (module docstring). `serve` returns
    (status, headers, body), or None to hand the request to Django untouched."""

    def __init__(self) -> None:
        from rest_framework.compat import LONG_SEPARATORS, SHORT_SEPARATORS
        from rest_framework.renderers import JSONRenderer

        from gateway.api import base, errors
        from gateway.api import views_messaging as views
        from gateway.credentials import verified
        from gateway.permissions import allowed_async

        self.verified, self.throttle, self.errors, self.views = verified, base._throttle, errors, views
        self.allowed = allowed_async
        # Byte for byte what DRF's JSONRenderer answers (its json.dumps with its encoder class and options,
        # then the two line separators escaped), with the encoder made once instead of per answer.
        renderer = JSONRenderer()
        self.encoder = renderer.encoder_class(
            ensure_ascii=renderer.ensure_ascii, allow_nan=not renderer.strict,
            separators=SHORT_SEPARATORS if renderer.compact else LONG_SEPARATORS)
        self.hosts: dict[bytes, bool] = {}
        # Read once: a setting change makes a new HotPath (GatewayASGIHandler.forget).
        self.on = self.enabled()
        self.body_limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        self.log = logging.getLogger("django.request")
        # The headers Django's middleware adds to an API response (SecurityMiddleware over plain HTTP,
        # XFrameOptionsMiddleware), in its order; `Allow` is the view's, as DRF sets it.
        referrer = settings.SECURE_REFERRER_POLICY
        if referrer and not isinstance(referrer, str):
            referrer = ",".join(referrer)
        tail = [(b"X-Frame-Options", settings.X_FRAME_OPTIONS.upper().encode())]  # first: see serve()
        if settings.SECURE_CONTENT_TYPE_NOSNIFF:
            tail.append((b"X-Content-Type-Options", b"nosniff"))
        if referrer:
            tail.append((b"Referrer-Policy", referrer.encode()))
        if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
            tail.append((b"Cross-Origin-Opener-Policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY.encode()))
        self.tail = tail
        self.allow = {kind: (b"Allow", allowed_methods(view).encode()) for kind, view in (
            ("messages", views.DestinationMessagesView), ("ack", views.AckView),
            ("receive", views.ReceiveView))}

    def render(self, data: Any) -> bytes:
        return self.encoder.encode(data).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").encode()

    @staticmethod
    def enabled() -> bool:
        # Settings that make Django's middleware answer or redirect before any view: leave those to it.
        return bool(getattr(settings, "SIGNALBOX_API_HOT_PATH", True)) and not (
            settings.SECURE_SSL_REDIRECT or settings.USE_X_FORWARDED_HOST or settings.PREPEND_WWW
            or settings.DISALLOWED_USER_AGENTS or settings.SECURE_HSTS_SECONDS)

    def host_allowed(self, host: bytes) -> bool:
        """Django's ALLOWED_HOSTS check (HttpRequest.get_host), remembered per Host header."""
        known = self.hosts.get(host)
        if known is None:
            from django.http.request import split_domain_port, validate_host

            allowed = settings.ALLOWED_HOSTS
            if settings.DEBUG and not allowed:
                allowed = [".localhost", "127.0.0.1", "[::1]"]
            domain, _port = split_domain_port(host.decode("latin-1"))
            known = bool(domain) and validate_host(domain, allowed)
            if len(self.hosts) > 1000:
                self.hosts.clear()
            self.hosts[host] = known
        return known

    async def serve(self, scope: dict[str, Any], body: bytes,
                    match: re.Match[str]) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
        found = request_headers(scope["headers"], _HOT_HEADERS, _NOT_HOT, _HOT_SINGLE, _MESSAGE_HEADERS)
        if found is None:
            return _FALLBACK
        host, authorization, content_type = (found.get(b"host"), found.get(b"authorization"),
                                             found.get(b"content-type"))
        message_headers = _MESSAGE_HEADERS in found
        if host is None or authorization is None or not self.host_allowed(host):
            return _FALLBACK
        # Only a token the authentication cache already verified (TokenAuthentication.cached).
        parts = authorization.split()
        if len(parts) != 2 or parts[0].lower() not in (b"token", b"bearer"):
            return _FALLBACK
        await self.verified.refresh()
        hit = self.verified.lookup(authorization)
        if hit is None:
            return _FALLBACK
        user = hit[0]
        data: dict[str, Any] | None = None
        raw: dict[str, Any] | None = None
        kind, name, consumer_id, action = match.groups()
        name = from_segment(name)  # as the URL patterns' `segment` converter (gateway/paths.py)
        if consumer_id is not None:
            consumer_id = from_segment(consumer_id)
        if body.strip():
            media = content_type.split(b";")[0].strip().lower() if content_type is not None else b""
            if media != b"application/json":
                raw = _raw_envelope(body, content_type, media) \
                    if consumer_id is None and not message_headers and not media.endswith(b"+json") else None
                if raw is None:
                    return _FALLBACK
            else:
                try:
                    data = json_input.loads(body)  # as common.json_body
                except ValueError:
                    return _FALLBACK
                if not isinstance(data, dict):
                    return _FALLBACK
        views = self.views
        params = _Params(scope.get("query_string", b""), data)
        try:
            if consumer_id is None:
                if data is None and raw is None:
                    return _FALLBACK
                endpoint = "messages"
                destination = views.url_destination(kind, name)
                if not await self.allowed(user, [destination], "write"):
                    return _FALLBACK
                now = views.runtime.async_broker().clock.now_ms()
                messages = views.parse_messages(data, now, user.get_username()) if raw is None \
                    else [views.parse_envelope(raw, now, user_id=user.get_username())]
            else:
                endpoint = action
                consumer = views.parse_own_consumer(user, kind, name, consumer_id)
                connections.touch_rest(consumer_id, consumer.lease_ms)
                if not await self.allowed(user, [consumer.destination], "read"):
                    return _FALLBACK
                if action == "ack":
                    if data is None:
                        return _FALLBACK
                    ids, mode, count = views.ack_params(params, data)
                else:
                    count, wait = views.receive_params(params)
                    if wait > 0:
                        return _FALLBACK  # a long poll: Django's handler watches for the client leaving
        except Exception:
            return _FALLBACK  # a refusal: Django answers it, nothing has changed yet
        # From here on the request takes effect; errors are answered as the views answer them.
        try:
            await self.throttle(_Caller(user), "api")
            if endpoint == "messages":
                result = await views.send_parsed(user, [destination], messages, [None] * len(messages))
                status = 201
            elif endpoint == "ack":
                result = await views.acknowledge(consumer, ids, mode, count)
                status = 200
            else:  # (an auto consumer's messages are acknowledged once the answer is written: after_write.py)
                return await views.receive_messages(consumer, count, 0.0,
                                                    lambda got: self.json_answer(200, endpoint, got), scope)
        except Exception as exc:
            return self.problem(scope, exc, self.allow[endpoint])
        return self.json_answer(status, endpoint, result)

    def json_answer(self, status: int, endpoint: str,
                    result: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        payload = self.render(result)
        return status, [(b"Content-Type", b"application/json"), self.allow[endpoint], self.tail[0],
                        (b"Content-Length", str(len(payload)).encode()), *self.tail[1:]], payload

    def problem(self, scope: dict[str, Any], exc: Exception,
                allow: tuple[bytes, bytes]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """The problem-details answer of errors.exception_handler, and Django's log line for it."""
        from django.utils.encoding import iri_to_uri

        errors = self.errors
        described = errors.describe(exc)
        if described is None:
            errors.log.exception("unexpected error in %s", scope["path"], exc_info=exc)
            described = (500, errors.problem(500, "internal_error", "Internal error",
                                             "the gateway failed unexpectedly; the error is logged"), {})
        status, body, extra = described
        query = scope.get("query_string", b"").decode("latin-1")
        body["instance"] = path_in_url(scope["path"]) + (("?" + iri_to_uri(query)) if query else "")
        payload = self.render(body)
        headers = [(b"Content-Type", errors.PROBLEM_CONTENT_TYPE.encode()), allow,
                   *((k.encode(), v.encode()) for k, v in extra.items()), self.tail[0],
                   (b"Content-Length", str(len(payload)).encode()), *self.tail[1:]]
        if errors.unavailable.store_unavailable(exc):
            errors.log_unavailable(scope["path"], exc)  # (its one line, naming the cause)
        else:
            log = self.log.error if status >= 500 else self.log.warning
            log("%s: %s", HTTPStatus(status).phrase, scope["path"])
        return status, headers, payload


def allowed_methods(view: type) -> str:
    """The Allow header DRF gives the view's responses (Django's View._allowed_methods, HEAD with GET)."""
    instance = view()
    if hasattr(instance, "get") and not hasattr(instance, "head"):
        instance.head = instance.get
    return ", ".join(instance._allowed_methods())
