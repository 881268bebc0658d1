"""Redis goes away under a running gateway process and comes back: every adapter says the broker is
unavailable (REST 503 + Retry-After, STOMP ERROR, JSON WebSocket error, the console feed's status), and
everything resumes when Redis is back, in the same gateway process, with nothing lost.

Real parts only: a redis-server of the test's own (AOF, appendfsync always) that the test kills with
SIGKILL and starts again on the same port and data folder, a uvicorn process serving the project's ASGI
app, and clients over real sockets.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from signalbox.embedded_redis import EmbeddedRedis, free_port
from tests.helpers.gateway_server import ALICE_TOKEN, GatewayServer, prepare_database, start_gateway
from tests.helpers.stomp_client import RawStomp

pytestmark = pytest.mark.e2e

LEASE_MS = 3000  # the WebSocket consumers' lease: the dead connection's messages come back within it


def rest(server: GatewayServer, method: str, path: str, body: object = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{path}", data=data, method=method,
        headers={"Authorization": f"Token {ALICE_TOKEN}", "Content-Type": "application/json",
                 **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read() or b"null")


def console_cookie(server: GatewayServer) -> str:
    """Log in to the console as alice over HTTP; the session and CSRF cookies for the live feed."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    base = f"http://127.0.0.1:{server.port}"
    page = opener.open(f"{base}/console/login/", timeout=10).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = urllib.parse.urlencode({"username": "alice", "password": "secret",
                                   "csrfmiddlewaretoken": token}).encode()
    opener.open(urllib.request.Request(f"{base}/console/login/", data=form, headers={"Referer": base}),
                timeout=10).read()
    cookies = {cookie.name: cookie.value for cookie in jar}
    assert "sessionid" in cookies, "the console login failed"
    return "; ".join(f"{k}={v}" for k, v in cookies.items())


def next_json(ws, of_type: str, timeout: float) -> dict:
    """The next message of `of_type` on a JSON socket within `timeout` (others are skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {of_type!r} message within {timeout} s"
        message = json.loads(ws.recv(remaining))
        if message.get("type") == of_type:
            return message


def next_status(ws, broker: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        message = next_json(ws, "status", max(0.01, deadline - time.monotonic()))
        if message["broker"] == broker:
            return message


@pytest.fixture
def outage(tmp_path: Path):
    """(redis server, gateway process) on a Redis of this test's own."""
    store = EmbeddedRedis(tmp_path / "redis", port=free_port(), appendfsync="always")
    store.start()
    namespace = f"t{uuid.uuid4().hex[:12]}"
    data_dir = tmp_path / "gateway"
    prepare_database(data_dir, namespace)
    server = start_gateway(data_dir, namespace, REDIS_URL=store.url, SIGNALBOX_WS_LEASE_MS=str(LEASE_MS))
    try:
        yield store, server
    finally:
        server.stop()
        store.stop()
    assert "Traceback" not in server.output(), server.output()


def test_while_redis_is_away_every_adapter_says_so_and_all_resumes_when_it_is_back(outage):
    store, server = outage
    with contextlib.ExitStack() as stack:
        check_outage_and_recovery(store, server, stack)


def check_outage_and_recovery(store: EmbeddedRedis, server: GatewayServer,
                              stack: contextlib.ExitStack) -> None:
    queue = f"outage.{uuid.uuid4().hex[:8]}"
    sent = rest(server, "POST", f"/api/v1/queues/{queue}/messages",
                {"messages": [{"body": f"before-{i}"} for i in range(3)]})
    assert sent[0] == 201, sent

    stomp = RawStomp(f"ws://127.0.0.1:{server.port}/stomp")
    stomp.connect()
    stomp.send("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "s", "ack": "client-individual",
                             "receipt": "sub"})
    stomp.expect("RECEIPT")
    held = sorted(stomp.expect("MESSAGE").body for _ in range(3))
    assert held == [b"before-0", b"before-1", b"before-2"]  # delivered, never acknowledged

    json_ws = stack.enter_context(ws_connect(f"ws://127.0.0.1:{server.port}/ws/v1", open_timeout=5))
    json_ws.send(json.dumps({"type": "connect", "login": "alice", "passcode": "secret", "id": 1}))
    assert next_json(json_ws, "ok", 5)["id"] == 1
    json_ws.send(json.dumps({"type": "subscribe", "subscription": "j", "destination": f"queue://{queue}.json",
                             "id": 2}))
    assert next_json(json_ws, "ok", 5)["id"] == 2

    cookie = console_cookie(server)
    feed = stack.enter_context(ws_connect(f"ws://127.0.0.1:{server.port}/ws/console/events",
                                          additional_headers={"Cookie": cookie}, open_timeout=5))
    assert next_status(feed, "ok", 3)

    gateway_pid = server.process.pid
    store.process.kill()  # kill -9: no goodbye, no flush beyond what `appendfsync always` did
    store.process.wait()
    killed_at = time.monotonic()

    # STOMP: the subscriber is told at once (the wake-up subscription dropping wakes its consumer),
    # not after a lease, and the connection ends as an ERROR ends it.
    error = stomp.expect("ERROR", timeout=5)
    assert error.get("message") == "Broker unavailable", error
    assert error.get("retry-after") == "1"
    assert b"reconnect" in error.body
    assert stomp.closed_within(5)
    assert time.monotonic() - killed_at < 3

    # JSON WebSocket: the equivalent error, then the close.
    error = next_json(json_ws, "error", 5)
    assert error["code"] == "broker_unavailable", error
    with pytest.raises(ConnectionClosed):
        json_ws.recv(5)

    # The console's feed says so within two seconds.
    status = next_status(feed, "unavailable", 2.5)
    assert "unavailable" in status["detail"]
    assert time.monotonic() - killed_at < 3.5

    # REST: 503, Retry-After, a problem body naming the cause (the same on the hot path and via Django).
    for path, body in ((f"/api/v1/queues/{queue}/messages", {"body": "during"}),
                       (f"/api/v1/queues/{queue}/consumers", {}),
                       (f"/api/v1/queues/{queue}", None)):
        status_code, headers, problem = rest(server, "POST" if body is not None else "GET", path, body)
        assert status_code == 503, (path, problem)
        assert headers["Retry-After"] == "1"
        assert headers["Content-Type"] == "application/problem+json"
        assert problem["code"] == "broker_unavailable" and problem["status"] == 503
        assert "Redis" in problem["detail"]

    # Django's own pages too (the console's analytics page reads Redis): 503, not a server error.
    page = urllib.request.Request(f"http://127.0.0.1:{server.port}/console/analytics/",
                                  headers={"Cookie": cookie})
    with pytest.raises(urllib.error.HTTPError) as refused_page:
        urllib.request.urlopen(page, timeout=10)
    assert refused_page.value.code == 503 and refused_page.value.headers["Retry-After"] == "1"
    assert refused_page.value.read().startswith(b"503 Broker unavailable: the broker is unavailable")

    # A new STOMP connection is refused with the same ERROR while Redis is away.
    refused = RawStomp(f"ws://127.0.0.1:{server.port}/stomp")
    refused.send("CONNECT", {"accept-version": "1.2", "host": "localhost", "login": "alice",
                             "passcode": "secret"})
    assert refused.expect("ERROR").get("message") == "Broker unavailable"
    assert refused.closed_within(5)

    store.start()  # the same port, data folder and AOF

    # Everything resumes in the same gateway process.
    assert server.process.poll() is None and server.process.pid == gateway_pid
    assert next_status(feed, "ok", 3)
    assert next_json(feed, "totals", 5)  # the feed's own loop went on
    status_code, _, body = rest(server, "POST", f"/api/v1/queues/{queue}/messages", {"body": "after"})
    assert status_code == 201, body

    again = RawStomp(f"ws://127.0.0.1:{server.port}/stomp")
    again.connect()
    again.send("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "s", "ack": "client-individual",
                             "receipt": "sub"})
    again.expect("RECEIPT")
    # The message sent after the restart comes, and the three the dead connection held come back,
    # redelivered, at the latest when its consumer's lease lapses.
    arrived = [again.expect("MESSAGE", timeout=LEASE_MS / 1000 * 2 + 3) for _ in range(4)]
    assert sorted(m.body for m in arrived) == [b"after", *held]
    assert all((m.get("redelivered") == "true") == (m.body != b"after") for m in arrived)
    fresh_send_at = time.monotonic()
    assert rest(server, "POST", f"/api/v1/queues/{queue}/messages", {"body": "later"})[0] == 201
    assert again.expect("MESSAGE", timeout=2).body == b"later"
    assert time.monotonic() - fresh_send_at < 1.5  # woken (subscribed again), not by the idle re-check
    for message in arrived:
        again.send("ACK", {"id": message.get("ack")})
    again.close()


def test_a_redis_loading_its_data_counts_as_unavailable():
    """A restarted Redis answers LOADING until its AOF is read; broker_core's drivers raise it as redis-py
    does (BusyLoadingError, a ConnectionError), so every adapter maps it like a refused connection."""
    import redis

    from broker_core.resp import reply_error
    from gateway.api.errors import describe

    error = reply_error("LOADING Redis is loading the dataset in memory")
    assert isinstance(error, redis.BusyLoadingError)
    status, problem, headers = describe(error)
    assert (status, problem["code"], headers) == (503, "broker_unavailable", {"Retry-After": "1"})
    assert "is loading its data" in problem["detail"]


def test_each_503_for_redis_being_away_is_logged_once(outage):
    """One line per refused request, whichever path answered it (the hot path, a DRF view, a Django
    view): the warning naming the cause, not a second line for the same 503 from Django's request log."""
    store, server = outage
    queue = f"logged.{uuid.uuid4().hex[:8]}"
    cookie = console_cookie(server)
    store.process.kill()
    store.process.wait()
    requests = ((f"/api/v1/queues/{queue}/messages", {"body": "during"}),
                (f"/api/v1/queues/{queue}/consumers", {}),
                (f"/api/v1/queues/{queue}", None))
    before = len(server.output().splitlines())
    for path, body in requests:
        assert rest(server, "POST" if body is not None else "GET", path, body)[0] == 503
    page = urllib.request.Request(f"http://127.0.0.1:{server.port}/console/analytics/",
                                  headers={"Cookie": cookie})
    with pytest.raises(urllib.error.HTTPError) as refused_page:
        urllib.request.urlopen(page, timeout=10)
    assert refused_page.value.code == 503
    time.sleep(0.5)  # (the lines are written by now)
    lines = [line for line in server.output().splitlines()[before:] if line.strip()]
    assert len(lines) == len(requests) + 1, "\n".join(lines)
    assert "/console/analytics/" in lines[-1]
    assert all("Redis unavailable" in line for line in lines), "\n".join(lines)
