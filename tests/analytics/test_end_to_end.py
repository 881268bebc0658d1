"""Traffic through the live broker (groups, redeliveries, a dead letter) → the archive task on a real
Celery worker → the management command running the Spark jobs → the summary the console reads."""

from __future__ import annotations

import time

import pytest
from django.core.management import CommandError, call_command

from analytics.store import read_summary
from broker_core.broker import Broker
from broker_core.messages import Message
from broker_core.model import ConsumerSpec

pytestmark = pytest.mark.e2e


def test_bad_time_ranges_are_refused_naming_the_option():
    with pytest.raises(CommandError, match="--since 'yesterday'"):
        call_command("signalbox_analytics", "--since", "yesterday", "--no-archive")
    with pytest.raises(CommandError, match="--until .* must be after --since"):
        call_command("signalbox_analytics", "--since", "2026-11-22", "--until", "2026-11-21", "--no-archive")


def send_and_consume(broker: Broker, queue: str = "orders") -> None:
    """50 messages: 40 in four groups (all owned by the consumer "early", though "late" joins halfway),
    5 released once (redelivered), 2 poison-nacked to ActiveMQ.DLQ, 48 acked."""
    spec = ConsumerSpec(prefetch=100, ack_mode="client-individual")
    first = broker.add_consumer(queue, spec, consumer_id="early")
    broker.send(queue, [Message(body=f"g{i}", group_id=f"g{i % 4}") for i in range(20)]
                + [Message(body=f"plain{i}") for i in range(10)])
    deliveries = broker.receive(first, max_messages=100)
    assert len(deliveries) == 30
    plain = [d.message_id for d in deliveries if d.group_id is None]
    assert len(plain) == 10
    broker.release(first, plain[:5])  # back with the redelivery counter raised
    again = broker.receive(first, max_messages=100)
    assert sorted(d.message_id for d in again) == sorted(plain[:5]) and all(d.redelivered for d in again)
    poisoned = plain[5:7]
    broker.nack(first, poisoned, poison=True)  # → ActiveMQ.DLQ
    broker.ack(first, [d.message_id for d in deliveries if d.message_id not in poisoned])
    late = broker.add_consumer(queue, spec, consumer_id="late")
    broker.send(queue, [Message(body=f"more{i}", group_id=f"g{i % 4}") for i in range(20)])
    more = broker.receive(first, max_messages=100)
    assert len(more) == 20 and broker.receive(late, max_messages=100) == []  # the groups stay with "early"
    broker.ack(first, [d.message_id for d in more])


def test_the_summary_counts_exactly_the_traffic_sent(spark, celery_worker, redis_client, namespace, tmp_path,
                                                      monkeypatch):
    monkeypatch.setenv("SIGNALBOX_ARCHIVE_URL", str(tmp_path / "archive"))
    monkeypatch.setenv("SIGNALBOX_ANALYTICS_OUTPUT", str(tmp_path / "analytics"))
    monkeypatch.setenv("SIGNALBOX_ARCHIVE_KEEP_MS", "0")
    broker = Broker(redis_client, namespace)
    send_and_consume(broker)

    from signalbox.tasks import archive_events

    archived = archive_events.delay(namespace).get(timeout=60)
    assert archived["archived"] > 100
    assert redis_client.xlen(f"{namespace}:{{q:orders}}:events") == 0
    # A relative --since, as docs/analytics.md shows it (argparse once took -10m for an option).
    call_command("signalbox_analytics", "--since", "-10m", "--until", str(int(time.time() * 1000) + 1000),
                 "--namespace", namespace, "--master", "local[2]")

    summary = read_summary(redis_client, namespace)
    orders = summary["destinations"]["queue://orders"]
    assert orders["totals"] == {"enqueued": 50, "dispatched": 55, "acked": 48, "redelivered": 5, "expired": 0,
                                "expired_on_arrival": 0,
                                "dead_lettered": 2, "discarded": 0, "evicted": 0, "lost": 0}
    assert summary["destinations"]["queue://ActiveMQ.DLQ"]["totals"]["enqueued"] == 2
    assert [(d["cause"], d["target"], d["count"]) for d in orders["dead_letters"]] == [
        ("poison", "queue://ActiveMQ.DLQ", 2)]
    assert orders["redeliveries"] == {"0": 45, "1": 5}
    assert orders["latency"]["send_to_dispatch"]["count"] == 50
    assert orders["latency"]["send_to_ack"]["count"] == 48
    assert orders["latency"]["dispatch_to_ack"]["count"] == 48
    assert set(orders["latency_by_consumer"]) == {"early"}
    groups = orders["groups"]
    assert groups["count"] == 4 and {g["group"]: g["messages"] for g in groups["top"]} == dict.fromkeys(
        ["g0", "g1", "g2", "g3"], 10)
    assert groups["consumers"] == [{"consumer": "early", "groups": 4, "messages": 40}]
    balance = groups["balance"]
    assert balance["consumers"] == 2 and balance["busiest_consumer"] == "early"
    assert balance["imbalance"] == pytest.approx(2.0) and balance["projected_imbalance"] == pytest.approx(1.0)
    assert balance["recommend_reset"] and balance["groups_to_move"] == 2
    assert (tmp_path / "analytics" / "summary.json").exists()
    assert (tmp_path / "analytics" / "latency").is_dir()
