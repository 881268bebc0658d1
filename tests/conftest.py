"""Fixtures every suite shares: a real Redis, key namespaces, a fake clock and a real Celery worker.

The session's Redis is started by the signalbox.testing plugin before Django loads (see there):
the server at REDIS_URL when that is set, else the embedded Valkey server started for this session.
Tests never flush Redis; each test keeps to its own key namespace instead.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import settings

from broker_core.clock import FakeClock
from signalbox.embedded_redis import EmbeddedRedis, configured_executable, free_port

# The broker fixtures tests/broker_core and tests/semantics share (a plugin: pytest only takes
# pytest_plugins from the top-level conftest).
pytest_plugins = ["tests.helpers.broker"]

# Property tests check what happens, not how fast: Hypothesis's 200 ms deadline per example failed them
# on a machine busy with other work. Time bounds are measured by the benchmarks (bench/adversarial.py).
settings.register_profile("signalbox", deadline=None)
settings.load_profile("signalbox")


@pytest.fixture(scope="module")
def redis_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of the session's real Redis (REDIS_URL, or the embedded server started for the session).
    A module marked `private_redis` gets a server of its own instead: its tests count what the server
    ran (INFO commandstats), which counts every client's commands, and the session's server also serves
    the background loops of servers other tests started (the Celery worker's BRPOP, the console server's
    samplers), whose commands landed in a count now and then."""
    if request.node.get_closest_marker("private_redis") is None:
        yield os.environ["REDIS_URL"]
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), port=free_port(), appendonly=False,
                           executable=configured_executable())
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A bytes-in, bytes-out client of the session's Redis. Never flush it: use `namespace`."""
    client = redis.Redis.from_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def namespace() -> str:
    """A key prefix no other test (or concurrent session on a shared Redis) uses, e.g. 't3f9a0c2e1b7d'."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def clock() -> FakeClock:
    """A clock the test moves by hand: now_ms(), advance(ms), set(ms)."""
    return FakeClock()


@pytest.fixture(scope="session")
def celery_app():
    """The project's Celery app, pointed at the session's Redis and its own queue."""
    from signalbox.celery import app

    return app


@pytest.fixture(scope="session")
def celery_worker(celery_app):
    """A real Celery worker (thread pool, in this process) consuming the session's queue.

    Started once per session; the start-up ping task proves it executes tasks before tests run.
    """
    import celery.contrib.testing.tasks  # noqa: F401 - registers celery.ping for the start-up check
    from celery.contrib.testing.worker import start_worker

    import tests.helpers.celery_tasks  # noqa: F401 - the worker only runs tasks known when it starts

    with start_worker(
        celery_app,
        pool="threads",
        concurrency=2,
        loglevel="WARNING",
        perform_ping_check=True,
        shutdown_timeout=30,
        hostname=f"test-{uuid.uuid4().hex[:8]}@localhost",
    ) as worker:
        yield worker


@pytest.fixture
async def channel_layer_cleanup():
    """Use in async tests that touch the channel layer: closes its Redis pools before the loop ends."""
    from tests.helpers.channels import close_channel_layer_pools

    yield
    await close_channel_layer_pools()


@pytest.fixture(autouse=True)
def _login_failures_forgotten() -> Iterator[None]:
    """Every test logs in from 127.0.0.1: one test's wrong passwords must not count against the next's
    (gateway/logins.py follows failed logins per client address, per process), and a failed login is
    answered at once unless a test of the pause sets it (tests/gateway_ws/test_login_guard.py)."""
    from django.test import override_settings

    from gateway.logins import guard

    guard.forget()
    with override_settings(SIGNALBOX_LOGIN_FAILURE_DELAY=0):
        yield
    guard.forget()


@pytest.fixture
def credentials_settled(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """The credential cache looks for other processes' user changes once, at the test's first request: a
    look later on (one a second) would find this test's namespace's counter unlike the one it saw last,
    in another test, and forget the credentials cached so far (for tests that count hasher runs or which
    requests took a lean path)."""
    from gateway.credentials import verified

    monkeypatch.setattr(verified, "next_look", 0.0)
    settings.SIGNALBOX_AUTH_CHANGES_SECONDS = 3600.0
