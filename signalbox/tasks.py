"""Celery tasks: one-line wrappers around broker_core.maintenance (the logic and its tests live there).

Beat sends `signalbox.maintenance.tick` every second (signalbox/celery.py); the tick visits what the
maintenance index says is due (docs/broker_core.md "The maintenance index") and runs those jobs. The
other tasks run one job on one destination by hand. `namespace` defaults to SIGNALBOX_NAMESPACE; results
are plain dicts.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any

import redis
from django.conf import settings

from broker_core import maintenance
from broker_core.broker import Broker
from broker_core.destinations import parse_destination
from broker_core.model import ConsumerRef
from signalbox.celery import app

log = logging.getLogger(__name__)
# What a tick report counts that changed something (the rest is bookkeeping: destinations, checks run).
TICK_WORK = ("reaped", "forwarded", "dispatched", "expired", "aborted", "offline_removed",
             "deletions_finished")


@functools.cache
def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


@functools.cache
def _broker(namespace: str) -> Broker:
    return Broker(_client(), namespace)


def redis_client() -> redis.Redis:
    """The worker's redis-py client, for keys of the worker's own (the analytics summary); broker state
    goes through `broker()`."""
    return _client()


def broker(namespace: str | None = None) -> Broker:
    """The worker's blocking broker client for a key namespace (one per namespace and process)."""
    return _broker(namespace or settings.SIGNALBOX_NAMESPACE)


def _plain(result: Any) -> Any:
    return dataclasses.asdict(result) if dataclasses.is_dataclass(result) else result


@app.task(name="signalbox.maintenance.tick")
def tick(namespace: str | None = None) -> dict[str, Any]:
    started = time.monotonic()
    try:
        report = _plain(maintenance.run_due(broker(namespace)))
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        # Redis restarting or away: one line a tick (not Celery's traceback of a failed task); the next
        # tick, a second later, does what this one could not
        log.warning("maintenance tick skipped: Redis unavailable (%s)", exc)
        return {"skipped": f"Redis unavailable: {exc}"}
    log_tick(report, time.monotonic() - started)
    return report


def log_tick(report: dict[str, Any], seconds: float) -> None:
    """One line per tick that matters: failed destinations (ERROR), slower than
    SIGNALBOX_MAINTENANCE_SLOW_SECONDS (WARNING), did work (INFO); an idle tick only at DEBUG, since beat
    sends one every second. The report rides along as the record's `tick` extra (a JSON field)."""
    work = {key: report[key] for key in TICK_WORK if report.get(key)}
    counts = ", ".join(f"{key} {len(value) if isinstance(value, list) else value}"
                       for key, value in work.items())
    summary = (f"maintenance tick: {counts or 'nothing due'} on {report.get('destinations', 0)} "
               f"destination(s) in {seconds * 1000:.0f} ms")
    slow = settings.SIGNALBOX_MAINTENANCE_SLOW_SECONDS
    extra = {"tick": report}
    if report.get("errors"):
        log.error("%s; %d destination(s) failed: %s", summary, len(report["errors"]),
                  "; ".join(report["errors"]), extra=extra)
    elif seconds > slow:
        log.warning("%s, over SIGNALBOX_MAINTENANCE_SLOW_SECONDS=%g", summary, slow, extra=extra)
    elif work:
        log.info(summary, extra=extra)
    else:
        log.debug(summary, extra=extra)


@app.task(name="signalbox.maintenance.recover")
def recover(destination: str, namespace: str | None = None) -> dict[str, Any]:
    return _plain(maintenance.run_recovery(broker(namespace), destination))


@app.task(name="signalbox.maintenance.sweep_expired")
def sweep_expired(destination: str, namespace: str | None = None, max_pages: int | None = None,
                  force: bool = True) -> dict[str, Any]:
    return _plain(maintenance.run_expiry_sweep(broker(namespace), destination, max_pages=max_pages,
                                               force=force))


@app.task(name="signalbox.maintenance.check_slow_consumers")
def check_slow_consumers(destination: str, namespace: str | None = None) -> dict[str, Any]:
    return _plain(maintenance.run_slow_consumer_check(broker(namespace), destination))


@app.task(name="signalbox.maintenance.abort_consumer")
def abort_consumer(destination: str, consumer_id: str, reason: str, abort_connection: bool = False,
                   namespace: str | None = None) -> None:
    maintenance.abort_consumer(broker(namespace), ConsumerRef(parse_destination(destination), consumer_id),
                               reason, abort_connection=abort_connection)


@app.task(name="signalbox.maintenance.expire_offline_durables")
def expire_offline_durables(destination: str, namespace: str | None = None) -> list[str]:
    return maintenance.run_offline_durable_cleanup(broker(namespace), destination, force=True)


# -- the event archive and the PySpark pipeline (analytics/) --------------------


@app.task(name="signalbox.analytics.archive")
def archive_events(namespace: str | None = None) -> dict[str, Any]:
    """Drain every destination's lifecycle events into the Parquet archive (analytics/archive.py)."""
    from analytics import tasks as analytics_tasks

    return analytics_tasks.archive(broker(namespace))


@app.task(name="signalbox.analytics.run")
def run_analytics(since: str | None = None, until: str | None = None, namespace: str | None = None
                  ) -> dict[str, Any]:
    """Run the PySpark jobs over [since, until) (default: the last SIGNALBOX_ANALYTICS_WINDOW_HOURS)."""
    from analytics import tasks as analytics_tasks

    return analytics_tasks.run(broker(namespace), since, until, summary_client=redis_client())
