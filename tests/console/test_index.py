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


def _busy_topic(broker: Broker, topic: str) -> None:
    """A topic whose figures come from everywhere stats looks: an offline durable subscription's backlog,
    an active one with messages in flight, acknowledged, dead-lettered and filtered out, a non-durable
    subscription, and an ended one whose counts stay on the topic."""
    uri = f"topic://{topic}"
    ledger = broker.add_consumer(uri, ConsumerSpec(client_id="billing", subscription_name="ledger"))
    broker.close_consumer(ledger)  # offline: keeps what is sent from now on
    audit = broker.add_consumer(uri, ConsumerSpec(client_id="audit", subscription_name="copy", prefetch=3,
                                                  selector="region = 'eu'", ack_mode="client-individual"))
    gone = broker.add_consumer(uri, ConsumerSpec(client_id="old", subscription_name="gone"))
    broker.add_consumer(uri, ConsumerSpec(prefetch=1))  # non-durable
    broker.send(uri, [Message(body=str(i), properties={"region": "eu" if i % 2 else "us"}) for i in range(9)])
    got = broker.receive(audit, 3)
    broker.ack(audit, got[0].message_id)
    broker.nack(audit, got[1].message_id, poison=True)
    broker.ack(gone, broker.receive(gone, 2)[-1].message_id)  # cumulative: both
    broker.close_consumer(gone)
    broker.unsubscribe(uri, client_id="old", subscription_name="gone")  # its counts stay on the topic


def test_topic_summaries_add_up_as_stats_in_bounded_calls(redis_client, redis_url):
    """A topic's summary (topic_summary_many) is what its full statistics add up to, whether it comes in
    one call, continued over many (a budget smaller than its subscriptions), or one topic per call (a
    Redis Cluster)."""
    from broker_core.destinations import parse_destination
    from broker_core.model import summary_of

    namespace = f"t{uuid.uuid4().hex[:10]}"
    broker = Broker(redis_client, namespace)
    _busy_topic(broker, "busy")
    broker.ensure_destination("topic://empty")
    extra = broker.add_consumer("topic://many", ConsumerSpec(client_id="m", subscription_name="0"))
    broker.close_consumer(extra)
    for _ in range(6):
        broker.add_consumer("topic://many", ConsumerSpec(prefetch=1))
    broker.send("topic://many", Message(body="x"))
    names = ["topic://busy", "queue://between", "topic://empty", "topic://gone", "topic://many"]
    broker.send("between", Message(body="q"))
    expected = [summary_of(broker.stats(n)) if n != "topic://gone" else None for n in names]
    assert expected[0].pending > 0 and expected[0].in_flight > 0 and expected[0].deadlettered == 1
    assert expected[0].consumer_count == 3 and expected[0].dequeued >= 3  # the ended one's acks stay
    assert expected[4].consumer_count == 7 and expected[4].pending + expected[4].in_flight == 7

    async def three_ways(aio: AsyncBroker):
        one_call = await aio.summaries(names)
        topics = [parse_destination(n) for n in names if n.startswith("topic://")]
        now = aio.clock.now_ms()
        calls = []
        original = aio._perform

        async def counting(io):  # each script call the driver makes
            if type(io) is tuple and io[0] in ("FCALL", "EVALSHA"):
                calls.append(io)
            return await original(io)

        aio._perform = counting
        small = await aio._run(aio.ops.summaries(topics, now, budget=3))
        aio._perform = original
        aio._summary_many = False  # as on a Redis Cluster
        return one_call, small, len(calls), await aio.summaries(names)

    one_call, small, calls, per_topic = _async(redis_url, namespace, three_ways)
    assert one_call[1] == summary_of(broker.stats("between"))  # the queue in between, as before
    for got in (one_call, per_topic):
        assert [got[i] for i in (0, 2, 3, 4)] == [expected[i] for i in (0, 2, 3, 4)]
    assert small == [expected[i] for i in (0, 2, 3, 4)]
    # 4 topics and 3 + 7 subscriptions at 3 units of work a call: several calls, each topic added up whole
    assert calls >= (4 + 10) // 3


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
