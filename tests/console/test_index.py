"""The console's broker_core reads against a real Redis: many destinations' counters at once (one script
over many queues, or one per queue where a Redis Cluster refuses that), and messages per group."""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid

import redis.asyncio

from broker_core.broker import AsyncBroker, Broker
from broker_core.messages import Message
from broker_core.model import ConsumerSpec


def _async(redis_url: str, namespace: str, run):
    async def main():
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            return await run(AsyncBroker(client, namespace))
        finally:
            await client.aclose()

    # A thread of its own: Playwright's sync API (the browser tests) keeps an event loop on this one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()


def test_summaries_match_stats_in_one_call_and_in_the_per_queue_fallback(redis_client, redis_url):
    namespace = f"t{uuid.uuid4().hex[:10]}"
    broker = Broker(redis_client, namespace)
    consumer = broker.add_consumer("a", ConsumerSpec(prefetch=2, lease_ms=60_000))
    broker.send("a", [Message(body=str(i), group_id="g") for i in range(5)])
    broker.send("b", Message(body="x"))
    broker.pause("b")
    broker.receive(consumer, 2)
    names = ["queue://a", "queue://b", "queue://gone"]

    async def both(aio: AsyncBroker):
        fast = await aio.summaries(names)
        aio._summary_many = False  # as on a Redis Cluster
        return fast, await aio.summaries(names)

    fast, fallback = _async(redis_url, namespace, both)
    assert fast == fallback
    assert fast[2] is None
    for summary in fast[:2]:
        stats = broker.stats(summary.destination)
        for field in ("queue_size", "pending", "in_flight", "parked", "group_count", "consumer_count",
                      "enqueued", "dequeued", "dispatched", "expired", "deadlettered", "paused"):
            assert getattr(summary, field) == getattr(stats, field), field
    assert fast[1].paused and not fast[0].paused
    assert (fast[0].in_flight, fast[0].pending, fast[0].consumer_count) == (2, 3, 1)


def test_stats_many_reads_many_destinations_in_order(redis_client, redis_url):
    namespace = f"t{uuid.uuid4().hex[:10]}"
    broker = Broker(redis_client, namespace)
    for i in range(30):
        broker.send(f"q{i}", [Message(body="x")] * i if i else [Message(body="y")])
    names = [f"queue://q{i}" for i in range(30)] + ["queue://missing"]
    many = _async(redis_url, namespace, lambda aio: aio.stats_many(names))
    assert [s.enqueued for s in many[:30]] == [max(i, 1) for i in range(30)]
    assert many[30] is None


def test_group_counts_count_pending_and_in_flight_messages_per_group(redis_client):
    namespace = f"t{uuid.uuid4().hex[:10]}"
    broker = Broker(redis_client, namespace)
    consumer = broker.add_consumer("orders", ConsumerSpec(prefetch=3, lease_ms=60_000))
    broker.send("orders", [Message(body="1", group_id="a")] * 1 + [Message(body="2", group_id="a")]
                + [Message(body=str(i), group_id="b") for i in range(4)] + [Message(body="plain")])
    counts = broker.group_counts("orders")
    # prefetch 3: a, a, b dispatched; b, b, b and the plain one pending
    assert counts.groups == {"a": (0, 2), "b": (3, 1)}
    assert counts.all_pending and counts.all_in_flight
    assert (counts.pending_examined, counts.in_flight_examined) == (4, 3)
    assert consumer.consumer_id
    limited = broker.group_counts("orders", pending_limit=2, in_flight_limit=10)
    assert not limited.all_pending and limited.pending_examined == 2
