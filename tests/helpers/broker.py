"""The broker fixtures (a Broker on the session's Redis, in the test's own key namespace, with its fake clock;
a policy setter) and the helpers `consumer` and `drain`, shared by tests/broker_core and tests/semantics.

A pytest plugin, registered once in tests/conftest.py, because the two folders are siblings and tests/ is
their only common parent. Suites with a `broker` fixture of their own (the gateway's, the maintenance
tests') keep theirs: the nearer definition wins."""

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
