"""REDIS_URL and DATABASE_URL switch to external services with no code change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json
from django.conf import settings
print(json.dumps({
    "redis_url": settings.REDIS_URL,
    "channel_hosts": [h["address"] for h in settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]],
    "broker": settings.CELERY_BROKER_URL,
    "results": settings.CELERY_RESULT_BACKEND,
    "database": {k: settings.DATABASES["default"][k] for k in ("ENGINE", "NAME", "HOST", "PORT", "USER")},
    "data_dir": str(settings.DATA_DIR),
}))
"""


def load_settings(tmp_path: Path, **env: str) -> dict:
    child_env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    child_env.update(DJANGO_SETTINGS_MODULE="signalbox.settings", SIGNALBOX_DATA_DIR=str(tmp_path), **env)
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=child_env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_defaults_are_the_embedded_redis_and_sqlite_in_the_data_folder(tmp_path):
    loaded = load_settings(tmp_path, SIGNALBOX_REDIS_PORT="7001")

    assert loaded["redis_url"] == "redis://127.0.0.1:7001/0"
    assert loaded["channel_hosts"] == [loaded["redis_url"]]
    assert loaded["broker"] == loaded["results"] == loaded["redis_url"]
    assert loaded["database"]["ENGINE"] == "django.db.backends.sqlite3"
    assert loaded["database"]["NAME"] == str(tmp_path / "db.sqlite3")
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600


def test_external_redis_and_postgresql_come_from_the_environment(tmp_path):
    loaded = load_settings(
        tmp_path,
        REDIS_URL="redis://:pw@redis.internal:6379/3",
        DATABASE_URL="postgres://signalbox:secret@db.internal:5433/broker",
    )

    assert loaded["redis_url"] == "redis://:pw@redis.internal:6379/3"
    assert loaded["channel_hosts"] == ["redis://:pw@redis.internal:6379/3"]
    assert loaded["broker"] == loaded["results"] == "redis://:pw@redis.internal:6379/3"
    assert loaded["database"] == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "broker",
        "HOST": "db.internal",
        "PORT": 5433,
        "USER": "signalbox",
    }


def test_a_unix_socket_url_is_celerys_redis_socket_url(tmp_path):
    """The launcher gives its children the embedded server's unix socket (signalbox/embedded_redis.py);
    redis-py and Channels take its unix:// URL, Celery takes the same place as redis+socket://."""
    loaded = load_settings(tmp_path, REDIS_URL="unix:///var/sb/redis.sock?db=2")

    assert loaded["redis_url"] == "unix:///var/sb/redis.sock?db=2"
    assert loaded["channel_hosts"] == [loaded["redis_url"]]
    assert loaded["broker"] == loaded["results"] == "redis+socket:///var/sb/redis.sock?virtual_host=2"


def test_the_secret_key_is_generated_once_and_kept(tmp_path):
    load_settings(tmp_path)
    first = (tmp_path / "secret_key").read_text()
    load_settings(tmp_path)
    assert (tmp_path / "secret_key").read_text() == first
    assert len(first) >= 50


def test_a_transactions_former_setting_name_is_refused_naming_the_new_one(tmp_path):
    """The limits were the WebSocket sessions' (SIGNALBOX_WS_MAX_TRANSACTION_*) and are broker_core's for
    every adapter now: an old name left in an environment is refused, not silently ignored."""
    child_env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    child_env.update(DJANGO_SETTINGS_MODULE="signalbox.settings", SIGNALBOX_DATA_DIR=str(tmp_path),
                     SIGNALBOX_WS_MAX_TRANSACTION_BYTES="1000")
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=child_env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0
    assert "SIGNALBOX_WS_MAX_TRANSACTION_BYTES is now SIGNALBOX_MAX_TRANSACTION_BYTES" in result.stderr
