"""GET /healthz reports Redis, the database, the Celery workers and the maintenance tick; 503 as soon
as one is down."""

from __future__ import annotations

import time

import pytest
from celery import Celery

from signalbox import health, tasks
from signalbox.embedded_redis import free_port
from signalbox.settings import celery_redis_url
from tests.helpers.redis_urls import with_database

pytestmark = pytest.mark.django_db


@pytest.fixture
def ticked(settings, namespace, celery_worker) -> str:
    """A deployment namespace of its own whose maintenance tick the real worker has just run once."""
    settings.SIGNALBOX_NAMESPACE = namespace
    tasks.tick.delay(namespace).get(timeout=30)
    return namespace


def test_all_healthy_with_a_running_worker(client, celery_worker, ticked):
    response = client.get("/healthz")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["redis"]["status"] == "ok"
    assert body["redis"]["version"]
    assert body["database"] == {"status": "ok", "vendor": "sqlite"}
    assert body["celery"]["status"] == "ok"
    assert celery_worker.hostname in body["celery"]["workers"]
    assert body["maintenance"]["status"] == "ok"
    assert 0 <= body["maintenance"]["age_ms"] < 15_000
    assert body["maintenance"]["errors"] == 0
    assert response["Cache-Control"] == "no-store"


def test_a_stale_maintenance_tick_makes_it_503_and_says_beat_or_the_workers_stopped(client, settings,
                                                                                     ticked):
    settings.SIGNALBOX_MAINTENANCE_STALE_SECONDS = 0.3
    time.sleep(0.5)  # no beat runs in this test: nothing ticks again

    response = client.get("/healthz")

    assert response.status_code == 503
    body = response.json()
    assert body["maintenance"]["status"] == "error"
    assert body["maintenance"]["age_ms"] >= 500
    assert "Celery beat or every worker has stopped" in body["maintenance"]["error"]
    assert "more than 0.3s" in body["maintenance"]["error"]
    assert body["celery"]["status"] == "ok"  # the workers answer pings; it is the tick that stopped


def test_a_tick_that_never_ran_makes_it_503(client, settings, namespace, celery_worker):
    settings.SIGNALBOX_NAMESPACE = namespace

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["maintenance"] == {
        "status": "error",
        "error": "the maintenance tick has never run: start Celery beat and a worker (./signalbox.sh run "
                 "starts both)"}


def test_unreachable_redis_makes_it_503_and_names_redis(client, settings, celery_worker, ticked):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"

    response = client.get("/healthz")

    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "error"
    assert body["redis"]["status"] == "error"
    assert "ConnectionError" in body["redis"]["error"]
    # The other checks still report on their own.
    assert body["database"]["status"] == "ok"
    assert body["celery"]["status"] == "ok"


def test_no_worker_answering_makes_it_503(client, settings, monkeypatch, redis_url):
    # A Celery app on another database of the same Redis: its broadcast ping reaches no worker.
    lonely_app = Celery("lonely", broker=celery_redis_url(with_database(redis_url, 15)))
    monkeypatch.setattr(health, "celery_app", lonely_app)
    settings.HEALTH_CHECK_TIMEOUT = 0.3

    response = client.get("/healthz")

    assert response.status_code == 503
    body = response.json()
    assert body["celery"] == {"status": "error", "error": "no Celery worker answered a ping within 0.3s"}
    assert body["redis"]["status"] == "ok"


def test_a_failing_database_is_reported_not_raised(monkeypatch):
    from django.db import connection

    def refuse() -> None:
        raise connection.Database.OperationalError("unable to open database file\nsecond line")

    monkeypatch.setattr(connection, "ensure_connection", refuse)

    assert health.check_database() == {
        "status": "error",
        "error": "OperationalError: unable to open database file",
    }


def test_a_hung_redis_is_reported_within_the_timeout(client, settings, monkeypatch, tmp_path):
    """Redis stopped (SIGSTOP: its connections stay open, nothing answers): every check that needs it
    says so within HEALTH_CHECK_TIMEOUT and a little, and a second probe meanwhile starts no second ping
    (a check stuck in a call would otherwise take one more thread per probe)."""
    import signal

    from signalbox.embedded_redis import EmbeddedRedis

    store = EmbeddedRedis(tmp_path / "redis", port=free_port())
    store.start()
    try:
        settings.REDIS_URL = store.url
        settings.HEALTH_CHECK_TIMEOUT = 0.5
        monkeypatch.setattr(health, "celery_app", Celery("hung", broker=celery_redis_url(store.url)))
        assert client.get("/healthz").json()["redis"]["status"] == "ok"
        store.process.send_signal(signal.SIGSTOP)
        try:
            for _ in range(2):
                started = time.monotonic()
                response = client.get("/healthz")
                assert time.monotonic() - started < 0.5 + 1 + 0.5
                assert response.status_code == 503
                body = response.json()
                assert body["redis"]["status"] == "error"
                assert body["celery"]["status"] == "error"
                assert body["maintenance"]["status"] == "error"
                assert body["database"]["status"] == "ok"
                if _ == 0:
                    first = health._running["celery"]
            assert health._running["celery"] is first or first.done()
        finally:
            store.process.send_signal(signal.SIGCONT)
    finally:
        store.stop()
