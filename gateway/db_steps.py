"""Blocking database steps run off the event loop."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections


async def db(fn: Callable[..., Any], *args: Any, executor: Executor | None = None) -> Any:
    """Run a blocking database step in a worker thread (of `executor`, else the event loop's pool), with
    a fresh connection closed after it.

    API requests skip Django's per-request thread and its request_started/finished signals
    (gateway/api/asgi.py), so nothing else would close the connection this thread opened."""

    def run() -> Any:
        close_old_connections()
        try:
            return fn(*args)
        finally:
            close_old_connections()

    return await sync_to_async(run, thread_sensitive=False, executor=executor)()
