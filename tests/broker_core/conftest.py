"""Fixtures for broker_core tests: a Broker on a real Redis, a fresh key namespace and a fake clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker_core.broker import Broker
from broker_core.model import ConsumerSpec


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
