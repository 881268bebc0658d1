"""spark.read.format("signalbox") reads the archive and the live Redis streams with the same rows."""

from __future__ import annotations

import pytest

from analytics.datasource import register
from broker_core.event_stream import count
from tests.analytics.journal import START_MS

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", autouse=True)
def registered(spark):
    register(spark)


def _keys(frame):
    return sorted((r["destination"], r["event_ms"], r["event_seq"], r["type"]) for r in frame.collect())


def test_the_archive_reads_back_every_event_with_its_destination_and_day(spark, archived_journal, journal):
    frame = spark.read.format("signalbox").load(archived_journal.root)
    rows = journal.rows()
    assert _keys(frame) == sorted((r["destination"], r["event_ms"], r["event_seq"], r["type"]) for r in rows)
    assert {r["date"] for r in frame.select("date").distinct().collect()} == {"2026-11-18"}
    orders = frame.filter("destination = 'queue://orders'").groupBy("type").count().collect()
    assert {r["type"]: r["count"] for r in orders}["enqueue"] == 300


def test_destination_and_time_options_narrow_the_archive(spark, archived_journal, journal):
    since, until = START_MS + 60_000, START_MS + 120_000
    frame = (spark.read.format("signalbox").option("destination", "queue://audit")
             .option("since", str(since)).option("until", str(until)).load(archived_journal.root))
    expected = [r for r in journal.rows() if r["destination"] == "queue://audit" and since <= r["ts"] < until]
    assert frame.count() == len(expected) > 0


def test_the_live_streams_read_as_the_same_rows_as_the_archive(spark, redis_client, redis_url, namespace):
    from broker_core.broker import Broker
    from broker_core.messages import Message
    from broker_core.model import ConsumerSpec

    broker = Broker(redis_client, namespace)
    broker.send("live.a", [Message(body="one"), Message(body="two")])
    consumer = broker.add_consumer("live.a", ConsumerSpec(prefetch=10, ack_mode="auto"))
    broker.receive(consumer, max_messages=10)
    broker.send("live.b", "three")
    frame = (spark.read.format("signalbox").option("source", "live").option("redis_url", redis_url)
             .option("namespace", namespace).load())
    counts = {(r["destination"], r["type"]): r["count"]
              for r in frame.groupBy("destination", "type").count().collect()}
    assert counts[("queue://live.a", "enqueue")] == 2 and counts[("queue://live.a", "ack")] == 2
    assert counts[("queue://live.b", "enqueue")] == 1
    held = sum(count(fields) for q in ("live.a", "live.b")
               for _, fields in redis_client.xrange(f"{namespace}:{{q:{q}}}:events"))
    assert frame.count() == held


def test_an_unknown_source_is_refused_by_name(spark):
    with pytest.raises(Exception, match="source must be 'archive' or 'live', got 'kafka'"):
        spark.read.format("signalbox").option("source", "kafka").load().collect()
