"""GET /healthz: whether Redis, the database and at least one Celery worker answer, and whether the
maintenance tick (Celery beat sending it, a worker running it) is alive, for monitoring.

The checks run concurrently, each bounded by HEALTH_CHECK_TIMEOUT, so a dead dependency makes the
endpoint slow by at most that timeout (a little more for the blocking checks' threads: `_answered`). A
dependency that hangs rather than refuses (a Redis stopped with SIGSTOP keeps its connections open) is
reported as not answering. 200 means all healthy, 503 means at least one is not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse

from signalbox.celery import app as celery_app
from signalbox.maintenance_check import Check, check_maintenance, error


async def check_redis(url: str | None = None, timeout: float | None = None) -> Check:
    timeout = settings.HEALTH_CHECK_TIMEOUT if timeout is None else timeout
    client = aioredis.Redis.from_url(
        url or settings.REDIS_URL, socket_connect_timeout=timeout, socket_timeout=timeout
    )
    try:
        info = await asyncio.wait_for(client.info("server"), timeout)
        persistence = await asyncio.wait_for(client.info("persistence"), timeout)
    except Exception as exc:  # any failure is reported, not raised: that is the endpoint's job
        return error(exc)
    finally:
        await client.aclose()
    return {
        "status": "ok",
        "version": info.get("redis_version"),
        "aof_enabled": bool(int(persistence.get("aof_enabled", 0))),
    }


def check_database() -> Check:
    try:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        return error(exc)
    finally:
        # Health probes arrive every few seconds; do not leave a connection behind in each thread.
        connection.close()
    return {"status": "ok", "vendor": connection.vendor}


def check_celery(app: Any = None, timeout: float | None = None) -> Check:
    """A broadcast ping. The first pong is enough: limit=1 returns without waiting out the timeout. On a
    connection of its own whose socket operations time out (the app's has no timeout: a hung Redis would
    hold the publish for good)."""
    app = app or celery_app
    timeout = settings.HEALTH_CHECK_TIMEOUT if timeout is None else timeout
    try:
        with app.connection_for_write(transport_options={"socket_timeout": timeout,
                                                         "socket_connect_timeout": timeout}) as conn:
            replies = app.control.ping(timeout=timeout, limit=1, connection=conn)
    except Exception as exc:
        return error(exc)
    workers = sorted(name for reply in replies for name in reply)
    if not workers:
        return {"status": "error", "error": f"no Celery worker answered a ping within {timeout:g}s"}
    return {"status": "ok", "workers": workers}


# The blocking checks run in threads of their own: one stuck in a call that ignores its timeout must not
# take a thread the requests' database steps need, and is not started again while it runs (`_running`).
_THREADS = concurrent.futures.ThreadPoolExecutor(max_workers=3, thread_name_prefix="healthz")
_running: dict[str, concurrent.futures.Future[Check]] = {}


async def _answered(name: str, check: Callable[[], Check]) -> Check:
    """`check()` in a thread, waited for HEALTH_CHECK_TIMEOUT + 1 s at most (its own timeouts should end it
    first); a probe that finds the last probe's check still running waits for that one instead."""
    running = _running.get(name)
    if running is None or running.done():
        running = _running[name] = _THREADS.submit(check)
    bound = settings.HEALTH_CHECK_TIMEOUT + 1
    try:
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(running)), bound)
    except TimeoutError:
        return {"status": "error", "error": f"no answer within {bound:g}s: what it waits for hangs"}


async def run_checks() -> dict[str, Check]:
    redis_status, database_status, celery_status, maintenance_status = await asyncio.gather(
        check_redis(),
        _answered("database", check_database),
        _answered("celery", check_celery),
        _answered("maintenance", check_maintenance),
    )
    return {"redis": redis_status, "database": database_status, "celery": celery_status,
            "maintenance": maintenance_status}


async def healthz(request: HttpRequest) -> JsonResponse:
    checks = await run_checks()
    healthy = all(check["status"] == "ok" for check in checks.values())
    body = {"status": "ok" if healthy else "error", **checks}
    response = JsonResponse(body, status=200 if healthy else 503)
    response["Cache-Control"] = "no-store"
    return response
