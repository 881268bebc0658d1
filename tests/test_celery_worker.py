"""The celery_worker fixture is a real worker: tasks sent through Redis run and report back."""

from __future__ import annotations

from tests.helpers.celery_tasks import record_in_redis


def test_a_task_sent_through_redis_runs_in_the_worker(celery_worker, redis_client, namespace):
    key = f"{namespace}:marker"

    result = record_in_redis.delay(key, "ran")

    assert result.get(timeout=10) == "ran"
    assert redis_client.get(key) == b"ran"


def test_the_worker_answers_control_pings(celery_app, celery_worker):
    replies = celery_app.control.ping(timeout=2)

    assert {"ok": "pong"} in [reply.get(celery_worker.hostname) for reply in replies]


def test_the_worker_consumes_this_sessions_own_queue(celery_app, celery_worker):
    queues = {queue.name for queue in celery_worker.consumer.task_consumer.queues}

    assert queues == {celery_app.conf.task_default_queue}
    assert celery_app.conf.task_default_queue.startswith("signalbox-test-")
