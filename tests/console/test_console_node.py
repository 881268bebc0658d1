"""The node page (issue 26, item 9), in Debian's headless Chromium, against a deployment of this test's own:
a gateway, a real Celery worker and beat and a STOMP listener, each a process started as `./signalbox.sh
run` starts it, on the session's Redis with a namespace and Celery queue of their own (heartbeats every
second, so "missing" is 3 s). Before the worker and beat start the page lists them as not running and the
tick as never run; once they run, every role with its pid and uptime and the tick alive; a beat killed
with SIGKILL turns missing, a worker stopped with SIGTERM stopped; the Redis figures are the server's; a
non-staff user is refused the page and the endpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.console.conftest import USERS, login
from tests.helpers.gateway_server import (
    ROOT,
    server_env,
    spawn_stomp_listener,
    start_gateway,
    wait_listening,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> Iterator[Any]:
    data_dir = tmp_path_factory.mktemp("node")
    namespace = f"t{uuid.uuid4().hex[:12]}"
    extra = {"SIGNALBOX_HEARTBEAT_SECONDS": "1", "SIGNALBOX_CELERY_QUEUE": f"{namespace}.celery",
             "SIGNALBOX_MAINTENANCE_STALE_SECONDS": "4"}
    env = server_env(data_dir, namespace, **extra)
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                   check=True, timeout=120)
    subprocess.run([sys.executable, "manage.py", "shell", "-c", USERS], cwd=ROOT, env=env, check=True,
                   timeout=60)
    server = start_gateway(data_dir, namespace, name="node", **extra)
    server.url = f"http://127.0.0.1:{server.port}"
    server.env, server.data_dir, server.namespace = env, data_dir, namespace
    server.children = []
    yield server
    for child in server.children:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    server.stop()


def _spawn(server: Any, name: str, *args: str) -> subprocess.Popen[bytes]:
    log = open(server.data_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child writes to it
    child = subprocess.Popen([sys.executable, "-m", "celery", "-A", "signalbox", "--quiet", *args], cwd=ROOT,
                             env=server.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    log.close()
    server.children.append(child)
    return child


def _row(page: Any, role: str, state: str | None = None) -> Any:
    selector = f'#processes tbody tr[data-role="{role}"]' + (f'[data-state="{state}"]' if state else "")
    return page.locator(selector)


def test_the_node_page_shows_each_process_and_the_tick_honestly(chromium, deployment, redis_client):
    page = login(chromium, deployment, "admin")
    try:
        page.get_by_role("link", name="Node").click()
        page.wait_for_url(f"{deployment.url}/console/node/")
        expect(page.locator("#live")).to_have_attribute("data-state", "connected")
        # only the gateway runs: the web process is listed, worker, beat and STOMP listener are not running
        web = _row(page, "web", "running")
        expect(web).to_have_count(1)
        expect(web).to_contain_text(str(deployment.process.pid))
        for role in ("worker", "beat", "stomp"):
            expect(_row(page, role, "absent")).to_contain_text("none running")
        expect(page.locator('[data-tick="age"]')).to_have_text("never")
        expect(page.locator('[data-tick="status"]')).to_contain_text("stale")

        worker = _spawn(deployment, "worker", "worker", "--pool", "solo", "--hostname",
                        f"node-test-{uuid.uuid4().hex[:6]}@%h")
        beat = _spawn(deployment, "beat", "beat", "--schedule", str(deployment.data_dir / "beat-schedule"))
        stomp = wait_listening(spawn_stomp_listener(deployment.data_dir, deployment.namespace,
                                                    SIGNALBOX_HEARTBEAT_SECONDS="1"))
        deployment.children.append(stomp.process)
        for role, pid in (("worker", worker.pid), ("beat", beat.pid), ("stomp", stomp.process.pid)):
            row = _row(page, role, "running")
            expect(row).to_have_count(1, timeout=60_000)  # Celery starts slowly on a busy machine
            expect(row).to_contain_text(str(pid))
            expect(_row(page, role, "absent")).to_have_count(0)
        expect(_row(page, "worker")).to_contain_text("node-test-")  # the worker's Celery hostname
        # beat sends the tick every second and the worker runs it
        expect(page.locator('[data-tick="status"]')).to_contain_text("alive", timeout=30_000)
        expect(page.locator('[data-tick="age"]')).to_contain_text("s ago")

        # the figures are Redis's own
        data = page.evaluate('SB.api("GET", "console/node")')
        assert data["redis"]["memory"]["max"] == int(redis_client.config_get("maxmemory")["maxmemory"])
        assert data["redis"]["aof"]["enabled"] == bool(redis_client.info("persistence")["aof_enabled"])
        assert data["redis"]["clients"]["connected"] >= 4  # at least the gateway, worker, beat, listener
        assert data["broker_memory"]["limit"] > 0
        expect(page.locator('[data-fact="clients"]')).not_to_have_text("–")
        if os.environ.get("SIGNALBOX_NODE_SCREENSHOT"):
            page.screenshot(path=os.environ["SIGNALBOX_NODE_SCREENSHOT"], full_page=True)

        # beat dies without a word: missing after three missed heartbeats, and the tick goes stale
        os.killpg(beat.pid, signal.SIGKILL)
        beat.wait(10)
        expect(_row(page, "beat", "missing")).to_contain_text(str(beat.pid), timeout=8000)
        expect(_row(page, "beat", "absent")).to_have_count(1)
        expect(page.locator('[data-tick="status"]')).to_contain_text("stale", timeout=15_000)
        expect(page.locator("#tick-problem")).to_contain_text("Celery beat or every worker has stopped")

        # the worker is stopped in order: it says so on its way out
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
        expect(_row(page, "worker", "stopped")).to_contain_text(str(worker.pid), timeout=8000)
        expect(_row(page, "worker", "absent")).to_have_count(1)
        expect(_row(page, "web", "running")).to_have_count(1)
    finally:
        page.context.close()


def test_the_node_page_and_endpoint_are_for_staff_only(chromium, deployment):
    page = login(chromium, deployment, "reader")
    try:
        expect(page.get_by_role("link", name="Node")).to_have_count(0)
        response = page.goto(f"{deployment.url}/console/node/")
        assert response.status == 403
        status = page.evaluate('fetch("/api/v1/console/node").then((r) => r.status)')
        assert status == 403
    finally:
        page.context.close()
