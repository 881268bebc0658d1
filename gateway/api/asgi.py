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

The hottest endpoints go further: hot_path.py's `HotPath` (and compat_hot.py's for ActiveMQ's
/api/message) serve them without Django's request machinery, handing anything but the plain case to
Django unchanged.

Both paths write an answer that carries a leased message (ActiveMQ's GET, an auto consumer's receive)
before that message is settled, and settle it right after (after_write.py: `finish` with the object
written and the server's `receive`, which tells whether the client was still there to be written to).

Every HTTP request (the console's too) is routed on its raw path, so that a name holding `/` or `%` stays
one segment (gateway/paths.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

import django
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, ASGIRequest, get_script_prefix
from django.core.signals import setting_changed
from django.urls import set_script_prefix
from django.utils.encoding import iri_to_uri

from gateway.api import after_write
from gateway.api.errors import URL_NOT_UTF8, url_not_utf8
from gateway.api.hot_path import HotPath
from gateway.metrics import ROUTE_KEY
from gateway.paths import path_in_url, routing_path

API_PREFIXES = ("/api/v1/", "/api/message")
# POST /api/v1/<kind>/<name>/messages | .../consumers/<id>/ack | .../consumers/<id>/receive
_HOT = re.compile(r"/api/v1/(queues|topics)/([^/]+)/(?:messages|consumers/([^/]+)/(ack|receive))\Z")


class GatewayRequest(ASGIRequest):
    """Django's request, whose path is a routing path (gateway/paths.py): its full path (redirects, links,
    a problem's `instance`) keeps the path's escapes instead of encoding their `%` again."""

    def _get_full_path(self, path: str, force_append_slash: bool) -> str:
        # (HttpRequest._get_full_path with path_in_url for escape_uri_path)
        query = self.META.get("QUERY_STRING", "")
        return "".join((path_in_url(path), "/" if force_append_slash and not path.endswith("/") else "",
                        f"?{iri_to_uri(query)}" if query else ""))


class GatewayASGIHandler(ASGIHandler):
    request_class = GatewayRequest
    hot: HotPath | None = None
    compat: Any = None  # compat_hot.CompatHotPath

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and b"%" in (raw := scope.get("raw_path") or b""):
            scope["path"] = routing_path(raw)  # (a path without `%` is its raw path already)
        if scope["type"] == "http" and scope.get("path", "").startswith(API_PREFIXES):
            if (b"%" in (scope.get("raw_path") or b"") or b"%" in scope.get("query_string", b"")) and (
                    refusal := url_not_utf8(scope)) is not None:
                scope[URL_NOT_UTF8] = refusal  # Django's path: the view refuses it once the caller is known
                await self.handle_api(scope, receive, send)
                return
            if scope["method"] == "POST" and (match := _HOT.match(scope["path"])) is not None:
                if self.hot is None:
                    GatewayASGIHandler.hot = HotPath()
                if self.hot.on:
                    await self.handle_hot(scope, receive, send, match)
                    return
            elif scope["path"].startswith("/api/message"):
                if self.compat is None:
                    # (not at the top: compat_hot needs Django's apps, which are not ready when this loads)
                    from gateway.api.compat_hot import CompatHotPath

                    GatewayASGIHandler.hot = self.hot or HotPath()
                    GatewayASGIHandler.compat = CompatHotPath(self.hot)
                if self.compat.wants(scope) and self.hot.on:  # type: ignore[union-attr]
                    await self.handle_hot(scope, receive, send, None)
                    return
            await self.handle_api(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def handle_hot(self, scope: dict[str, Any], receive: Any, send: Any,
                         match: re.Match[str] | None) -> None:
        """The hot path (module docstring; `match` None: /api/message's, compat_hot.py), or Django's with
        the body replayed."""
        # (a setting changed while the body arrives makes new ones: _forget_lean_paths)
        hot, compat = self.hot, self.compat
        assert hot is not None
        messages: list[dict[str, Any]] = []
        size = 0
        limit = hot.body_limit
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
        after_write.open_slot(scope)
        if not messages[-1].get("more_body") and (limit is None or size <= limit):
            body = b"".join(m.get("body", b"") for m in messages)
            if match is None:
                answer = await compat.serve(scope, body)
            else:
                answer = await hot.serve(scope, body, match)
        if answer is None:
            messages.reverse()

            async def replayed() -> Any:
                return messages.pop() if messages else await receive()

            replayed.__wrapped__ = receive  # type: ignore[attr-defined]  # (the server's: after_write.dropped)
            await self.handle_api(scope, replayed, send)
            return
        status, headers, payload = answer
        # the URL pattern's name, for the request metrics (gateway.metrics); Django's path names its own
        if match is None:
            scope[ROUTE_KEY] = compat.route(scope)
        else:
            scope[ROUTE_KEY] = "api-messages" if match.group(3) is None else f"api-{match.group(4)}"
        written = None
        try:
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": payload})
            written = answer
        finally:
            # the message it carries settled only now, and given back if the client was gone (after_write.py)
            await after_write.finish(scope, written, receive)

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

        after_write.open_slot(scope)
        answered = False

        async def process_request() -> Any:
            nonlocal answered
            response = await self.run_get_response(request)
            with contextlib.suppress(asyncio.CancelledError):
                await self.send_response(response, send)
                answered = True
            # the message the answer carries settled only now it is written, and given back if the client
            # was gone (after_write.py)
            await after_write.finish(scope, response if answered else None, receive)
            return response

        # As Django does: a client that disconnects cancels its request (a long-poll stops waiting). Once the
        # answer is out the request only settles what it carried: that runs to its end (uvicorn reports a
        # disconnect as soon as the response is complete).
        tasks = [asyncio.create_task(self.listen_for_disconnect(receive)),
                 asyncio.create_task(process_request())]
        try:
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
                elif task is tasks[1] and answered:
                    await task
                else:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        finally:
            await after_write.finish(scope, None)  # handed over, never written: given back
        try:
            response = tasks[1].result()
        except asyncio.CancelledError:
            pass
        else:
            response.close()  # request_finished, inline
        body_file.close()


def _forget_lean_paths(**_kwargs: Any) -> None:
    """A setting changed (override_settings, the tests' `settings` fixture): the next request makes the lean
    paths again, from the settings as they are now (HotPath reads them once)."""
    GatewayASGIHandler.hot = None
    GatewayASGIHandler.compat = None


setting_changed.connect(_forget_lean_paths, dispatch_uid="gateway-api-lean-paths")


def get_asgi_application() -> GatewayASGIHandler:
    """django.core.asgi.get_asgi_application, with the gateway's handler."""
    django.setup(set_prefix=False)
    return GatewayASGIHandler()
