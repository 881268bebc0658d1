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
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import django
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.urls import set_script_prefix

API_PREFIXES = ("/api/v1/", "/api/message")


class GatewayASGIHandler(ASGIHandler):
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith(API_PREFIXES):
            await self.handle_api(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

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


def get_asgi_application() -> GatewayASGIHandler:
    """django.core.asgi.get_asgi_application, with the gateway's handler."""
    django.setup(set_prefix=False)
    return GatewayASGIHandler()
