"""The maintenance tasks in real Celery processes: the session's worker runs the tick, a real beat
schedules it from signalbox/celery.py, and a worker process killed in the middle of a sweep loses
nothing (the next run takes over once its lease lapses)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from broker_core import maintenance
from broker_core.broker import Broker
from broker_core.clock import FakeClock, SystemClock
from broker_core.messages import Message
from broker_core.model import Consumer, ConsumerSpec
from signalbox import tasks
from signalbox.celery import MAINTENANCE_TICK, app

ROOT = Path(__file__).resolve().parents[1]
MAINTENANCE_TASKS = {
    "signalbox.maintenance.tick", "signalbox.maintenance.recover", "signalbox.maintenance.sweep_expired",
    "signalbox.maintenance.check_slow_consumers", "signalbox.maintenance.abort_consumer",
}


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> float:
    """Poll until `predicate()` is true; returns the seconds it took."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - started


@contextmanager
def celery_process(*arguments: str, log: Path, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """`celery -A signalbox <arguments>` in its own process group, against the session's Redis."""
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "celery", "-A", "signalbox", *arguments],
                                   cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def lapsing_consumer(broker: Broker) -> Consumer:
    """Consumer A holds m0 on a 1 s lease nobody renews; B (long lease, returned) is there to take over."""
    a = broker.add_consumer("orders", ConsumerSpec(prefetch=5, lease_ms=1_000), consumer_id="A")
    broker.send("orders", Message(body="m0"))
    assert [d.body for d in broker.receive(a, 10)] == ["m0"]
    return broker.add_consumer("orders", ConsumerSpec(prefetch=5, lease_ms=3_600_000), consumer_id="B")


def stored_ids(broker: Broker, destination: str) -> set[str]:
    ids: set[str] = set()
    cursor = None
    while True:
        page = broker.browse(destination, cursor=cursor, limit=1_000)
        ids |= {browsed.message.message_id for browsed in page.messages}
        if page.next_cursor is None:
            return ids
        cursor = page.next_cursor


def consumer_ids(broker: Broker) -> list[str]:
    return sorted(c.consumer_id for c in broker.stats("orders").consumers)


def test_the_worker_knows_the_maintenance_tasks_and_beat_sends_the_tick_every_second(celery_worker):
    assert set(celery_worker.app.tasks) >= MAINTENANCE_TASKS
    entry = app.conf.beat_schedule["broker maintenance"]
    assert (entry["task"], entry["schedule"]) == (MAINTENANCE_TICK, 1.0)
    assert entry["options"]["expires"] > 1.0


def test_the_tick_task_runs_in_the_worker_and_reaps_a_lapsed_consumer(celery_worker, redis_client, namespace):
    broker = Broker(redis_client, namespace)  # the worker's clock: the system's
    b = lapsing_consumer(broker)
    time.sleep(1.05)

    report = tasks.tick.delay(namespace=namespace).get(timeout=10)

    assert report["reaped"] == ["queue://orders#A"] and report["errors"] == []
    assert consumer_ids(broker) == ["B"]
    assert [(d.body, d.redelivered) for d in broker.receive(b, 10)] == [("m0", True)]


def test_a_by_hand_task_runs_one_job(celery_worker, redis_client, namespace):
    broker = Broker(redis_client, namespace)
    now = SystemClock().now_ms()
    late_producer = Broker(redis_client, namespace, FakeClock(now - 10_000))  # "old" enqueued, then expired
    late_producer.send("orders", [Message(body="old", expiration=now - 5_000), Message(body="new")])

    result = tasks.sweep_expired.delay("orders", namespace=namespace).get(timeout=10)

    assert (result["ran"], result["expired"], result["cycle_done"]) == (True, 1, True)
    assert broker.stats("orders").pending == 1


@pytest.mark.e2e
def test_beat_and_a_worker_reap_a_lapsed_consumer_within_seconds(celery_worker, redis_client, namespace,
                                                                  tmp_path):
    broker = Broker(redis_client, namespace)
    broker.ensure_destination("orders")
    with celery_process("beat", "--loglevel", "WARNING", "--schedule", str(tmp_path / "schedule"),
                        "--pidfile", str(tmp_path / "beat.pid"), log=tmp_path / "beat.log",
                        SIGNALBOX_NAMESPACE=namespace):
        # The tick carries beat's namespace; the session's worker runs it.
        wait_for(lambda: maintenance.last_tick(broker), 30, "the first tick")
        b = lapsing_consumer(broker)
        time.sleep(1.0)
        took = wait_for(lambda: consumer_ids(broker) == ["B"], 10, "the reaper")
    assert took < 3.0
    assert [(d.body, d.redelivered) for d in broker.receive(b, 10)] == [("m0", True)]


@pytest.mark.e2e
def test_a_worker_killed_in_the_middle_of_a_sweep_loses_nothing(redis_client, namespace, tmp_path):
    broker = Broker(redis_client, namespace)
    broker.policies.set_entry("queue", "orders", {"maxExpirePageSize": 10})
    total = 6_000
    # Sent by a producer whose clock is 10 s behind, so they are enqueued, and run out before the
    # worker (on the system clock) looks at them.
    now = SystemClock().now_ms()
    producer = Broker(redis_client, namespace, FakeClock(now - 10_000))
    sent: set[str] = set()
    for start in range(0, total, 1_000):
        sent |= set(producer.send("orders", [Message(body=f"m{start + i}", expiration=now - 5_000)
                                             for i in range(1_000)]))
    assert broker.stats("orders").pending == total
    queue = f"maintenance-{uuid.uuid4().hex[:8]}"
    with celery_process("worker", "-Q", queue, "--pool", "solo", "--loglevel", "WARNING", "--without-gossip",
                        "--without-mingle", "--without-heartbeat", "-n", f"{queue}@localhost",
                        log=tmp_path / "worker.log") as worker:
        tasks.sweep_expired.apply_async(kwargs={"destination": "orders", "namespace": namespace},
                                        queue=queue, ignore_result=True)
        wait_for(lambda: maintenance.job_status(broker, "orders")["expire"].get("examined", 0) >= 500, 60,
                 "the sweep to get going")
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)

    status = maintenance.job_status(broker, "orders")["expire"]
    assert status["running"] == 1 and "leased_until" in status  # killed mid-sweep, lease still held
    assert broker.stats("orders").queue_size > 0  # the sweep had not finished
    # Every message is somewhere: still queued, set aside for the DLQ, or there (a forward the worker
    # was in the middle of may be in both; its second delivery is dropped as a duplicate).
    forwarding = {key.decode() for key in redis_client.hkeys(f"{namespace}:{{q:orders}}:fwd")}
    assert stored_ids(broker, "orders") | forwarding | stored_ids(broker, "ActiveMQ.DLQ") == sent

    # Another worker, once the lease has lapsed, finishes the sweep from where it stopped.
    later = Broker(redis_client, namespace, FakeClock(status["leased_until"] - 1))
    assert maintenance.run_expiry_sweep(later, "orders").ran is False  # not yet: the lease runs to here
    later.clock.advance(1)
    sweep = maintenance.run_expiry_sweep(later, "orders", max_pages=None)
    assert sweep.ran and sweep.cycle_done
    later.clock.advance(maintenance.FORWARD_GRACE_MS)
    maintenance.run_recovery(later, "orders")  # any forward the dead worker left is delivered

    orders, dlq = broker.stats("orders"), broker.stats("ActiveMQ.DLQ")
    assert (orders.queue_size, orders.forwarding, orders.expired) == (0, 0, total)
    assert dlq.queue_size == total and stored_ids(broker, "ActiveMQ.DLQ") == sent  # each once
    assert maintenance.job_status(broker, "orders")["expire"]["running"] == 0


def test_a_tick_while_redis_is_away_is_one_warning_line_without_a_traceback(caplog, namespace, monkeypatch):
    """Redis restarting (the launcher restarts it after a crash): beat's tick every second must not log
    Celery's traceback of a failed task, nor the maintenance's own traces; one WARNING line a tick."""
    from signalbox.embedded_redis import free_port

    away = Broker(redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1),
                  namespace)  # (nothing listens there: connection refused)
    monkeypatch.setattr(tasks, "broker", lambda namespace=None: away)
    with caplog.at_level("DEBUG"):
        report = tasks.tick.apply(kwargs={"namespace": namespace}).get()
    assert report["skipped"].startswith("Redis unavailable: ")
    records = [r for r in caplog.records if r.levelno >= 30]
    assert [(r.levelname, r.exc_info) for r in records] == [("WARNING", None)], caplog.text
    assert "maintenance tick skipped: Redis unavailable" in records[0].getMessage()


def test_a_maintenance_step_that_loses_redis_logs_one_line(caplog):
    tally = maintenance._Tally()

    def lost() -> None:
        raise redis.ConnectionError("Connection refused")

    with caplog.at_level("DEBUG"):
        assert not maintenance._guarded(tally, "rate history", lost)
    assert [(r.levelname, r.exc_info) for r in caplog.records] == [("WARNING", None)]
    assert tally.errors == ["rate history: Redis unavailable: Connection refused"]
