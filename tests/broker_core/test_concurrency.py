"""Several OS processes on one queue: producers, consumers that ack, consumers that die mid-batch.

Every message must end acknowledged exactly once: the dead consumers' leases lapse, the reaper returns
their messages, and the survivors take them.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid

import pytest
import redis

from broker_core.broker import Broker
from broker_core.errors import UnknownConsumer
from broker_core.event_stream import expand
from broker_core.messages import Message
from broker_core.model import ConsumerSpec

DEST = "work"
PRODUCERS, PER_PRODUCER = 3, 400


def produce(url: str, ns: str, index: int) -> None:
    broker = Broker(redis.Redis.from_url(url), ns)
    for i in range(0, PER_PRODUCER, 10):
        broker.send(DEST, [Message(body=f"p{index}-{i + j}") for j in range(10)])


def consume(url: str, ns: str, die_after: int | None) -> None:
    """Receive and ack until the queue stays empty; with die_after, vanish mid-batch without closing."""
    client = redis.Redis.from_url(url)
    broker = Broker(client, ns)
    c = broker.add_consumer(DEST, ConsumerSpec(prefetch=20, ack_mode="client-individual", lease_ms=1000))
    received, idle_since = 0, time.monotonic()
    while time.monotonic() - idle_since < 3:
        try:
            batch = broker.receive(c, 10, lease_ms=1000)
        except UnknownConsumer:  # reaped while stalled: register again
            c = broker.add_consumer(DEST, ConsumerSpec(prefetch=20, ack_mode="client-individual",
                                                       lease_ms=1000))
            continue
        if not batch:
            time.sleep(0.02)
            continue
        idle_since = time.monotonic()
        for d in batch:
            received += 1
            if die_after is not None and received >= die_after:
                os._exit(3)  # a crash: no ack, no close
            broker.ack(c, d.message_id)
            client.rpush(f"{ns}:test:acked", d.message_id)
    broker.close_consumer(c)


@pytest.mark.e2e
def test_every_message_is_acked_exactly_once_across_processes_that_crash(redis_url, redis_client):
    ns = f"t{uuid.uuid4().hex[:12]}"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=produce, args=(redis_url, ns, i)) for i in range(PRODUCERS)]
    procs += [ctx.Process(target=consume, args=(redis_url, ns, die)) for die in (None, None, 15, 40)]
    for p in procs:
        p.start()
    reaper = Broker(redis_client, ns)
    total = PRODUCERS * PER_PRODUCER
    deadline = time.monotonic() + 90
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        if reaper.destinations():
            reaper.reap_lapsed(DEST)
        time.sleep(0.2)
    for p in procs:
        p.join(5)
    crashed = [p.exitcode for p in procs].count(3)
    assert crashed == 2
    # messages of the crashed consumers wait for their leases; finish with a fresh consumer
    reaper.reap_lapsed(DEST)
    last = reaper.add_consumer(DEST, ConsumerSpec(prefetch=100, ack_mode="client-individual"))
    while batch := reaper.receive(last, 100):
        for d in batch:
            reaper.ack(last, d.message_id)
            redis_client.rpush(f"{ns}:test:acked", d.message_id)
    acked = [m.decode() for m in redis_client.lrange(f"{ns}:test:acked", 0, -1)]
    assert len(acked) == total
    assert len(set(acked)) == total
    stats = reaper.stats(DEST)
    assert (stats.enqueued, stats.dequeued, stats.queue_size) == (total, total, 0)
    events = expand(redis_client.xrange(f"{ns}:{{q:{DEST}}}:events"))
    redeliveries = [e for _, e in events if e[b"type"] == b"return"]
    assert redeliveries  # the crashed consumers' messages really went back
