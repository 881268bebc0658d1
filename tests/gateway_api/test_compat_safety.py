"""ActiveMQ's /api/message GET must neither lose a message nor let its properties inject headers (issue
21 §3). Over a real uvicorn server: what a client receives is what the HTTP server really sent, and a
header the server refuses (NUL) or obeys (Content-Length) shows as it would to a client. In process:
an answer that fails to build, a process that died holding a message, the console's cookie."""

from __future__ import annotations

import base64
import uuid
from urllib.parse import unquote

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_core import turns
from broker_core.broker import AsyncBroker
from gateway.api import compat, compat_headers
from tests.gateway_api.mixins import assert_problem, blocking
from tests.helpers.gateway_server import ALICE_TOKEN, own_gateway

TOKEN = {"Authorization": f"Token {ALICE_TOKEN}"}
BASIC = {"Authorization": "Basic " + base64.b64encode(b"alice:secret").decode()}


def decoded(value: str) -> str:
    """What a client does with a header value (docs/api.md): RFC 8187 ext-values are decoded."""
    return unquote(value[len("UTF-8''"):], errors="strict") if value.startswith("UTF-8''") else value


# -- the mapping itself -----------------------------------------------------------------------------

@given(st.text())
@settings(max_examples=300, deadline=None)
def test_every_value_becomes_a_safe_header_that_decodes_back(text):
    value = compat_headers.header_value(text)
    assert value.isascii() and value.isprintable()  # no CR, LF, NUL or other control, no non-ASCII
    assert value == value.strip()
    assert decoded(value) == text


def test_names_that_are_not_tokens_or_are_reserved_are_omitted():
    headers, omitted = compat_headers.property_headers({
        "region": "eu", "Set-Cookie": "s=1", "transfer-encoding": "chunked", "ID": "ID:spoof",
        "Content-Length": "1", "content-type": "text/html", "Location": "http://evil", "bad name": "x",
        "crlf\r\nx": "y", "Access-Control-Allow-Origin": "*", "n": 5, "flag": True, "x" * 300: "long",
        "big": "v" * (compat_headers.MAX_PROPERTY_HEADER_BYTES + 1)})
    assert headers == [("region", "eu"), ("n", "5"), ("flag", "true")]
    assert set(omitted) == {"Set-Cookie", "transfer-encoding", "ID", "Content-Length", "content-type",
                            "Location", "bad name", "crlf\r\nx", "Access-Control-Allow-Origin", "x" * 300,
                            "big"}
    listed = compat_headers.omitted_header(omitted)
    assert listed.isascii() and listed.isprintable() and "bad%20name" in listed and "crlf%0D%0Ax" in listed


# -- over a real server -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with own_gateway(tmp_path_factory.mktemp("compat-gateway"), "compat") as gateway:
        yield gateway


@pytest.fixture
def http(server):
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=30) as client:
        yield client


HOSTILE = [  # (property name, value): each broke or spoofed the answer before
    ("note", "line one\r\nSet-Cookie: stolen=1"),  # was a 500, the message gone
    ("nul", "before\x00after"),  # the server dropped the connection, the message gone
    ("Content-Length", "1"),  # the body was cut to one byte
    ("Transfer-Encoding", "chunked"),
    ("Set-Cookie", "sessionid=attacker"),
    ("id", "ID:spoofed"),
    ("greeting", "grüß dich ☃"),
    ("padded", "  x  "),
    ("looks_encoded", "UTF-8''%41"),
]


@pytest.mark.e2e
@pytest.mark.parametrize("name,value", HOSTILE, ids=[name for name, _ in HOSTILE])
def test_hostile_properties_are_delivered_safely_and_the_message_acknowledged(server, http, name, value):
    queue = f"compat.hostile.{uuid.uuid4().hex[:8]}"
    body = f"body of {name} " + "z" * 50
    response = http.post(f"/api/v1/queues/{queue}/messages", headers=TOKEN,
                         json={"body": body, "properties": {name: value, "kept": "yes"}})
    assert response.status_code == 201, response.text
    message_id = response.json()["message_ids"][0]
    got = http.get(f"/api/message/{queue}", params={"type": "queue", "readTimeout": "2000",
                                                    "clientId": "hostile"}, headers=BASIC)
    assert got.status_code == 200, (got.status_code, got.text)
    assert got.text == body  # whole, not cut by a Content-Length property
    assert got.headers["id"] == message_id  # not spoofed
    assert got.headers["kept"] == "yes"
    assert "set-cookie" not in got.headers and "transfer-encoding" not in got.headers
    assert got.headers["content-length"] == str(len(body))
    lowered = name.lower()
    if lowered in compat_headers.RESERVED_HEADERS or lowered.startswith(compat_headers.RESERVED_PREFIXES):
        assert unquote(got.headers[compat_headers.OMITTED_HEADER]) == name
    else:
        assert decoded(got.headers[name]) == value
    stats = http.get(f"/api/v1/queues/{queue}", headers=TOKEN).json()
    assert (stats["queue_size"], stats["in_flight"], stats["dequeued"]) == (0, 0, 1)  # acknowledged once


@pytest.mark.e2e
def test_a_head_request_consumes_nothing(server, http):
    """HEAD is answered without a body (the HTTP server drops it): a HEAD answered as a GET took the message,
    acknowledged it, and sent none of it. It is refused, and the message stays for a GET."""
    queue = f"compat.head.{uuid.uuid4().hex[:8]}"
    sent = http.post(f"/api/v1/queues/{queue}/messages", headers=TOKEN, json={"body": "kept"})
    assert sent.status_code == 201
    params = {"type": "queue", "readTimeout": "2000", "clientId": "head"}
    head = http.head(f"/api/message/{queue}", params=params, headers=BASIC)
    assert head.status_code == 405
    assert "HEAD" not in head.headers["allow"] and "GET" in head.headers["allow"]
    stats = http.get(f"/api/v1/queues/{queue}", headers=TOKEN).json()
    assert (stats["queue_size"], stats["in_flight"], stats["dequeued"]) == (1, 0, 0)
    got = http.get(f"/api/message/{queue}", params=params, headers=BASIC)
    assert (got.status_code, got.text) == (200, "kept")
    assert "redelivered" not in got.headers or got.headers["redelivered"] == "false"


# -- in process: failures while answering, and the cookie --------------------------------------------

pytestmark_db = pytest.mark.django_db(transaction=True)


@pytest.fixture
def basic(make_user):
    make_user("amq", [("queue://>", "admin")])
    return {"Authorization": "Basic " + base64.b64encode(b"amq:pw").decode()}


async def _stats(api, make_user, queue: str) -> dict:
    root = await blocking(make_user)(f"root{uuid.uuid4().hex[:6]}", superuser=True)
    return (await api.get(f"/api/v1/queues/{queue}", headers=root)).json()


@pytestmark_db
async def test_an_answer_that_fails_to_build_gives_the_message_back(api, basic, make_user, monkeypatch):
    await api.post("/api/message/orders.fail?type=queue", content="keep me", headers=basic)

    def broken(delivery, params):
        raise RuntimeError("rendering failed")

    with monkeypatch.context() as patch:
        patch.setattr(compat, "answer", broken)
        failed = await api.get("/api/message/orders.fail?type=queue&clientId=c&readTimeout=1000",
                               headers=basic)
    assert_problem(failed, 500, "internal_error")
    again = await api.get("/api/message/orders.fail?type=queue&clientId=c&readTimeout=3000", headers=basic)
    assert (again.status_code, again.text) == (200, "keep me")  # redelivered, not lost
    stats = await _stats(api, make_user, "orders.fail")
    assert (stats["queue_size"], stats["in_flight"]) == (0, 0)


@pytestmark_db
async def test_a_message_held_by_a_request_that_died_is_given_back_by_the_next(api, basic, make_user,
                                                                              monkeypatch):
    await api.post("/api/message/orders.crash?type=queue", content="survivor", headers=basic)

    class Died(BaseException):
        """The process dying between receiving and answering: nothing acks or nacks."""

    def died(*_args, **_kwargs):
        raise Died

    with monkeypatch.context() as patch:
        patch.setattr(compat, "answer", died)  # dies while building the answer...
        patch.setattr(AsyncBroker, "nack", died)  # ... before it can give the message back
        with pytest.raises(Died):
            await api.get("/api/message/orders.crash?type=queue&clientId=c&readTimeout=1000", headers=basic)
    assert (await _stats(api, make_user, "orders.crash"))["in_flight"] == 1
    got = await api.get("/api/message/orders.crash?type=queue&clientId=c&readTimeout=3000", headers=basic)
    assert (got.status_code, got.text) == (200, "survivor")
    stats = await _stats(api, make_user, "orders.crash")
    assert (stats["queue_size"], stats["in_flight"]) == (0, 0)


@pytestmark_db
@pytest.mark.parametrize("lean", [True, False], ids=["lean-path", "django-path"])
async def test_an_ack_that_fails_after_the_answer_was_written_gives_the_message_back(
        api, basic, make_user, settings, monkeypatch, lean):
    """The answer goes out first (gateway/api/after_write.py); its ack failing then cannot take the message
    back from the client, so it is given back to the queue: delivered again, at least once."""
    settings.SIGNALBOX_API_HOT_PATH = lean
    queue = f"orders.ackfail{int(lean)}"
    url = f"/api/message/{queue}?type=queue&clientId=c&readTimeout=1000"
    empty = await api.get(url.replace("=1000", "=10"), headers=basic)  # the consumer made, credentials cached
    assert empty.status_code == 204
    await api.post(f"/api/message/{queue}?type=queue", content="twice", headers=basic)

    async def refused(*_args, **_kwargs):
        raise ConnectionError("the ack never reached Redis")

    with monkeypatch.context() as patch:
        patch.setattr(turns, "settle", refused)
        first = await api.get(url, headers=basic)
    assert (first.status_code, first.text) == (200, "twice")  # written before the ack was tried
    again = await api.get(url, headers=basic)  # the turn ended: not refused as concurrent
    assert (again.status_code, again.text) == (200, "twice")
    stats = await _stats(api, make_user, queue)
    assert (stats["queue_size"], stats["in_flight"], stats["dequeued"]) == (0, 0, 1)


@pytestmark_db
async def test_the_console_session_cookie_does_not_consume(api, make_user):
    headers = await blocking(make_user)("eve", [("queue://orders.>", "admin")])
    await api.post("/api/message/orders.csrf?type=queue", content="not for a cross-site link",
                   headers=headers)
    from django.test import Client

    client = Client()
    await blocking(client.login)(username="eve", password="pw")
    api.cookies.set("sessionid", client.cookies["sessionid"].value)
    assert (await api.get("/api/v1/destinations")).status_code == 200  # the console's API takes it
    refused = await api.get("/api/message/orders.csrf?type=queue&readTimeout=100")
    assert_problem(refused, 401, "not_authenticated")
    api.cookies.clear()
    stats = await _stats(api, make_user, "orders.csrf")
    assert stats["queue_size"] == 1  # still there


@pytestmark_db
async def test_a_page_of_another_site_cannot_use_remembered_basic_credentials(api, basic, make_user):
    # a browser sends the Basic credentials it remembers with a cross-site link, image or form too; it
    # also says where the request comes from (Sec-Fetch-Site), which clients such as curl never send
    await api.post("/api/message/orders.site?type=queue", content="stays", headers=basic)
    for site in ("cross-site", "same-site"):  # same-site: another port of the host is one
        got = await api.get("/api/message/orders.site?type=queue&readTimeout=100",
                            headers={**basic, "Sec-Fetch-Site": site})
        assert_problem(got, 403, "cross_site_request")
        sent = await api.post("/api/message/orders.site?type=queue", content="injected",
                              headers={**basic, "Sec-Fetch-Site": site})
        assert_problem(sent, 403, "cross_site_request")
    assert (await _stats(api, make_user, "orders.site"))["queue_size"] == 1
    mine = await api.get("/api/message/orders.site?type=queue&readTimeout=1000",
                         headers={**basic, "Sec-Fetch-Site": "same-origin"})
    assert (mine.status_code, mine.text) == (200, "stays")
