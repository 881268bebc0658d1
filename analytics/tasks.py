"""What the Celery tasks and the management command run (signalbox/tasks.py wraps these in one line)."""

from __future__ import annotations

import time
from typing import Any

from broker_core.broker import Broker

from . import config
from .archive import ArchiveLocation, archive_all
from .pipeline import check_range, iso, parse_time
from .pipeline import run as run_pipeline


def archive(broker: Broker) -> dict[str, Any]:
    """One archive run over every destination, with the configured location, retention and keep time."""
    location = ArchiveLocation.parse(config.archive_url())
    return archive_all(broker, location, retention_days=config.archive_retention_days(),
                       keep_ms=config.archive_keep_ms()).as_dict()


def time_range(since: str | None, until: str | None) -> tuple[int, int]:
    """[since, until) in epoch ms from the command's options; relative times count back from one `now`,
    and an empty range is refused (RangeError) before anything runs."""
    now_ms = int(time.time() * 1000)
    until_ms = parse_time(until, name="until", now_ms=now_ms) if until else now_ms
    since_ms = (parse_time(since, name="since", now_ms=now_ms) if since
                else until_ms - int(config.analytics_window_hours() * 3_600_000))
    check_range(since_ms, until_ms)
    return since_ms, until_ms


def run(broker: Broker, since: str | None = None, until: str | None = None, *, summary_client: Any,
        archive_first: bool = True, destinations: list[str] | None = None,
        master: str | None = None) -> dict[str, Any]:
    """Archive what is in the streams, then run the jobs; the summary goes to the output and to Redis
    (with `summary_client`, the worker's redis-py client: analytics' own key, not broker state)."""
    from .spark import spark_session

    since_ms, until_ms = time_range(since, until)
    archived = archive(broker)["archived"] if archive_first else 0
    spark = spark_session("signalbox-analytics", master)
    result = run_pipeline(spark, since_ms=since_ms, until_ms=until_ms, destinations=destinations,
                          redis_client=summary_client, namespace=broker.namespace)
    return {"archived": archived, "output": result.output, "seconds": round(result.seconds, 2),
            "since": iso(since_ms), "until": iso(until_ms), "since_ms": since_ms, "until_ms": until_ms,
            "destinations": sorted(result.summary["destinations"])}
