"""Fixtures of broker_core's own tests beside the shared ones (tests/conftest.py)."""

from __future__ import annotations

import pytest
import redis.asyncio

from broker_core.broker import AsyncBroker


@pytest.fixture
def channel(redis_client, namespace):
    """A notify channel of the test's namespace, subscribed: (its name, the pub/sub client) — where an
    armed consumer's pushes are published (test_push.py, test_byte_budget.py; read with `published`)."""
    pubsub = redis_client.pubsub()
    name = f"{namespace}:wake:push-test"
    pubsub.subscribe(name)
    assert pubsub.get_message(timeout=1)["type"] == "subscribe"
    yield name, pubsub
    pubsub.close()


@pytest.fixture
async def aio(broker, redis_url, namespace, clock):
    """An AsyncBroker on the test's namespace and clock, with the blocking `broker`'s policies."""
    client = redis.asyncio.Redis.from_url(redis_url)
    aio = AsyncBroker(client, namespace, clock, policies=broker.policies)
    try:
        yield aio
    finally:
        await aio.aclose()
        await client.aclose()
