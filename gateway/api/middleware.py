"""Django's middleware, run inline for the gateway's API requests.

Under ASGI, Django runs each classic middleware's process_request/process_response in a worker
thread (`sync_to_async`), two thread hops per middleware per request: with the default stack that
was 3-4 ms of a 4 ms send. The API's requests need none of that care: these middlewares only set
headers, read cookies and build lazy objects, and API views never modify the session (the one step
that writes to the database). So for paths under API_PREFIXES the wrapped middleware's methods run
directly on the event loop; every other request (admin, console) goes through Django's usual path.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.utils.module_loading import import_string

from gateway.api.asgi import API_PREFIXES


def inline_for_api(dotted_path: str, *, skip: bool = False) -> type:
    """A subclass of the middleware (so Django's checks still recognise it) that runs inline for
    API paths when serving asynchronously, or not at all for them with `skip`."""
    middleware_class = import_string(dotted_path)
    namespace: dict[str, Any] = {}

    def __call__(self: Any, request: Any) -> Any:
        if self.async_mode:
            return _acall(self, request)
        return middleware_class.__call__(self, request)

    async def _acall(self: Any, request: Any) -> Any:
        if not request.path.startswith(API_PREFIXES):
            return await self.__acall__(request)
        if skip:
            return await self.get_response(request)
        response = None
        if hasattr(self, "process_request"):
            response = self.process_request(request)
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            response = self.process_response(request, response)
        return response

    namespace["__call__"] = __call__
    if hasattr(middleware_class, "process_view"):
        sync_view = middleware_class.process_view

        async def process_view(self: Any, request: Any, view: Any, args: Any, kwargs: Any) -> Any:
            if request.path.startswith(API_PREFIXES):
                return sync_view(self, request, view, args, kwargs)
            return await sync_to_async(sync_view, thread_sensitive=True)(self, request, view, args, kwargs)

        namespace["process_view"] = process_view
    return type(f"{middleware_class.__name__}", (middleware_class,), {**namespace, "__module__": __name__})


SecurityMiddleware = inline_for_api("django.middleware.security.SecurityMiddleware")
SessionMiddleware = inline_for_api("django.contrib.sessions.middleware.SessionMiddleware")
CommonMiddleware = inline_for_api("django.middleware.common.CommonMiddleware")
CsrfViewMiddleware = inline_for_api("django.middleware.csrf.CsrfViewMiddleware")
AuthenticationMiddleware = inline_for_api("django.contrib.auth.middleware.AuthenticationMiddleware")
# The API never shows flash messages.
MessageMiddleware = inline_for_api("django.contrib.messages.middleware.MessageMiddleware", skip=True)
XFrameOptionsMiddleware = inline_for_api("django.middleware.clickjacking.XFrameOptionsMiddleware")
