"""The analytics pipeline: archive → metric tables (Parquet) → a compact summary for the console.

Run it with `python manage.py signalbox_analytics --since … --until …`, the Celery task
`signalbox.analytics.run`, or plain spark-submit:
`spark-submit analytics/pipeline.py --archive /path/archive --output /path/out --since 2026-11-21`.
The summary is written to `<output>/summary.json` and, given a Redis client, to `<ns>:analytics:summary`,
where the console reads it from any process.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

if __package__ in (None, ""):  # spark-submit runs this file as a script
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from analytics import config, jobs
from analytics.archive import ArchiveLocation
from analytics.balance import balance
from analytics.events import SPARK_SCHEMA_DDL
from analytics.store import write_summary

TABLES = ("per_minute", "latency", "redeliveries", "dead_letters", "groups", "group_consumers",
          "slow_consumer_episodes", "aborts")
SUMMARY_MINUTES = 1440  # the per-minute series in the summary: the last day of the range at most
SUMMARY_LIST = 20  # top groups, recent episodes and aborts per destination


class RangeError(ValueError):
    """A time range the pipeline cannot run."""


TIME_OPTIONS = ("--since", "--until")
RELATIVE_UNITS = {"m": 60_000, "h": 3_600_000, "d": 86_400_000}
TIME_FORMS = ("ISO 8601 (2026-11-21 or 2026-11-21T10:00, UTC unless it has an offset), epoch ms, "
              "or a time relative to now: -30m, -6h, -2d (minutes, hours, days)")


def attach_time_values(args: list[str] | None) -> list[str] | None:
    """`--since -6h` as `--since=-6h`. argparse takes an argument that starts with "-" and is not a
    plain negative number for an option, so `--since -6h` failed with "expected one argument";
    attached, the value reaches parse_time, which accepts it or names it in its error."""
    if args is None:
        return None
    out: list[str] = []
    items = iter(args)
    for arg in items:
        if arg in TIME_OPTIONS:
            value = next(items, None)
            if value is not None and value.startswith("-") and not value.startswith("--"):
                out.append(f"{arg}={value}")
                continue
            out.append(arg)
            if value is not None:
                out.append(value)
            continue
        out.append(arg)
    return out


def parse_time(text: str, *, name: str, now_ms: int | None = None) -> int:
    """Epoch ms from ISO 8601 (`2026-11-21`, `2026-11-21T10:00`, with or without offset; naive is UTC),
    epoch milliseconds, or a relative `-30m` / `-6h` / `-2d` before now."""
    value = text.strip()
    if not value:
        raise RangeError(f"--{name} is empty: use {TIME_FORMS}")
    if value.startswith("-"):
        count, unit = value[1:-1], value[-1:]
        if unit not in RELATIVE_UNITS or not count.isdigit():
            raise RangeError(f"--{name} {text!r} is not a relative time: use -30m, -6h or -2d "
                             "(a whole number of minutes, hours or days before now)")
        now = int(time.time() * 1000) if now_ms is None else now_ms
        moment_ms = now - int(count) * RELATIVE_UNITS[unit]
        if moment_ms < 0:
            raise RangeError(f"--{name} {text!r} reaches before 1970-01-01")
        return moment_ms
    if value.isdigit():
        return int(value)
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError as exc:
        raise RangeError(f"--{name} {text!r} is not a date/time: use {TIME_FORMS}") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


def iso(ms: int) -> str:
    """A moment as people read it, in UTC: 2026-11-21T10:00:00Z (errors and the command's output)."""
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_range(since_ms: int, until_ms: int) -> None:
    if until_ms <= since_ms:
        raise RangeError(f"--until ({iso(until_ms)}) must be after --since ({iso(since_ms)})")


def _day(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d")


def load_events(spark: Any, location: ArchiveLocation, since_ms: int, until_ms: int,
                destinations: list[str] | None = None) -> Any:
    """The archived events with since_ms <= ts < until_ms; the day folders outside are never read."""
    from pyspark.sql import functions as F

    if location.fs.get_file_info(location.root).type != pafs.FileType.Directory:
        return spark.createDataFrame([], SPARK_SCHEMA_DDL)
    frame = (spark.read.schema(SPARK_SCHEMA_DDL).option("basePath", location.spark_path)
             .parquet(location.spark_path))
    frame = frame.filter((F.col("date") >= _day(since_ms)) & (F.col("date") <= _day(until_ms)))
    frame = frame.filter((F.col("ts") >= since_ms) & (F.col("ts") < until_ms))
    if destinations:
        frame = frame.filter(F.col("destination").isin(*destinations))
    return frame


# The columns the jobs read (the archive's other columns are never decoded).
JOB_COLUMNS = ("event_ms", "event_seq", "ts", "type", "msg", "consumer", "group", "reason", "cause", "target",
               "detail", "strategy", "redeliveries", "count", "attrs", "destination")


def compute(events: Any, keep: Callable[[Any], Any] = lambda frame: frame) -> dict[str, Any]:
    """Every metric table, as DataFrames (lazy). `keep` is applied to each small intermediate that several
    tables read (the pipeline persists them): the control events (groups, dead letters, slow consumers,
    aborts), the consumers seen and the grouped enqueues, and the per-message facts (jobs.message_facts:
    the one shuffle of the bulk events by message, aggregated into latency histograms, redelivery counts
    and group pairs; jobs.all_facts adds the few complex messages, folded). The events themselves are not
    kept: each pass reads only its Parquet columns, which costs no more than scanning a cache of them.
    Picking the key salt and counting the complex messages run two small jobs."""
    control = keep(jobs.control_events(events))
    seen = keep(jobs.consumers_seen(events))
    grouped = keep(jobs.group_messages(events))
    salt = jobs.key_salt(seen, grouped)
    names = jobs.consumer_names(seen, salt)
    facts = keep(jobs.all_facts(events, keep(jobs.message_facts(jobs.messages(events, salt))), salt))
    return {
        "per_minute": jobs.per_minute(events),
        "latency": jobs.latency_from_facts(facts, names),
        "redeliveries": jobs.redeliveries_from_facts(facts),
        "dead_letters": jobs.dead_letter_causes(control),
        "groups": jobs.groups(control, grouped),
        "group_consumers": jobs.group_consumers_from_facts(facts, names),
        "slow_consumer_episodes": jobs.slow_consumer_episodes(control),
        "aborts": jobs.aborts(control),
        "active_consumers": jobs.active_consumers(events, seen),
    }


@dataclass
class Result:
    summary: dict[str, Any]
    output: str
    seconds: float


def _rows(frame: Any) -> list[dict[str, Any]]:
    """An aggregated table as dicts (aggregates only: one row per destination/minute/group/consumer)."""
    return [row.asDict(recursive=True) for row in frame.collect()]


def summarise(tables: dict[str, list[dict[str, Any]]], since_ms: int, until_ms: int) -> dict[str, Any]:
    """The compact per-destination summary the console draws (see docs/analytics.md for its shape)."""
    out: dict[str, dict[str, Any]] = {}

    def dest(name: str) -> dict[str, Any]:
        return out.setdefault(name, {
            "totals": dict.fromkeys(jobs.COUNTER_NAMES, 0), "per_minute": [], "latency": {},
            "latency_by_consumer": {}, "redeliveries": {}, "dead_letters": [],
            "groups": {"top": [], "consumers": [], "balance": None},
            "slow_consumers": {"episodes": 0, "aborts": 0, "recent_episodes": [], "recent_aborts": []}})

    for row in sorted(tables["per_minute"], key=lambda r: r["minute_ms"]):
        entry = dest(row["destination"])
        for name in jobs.COUNTER_NAMES:
            entry["totals"][name] += row[name]
        entry["per_minute"].append([row["minute_ms"], *(row[name] for name in jobs.COUNTER_NAMES)])
    for entry in out.values():
        entry["per_minute"] = entry["per_minute"][-SUMMARY_MINUTES:]
    for row in tables["latency"]:
        stats = {k: row[k] for k in ("count", "p50", "p95", "p99")}
        entry = dest(row["destination"])
        if row["consumer"] is None:
            entry["latency"][row["metric"]] = stats
        else:
            entry["latency_by_consumer"].setdefault(row["consumer"], {})[row["metric"]] = stats
    for row in tables["redeliveries"]:
        dest(row["destination"])["redeliveries"][str(row["redeliveries"])] = row["messages"]
    for row in sorted(tables["dead_letters"], key=lambda r: -r["count"]):
        dest(row["destination"])["dead_letters"].append(
            {k: row[k] for k in ("outcome", "cause", "target", "count", "sample_detail")})
    by_dest_groups: dict[str, list[dict[str, Any]]] = {}
    for row in tables["groups"]:
        by_dest_groups.setdefault(row["destination"], []).append(row)
    active: dict[str, list[str]] = {}
    for row in tables["active_consumers"]:
        active.setdefault(row["destination"], []).append(row["consumer"])
    for name, rows in by_dest_groups.items():
        entry = dest(name)
        entry["groups"]["top"] = [
            {k: r[k] for k in ("group", "messages", "owner_changes", "owner")}
            for r in sorted(rows, key=lambda r: (-r["messages"], r["group"]))[:SUMMARY_LIST]]
        entry["groups"]["count"] = len(rows)
        entry["groups"]["owner_changes"] = sum(r["owner_changes"] for r in rows)
        entry["groups"]["balance"] = balance(
            name, [(r["group"], r["messages"], r["owner"]) for r in rows], active.get(name, [])).as_dict()
    for row in sorted(tables["group_consumers"], key=lambda r: (-r["messages"], r["consumer"])):
        dest(row["destination"])["groups"]["consumers"].append(
            {k: row[k] for k in ("consumer", "groups", "messages")})
    for row in sorted(tables["slow_consumer_episodes"], key=lambda r: -r["start_ts"]):
        slow = dest(row["destination"])["slow_consumers"]
        slow["episodes"] += 1
        if len(slow["recent_episodes"]) < SUMMARY_LIST:
            slow["recent_episodes"].append({k: row[k] for k in ("consumer", "start_ts", "end_ts", "signals")})
    for row in sorted(tables["aborts"], key=lambda r: -r["ts"]):
        slow = dest(row["destination"])["slow_consumers"]
        slow["aborts"] += 1
        if len(slow["recent_aborts"]) < SUMMARY_LIST:
            slow["recent_aborts"].append({k: row[k] for k in ("consumer", "ts", "reason", "strategy")})
    return {"generated_at_ms": int(time.time() * 1000), "since_ms": since_ms, "until_ms": until_ms,
            "counters": list(jobs.COUNTER_NAMES), "destinations": out}


def run(spark: Any, *, since_ms: int, until_ms: int, archive: str | None = None, output: str | None = None,
        destinations: list[str] | None = None, redis_client: Any = None, namespace: str | None = None
        ) -> Result:
    """Run every job over [since_ms, until_ms), write the tables and the summary; returns the summary."""
    check_range(since_ms, until_ms)
    started = time.monotonic()
    location = ArchiveLocation.parse(archive or config.archive_url())
    target = ArchiveLocation.parse(output or config.output_url())
    # Compute each shared intermediate once (compute's `keep`, spilling to disk if it does not fit), and
    # keep each small table cached between writing it and collecting it for the summary (no re-reading,
    # no recomputation). The events are read by a few passes, each decoding only its Parquet columns.
    from pyspark import StorageLevel

    kept: list[Any] = []

    def keep(frame: Any) -> Any:
        kept.append(frame.persist(StorageLevel.MEMORY_AND_DISK))
        return frame

    events = load_events(spark, location, since_ms, until_ms, destinations).select(*JOB_COLUMNS)
    frames = compute(events, keep)
    tables = {}
    for name in (*TABLES, "active_consumers"):
        frame = frames[name].cache()
        if name in TABLES:
            frame.write.mode("overwrite").parquet(f"{target.spark_path}/{name}")
        tables[name] = _rows(frame)
        frame.unpersist()
    for frame in kept:
        frame.unpersist()
    summary = summarise(tables, since_ms, until_ms)
    text = json.dumps(summary, separators=(",", ":"), default=str)
    target.fs.create_dir(target.root, recursive=True)
    with target.fs.open_output_stream(f"{target.root}/summary.json") as stream:
        stream.write(text.encode())
    if redis_client is not None and namespace:
        write_summary(redis_client, namespace, text)
    return Result(summary, target.url, time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="analytics/pipeline.py", description=__doc__.splitlines()[0])
    parser.add_argument("--since", default="-24h", help=f"start: {TIME_FORMS}; default -24h")
    parser.add_argument("--until", default=None, help="end, exclusive (default: now)")
    parser.add_argument("--archive", default=None,
                        help="archive folder or URL (default SIGNALBOX_ARCHIVE_URL)")
    parser.add_argument("--output", default=None, help="output folder or URL (SIGNALBOX_ANALYTICS_OUTPUT)")
    parser.add_argument("--destination", action="append", help="only this destination URI (repeatable)")
    parser.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else "
                        "SIGNALBOX_SPARK_MASTER, else local[*])")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL"),
                        help="also store the summary in this Redis (default REDIS_URL)")
    parser.add_argument("--namespace", default=os.environ.get("SIGNALBOX_NAMESPACE", "sb"))
    args = parser.parse_args(attach_time_values(sys.argv[1:] if argv is None else argv))
    try:
        since = parse_time(args.since, name="since")
        until = parse_time(args.until, name="until") if args.until else int(time.time() * 1000)
        check_range(since, until)
    except RangeError as exc:
        parser.error(str(exc))
    from analytics.spark import spark_session

    client = None
    if args.redis_url:
        import redis

        client = redis.Redis.from_url(args.redis_url)
    spark = spark_session("signalbox-analytics", args.master)
    result = run(spark, since_ms=since, until_ms=until, archive=args.archive, output=args.output,
                 destinations=args.destination, redis_client=client, namespace=args.namespace)
    print(json.dumps({"output": result.output, "seconds": round(result.seconds, 2),
                      "destinations": sorted(result.summary["destinations"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
