"""A browser subscribes: a page using @stomp/stompjs (npm, installed by signalbox.sh) in Debian's headless
Chromium, driven by Playwright, connects to the live gateway, subscribes, receives, acknowledges and
answers. Skipped only where Chromium or the npm package is not installed (CI installs both)."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest

from signalbox.embedded_redis import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
STOMPJS = ROOT / "node_modules" / "@stomp" / "stompjs" / "bundles" / "stomp.umd.min.js"
PAGE = Path(__file__).with_name("browser") / "stomp_page.html"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class _Files(http.server.SimpleHTTPRequestHandler):
    """Serves the page and the stompjs bundle (the page's origin is this server's, 127.0.0.1)."""

    def translate_path(self, path: str) -> str:
        name = path.split("?", 1)[0]
        if name == "/stomp.umd.min.js":
            return str(STOMPJS)
        return str(PAGE)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def page_server():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (.ci/apt-packages lists it)")
    if not STOMPJS.exists():
        pytest.skip("@stomp/stompjs is not installed (signalbox.sh test runs npm ci)")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), functools.partial(_Files))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def page_gateway(gateway_data, page_server):
    """A gateway that lets the page open WebSockets: the page comes from another port of 127.0.0.1, another
    origin, which is refused unless SIGNALBOX_ALLOWED_ORIGINS lists it (docs/websocket.md)."""
    from tests.helpers.gateway_server import start_gateway

    data_dir, namespace = gateway_data
    server = start_gateway(data_dir, namespace, name="browser", SIGNALBOX_ALLOWED_ORIGINS=page_server)
    yield server
    server.stop()


@pytest.mark.parametrize("endpoint", ["web server", "listener port"])
def test_a_stompjs_page_in_chromium_subscribes_receives_acks_and_replies(page_gateway, page_server, clients,
                                                                           broker, endpoint, request):
    """Over the web server's /stomp, and over the STOMP listener's WebSocket port (ActiveMQ's ws://
    connector, which a page of any origin may use: it logs in with CONNECT's credentials, no cookie)."""
    from playwright.sync_api import sync_playwright

    if endpoint == "web server":
        url = f"ws://127.0.0.1:{page_gateway.port}/stomp"
    else:
        url = f"ws://127.0.0.1:{request.getfixturevalue('stomp_listener').ws_port}/stomp"

    name = f"browser.{uuid.uuid4().hex[:8]}"
    queue = f"/queue/{name}"
    replies = f"/queue/browser.replies.{uuid.uuid4().hex[:8]}"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            page.goto(f"{page_server}/page.html?broker={url}&queue={queue}")
            page.wait_for_function("window.subscribed === true", timeout=15_000)
            assert page.evaluate("window.connected.version") == "1.2"

            producer = clients()
            producer.receipt(producer.conn.subscribe, replies, id="replies")
            producer.conn.send(queue, "hello browser", headers={"persistent": "true", "reply-to": replies,
                                                               "region": "eu"})
            page.wait_for_function("window.received.length === 1", timeout=10_000)
            (received,) = page.evaluate("window.received")
            assert received["body"] == "hello browser"
            assert received["headers"]["destination"] == queue
            assert received["headers"]["persistent"] == "true"
            assert received["headers"]["region"] == "eu"
            assert producer.expect("MESSAGE").body == b"pong: hello browser"
            assert page.evaluate("window.errors") == []
            deadline = time.monotonic() + 5  # the page's ACK is on its way
            while broker.stats(f"queue://{name}").queue_size and time.monotonic() < deadline:
                time.sleep(0.05)
            assert broker.stats(f"queue://{name}").queue_size == 0
        finally:
            browser.close()
