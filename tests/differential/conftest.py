"""A gateway and a STOMP listener of the differential suite's own: a namespace with the suite's policy
file (tests/differential/signalbox-policies.toml) loaded, so that no other test's policies leak in or out."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis

from broker_core.config.virtual import load_virtual_config

POLICIES = Path(__file__).parent / "signalbox-policies.toml"


@pytest.fixture(scope="module")
def signalbox(tmp_path_factory, redis_url):
    from broker_core.broker import Broker
    from broker_core.config.policy_map import load_policy_file
    from broker_core.ops import virtual
    from tests.helpers.gateway_server import (
        prepare_database,
        spawn_gateway,
        spawn_stomp_listener,
        wait_listening,
    )

    data_dir = tmp_path_factory.mktemp("differential")
    namespace = f"d{uuid.uuid4().hex[:12]}"
    prepare_database(data_dir, namespace)
    client = redis.Redis.from_url(redis_url)
    try:
        broker = Broker(client, namespace)
        broker.policies.load_from(load_policy_file(POLICIES))
        broker.refresh_policies()
        virtual.configure(broker, load_virtual_config(POLICIES))
    finally:
        client.close()
    servers = [spawn_gateway(data_dir, namespace, "differential-ws"),
               spawn_stomp_listener(data_dir, namespace, "differential-tcp")]
    for server in servers:
        wait_listening(server)
    gateway, listener = servers
    yield SimpleNamespace(ws=f"ws://127.0.0.1:{gateway.port}/stomp", tcp=f"tcp://127.0.0.1:{listener.port}",
                          http=f"http://127.0.0.1:{gateway.port}")
    for server in servers:
        server.stop()
