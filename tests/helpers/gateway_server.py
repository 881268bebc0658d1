"""Real gateway processes for WebSocket tests and benchmarks: uvicorn serving the project's ASGI app on a
free port, against the session's Redis and a SQLite database of its own with known users."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from signalbox.embedded_redis import PortNotOpen, free_port, wait_for_port
from signalbox.launcher import WEB_SOCKET_PROTOCOL

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = "tests.gateway_ws.server_settings"

# alice: superuser (password 'secret', token ALICE_TOKEN); bob: no permissions but read on queue://bob.>;
# carol: admin of queue://carol.>, write to the scheduler management topic; sam: staff, carol's grants
ALICE_TOKEN = "a" * 40
_USERS = f"""
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from gateway.models import DestinationPermission
User = get_user_model()
alice = User.objects.create_superuser("alice", "alice@example.com", "secret")
Token.objects.create(user=alice, key="{ALICE_TOKEN}")
bob = User.objects.create_user("bob", "bob@example.com", "secret")
rule = DestinationPermission.objects.create(destination="queue://bob.>", can_read=True, can_write=True)
rule.users.add(bob)
carol = User.objects.create_user("carol", "carol@example.com", "secret")
for pattern, actions in (("queue://carol.>", dict(can_admin=True)),
                         ("topic://ActiveMQ.Scheduler.Management", dict(can_write=True))):
    DestinationPermission.objects.create(destination=pattern, **actions).users.add(carol)
sam = User.objects.create_user("sam", "sam@example.com", "secret", is_staff=True)
for rule in DestinationPermission.objects.filter(users=carol):
    rule.users.add(sam)
"""


def server_env(data_dir: Path, namespace: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DJANGO_SETTINGS_MODULE=SETTINGS, DATABASE_URL=f"sqlite:///{data_dir / 'db.sqlite3'}",
               SIGNALBOX_DATA_DIR=str(data_dir), SIGNALBOX_NAMESPACE=namespace, PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


def prepare_database(data_dir: Path, namespace: str) -> None:
    """Migrate a fresh SQLite database and create the test users."""
    data_dir.mkdir(parents=True, exist_ok=True)
    env = server_env(data_dir, namespace)
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                   check=True, timeout=120)
    subprocess.run([sys.executable, "manage.py", "shell", "-c", _USERS], cwd=ROOT, env=env, check=True,
                   timeout=60)


@dataclass
class GatewayServer:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    ws_port: int = 0  # a STOMP listener's port for STOMP over WebSocket

    @property
    def stomp_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/stomp"

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: the process dies without closing anything (the fault test)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def start_gateway(data_dir: Path, namespace: str, name: str = "gateway", **extra_env: str) -> GatewayServer:
    """uvicorn on a free port; returns once it accepts connections."""
    return wait_listening(spawn_gateway(data_dir, namespace, name, **extra_env))


def spawn_gateway(data_dir: Path, namespace: str, name: str = "gateway", *, http: str = "auto",
                  **extra_env: str) -> GatewayServer:
    """Start uvicorn on a free port without waiting for it (start several, then `wait_listening`). `http`:
    uvicorn's HTTP implementation (auto: httptools, as `run` has it, when installed; or h11)."""
    port = free_port()
    log_path = data_dir / f"{name}-{port}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - the child writes to it
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "signalbox.asgi:application", "--host", "127.0.0.1", "--port",
         str(port), "--ws", WEB_SOCKET_PROTOCOL, "--http", http, "--lifespan", "off",
         "--log-level", "warning", "--no-access-log"],
        cwd=ROOT, env=server_env(data_dir, namespace, **extra_env), stdin=subprocess.DEVNULL, stdout=log,
        stderr=subprocess.STDOUT)
    log.close()
    return GatewayServer(process, port, log_path)


def spawn_stomp_listener(data_dir: Path, namespace: str, name: str = "stomp",
                         **extra_env: str) -> GatewayServer:
    """`manage.py stomp_listener` (STOMP over TCP on `port`, over WebSocket on `ws_port`) on free ports,
    without waiting for it."""
    port, ws_port = free_port(), free_port()
    log_path = data_dir / f"{name}-{port}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - the child writes to it
    process = subprocess.Popen(
        [sys.executable, "manage.py", "stomp_listener", "--host", "127.0.0.1", "--port", str(port),
         "--ws-port", str(ws_port)],
        cwd=ROOT, env=server_env(data_dir, namespace, **extra_env), stdin=subprocess.DEVNULL, stdout=log,
        stderr=subprocess.STDOUT)
    log.close()
    return GatewayServer(process, port, log_path, ws_port)


def wait_listening(server: GatewayServer, timeout: float = 30) -> GatewayServer:
    try:
        wait_for_port(server.port, process=server.process, timeout=timeout)
    except PortNotOpen as exc:
        server.kill()
        raise AssertionError(f"gateway: {exc}:\n{server.output()}") from None
    return server


@contextlib.contextmanager
def running_gateway(data_dir: Path, namespace: str, name: str = "gateway",
                    **extra_env: str) -> Iterator[GatewayServer]:
    """A gateway on an existing database and namespace (the session's), with these settings; stopped at the
    end, when it may not have logged a traceback."""
    gateway = start_gateway(data_dir, namespace, name, **extra_env)
    gateway.namespace = namespace  # (for a test that reaches the same broker state through broker_core)
    try:
        yield gateway
    finally:
        gateway.stop()
    assert "Traceback" not in gateway.output(), gateway.output()


@contextlib.contextmanager
def own_gateway(data_dir: Path, name: str) -> Iterator[GatewayServer]:
    """A gateway of a test module's own: a fresh database with the test users and namespace, stopped at the
    end."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    prepare_database(data_dir, namespace)
    gateway = start_gateway(data_dir, namespace, name=name)
    gateway.namespace = namespace  # (for a test that reaches the same broker state through broker_core)
    try:
        yield gateway
    finally:
        gateway.stop()


@contextlib.contextmanager
def own_gateway_and_listener(data_dir: Path, name: str, **extra_env: str) -> Iterator[dict[str, Any]]:
    """A web process and a STOMP listener of a test module's own, on one fresh database and namespace, with
    these settings; stopped at the end, when neither may have logged a traceback."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    prepare_database(data_dir, namespace)
    gateway = spawn_gateway(data_dir, namespace, f"{name}-gw", **extra_env)
    listener = spawn_stomp_listener(data_dir, namespace, f"{name}-stomp", **extra_env)
    try:
        wait_listening(gateway)
        wait_listening(listener)
        yield {"gateway": gateway, "listener": listener, "namespace": namespace, "data_dir": data_dir}
    finally:
        gateway.stop()
        listener.stop()
    for server in (gateway, listener):
        assert "Traceback" not in server.output(), server.output()
