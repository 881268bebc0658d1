"""Time of the analytics job (every table + the summary) over 1M, 5M and 10M archived events.

Usage: python bench/analytics.py [--sizes 1000000 5000000 10000000] [--master local[2]]
                                 [--driver-memory 4g] [--workdir DIR]

The events are generated with Spark (a message life is enqueue → dispatch → ack; 1 in 20 is nacked and
redelivered, 1 in 500 dead-lettered, 1 in 3 is in one of 1,000 groups; 4 destinations, 8 consumers)
and written in the archive's layout (date= / destination= folders), so the job reads exactly what the
archiver writes. Generation is timed separately; the job's time includes reading, every table, writing
them and the summary. A 100k-event warm-up run goes first (JVM start-up and code generation).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.pipeline import run  # noqa: E402
from analytics.spark import spark_session  # noqa: E402

BASE_MS = 1_795_000_000_000
EVENTS_PER_MESSAGE = 3 + 2 / 20 + 3 / 1000  # enqueue, dispatch, ack; redeliveries; group assignments


def generate(spark, events: int, path: str) -> int:
    """Write about `events` events in the archive layout; returns the exact number written."""
    from pyspark.sql import functions as F

    messages = int(events / EVENTS_PER_MESSAGE)
    i = F.col("id")
    ts0 = F.lit(BASE_MS) + i * 2  # one message every 2 ms: 10M events span about 1.8 hours
    consumer = F.concat(F.lit("c"), F.pmod(F.hash(i), F.lit(8)))
    group = F.when(i % 3 == 0, F.concat(F.lit("g"), i % 1000))
    redelivered = i % 20 == 0
    dead = i % 500 == 0
    none_s, none_l = F.lit(None).cast("string"), F.lit(None).cast("long")

    def event(kind: str, ts, *, c=none_s, g=none_s, redeliveries=none_l, cause=none_s, target=none_s):
        return F.struct(ts.alias("ts"), F.lit(kind).alias("type"), c.alias("consumer"), g.alias("group"),
                        redeliveries.alias("redeliveries"), cause.alias("cause"), target.alias("target"))

    candidates = F.array(
        event("enqueue", ts0, g=F.coalesce(group, F.lit(""))),
        F.when(group.isNotNull() & (i < 3000), event("group_assign", ts0 + 1, c=consumer, g=group)),
        event("dispatch", ts0 + 1 + i % 50, c=consumer, redeliveries=F.lit(0).cast("long")),
        F.when(redelivered, event("redeliver", ts0 + 60, c=consumer, redeliveries=F.lit(1).cast("long"))),
        F.when(redelivered, event("dispatch", ts0 + 100, c=consumer, redeliveries=F.lit(1).cast("long"))),
        F.when(dead, event("deadletter", ts0 + 200, cause=F.lit("poison"), target=F.lit("queue://ActiveMQ.DLQ")))
        .otherwise(event("ack", ts0 + 150 + i % 300, c=consumer)),
    )
    rows = (spark.range(messages)
            .select(i, F.concat(F.lit("queue://bench."), i % 4).alias("destination"),
                    F.concat(F.lit("m"), i).alias("msg"),
                    F.posexplode(F.filter(candidates, lambda e: e.isNotNull())).alias("pos", "e"))
            .select("destination", "msg", "pos", "e.*"))
    rows = rows.select(
        F.col("ts").alias("event_ms"), F.col("pos").cast("long").alias("event_seq"), "ts", "type",
        "msg", "consumer", "group", none_s.alias("reason"), "cause", "target", none_s.alias("detail"),
        none_s.alias("strategy"), none_l.alias("priority"), none_l.alias("size"), "redeliveries",
        none_l.alias("delay"), none_l.alias("expiration"), none_l.alias("count"),
        F.lit(None).cast("map<string,string>").alias("attrs"),
        F.date_format(F.timestamp_millis("ts"), "yyyy-MM-dd").alias("date"), "destination")
    rows.write.mode("overwrite").partitionBy("date", "destination").parquet(path)
    return spark.read.parquet(path).count()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 5_000_000, 10_000_000])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--workdir", default=None, help="where to put the generated archives (default: tmp)")
    args = parser.parse_args()
    os.environ.setdefault("SIGNALBOX_SPARK_DRIVER_MEMORY", args.driver_memory)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="signalbox-bench-analytics-"))
    spark = spark_session("signalbox-bench", args.master)
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"Spark {spark.version} on {spark.sparkContext.master}, driver memory "
          f"{spark.conf.get('spark.driver.memory', '1g')}, "
          f"shuffle partitions {spark.conf.get('spark.sql.shuffle.partitions')}")
    try:
        results = []
        for size in [100_000, *args.sizes]:
            archive = str(workdir / f"archive-{size}")
            started = time.monotonic()
            written = generate(spark, size, f"file://{archive}")
            generated = time.monotonic() - started
            result = run(spark, since_ms=BASE_MS - 1, until_ms=BASE_MS + 86_400_000, archive=archive,
                         output=str(workdir / f"out-{size}"))
            if size == 100_000:
                print(f"warm-up: {written:,} events in {result.seconds:.1f} s")
                continue
            results.append((written, result.seconds))
            print(f"{written:>12,} events  generate {generated:6.1f} s  job {result.seconds:6.1f} s  "
                  f"{written / result.seconds:>10,.0f} events/s", flush=True)
        if len(results) > 1:
            (n0, t0), (n1, t1) = results[0], results[-1]
            print(f"cost ratio {t1 / t0:.2f} for {n1 / n0:.2f}x the events "
                  f"({'no worse than' if t1 / t0 <= n1 / n0 * 1.05 else 'worse than'} linear)")
    finally:
        spark.stop()
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
