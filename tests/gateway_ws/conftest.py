"""Fixtures of the WebSocket gateway tests: an isolated broker namespace for in-process consumers, users
with passwords and API tokens, and STOMP helpers over Channels' WebsocketCommunicator."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from django.test import override_settings

from gateway import runtime

FAST_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _close_thread_connections() -> None:
    """Authentication ran in asgiref's worker thread and left a database connection there, which the next
    test's consumer (closing old connections) would trip pytest-django's database blocker on. SQLite's
    close() keeps in-memory test databases open, hence the base class's close."""
    from django.db import connections
    from django.db.backends.base.base import BaseDatabaseWrapper

    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:
            BaseDatabaseWrapper.close(conn)


@pytest.fixture
async def ws_runtime(channel_layer_cleanup) -> AsyncIterator[str]:
    """The gateway runtime on a namespace of its own; yields the namespace. Closes the event loop's broker
    client and wake-up hub at the end."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    with override_settings(SIGNALBOX_NAMESPACE=namespace, PASSWORD_HASHERS=FAST_HASHERS):
        runtime.policies.cache_clear()
        runtime.transaction_limits.cache_clear()  # (a test may set its own)
        runtime._async.clear()
        try:
            yield namespace
        finally:
            from asgiref.sync import sync_to_async

            await sync_to_async(_close_thread_connections)()
            for aio, hub in list(runtime._async.values()):
                if hub._listener is not None:
                    hub._listener.cancel()
                    with contextlib.suppress(BaseException):
                        await hub._listener
                await aio.redis.aclose()
            runtime._async.clear()
            runtime.policies.cache_clear()
            runtime.transaction_limits.cache_clear()


@pytest.fixture
def stomp_user(transactional_db):
    """A user `alice` with password `secret` and an API token; returns (user, token key)."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    with override_settings(PASSWORD_HASHERS=FAST_HASHERS):
        user = get_user_model().objects.create_superuser("alice", "alice@example.com", "secret")
    token = Token.objects.create(user=user)
    return user, token.key


@pytest.fixture(scope="session")
def gateway_data(tmp_path_factory) -> tuple:
    """A data folder with a migrated database and the test users, and a broker namespace for the gateway
    processes of this session."""
    from tests.helpers.gateway_server import prepare_database

    data_dir = tmp_path_factory.mktemp("gateway")
    namespace = f"t{uuid.uuid4().hex[:12]}"
    prepare_database(data_dir, namespace)
    return data_dir, namespace


@pytest.fixture(scope="session")
def gateway(gateway_data):
    """One live gateway process (uvicorn + the project's ASGI app) for the session's protocol tests."""
    from tests.helpers.gateway_server import running_gateway

    with running_gateway(*gateway_data) as server:
        yield server


TWO_GATEWAYS_LEASE_MS = 2000


@pytest.fixture
def two_gateways(gateway_data, request):
    """Two more gateway processes on the session's namespace, with a short consumer lease
    (TWO_GATEWAYS_LEASE_MS), for tests that kill one; both are killed at the end."""
    from tests.helpers.gateway_server import spawn_gateway, wait_listening

    data_dir, namespace = gateway_data
    servers = [spawn_gateway(data_dir, namespace, f"{request.node.name[:40]}-{n}",
                             SIGNALBOX_WS_LEASE_MS=str(TWO_GATEWAYS_LEASE_MS)) for n in range(2)]
    for server in servers:
        wait_listening(server)
    yield servers
    for server in servers:
        server.kill()


@pytest.fixture
def broker(gateway, redis_client):
    """A blocking broker client on the gateway's namespace, to look at broker state."""
    from broker_core.broker import Broker

    return Broker(redis_client, gateway.namespace)


@pytest.fixture
def queue_name() -> str:
    return f"q{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def stomp_listener(gateway_data):
    """One STOMP listener process (`manage.py stomp_listener`: TCP on `port`, WebSocket on `ws_port`) on the
    session's namespace."""
    from tests.helpers.gateway_server import spawn_stomp_listener, wait_listening

    data_dir, namespace = gateway_data
    server = wait_listening(spawn_stomp_listener(data_dir, namespace))
    server.namespace = namespace
    yield server
    server.stop()
    output = server.output()
    assert "Traceback" not in output, output


@pytest.fixture
def stomp_transport() -> str:
    """How `clients` connect: 'ws' (the web server's /stomp) here; a module that overrides this with params
    runs on others too: 'tcp' (the STOMP listener's TCP port), 'ws-port' (its WebSocket port)."""
    return "ws"


@pytest.fixture
def clients(gateway, stomp_transport, request):
    """Factory of connected stomp.py clients; all are closed at the end of the test."""
    from tests.helpers.stomp_client import Client

    made: list[Client] = []
    tcp = stomp_transport == "tcp"
    if stomp_transport == "ws":
        port = gateway.port
    else:
        listener = request.getfixturevalue("stomp_listener")
        port = listener.port if tcp else listener.ws_port

    def make(login: str = "alice", passcode: str = "secret", *, heartbeats=(0, 0), connect: bool = True,
             binary_mode: bool = False, **headers: str) -> Client:
        client = Client(port, heartbeats=heartbeats, binary_mode=binary_mode, tcp=tcp)
        made.append(client)
        return client.connect(login, passcode, **headers) if connect else client

    yield make
    for client in made:
        client.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate and its key (PEM) for localhost and 127.0.0.1: stomp+ssl's and wss's."""
    if not shutil.which("openssl"):
        pytest.skip("needs the openssl command")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.fixture
def listener(gateway_data, request):
    """Factory of STOMP listeners of the test's own, with settings of its own (environment variables);
    killed at the end."""
    from tests.helpers.gateway_server import spawn_stomp_listener, wait_listening

    made = []

    def start(**env: str):
        data_dir, namespace = gateway_data
        server = wait_listening(spawn_stomp_listener(data_dir, namespace, f"{request.node.name[:40]}", **env))
        made.append(server)
        return server

    yield start
    for server in made:
        server.kill()


@pytest.fixture
def closing():
    """`closing(conn)` returns `conn` and closes it at the end of the test."""
    made = []

    def keep(conn):
        made.append(conn)
        return conn

    yield keep
    for conn in made:
        conn.close()
