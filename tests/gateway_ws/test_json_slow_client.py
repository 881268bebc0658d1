"""A client of the JSON protocol (/ws/v1) that reads nothing, over a real socket to a web process of the
test's own: every answer waits in the connection's send buffer, a refusal's error too, so a client that
sends refused request after refused request and never reads fills it and is cut off as too slow, as for
any message; its subscription's consumer is closed with it."""

from __future__ import annotations

import json
import uuid

import pytest

from broker_core.broker import Broker
from tests.helpers.gateway_server import spawn_gateway, wait_listening
from tests.helpers.polling import eventually, flooded_until_cut_off
from tests.helpers.stomp_client import RawWsSocket

pytestmark = pytest.mark.e2e


def test_a_client_that_reads_none_of_its_errors_is_cut_off_as_too_slow(gateway_data, redis_client):
    data_dir, namespace = gateway_data
    server = wait_listening(spawn_gateway(data_dir, namespace, "json-slow",
                                          SIGNALBOX_WS_SLOW_CLIENT_SECONDS="1",
                                          SIGNALBOX_WS_SEND_BUFFER_BYTES="65536"))
    try:
        name = f"json.slow.{uuid.uuid4().hex[:8]}"
        broker = Broker(redis_client, namespace)
        broker.ensure_destination(name)
        client = RawWsSocket(server.port, rcvbuf=4096, path="/ws/v1", subprotocol=None)
        client.send_text(json.dumps({"type": "connect", "login": "alice", "passcode": "secret"}).encode())
        client.send_text(json.dumps({"type": "subscribe", "subscription": "s", "destination": f"queue://{name}",
                                     "ack_mode": "client-individual"}).encode())
        eventually(lambda: broker.stats(name).consumer_count == 1, timeout=10)
        bad = json.dumps({"type": "x" * 4000}).encode()  # each refused, its error naming the type
        client.sock.settimeout(30)
        # (8 MB of errors: more than the kernel's buffers take)
        flooded_until_cut_off(client.send_text, bad, 2000, lambda: broker.stats(name).consumer_count)
        client.sock.close()
    finally:
        server.kill()
