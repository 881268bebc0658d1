"""Fixtures of the console's browser tests: a live gateway (uvicorn + the project's ASGI app) with an
admin and a read-only user, a broker client on its namespace, and Debian's Chromium driven by
Playwright (skipped only where Chromium is not installed; CI installs it from .ci/apt-packages)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.gateway_server import ROOT, server_env, start_gateway

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PASSWORD = "console-secret"

# admin: a superuser; reader: may read (browse, see) every queue, nothing else.
USERS = f"""
from django.contrib.auth import get_user_model
from gateway.models import DestinationPermission
User = get_user_model()
User.objects.create_superuser("admin", "admin@example.com", "{PASSWORD}")
reader = User.objects.create_user("reader", "reader@example.com", "{PASSWORD}")
rule = DestinationPermission.objects.create(destination=">", can_read=True)
rule.users.add(reader)
"""


@pytest.fixture(scope="session")
def console_server(tmp_path_factory) -> Iterator[Any]:
    data_dir = tmp_path_factory.mktemp("console")
    namespace = f"t{uuid.uuid4().hex[:12]}"
    env = server_env(data_dir, namespace)
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                   check=True, timeout=120)
    subprocess.run([sys.executable, "manage.py", "shell", "-c", USERS], cwd=ROOT, env=env, check=True,
                   timeout=60)
    server = start_gateway(data_dir, namespace, name="console")
    server.namespace = namespace
    server.data_dir = data_dir
    server.url = f"http://127.0.0.1:{server.port}"
    yield server
    server.stop()
    output = server.output()
    assert "Traceback" not in output, output


@pytest.fixture
def broker(console_server, redis_client):
    from broker_core.broker import Broker

    return Broker(redis_client, console_server.namespace)


@pytest.fixture
def queue_name() -> str:
    return f"cq.{uuid.uuid4().hex[:10]}"


# Module scope, not session: Playwright's sync API keeps an event loop running in this thread while it
# is open, and the asyncio tests that run after a browser module need that thread free again.
@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (.ci/apt-packages lists it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


def login(browser: Any, server: Any, user: str = "admin", color_scheme: str = "light",
          viewport: dict[str, int] | None = None) -> Any:
    """A new browser context logged in to the console as `user`; returns its page."""
    context = browser.new_context(color_scheme=color_scheme,
                                  viewport=viewport or {"width": 1366, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{server.url}/console/")
    page.fill("#id_username", user)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.url}/console/")
    return page


@pytest.fixture
def admin_page(chromium, console_server) -> Iterator[Any]:
    page = login(chromium, console_server, "admin")
    yield page
    page.context.close()


@pytest.fixture
def reader_page(chromium, console_server) -> Iterator[Any]:
    page = login(chromium, console_server, "reader")
    yield page
    page.context.close()


@pytest.fixture
def topic_name() -> str:
    return f"ct.{uuid.uuid4().hex[:10]}"


# may read every topic, nothing else (the session's "reader" reads queues only)
TOPIC_READER = f"""
from django.contrib.auth import get_user_model
from gateway.models import DestinationPermission
user = get_user_model().objects.create_user("topic-reader", "tr@example.com", "{PASSWORD}")
DestinationPermission.objects.create(destination="topic://>", can_read=True).users.add(user)
"""


@pytest.fixture(scope="session")
def topic_reader(console_server) -> str:
    env = server_env(console_server.data_dir, console_server.namespace)
    subprocess.run([sys.executable, "manage.py", "shell", "-c", TOPIC_READER], cwd=ROOT, env=env, check=True,
                   timeout=60)
    return "topic-reader"
