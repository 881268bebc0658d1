"""The analytics' figures against the real broker's own counters and the message lives it went through:
scripted histories on a real Redis, archived by the archiver, computed by the pipeline on Spark.
A topic's subscriptions each get their own copy of a message (one `enqueue` on the topic's stream, then
each subscription's `dispatch`/`ack` events, carrying its `sub`): the latencies are each subscription's own.
Events the stream's cap dropped before the archive read them are counted as lost; expiry on arrival apart."""

from __future__ import annotations

import pytest

from analytics import jobs
from analytics.archive import ArchiveLocation, archive_all
from analytics.pipeline import load_events, run
from broker_core.broker import Broker
from broker_core.clock import FakeClock
from broker_core.messages import Message
from broker_core.model import ConsumerSpec

pytestmark = pytest.mark.e2e

TOPIC = "topic://news"


def test_each_subscription_has_its_own_latencies(spark, redis_client, namespace, tmp_path):
    clock = FakeClock()
    t0 = clock.now_ms()
    broker = Broker(redis_client, namespace, clock=clock)
    pushed = broker.add_consumer(TOPIC, ConsumerSpec(prefetch=10, ack_mode="client-individual"),
                                 consumer_id="pushed")
    pulled = broker.add_consumer(TOPIC, ConsumerSpec(prefetch=0, ack_mode="client-individual"),
                                 consumer_id="pulled")
    broker.send(TOPIC, Message(body="x"))  # dispatched to "pushed" now (t0)
    clock.advance(20)
    [to_pushed] = broker.receive(pushed, max_messages=10)
    [to_pulled] = broker.receive(pulled, max_messages=10)  # dispatched at t0 + 20
    clock.advance(30)
    broker.ack(pushed, [to_pushed.message_id])  # t0 + 50
    clock.advance(40)
    broker.ack(pulled, [to_pulled.message_id])  # t0 + 90
    stats = broker.stats(TOPIC)
    assert (stats.enqueued, stats.dispatched, stats.dequeued) == (1, 2, 2)

    location = ArchiveLocation.parse(tmp_path / "archive")
    archive_all(broker, location, destinations=[TOPIC])
    since, until = t0, t0 + 60_000
    expected = {"pushed": {"send_to_dispatch": 0, "dispatch_to_ack": 50, "send_to_ack": 50},
                "pulled": {"send_to_dispatch": 20, "dispatch_to_ack": 70, "send_to_ack": 90}}

    events = load_events(spark, location, since, until)
    lives = {r["first_dispatch"]["consumer"]: r for r in jobs.lives(events).collect()}
    assert set(lives) == {"pushed", "pulled"}  # a life per subscription
    summary = run(spark, since_ms=since, until_ms=until, archive=str(tmp_path / "archive"),
                  output=str(tmp_path / "out")).summary
    news = summary["destinations"][TOPIC]
    assert news["totals"]["enqueued"] == 1 and news["totals"]["dispatched"] == 2
    assert news["totals"]["acked"] == 2
    by_consumer = {consumer: {metric: stats["p50"] for metric, stats in metrics.items()}
                   for consumer, metrics in news["latency_by_consumer"].items()}
    assert by_consumer == expected
    assert {metric: stats["count"] for metric, stats in news["latency"].items()} == dict.fromkeys(
        jobs.LATENCY_METRICS, 2)
    assert news["redeliveries"] == {"0": 2}


def test_events_lost_before_archiving_are_counted_in_the_summary(spark, redis_client, namespace, tmp_path):
    clock = FakeClock()
    t0 = clock.now_ms()
    broker = Broker(redis_client, namespace, clock=clock)
    broker.policies.set_entry("queue", ">", {"eventsMaxLen": 50})
    broker.refresh_policies()
    broker.ensure_destination("orders")
    for i in range(80):
        broker.send("orders", Message(body=str(i)))
    location = ArchiveLocation.parse(tmp_path / "archive")
    archive_all(broker, location, destinations=["queue://orders"])
    summary = run(spark, since_ms=t0, until_ms=t0 + 60_000, archive=str(tmp_path / "archive"),
                  output=str(tmp_path / "out")).summary
    totals = summary["destinations"]["queue://orders"]["totals"]
    assert (totals["enqueued"], totals["lost"]) == (50, 30)
    assert broker.stats("orders").enqueued == totals["enqueued"] + totals["lost"]


def test_expired_counts_as_the_broker_counts_expired_and_expired_on_arrival(spark, redis_client, namespace,
                                                                            tmp_path):
    clock = FakeClock()
    t0 = clock.now_ms()
    broker = Broker(redis_client, namespace, clock=clock)
    broker.send("orders", Message(body="late", expiration=t0 - 1))  # expired on arrival: never enqueued
    broker.send("orders", Message(body="soon", expiration=t0 + 1_000))
    broker.send("orders", Message(body="kept"))
    clock.advance(2_000)
    broker.sweep_expired("orders")
    stats = broker.stats("orders")
    assert (stats.enqueued, stats.expired, stats.expired_on_arrival) == (2, 1, 1)

    location = ArchiveLocation.parse(tmp_path / "archive")
    archive_all(broker, location, destinations=["queue://orders"])
    summary = run(spark, since_ms=t0, until_ms=t0 + 60_000, archive=str(tmp_path / "archive"),
                  output=str(tmp_path / "out")).summary
    totals = summary["destinations"]["queue://orders"]["totals"]
    assert (totals["enqueued"], totals["expired"], totals["expired_on_arrival"]) == (2, 1, 1)
