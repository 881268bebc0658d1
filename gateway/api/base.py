"""The async view every endpoint derives from: DRF's request, parsing, rendering and exception
handling, with the handlers as coroutines.

Django runs synchronous views of an ASGI server on one shared thread; the gateway's handlers
long-poll and talk to Redis, so they are coroutines instead, and the few blocking steps (a database
read on an authentication cache miss, an audit record) run in a thread.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from rest_framework import exceptions
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker_core.destinations import Destination
from broker_core.errors import UnknownDestination
from broker_core.model import DestinationStats
from gateway import runtime
from gateway.api import after_write
from gateway.api.auth import SessionAuthentication, TokenAuthentication, authorization_header, is_basic
from gateway.api.codec import render_message
from gateway.api.common import destination_from_url, int_param, setting
from gateway.api.errors import URL_NOT_UTF8, Problem, describe
from gateway.credentials import verified
from gateway.db_steps import db
from gateway.logins import LoginRefused, failure_pause, in_login_thread
from gateway.permissions import Action, allowed_async, temporary_refusal


class RateLimited(exceptions.Throttled):
    pass


async def _throttle(request: Request, scope: str) -> None:
    """Fixed one-second window per user in Redis (so every gateway process counts together).
    Off unless SIGNALBOX_API_RATE_LIMIT (requests per second per user) is set."""
    limit = int(setting("SIGNALBOX_API_RATE_LIMIT", 0) or 0)
    if limit <= 0:
        return
    window = int(time.time())
    key = f"{settings.SIGNALBOX_NAMESPACE}:gw:rate:{scope}:{request.user.pk}:{window}"
    client = runtime.async_redis()  # the gateway's own counter, not broker state
    pipe = client.pipeline(transaction=False)
    pipe.incr(key)
    pipe.expire(key, 2)
    count, _ = await pipe.execute()
    if int(count) > limit:
        raise RateLimited(wait=max(0.001, window + 1 - time.time()),
                          detail=f"more than {limit} requests per second (SIGNALBOX_API_RATE_LIMIT)")


class GatewayView(APIView):
    """Base of the API views: handlers are `async def get/post/...`."""

    authentication_classes = [TokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]
    throttle_scope = "api"

    view_is_async = True  # every handler below is a coroutine (checked by Django's View.as_view)

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # The API speaks JSON only: answer in it whatever the Accept header says (no 406, and no
        # Accept parsing on every request).
        return super().perform_content_negotiation(request, force=True)

    async def options(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().options(request, *args, **kwargs)

    async def authenticate(self, request: Request) -> None:
        await verified.refresh()  # (another process's changes of users and tokens)
        for authenticator in request.authenticators:
            cached = getattr(authenticator, "cached", None)
            hit = cached(request) if cached else None
            if hit is not None:
                request._authenticator = authenticator
                request.user, request.auth = hit
                return
        # A cache miss reads the database: do it off the event loop (a password login in the logins' threads).
        if not is_basic(authorization_header(request)):
            await db(lambda: request.user)
            return
        try:
            await in_login_thread(lambda: request.user)
        except (exceptions.AuthenticationFailed, LoginRefused):
            await failure_pause()
            raise

    async def initial_async(self, request: Request) -> None:
        self.format_kwarg = self.get_format_suffix(**self.kwargs)
        neg = self.perform_content_negotiation(request)
        request.accepted_renderer, request.accepted_media_type = neg
        version, scheme = self.determine_version(request, *self.args, **self.kwargs)
        request.version, request.versioning_scheme = version, scheme
        await self.authenticate(request)
        self.check_permissions(request)
        refusal = getattr(request._request, "scope", {}).get(URL_NOT_UTF8)  # (asgi.py: a URL not UTF-8)
        if refusal is not None:
            raise refusal
        if request.user.is_authenticated:
            await _throttle(request, self.throttle_scope)

    async def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.args = args
        self.kwargs = kwargs
        request = self.initialize_request(request, *args, **kwargs)
        self.request = request
        self.headers = self.default_response_headers
        try:
            await self.initial_async(request)
            method = request.method.lower()
            handler = getattr(self, method, None) if method in self.http_method_names else None
            if handler is None:
                raise exceptions.MethodNotAllowed(request.method)
            response = await handler(request, *args, **kwargs)
        except Exception as exc:
            response = self.handle_exception(exc)
        self.response = self.finalize_response(request, response, *args, **kwargs)
        plain = rendered(self.response)
        if plain is not self.response:  # (an answer carrying leased messages: its settlement follows it)
            after_write.rendered_as(getattr(request._request, "scope", None), self.response, plain)
        return plain

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
            header = self.get_authenticate_header(self.request)
            exc.auth_header = header or 'Token realm="signalbox"'  # type: ignore[attr-defined]
            if not header:
                exc.status_code = 401
        response = self.settings.EXCEPTION_HANDLER(exc, self.get_exception_handler_context())
        if response is None:  # pragma: no cover - our handler always answers
            raise exc
        response.exception = True
        return response

    # -- helpers for the handlers --------------------------------------------------------------------

    async def require(self, request: Request, destinations: Destination | Iterable[Destination],
                      action: Action) -> None:
        """Raise 403 (401 when anonymous) unless the user may do `action` on every destination."""
        targets = [destinations] if isinstance(destinations, Destination) else list(destinations)
        if await allowed_async(request.user, targets, action):
            return
        if not request.user.is_authenticated:
            raise exceptions.NotAuthenticated()
        names = ", ".join(d.uri for d in targets)
        raise exceptions.PermissionDenied(f"user {request.user.get_username()!r} has no {action} "
                                          f"permission on {names}")

    async def destination(self, request: Request, kind: str, name: str, action: Action) -> Destination:
        """The destination the URL names (`queues`/`topics` + name), once the user may do `action` on it."""
        destination = destination_from_url(kind, name)
        await self.require(request, destination, action)
        return destination

    async def audited(self, request: Request, action: str, destination: str, target: str,
                      parameters: dict[str, Any], run: Callable[[], Awaitable[Response]]) -> Response:
        """Run an administrative action and keep an audit record of it, whatever its outcome."""
        try:
            response = await run()
        except Exception as exc:
            described = describe(exc)
            status_code, body = (described[0], described[1]) if described else (500, {"detail": str(exc)})
            await record_audit(request, action, destination, target, parameters, status_code, body)
            raise
        result = response.data if isinstance(response.data, dict) else {}
        await record_audit(request, action, destination, target, parameters, response.status_code, result)
        return response


def rendered(response: Any) -> Any:
    """Render a DRF Response here, on the event loop (JSON only, no I/O), and hand Django a plain
    HttpResponse: a response with a render() method costs a thread hop in Django's async handler."""
    if not isinstance(response, Response):
        return response
    response.render()
    plain = HttpResponse(response.content, status=response.status_code)
    for name, value in response.items():
        plain[name] = value
    plain.cookies = response.cookies
    if getattr(response, "_has_been_logged", False):  # (errors.log_unavailable wrote its line)
        plain._has_been_logged = True  # type: ignore[attr-defined]
    return plain


async def record_audit(request: Request, action: str, destination: str, target: str,
                       parameters: dict[str, Any], status_code: int, result: dict[str, Any]) -> None:
    from gateway.models import AuditRecord

    user = request.user if request.user.is_authenticated else None
    forwarded = request.META.get("REMOTE_ADDR", "")

    def write() -> None:
        AuditRecord.objects.create(
            user=user, username=user.get_username() if user else "", action=action,
            destination=destination, target=target[:256], parameters=_jsonable(parameters),
            succeeded=status_code < 400, status_code=status_code, result=_jsonable(result),
            remote_addr=forwarded[:64])

    await db(write)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


# -- what views on one destination share

async def stats_or_404(destination: Destination) -> DestinationStats:
    try:
        return await runtime.async_broker().stats(destination)
    except UnknownDestination:
        raise Problem(404, "unknown_destination", "Unknown destination", f"no destination {destination.uri}",
                      destination=destination.uri) from None


async def on_existing(view: GatewayView, request: Request, destination: Destination, action: str,
                      work: Callable[[], Awaitable[Response]], target: str = "",
                      parameters: dict[str, Any] | None = None) -> Response:
    """An audited administrative action on a destination that must exist: 404 (audited too) if it does
    not, else `work()`."""

    async def run() -> Response:
        await stats_or_404(destination)
        return await work()

    return await view.audited(request, action, destination.uri, target, parameters or {}, run)


def refuse_temporary_contents(request: Request, destination: Destination) -> None:
    """403 when the user may not read, or move or copy out, a temporary destination's messages
    (permissions.temporary_refusal: REST has no connection, so over REST only a staff user may)."""
    refusal = temporary_refusal(request.user, destination)
    if refusal is not None:
        raise exceptions.PermissionDenied(refusal)


async def browse(view: GatewayView, request: Request, destination: Destination) -> Response:
    await view.require(request, destination, "read")
    refuse_temporary_contents(request, destination)
    await stats_or_404(destination)
    limit = int_param(request, "limit", 100, 1, 1000)
    selector = request.query_params.get("selector") or None
    cursor = request.query_params.get("cursor") or None
    result = await runtime.async_broker().browse(destination, selector=selector, cursor=cursor, limit=limit)
    return Response({"messages": [render_message(m) for m in result.messages],
                     "next_cursor": result.next_cursor})
