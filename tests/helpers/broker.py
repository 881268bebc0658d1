"""The broker fixtures (a Broker on the session's Redis, in the test's own key namespace, with its fake clock;
a policy setter) and the helpers `consumer`, `drain` and `full_queue`, shared by tests/broker_core and
tests/semantics.

A pytest plugin, registered once in tests/conftest.py, because the two folders are siblings and tests/ is
their only common parent. Suites with a `broker` fixture of their own (the gateway's, the maintenance
tests') keep theirs: the nearer definition wins."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio

from broker_core.broker import AsyncBroker, Broker
from broker_core.clock import SystemClock
from broker_core.messages import Message
from broker_core.model import ConsumerSpec

KB = "x" * 1000  # a body that packs to a little over 1,000 bytes


@pytest.fixture
def broker(redis_client, namespace, clock) -> Iterator[Broker]:
    b = Broker(redis_client, namespace, clock)
    yield b
    b.close()


@pytest.fixture
def policy(broker):
    """Set a policy entry for queues matching `pattern` and apply it to existing destinations."""

    def set_policy(pattern: str = ">", **attributes):
        broker.policies.set_entry("queue", pattern, attributes)
        broker.refresh_policies()

    return set_policy


def consumer(broker, dest="orders", **kw):
    cid = kw.pop("consumer_id", None)
    return broker.add_consumer(dest, ConsumerSpec(**kw), consumer_id=cid)


def drain(broker, c, n=1000):
    """Receive everything currently dispatched to consumer c (without acking)."""
    out = []
    while True:
        got = broker.receive(c, 100)
        if not got:
            return out
        out += got
        if len(out) >= n:
            return out


@contextlib.asynccontextmanager
async def full_queue(redis_url: str, namespace: str, wait_ms: int) -> AsyncIterator[AsyncBroker]:
    """An AsyncBroker (its own Redis client, the system clock) whose queue `orders` is full: its memoryLimit
    holds two KB messages and has them, and a send waits up to `wait_ms` for space
    (sendFailIfNoSpaceAfterTimeout) before it fails."""
    client = redis.asyncio.Redis.from_url(redis_url)
    sync = Broker(redis.Redis.from_url(redis_url), namespace, SystemClock())
    sync.policies.set_entry("queue", "orders", {"memoryLimit": 2 * 1100,
                                                "sendFailIfNoSpaceAfterTimeout": wait_ms})
    broker = AsyncBroker(client, namespace, SystemClock(), policies=sync.policies)
    try:
        await broker.send("orders", [Message(body=KB), Message(body=KB)])
        yield broker
    finally:
        await client.aclose()
        sync.close()


def published(pubsub, timeout=1.0):
    """The next message published on a subscribed pub/sub client's channel (its data), None if none came."""
    got = pubsub.get_message(timeout=timeout)
    return None if got is None else got["data"]
