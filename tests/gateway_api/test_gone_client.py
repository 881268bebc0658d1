"""An answer carrying a leased message whose client has gone is given back, never acknowledged
(gateway/api/after_write.py), over real gateway processes and real sockets.

The client is a raw socket that sends its request and closes. The gateway reaches Redis through a TCP proxy
(tests/helpers/redis_proxy.py) that holds the reply carrying the message until the gateway has seen the
client leave, so the order is certain, not a race: the client is gone before the answer is written (the
lean paths: uvicorn's `send` then drops it silently), or while the request waits for its message (a long
poll, Django's handler: it cancels the request). Either way the message must come back, receivable by
another consumer, marked redelivered (given back as a `nack`), and never counted as dequeued. Both of
uvicorn's HTTP implementations: httptools (what `run` uses) and h11. (The auto consumer's long poll was
given back before too: it stays as a guard; every other case failed on the old code, lost or left
leased.)"""

from __future__ import annotations

import base64
import socket
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.helpers.gateway_server import ALICE_TOKEN, prepare_database, spawn_gateway, wait_listening
from tests.helpers.redis_proxy import RedisProxy

pytestmark = pytest.mark.e2e

TOKEN = {"Authorization": f"Token {ALICE_TOKEN}"}
BASIC = {"Authorization": "Basic " + base64.b64encode(b"alice:secret").decode()}
# time for the gateway to see a closed connection (its event loop is idle then, waiting for Redis)
SEEN_CLOSED_S = 0.3


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("gone")
    namespace = f"t{uuid.uuid4().hex[:12]}"
    prepare_database(data_dir, namespace)
    return data_dir, namespace


@pytest.fixture(scope="module")
def survivor(database):
    """A gateway reaching Redis directly: the test's own view of the broker."""
    data_dir, namespace = database
    server = wait_listening(spawn_gateway(data_dir, namespace, "survivor"))
    yield server
    server.stop()
    assert "Traceback" not in server.output(), server.output()


@pytest.fixture(scope="module", params=["httptools", "h11"])
def held(request, database, redis_url):
    """(gateway, proxy): a gateway with uvicorn's `param` HTTP implementation reaching Redis through the
    proxy."""
    data_dir, namespace = database
    proxy = RedisProxy(redis_url)
    server = wait_listening(spawn_gateway(data_dir, namespace, f"held-{request.param}", http=request.param,
                                          REDIS_URL=proxy.url))
    yield server, proxy
    server.stop()
    proxy.close()
    assert "Traceback" not in server.output(), server.output()


def _request(port: int, method: str, target: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Length: 0",
             *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _leave_as_the_message_comes(gateway, proxy: RedisProxy, request: bytes, body: bytes, produce) -> None:
    """Send `request` on a raw socket; `produce()` the message; once Redis's reply carrying it is held on its
    way to the gateway, close the socket, give the gateway time to see that, and let the reply go on."""
    proxy.hold_reply((body,))
    client = socket.create_connection(("127.0.0.1", gateway.port))
    try:
        client.sendall(request)
        produce()
        assert proxy.held.wait(10), "the message never reached the gateway"
    finally:
        client.close()
    time.sleep(SEEN_CLOSED_S)
    proxy.release()


def _settled(http: httpx.Client, queue: str) -> tuple[int, int]:
    """(in flight, dequeued) once nothing is in flight (the gateway has settled), or after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        stats = http.get(f"/api/v1/queues/{queue}", headers=TOKEN).json()
        if stats["in_flight"] == 0 or time.monotonic() > deadline:
            return stats["in_flight"], stats["dequeued"]
        time.sleep(0.05)


def _received_elsewhere(http: httpx.Client, queue: str) -> list[tuple[str, bool, int]]:
    """What a new consumer of `queue` receives within a few seconds (a nack's redelivery delay included)."""
    made = http.post(f"/api/v1/queues/{queue}/consumers", headers=TOKEN, json={"prefetch": 0})
    assert made.status_code == 201, made.text
    got = http.post(f"/api/v1/queues/{queue}/consumers/{made.json()['consumer_id']}/receive",
                    params={"max_messages": 10, "wait": 5}, headers=TOKEN)
    assert got.status_code == 200, got.text
    return [(m["body"], m["redelivered"], m["delivery_count"]) for m in got.json()["messages"]]


def _send(http: httpx.Client, queue: str, body: str):
    def produce() -> None:
        sent = http.post(f"/api/v1/queues/{queue}/messages", headers=TOKEN, json={"body": body})
        assert sent.status_code == 201, sent.text
    return produce


@pytest.mark.parametrize(("read_timeout", "browser"), [(0, False), (0, True), (10_000, False)],
                         ids=["lean-at-once", "django-at-once", "django-long-poll"])
def test_a_compat_get_whose_client_left_gives_its_message_back(held, survivor, read_timeout, browser):
    """at-once: the message is there when the GET comes. On the lean path (compat_hot.py) the client is gone
    before the answer is written; on Django's (a browser's same-origin request goes there) the request is
    cancelled while its turn's call leases the message. django-long-poll: the GET waits, and the client
    leaves as the message arrives."""
    gateway, proxy = held
    queue = f"gone.compat.{uuid.uuid4().hex[:8]}"
    body = f"keep me {uuid.uuid4().hex}"
    target = f"/api/message/{queue}?type=queue&clientId=k&readTimeout={read_timeout}"
    headers = BASIC | ({"Sec-Fetch-Site": "same-origin"} if browser else {})
    with (httpx.Client(base_url=f"http://127.0.0.1:{gateway.port}", timeout=30) as gateway_http,
          httpx.Client(base_url=f"http://127.0.0.1:{survivor.port}", timeout=30) as http):
        # the consumer made and the credentials verified (cached: the next GET may take the lean path)
        first = gateway_http.get(f"/api/message/{queue}?type=queue&clientId=k&readTimeout=0", headers=BASIC)
        assert first.status_code == 204, first.text
        request = _request(gateway.port, "GET", target, headers)
        _leave_and_find_it_kept(gateway, proxy, http, queue, body, request, waits=bool(read_timeout))
        # the client's consumer is free again: its next GET is not refused as concurrent
        again = gateway_http.get(f"/api/message/{queue}?type=queue&clientId=k&readTimeout=0", headers=BASIC)
        assert again.status_code == 204, again.text


def _leave_and_find_it_kept(gateway: Any, proxy: Any, http: httpx.Client, queue: str, body: str, request: Any,
                            waits: bool) -> None:
    """The message sent (after a moment when the request `waits` for it, else first), the client leaving
    as it comes; then neither in flight nor dequeued, and another consumer gets it, redelivered."""
    produce = _send(http, queue, body)
    if waits:
        _leave_as_the_message_comes(gateway, proxy, request, body.encode(),
                                    lambda: (time.sleep(0.5), produce()))
    else:
        produce()
        _leave_as_the_message_comes(gateway, proxy, request, body.encode(), lambda: None)
    assert _settled(http, queue) == (0, 0), "(in flight, dequeued): 1 dequeued is acknowledged, never "\
                                            "written: lost; 1 in flight is left leased"
    assert _received_elsewhere(http, queue) == [(body, True, 2)]


@pytest.mark.parametrize("wait", [0, 10], ids=["lean-at-once", "django-long-poll"])
def test_an_auto_receive_whose_client_left_gives_its_message_back(held, survivor, wait):
    """The native API's receive for an ack-mode-auto consumer, as the compat GET above."""
    gateway, proxy = held
    queue = f"gone.auto.{uuid.uuid4().hex[:8]}"
    body = f"keep me {uuid.uuid4().hex}"
    with (httpx.Client(base_url=f"http://127.0.0.1:{gateway.port}", timeout=30) as gateway_http,
          httpx.Client(base_url=f"http://127.0.0.1:{survivor.port}", timeout=30) as http):
        made = gateway_http.post(f"/api/v1/queues/{queue}/consumers", headers=TOKEN,
                                 json={"ack_mode": "auto", "prefetch": 0})
        assert made.status_code == 201, made.text
        consumer_id = made.json()["consumer_id"]
        target = f"/api/v1/queues/{queue}/consumers/{consumer_id}/receive?wait={wait}"
        request = _request(gateway.port, "POST", target, TOKEN)
        _leave_and_find_it_kept(gateway, proxy, http, queue, body, request, waits=bool(wait))
