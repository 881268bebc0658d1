"""The ground rules: broker_core stays framework-free, and the shared fixtures are real."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import redis

from broker_core.clock import FakeClock

ROOT = Path(__file__).resolve().parent.parent


def test_broker_core_and_all_its_modules_import_without_django_channels_or_celery():
    probe = """
import importlib, json, pkgutil, sys
import broker_core
names = [m.name for m in pkgutil.walk_packages(broker_core.__path__, "broker_core.")]
for name in names:
    importlib.import_module(name)
frameworks = sorted({m.split(".")[0] for m in sys.modules} & {"django", "channels", "celery", "kombu"})
print(json.dumps({"modules": names, "frameworks": frameworks}))
"""
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"importing broker_core failed:\n{result.stderr}"
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert "broker_core.clock" in report["modules"]
    assert report["frameworks"] == []


def test_the_lua_scripts_ship_as_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_data = config["tool"]["setuptools"]["package-data"]["broker_core"]
    assert set(package_data) == {"scripts/lua/*.lua", "scripts/lua/includes/*.lua"}


def test_redis_fixture_is_a_real_redis_of_at_least_6_2(redis_client: redis.Redis):
    info = redis_client.info("server")
    major, minor = (int(part) for part in info["redis_version"].split(".")[:2])
    assert (major, minor) >= (6, 2)
    # A real server runs Lua, which every broker_core transition depends on.
    assert redis_client.eval("return redis.call('PING')", 0) == b"PONG"


def test_redis_client_speaks_bytes(redis_client: redis.Redis, namespace: str):
    key = f"{namespace}:bytes"
    redis_client.set(key, b"\x00\xffpayload", ex=60)
    assert redis_client.get(key) == b"\x00\xffpayload"


def test_namespaces_are_unique_and_safe_as_key_prefixes(namespace: str):
    assert namespace.startswith("t") and namespace[1:].isalnum()
    # Redis Cluster hash tags use braces; a namespace must not open one by accident.
    assert "{" not in namespace and "}" not in namespace


def test_clock_fixture_is_a_fake_clock_moved_by_hand(clock: FakeClock):
    start = clock.now_ms()
    assert clock.advance(1500) == start + 1500
    assert clock.now_ms() == start + 1500
    clock.set(42)
    assert clock.now_ms() == 42
