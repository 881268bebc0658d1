"""The WebSocket Origin check over a real socket (issue 21 §4): a browser sends the console's session
cookie to every port of the host, so only a page of this very server (scheme, host and port) or of a
configured origin may open a session-authenticated WebSocket."""

from __future__ import annotations

import json
import re
import uuid

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.helpers.gateway_server import prepare_database, start_gateway

pytestmark = pytest.mark.e2e


def _start(tmp_path_factory, name: str, **env: str):
    data_dir = tmp_path_factory.mktemp(name)
    namespace = f"t{uuid.uuid4().hex[:12]}"
    prepare_database(data_dir, namespace)
    return start_gateway(data_dir, namespace, name=name, **env)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    gateway = _start(tmp_path_factory, "origin")
    try:
        yield gateway
    finally:
        gateway.stop()


def session_cookie(port: int) -> str:
    """Log alice in through the admin's login form, as a browser would: the console's session cookie."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        page = http.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        done = http.post("/admin/login/", data={"username": "alice", "password": "secret",
                                                "csrfmiddlewaretoken": token, "next": "/admin/"})
        assert done.status_code == 302, done.text
        return http.cookies["sessionid"]


def send_over_session(port: int, origin: str | None, cookie: str) -> dict:
    """Open /ws/v1 with the cookie (and Origin), send without logging in: the session is the login."""
    headers = {"Cookie": f"sessionid={cookie}"}
    with connect(f"ws://127.0.0.1:{port}/ws/v1", origin=origin, additional_headers=headers,
                 open_timeout=5) as ws:
        ws.send(json.dumps({"type": "send", "id": 1, "destination": "queue://origin.check",
                            "message": {"body": "x"}}))
        return json.loads(ws.recv(timeout=5))


def test_a_page_on_another_port_of_the_same_host_is_refused(server):
    cookie = session_cookie(server.port)
    for origin in ("http://127.0.0.1:9999", "https://127.0.0.1:" + str(server.port), "http://127.0.0.1",
                   "http://evil.example:" + str(server.port), "null"):
        with pytest.raises(InvalidStatus) as refused:
            send_over_session(server.port, origin, cookie)
        assert refused.value.response.status_code == 403, origin


def test_a_page_of_this_server_and_a_client_without_origin_are_accepted(server):
    cookie = session_cookie(server.port)
    for origin in (f"http://127.0.0.1:{server.port}", f"http://localhost:{server.port}", None):
        answer = send_over_session(server.port, origin, cookie)
        assert answer["type"] == "ok" and answer["id"] == 1, (origin, answer)


def test_configured_origins_replace_the_derived_ones(tmp_path_factory):
    gateway = _start(tmp_path_factory, "origin-configured",
                     SIGNALBOX_ALLOWED_ORIGINS="https://console.example.com, http://127.0.0.1:9999")
    try:
        cookie = session_cookie(gateway.port)
        assert send_over_session(gateway.port, "http://127.0.0.1:9999", cookie)["type"] == "ok"
        assert send_over_session(gateway.port, "https://console.example.com:443", cookie)["type"] == "ok"
        with pytest.raises(InvalidStatus):
            send_over_session(gateway.port, f"http://127.0.0.1:{gateway.port}", cookie)
    finally:
        gateway.stop()
