"""The fixtures of a test module that runs servers of its own, for settings the session's gateway does not
have: `servers` (own_gateway_and_listener, module-scoped), `api` (their REST API as alice) and `broker` (a
blocking broker client on their namespace, in place of tests/gateway_ws/conftest.py's, which is on the
session gateway's). A factory rather than conftest fixtures because each module gives its own settings, and
its `broker` must win over the conftest's: assigned at module level, they are the nearest definitions.

    servers, api, broker = own_servers_fixtures("conns", SIGNALBOX_CONNECTION_LEASE_MS="1500")
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from broker_core.broker import Broker
from tests.helpers.gateway_server import ALICE_TOKEN, own_gateway_and_listener


def own_servers_fixtures(name: str, **settings: str) -> tuple[Any, Any, Any]:
    """(servers, api, broker) fixtures for one module; `name` names its data folder and server logs."""

    @pytest.fixture(scope="module")
    def servers(tmp_path_factory) -> Iterator[dict[str, Any]]:
        """The module's gateway and listener: {"gateway", "listener", "namespace", "data_dir"}."""
        with own_gateway_and_listener(tmp_path_factory.mktemp(name), name, **settings) as running:
            yield running

    @pytest.fixture
    def api(servers) -> Iterator[httpx.Client]:
        """Their REST API (`/api/v1` relative paths) as alice, a superuser."""
        with httpx.Client(base_url=f"http://127.0.0.1:{servers['gateway'].port}/api/v1",
                          headers={"Authorization": f"Token {ALICE_TOKEN}"}, timeout=10) as client:
            yield client

    @pytest.fixture
    def broker(servers, redis_client) -> Broker:
        """A blocking broker client on their namespace, to look at broker state."""
        return Broker(redis_client, servers["namespace"])

    return servers, api, broker
