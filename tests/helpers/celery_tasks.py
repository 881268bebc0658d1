"""Tasks only the test worker runs. Imported before the worker starts so it knows them."""

from __future__ import annotations

import redis
from django.conf import settings

from signalbox.celery import app


@app.task(name="tests.record_in_redis")
def record_in_redis(key: str, value: str) -> str:
    """Proves a task ran inside a worker: writes to the same Redis the test reads."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        client.set(key, value, ex=300)
    finally:
        client.close()
    return value
