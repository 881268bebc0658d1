"""One STOMP connection per client-id, across gateway processes, as ActiveMQ refuses a second one
(InvalidClientIDException). The claim is a Redis lease: a connection that ends frees the id at once, a
gateway process that dies frees it when the lease lapses."""

from __future__ import annotations

import time
import uuid

import pytest
from stomp.exception import ConnectFailedException

from tests.gateway_ws.conftest import TWO_GATEWAYS_LEASE_MS
from tests.helpers.stomp_client import Client

LEASE_MS = TWO_GATEWAYS_LEASE_MS


@pytest.fixture
def client_id() -> str:
    return f"app-{uuid.uuid4().hex[:8]}"


def refused(port: int, client_id: str) -> dict[str, str]:
    """Connect with `client_id` and expect the refusal; returns the ERROR's headers."""
    client = Client(port)
    try:
        with pytest.raises(ConnectFailedException):
            client.connect(**{"client-id": client_id})
        error = client.expect("ERROR")
        assert client.expect("DISCONNECTED", timeout=5)
        return error.headers
    finally:
        client.close()


def test_a_second_connection_with_the_same_client_id_is_refused_as_activemq_does(gateway, client_id):
    first = Client(gateway.port).connect(**{"client-id": client_id})
    try:
        headers = refused(gateway.port, client_id)
        assert headers["message"].startswith(f"Broker: localhost - Client: {client_id} already connected "
                                             "from ws://127.0.0.1:")
        # the first connection is untouched, and another id is fine
        first.receipt(first.conn.send, "/queue/clientid.check", "still here")
        other = Client(gateway.port).connect(**{"client-id": f"{client_id}-2"})
        other.close()
    finally:
        first.close()


def test_the_id_is_free_again_as_soon_as_its_connection_ends(gateway, client_id):
    Client(gateway.port).connect(**{"client-id": client_id}).close()
    again = Client(gateway.port).connect(**{"client-id": client_id})
    assert again.conn.is_connected()
    again.close()


@pytest.mark.e2e
def test_the_refusal_holds_across_gateway_processes_and_a_dead_gateways_claim_lapses(two_gateways, client_id):
    doomed, survivor = two_gateways
    holder = Client(doomed.port).connect(**{"client-id": client_id})
    try:
        headers = refused(survivor.port, client_id)
        assert f"Client: {client_id} already connected from ws://127.0.0.1:" in headers["message"]

        doomed.kill()  # SIGKILL: nothing releases the claim; its lease must lapse
        killed_at = time.monotonic()
        while True:
            try:
                taker = Client(survivor.port).connect(**{"client-id": client_id})
                break
            except ConnectFailedException:
                assert time.monotonic() - killed_at < LEASE_MS / 1000 + 2, "the claim never lapsed"
                time.sleep(0.2)
        assert taker.conn.is_connected()
        assert time.monotonic() - killed_at <= LEASE_MS / 1000 + 2
        taker.close()
    finally:
        holder.close()
