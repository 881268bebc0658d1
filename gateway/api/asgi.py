"""Django's ASGI handler with a lean path for the gateway's API requests.

Django's handler serves every request inside its own ThreadSensitiveContext (a new worker thread per
request) and hops to a thread three times even for an async view: to send request_started, to
close the response (request_finished) and, for a DRF Response, to render it. On a 2-core machine
that was about 2 ms of a 2.5 ms request. API requests here are async from end to end and use the
database only in a few explicit `sync_to_async` calls (authentication cache misses, audit records),
which close their connection themselves (`gateway.api.base.db`). So for paths under API_PREFIXES
the handler skips the per-request thread and runs the signals inline: their receivers touch only
this thread's database connections, which the event loop never opens. Every other request takes
Django's usual path.

The hottest endpoints go further (`HotPath`): POST a JSON message or batch, or a raw body (without
Message-* headers or content-type parameters), to a queue/topic URL, receive without waiting, ack (and
ack-then-receive). For them Django's request object, URL resolver,
middleware chain and DRF's request wrapping cost more CPU than the broker call itself (profiled:
~0.5 ms of Python per request). The hot path parses the ASGI scope itself and calls the same
functions the views call (views_messaging.send_parsed, receive_messages, acknowledge), with the same
checks in the same order: allowed host, token from the authentication cache, permission, rate limit.
Whenever a request is anything but the plain case (no cached token, a denied permission, an
Idempotency-Key, a malformed body, a raw body with Message-* headers, a long-poll wait, bad parameters...)
it is handed to Django unchanged (the body replayed), before anything has changed, so every refusal keeps
Django's exact answer. `SIGNALBOX_API_HOT_PATH = False` turns it off.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl

import django
from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.urls import set_script_prefix

from gateway import connections
from gateway.api import json_input
from gateway.metrics import ROUTE_KEY

API_PREFIXES = ("/api/v1/", "/api/message")
# POST /api/v1/<kind>/<name>/messages | .../consumers/<id>/ack | .../consumers/<id>/receive
_HOT = re.compile(r"/api/v1/(queues|topics)/([^/]+)/(?:messages|consumers/([^/]+)/(ack|receive))\Z")


class GatewayASGIHandler(ASGIHandler):
    hot: HotPath | None = None
    compat: Any = None  # compat_hot.CompatHotPath

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith(API_PREFIXES):
            if scope["method"] == "POST" and (match := _HOT.match(scope["path"])) is not None:
                if self.hot is None:
                    GatewayASGIHandler.hot = HotPath()
                if self.hot.enabled():
                    await self.handle_hot(scope, receive, send, match)
                    return
            elif scope["path"].startswith("/api/message"):
                if self.compat is None:
                    from gateway.api.compat_hot import CompatHotPath

                    GatewayASGIHandler.hot = self.hot or HotPath()
                    GatewayASGIHandler.compat = CompatHotPath(self.hot)
                if self.compat.wants(scope) and self.hot.enabled():  # type: ignore[union-attr]
                    await self.handle_hot(scope, receive, send, None)
                    return
            await self.handle_api(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def handle_hot(self, scope: dict[str, Any], receive: Any, send: Any,
                         match: re.Match[str] | None) -> None:
        """The hot path (module docstring; `match` None: /api/message's, compat_hot.py), or Django's with
        the body replayed."""
        messages: list[dict[str, Any]] = []
        size = 0
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its request: nothing to answer
            messages.append(message)
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
            if limit is not None and size > limit:
                break  # too large for the hot path: Django refuses it (413) as it always did
        answer = None
        if not messages[-1].get("more_body") and (limit is None or size <= limit) and self.hot is not None:
            body = b"".join(m.get("body", b"") for m in messages)
            if match is None:
                answer = await self.compat.serve(scope, body)
            else:
                answer = await self.hot.serve(scope, body, match)
        if answer is None:
            messages.reverse()

            async def replayed() -> Any:
                return messages.pop() if messages else await receive()

            await self.handle_api(scope, replayed, send)
            return
        status, headers, payload = answer
        # the URL pattern's name, for the request metrics (gateway.metrics); Django's path names its own
        if match is None:
            scope[ROUTE_KEY] = self.compat.route(scope)
        else:
            scope[ROUTE_KEY] = "api-messages" if match.group(3) is None else f"api-{match.group(4)}"
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def handle_api(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """ASGIHandler.handle without the thread hops (see the module docstring)."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            error_response.close()
            return

        async def process_request() -> Any:
            response = await self.run_get_response(request)
            with contextlib.suppress(asyncio.CancelledError):
                await self.send_response(response, send)
            return response

        # As Django does: a client that disconnects cancels its request (a long-poll stops waiting).
        tasks = [asyncio.create_task(self.listen_for_disconnect(receive)),
                 asyncio.create_task(process_request())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            response = tasks[1].result()
        except asyncio.CancelledError:
            pass
        else:
            response.close()  # request_finished, inline
        body_file.close()


class _Params:
    """What views_messaging's parameter helpers read from a DRF request (common.int_param)."""

    __slots__ = ("query_params", "_json")

    def __init__(self, query_string: bytes, data: dict[str, Any] | None) -> None:
        # As Django's QueryDict.get: the last value of a repeated name.
        self.query_params = dict(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)) \
            if query_string else {}
        self._json = data


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
# views keep its record).
_HOT_HEADERS = frozenset({b"authorization", b"content-type", b"host"})
_NOT_HOT = frozenset({b"idempotency-key"})


def request_headers(headers: list[tuple[bytes, bytes]], wanted: frozenset[bytes],
                    refused: frozenset[bytes]) -> dict[bytes, bytes] | None:
    """The ASGI scope's headers named in `wanted` (lower case, as ASGI gives them), for HotPath and
    compat_hot.CompatHotPath: the last of a repeated header, but Cookie lines joined with "; " (as Django
    joins them) and a second Authorization refused. None when the request is not the lean path's: a
    second Authorization, or any header in `refused`."""
    found: dict[bytes, bytes] = {}
    for name, value in headers:
        if name in wanted:
            if name in found:
                if name == b"authorization":
                    return None  # two credentials: Django's authentication answers
                if name == b"cookie":
                    value = found[name] + b"; " + value
            found[name] = value
        elif name in refused:
            return None
    return found


class HotPath:
    """Serves the hot endpoints without Django's request machinery (module docstring). `serve` returns
    (status, headers, body), or None to hand the request to Django untouched."""

    def __init__(self) -> None:
        from rest_framework.renderers import JSONRenderer

        from gateway.api import base, errors
        from gateway.api import views_messaging as views
        from gateway.credentials import verified
        from gateway.permissions import allowed_async

        self.verified, self.throttle, self.errors, self.views = verified, base._throttle, errors, views
        self.allowed = allowed_async
        self.render = JSONRenderer().render  # byte for byte what DRF's views answer
        self.hosts: dict[bytes, bool] = {}
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
        self.allow = {kind: (b"Allow", _allowed_methods(view).encode()) for kind, view in (
            ("messages", views.DestinationMessagesView), ("ack", views.AckView),
            ("receive", views.ReceiveView))}

    def enabled(self) -> bool:
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
        found = request_headers(scope["headers"], _HOT_HEADERS, _NOT_HOT)
        if found is None:
            return _FALLBACK
        host, authorization, content_type = (found.get(b"host"), found.get(b"authorization"),
                                             found.get(b"content-type"))
        # Django's to read: a repeated Content-Type (Django joins repeated headers), and a raw body's
        # envelope fields (Message-* headers, views_messaging._raw_envelope)
        names = [name for name, _value in scope["headers"]]
        if names.count(b"content-type") > 1:
            return _FALLBACK
        message_headers = any(name.startswith(b"message-") for name in names)
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
            else:
                result = await views.receive_messages(consumer, count, 0.0)
                status = 200
        except Exception as exc:
            return self.problem(scope, exc, self.allow[endpoint])
        payload = self.render(result)
        return status, [(b"Content-Type", b"application/json"), self.allow[endpoint], self.tail[0],
                        (b"Content-Length", str(len(payload)).encode()), *self.tail[1:]], payload

    def problem(self, scope: dict[str, Any], exc: Exception,
                allow: tuple[bytes, bytes]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """The problem-details answer of errors.exception_handler, and Django's log line for it."""
        from django.utils.encoding import escape_uri_path, iri_to_uri

        errors = self.errors
        described = errors.describe(exc)
        if described is None:
            errors.log.exception("unexpected error in %s", scope["path"], exc_info=exc)
            described = (500, errors.problem(500, "internal_error", "Internal error",
                                             "the gateway failed unexpectedly; the error is logged"), {})
        status, body, extra = described
        query = scope.get("query_string", b"").decode("latin-1")
        body["instance"] = escape_uri_path(scope["path"]) + (("?" + iri_to_uri(query)) if query else "")
        payload = self.render(body)
        headers = [(b"Content-Type", errors.PROBLEM_CONTENT_TYPE.encode()), allow,
                   *((k.encode(), v.encode()) for k, v in extra.items()), self.tail[0],
                   (b"Content-Length", str(len(payload)).encode()), *self.tail[1:]]
        log = self.log.error if status >= 500 else self.log.warning
        log("%s: %s", HTTPStatus(status).phrase, scope["path"])
        return status, headers, payload


def _allowed_methods(view: type) -> str:
    """The Allow header DRF gives the view's responses (Django's View._allowed_methods, HEAD with GET)."""
    instance = view()
    if hasattr(instance, "get") and not hasattr(instance, "head"):
        instance.head = instance.get
    return ", ".join(instance._allowed_methods())


def get_asgi_application() -> GatewayASGIHandler:
    """django.core.asgi.get_asgi_application, with the gateway's handler."""
    django.setup(set_prefix=False)
    return GatewayASGIHandler()
