"""A gateway process dies holding a subscriber with unacknowledged messages: nothing is lost. Its
consumer's lease lapses, a gateway process that lives on reaps it, and a subscriber there gets the
messages again, marked redelivered, within about one lease."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.gateway_ws.conftest import TWO_GATEWAYS_LEASE_MS
from tests.helpers.stomp_client import Client

pytestmark = pytest.mark.e2e

LEASE_MS = TWO_GATEWAYS_LEASE_MS


def test_killing_the_gateway_of_a_subscriber_redelivers_its_unacked_messages_elsewhere(two_gateways):
    doomed, survivor = two_gateways
    queue = f"/queue/fault.{uuid.uuid4().hex[:8]}"
    held = Client(doomed.port).connect()
    other = Client(survivor.port).connect()
    try:
        held.receipt(held.conn.subscribe, queue, id="s", ack="client-individual",
                     headers={"activemq.prefetchSize": "10"})
        for i in range(5):
            other.conn.send(queue, f"m{i}", headers={"persistent": "true"})
        assert [m.body for m in held.messages(5)] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        other.receipt(other.conn.subscribe, queue, id="s", ack="client-individual")
        assert other.silent(0.3)  # the doomed subscriber holds them all

        doomed.kill()
        killed_at = time.monotonic()
        again = other.messages(5, timeout=2 * LEASE_MS / 1000 + 2)
        elapsed = time.monotonic() - killed_at
        assert sorted(m.body for m in again) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        assert all(m.headers["redelivered"] == "true" for m in again)
        # the lease lapses at most LEASE_MS after the kill; the survivor reaps within a third of a lease
        # (plus delivery, with room for a loaded machine)
        assert elapsed < LEASE_MS / 1000 * 4 / 3 + 1.5, elapsed
    finally:
        other.close()
        held.close()
