"""Is the maintenance tick alive? One judgement for every reader: GET /healthz (signalbox/health.py), the
console's node page and GET /metrics (signalbox/node.py, metrics.py) and the REST job listing
(gateway/api/views_maintenance.py). Apart from health.py because node.py needs it and health.py needs the
Celery app, whose signal handlers start node.py's heartbeats: kept together, the three import each other.
"""

from __future__ import annotations

from typing import Any

import redis
from django.conf import settings

from broker_core import maintenance
from broker_core.broker import Broker

Check = dict[str, Any]


def error(exc: BaseException) -> Check:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return {"status": "error", "error": f"{type(exc).__name__}: {message}"}


def stale_after_ms() -> int:
    """SIGNALBOX_MAINTENANCE_STALE_SECONDS in ms: the tick runs every second (signalbox/celery.py), so one
    that has not finished for this long means beat or every worker stopped (a tick over many destinations
    may itself take a few seconds, hence the default of 15 s)."""
    return int(settings.SIGNALBOX_MAINTENANCE_STALE_SECONDS * 1000)


def tick_status(tick: dict[str, int], now_ms: int, stale_ms: int) -> Check:
    """Judge `maintenance.last_tick`: ok while the last tick finished within `stale_ms`. The REST API's
    job listing (gateway/api/views_maintenance.py) reports the same judgement."""
    if not tick:
        return {"status": "error", "error": "the maintenance tick has never run: start Celery beat and a "
                                            "worker (./signalbox.sh run starts both)"}
    age = now_ms - tick["last_tick"]
    out: Check = {"status": "ok", **tick, "age_ms": age}
    if age > stale_ms:
        out.update(status="error", error=f"the maintenance tick last ran {age / 1000:.1f}s ago (more than "
                                         f"{stale_ms / 1000:g}s): Celery beat or every worker has stopped")
    return out


def check_maintenance(timeout: float | None = None) -> Check:
    """Is the maintenance dispatcher alive? `broker_core.maintenance.last_tick` of this deployment."""
    timeout = settings.HEALTH_CHECK_TIMEOUT if timeout is None else timeout
    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        broker = Broker(client, settings.SIGNALBOX_NAMESPACE)
        return tick_status(maintenance.last_tick(broker), broker.clock.now_ms(), stale_after_ms())
    except Exception as exc:
        return error(exc)
    finally:
        client.close()
