"""ActiveMQ's /api/message GET answers before it settles (gateway/api/after_write.py), over real gateway
processes: one killed with SIGKILL between writing a GET's answer and settling its message loses nothing,
and a client's GETs one after the other are never refused as concurrent.

The doomed gateway reaches Redis through a TCP proxy (tests/helpers/redis_proxy.py) that stops one
connection at the GET's settlement (the command ending the consumer's turn): either before Redis gets it
(the process dies after the write, before the settlement: the message must come back, redelivered) or
after Redis ran it, holding its reply (had the settlement gone before the write, as it once did, the
process would die acknowledged and unanswered: the message lost). The native API's receive for an
ack-mode-auto consumer is settled the same way, and tested the same way."""

from __future__ import annotations

import base64
import os
import time
import uuid

import httpx
import pytest

from broker_core.scripts.library import script
from tests.helpers.gateway_server import ALICE_TOKEN, prepare_database, spawn_gateway, wait_listening
from tests.helpers.redis_proxy import RedisProxy

pytestmark = pytest.mark.e2e

TOKEN = {"Authorization": f"Token {ALICE_TOKEN}"}
BASIC = {"Authorization": "Basic " + base64.b64encode(b"alice:secret").decode()}
LEASE_MS = 2000  # the doomed gateway's compat consumers lapse this soon after it dies


@pytest.fixture
def gateways(tmp_path, redis_url):
    """(doomed, survivor, proxy): a gateway reaching Redis through the proxy, with a short compat lease,
    and one reaching it directly, on one fresh database and namespace."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    prepare_database(tmp_path, namespace)
    proxy = RedisProxy(redis_url)
    doomed = spawn_gateway(tmp_path, namespace, "doomed", REDIS_URL=proxy.url,
                           SIGNALBOX_COMPAT_LEASE_MS=str(LEASE_MS))
    survivor = spawn_gateway(tmp_path, namespace, "survivor")
    try:
        wait_listening(doomed)
        wait_listening(survivor)
        yield doomed, survivor, proxy
    finally:
        doomed.kill()
        survivor.stop()
        proxy.close()
    assert "Traceback" not in survivor.output(), survivor.output()


def _redelivered(http: httpx.Client, queue: str, wait_s: float) -> list[dict]:
    """What a new consumer of `queue` receives within `wait_s` (its long poll also closes lapsed consumers,
    which gives their messages back)."""
    made = http.post(f"/api/v1/queues/{queue}/consumers", headers=TOKEN, json={})
    assert made.status_code == 201, made.text
    receive = f"/api/v1/queues/{queue}/consumers/{made.json()['consumer_id']}/receive"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        got = http.post(receive, params={"max_messages": 10, "wait": 1}, headers=TOKEN)
        assert got.status_code == 200, got.text
        if got.json()["messages"]:
            return got.json()["messages"]
    return []


@pytest.mark.parametrize("client", ["clientId=k", "session"], ids=["lean-path", "django-path"])
@pytest.mark.parametrize("where", ["request", "reply"])
def test_a_gateway_killed_around_the_settlement_loses_nothing(gateways, where, client):
    doomed, survivor, proxy = gateways
    queue = f"compat.kill.{uuid.uuid4().hex[:8]}"
    url = f"/api/message/{queue}?type=queue&readTimeout=2000"
    with (httpx.Client(base_url=f"http://127.0.0.1:{doomed.port}", timeout=4) as doomed_http,
          httpx.Client(base_url=f"http://127.0.0.1:{survivor.port}", timeout=30) as http):
        sent = http.post(f"/api/v1/queues/{queue}/messages", headers=TOKEN, json={"body": "keep me"})
        assert sent.status_code == 201, sent.text
        if client != "session":  # (without clientId the first GET makes the session: Django's path)
            url += "&" + client
        # the settlement: the command that ends this queue's consumer's turn
        proxy.stop_at((b"{q:" + queue.encode() + b"}", b":turn\r\n"), where)
        try:
            got = doomed_http.get(url, headers=BASIC)
        except httpx.TransportError as exc:  # (no answer before the settlement: the old order)
            got = exc
        assert proxy.stopped.wait(10), "the GET never settled"
        doomed.kill()  # SIGKILL: after the write, and before (or, "reply", unaware of) the settlement
        answered = [got.text] if isinstance(got, httpx.Response) and got.status_code == 200 else []
        again = _redelivered(http, queue, 2 * LEASE_MS / 1000 + 4)
        assert answered + [m["body"] for m in again], f"lost: acknowledged, never answered ({got!r})"
        assert answered == ["keep me"], f"not answered before the settlement: {got!r}"
        if where == "request":  # never acknowledged: the lease gives it back, marked redelivered
            seen = [(m["body"], m["redelivered"], m["delivery_count"]) for m in again]
            assert seen == [("keep me", True, 2)]
        else:  # acknowledged once it was written: delivered once
            assert again == []
            stats = http.get(f"/api/v1/queues/{queue}", headers=TOKEN).json()
            assert (stats["queue_size"], stats["in_flight"], stats["dequeued"]) == (0, 0, 1)


@pytest.fixture
def gateway_for_turns(tmp_path, redis_url):
    namespace = f"t{uuid.uuid4().hex[:12]}"
    prepare_database(tmp_path, namespace)
    server = wait_listening(spawn_gateway(tmp_path, namespace, "turns"))
    try:
        yield server
    finally:
        server.stop()
    assert "Traceback" not in server.output(), server.output()


@pytest.mark.parametrize("client", ["clientId=k", "session"], ids=["lean-path", "django-path"])
def test_back_to_back_gets_of_one_client_are_never_refused_as_concurrent(gateway_for_turns, client):
    """Each GET's settlement (which ends the consumer's turn) goes after its answer: the client's next GET,
    sent the moment the answer arrives, must still find the turn free."""
    queue = f"compat.turns.{uuid.uuid4().hex[:8]}"
    n = int(os.environ.get("SIGNALBOX_TEST_BACK_TO_BACK", "300"))
    with httpx.Client(base_url=f"http://127.0.0.1:{gateway_for_turns.port}", timeout=30) as http:
        sent = http.post(f"/api/v1/queues/{queue}/messages", headers=TOKEN,
                         json={"messages": [{"body": f"m{i}"} for i in range(n)]})
        assert sent.status_code == 201, sent.text
        url = f"/api/message/{queue}?type=queue&readTimeout=2000"
        if client != "session":
            url += "&" + client
        bodies = []
        for _ in range(n):  # one keep-alive connection, the session cookie kept by the client
            got = http.get(url, headers=BASIC)
            assert got.status_code == 200, (len(bodies), got.status_code, got.text)
            bodies.append(got.text)
        assert bodies == [f"m{i}" for i in range(n)]
        stats = http.get(f"/api/v1/queues/{queue}", headers=TOKEN).json()
        assert (stats["queue_size"], stats["in_flight"], stats["dequeued"]) == (0, 0, n)


# -- the native API's receive, ack mode auto: acknowledged once its answer is written too ---------------

@pytest.mark.parametrize("path", ["lean", "django"])
@pytest.mark.parametrize("stop", ["receive-reply", "ack-request", "ack-reply"])
def test_a_gateway_killed_around_an_auto_consumers_receive_loses_nothing(gateways, stop, path):
    """receive-reply: killed once Redis handed the message over, before the answer was written (the receive
    script acknowledged it there, once: lost); ack-request: after the write, before the ack reached Redis;
    ack-reply: after the ack ran."""
    doomed, survivor, proxy = gateways
    queue = f"native.kill.{uuid.uuid4().hex[:8]}"
    with (httpx.Client(base_url=f"http://127.0.0.1:{doomed.port}", timeout=4) as doomed_http,
          httpx.Client(base_url=f"http://127.0.0.1:{survivor.port}", timeout=30) as http):
        made = doomed_http.post(f"/api/v1/queues/{queue}/consumers", headers=TOKEN,
                                json={"ack_mode": "auto", "lease_ms": LEASE_MS})
        assert made.status_code == 201, made.text
        consumer_id = made.json()["consumer_id"]
        sent = http.post(f"/api/v1/queues/{queue}/messages", headers=TOKEN, json={"body": "keep me"})
        assert sent.status_code == 201, sent.text
        message_id = sent.json()["message_ids"][0].encode()
        call, where = stop.split("-")
        # the receive: the receive script's call naming the consumer; the ack: the one naming the message
        receive = (consumer_id.encode(), script("receive").function.encode())
        proxy.stop_at(receive if call == "receive" else (message_id, b"individual"), where)
        wait = 0 if path == "lean" else 2  # (a receive that waits goes to Django's handler, hot_path.py)
        try:
            got = doomed_http.post(f"/api/v1/queues/{queue}/consumers/{consumer_id}/receive",
                                   params={"wait": wait}, headers=TOKEN)
        except httpx.TransportError as exc:
            got = exc
        proxy.stopped.wait(3)
        doomed.kill()
        answered = ([m["body"] for m in got.json()["messages"]]
                    if isinstance(got, httpx.Response) and got.status_code == 200 else [])
        again = _redelivered(http, queue, 2 * LEASE_MS / 1000 + 4)
        assert answered + [m["body"] for m in again], f"lost: acknowledged, never answered ({got!r})"
        assert proxy.stopped.is_set(), "the stop was never reached"
        assert answered == ([] if call == "receive" else ["keep me"]), got
        if where == "request" or call == "receive":  # never acknowledged: redelivered
            assert [(m["body"], m["redelivered"]) for m in again] == [("keep me", True)]
        else:
            assert again == []
            stats = http.get(f"/api/v1/queues/{queue}", headers=TOKEN).json()
            assert (stats["queue_size"], stats["in_flight"], stats["dequeued"]) == (0, 0, 1)
