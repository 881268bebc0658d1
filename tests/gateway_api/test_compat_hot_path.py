"""The lean path of ActiveMQ's /api/message (gateway/api/compat_hot.py): the same answers as Django's path,
and taken only in the plain case. The same requests run with the lean paths on and off
(SIGNALBOX_API_HOT_PATH) against the real ASGI app and Redis."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from broker_core import turns
from gateway import runtime
from gateway.api import compat
from gateway.api.asgi import GatewayASGIHandler
from tests.gateway_api.mixins import blocking

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def django_path_calls(monkeypatch: pytest.MonkeyPatch, credentials_settled: None) -> list[str]:
    """Method and path of the API requests Django's handler served (a spy: the handler still runs)."""
    calls: list[str] = []
    original = GatewayASGIHandler.handle_api

    async def spy(self: Any, scope: dict[str, Any], receive: Any, send: Any) -> None:
        calls.append(f"{scope['method']} {scope['path']}")
        await original(self, scope, receive, send)

    monkeypatch.setattr(GatewayASGIHandler, "handle_api", spy)
    return calls


@pytest.fixture
def basic(make_user):
    make_user("amq", [("queue://>", "admin")])
    return {"Authorization": "Basic " + base64.b64encode(b"amq:pw").decode()}


def _comparable(response: httpx.Response, queue: str) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body, with the parts that differ between two runs made alike."""
    headers = {k.lower(): v.replace(queue, "Q") for k, v in response.headers.items()}
    for varying in ("messageid", "id", "set-cookie"):
        if varying in headers:
            headers[varying] = "..."
    headers.pop("content-length", None)  # (the body names the queue in a problem's instance)
    return response.status_code, headers, response.content.replace(queue.encode(), b"Q")


async def _flow(api: httpx.AsyncClient, basic: dict[str, str], queue: str) -> list[httpx.Response]:
    """POST (raw body, parameters as properties), a first GET (makes the session), GETs in the session
    and by clientId, with properties that must be omitted or encoded."""
    url = f"/api/message/{queue}"
    out = [await api.post(f"{url}?type=queue", content="warm", headers=basic)]  # verifies the credentials
    out.append(await api.post(f"{url}?type=queue&JMSPriority=7&JMSCorrelationID=c1&region=eu&n=1",
                              content="héllo", headers={**basic, "Content-Type": "text/plain"}))
    out.append(await api.post(url, params={"type": "queue", "body": "<?xml version='1.0'?><a/>",
                                           "JMSXGroupID": "cart", "Set-Cookie": "x", "note": "a\r\nb"},
                              headers=basic))
    first = await api.get(f"{url}?type=queue&readTimeout=1000", headers=basic)  # no cookie yet
    out.append(first)
    cookie = {"Cookie": f"JSESSIONID={first.cookies['JSESSIONID']}"}
    out.append(await api.get(f"{url}?type=queue&readTimeout=1000", headers={**basic, **cookie}))
    out.append(await api.delete(f"{url}?type=queue&readTimeout=1000&clientId=c7", headers=basic))
    out.append(await api.get(f"{url}?type=queue&readTimeout=50&clientId=c7", headers=basic))  # empty
    out.append(await api.get(f"{url}?type=queue&readTimeout=x&clientId=c7", headers=basic))  # refused
    return out


async def test_the_lean_path_answers_as_django_does(api, basic, settings, django_path_calls):
    settings.SIGNALBOX_API_HOT_PATH = True
    api.cookies.clear()
    lean = await _flow(api, basic, "orders.lean")
    lean_django = list(django_path_calls)
    settings.SIGNALBOX_API_HOT_PATH = False
    api.cookies.clear()
    plain = await _flow(api, basic, "orders.plain")

    assert [r.status_code for r in lean] == [200, 200, 200, 200, 200, 200, 204, 400]
    assert [_comparable(r, "orders.lean") for r in lean] == [_comparable(r, "orders.plain") for r in plain]
    assert lean[5].text == "<a/>" and lean[5].headers["JMSXGroupID"] == "cart"
    assert lean[4].text == "héllo" and lean[4].headers["region"] == "eu"
    # Django served: the first POST (credentials not verified yet), the first GET (it makes the session
    # cookie), the empty GET (after the lean path found nothing at once), the refused readTimeout
    url = "/api/message/orders.lean"
    assert lean_django == [f"POST {url}", f"GET {url}", f"GET {url}", f"GET {url}"]


async def test_nothing_is_left_in_flight_or_turned(api, basic, settings, django_path_calls, make_user):
    settings.SIGNALBOX_API_HOT_PATH = True
    url = "/api/message/orders.count?type=queue&clientId=k&readTimeout=1000"
    for n in range(5):
        assert (await api.post(url, content=f"m{n}", headers=basic)).status_code == 200
    got = [(await api.get(url, headers=basic)).text for _ in range(5)]
    assert got == [f"m{n}" for n in range(5)]
    root = await blocking(make_user)("root", superuser=True)
    stats = (await api.get("/api/v1/queues/orders.count", headers=root)).json()
    assert (stats["queue_size"], stats["in_flight"], stats["dequeued"]) == (0, 0, 5)
    # every GET on the lean path, the consumer's creation included (clientId: no session to make)
    assert django_path_calls == ["POST /api/message/orders.count", "GET /api/v1/queues/orders.count"]
    # and no turn left taken: the next request's turn begins, with nothing in flight
    ref = compat.consumer_ref(await _user_pk("amq"), "c:k", compat.compat_destination("orders.count",
                                                                                       {"type": ["queue"]}))
    assert await turns.begin_turn(runtime.async_broker(), ref, 1000) == 0


async def test_an_answer_that_fails_to_build_on_the_lean_path_gives_the_message_back(api, basic, settings,
                                                                                     monkeypatch):
    settings.SIGNALBOX_API_HOT_PATH = True
    url = "/api/message/orders.leanfail?type=queue&clientId=c&readTimeout=1000"
    await api.post(url, content="first", headers=basic)
    assert (await api.get(url, headers=basic)).text == "first"  # the consumer exists, credentials cached
    await api.post(url, content="keep me", headers=basic)

    def broken(delivery, params):
        raise RuntimeError("rendering failed")

    with monkeypatch.context() as patch:
        patch.setattr(compat, "answer", broken)
        failed = await api.get(url, headers=basic)
    assert failed.status_code == 500 and failed.json()["code"] == "internal_error"
    again = await api.get(url, headers=basic)
    assert (again.status_code, again.text) == (200, "keep me")  # redelivered, not lost
    assert again.headers["id"]


async def test_a_busy_consumer_is_409_on_the_lean_path(api, basic, settings, django_path_calls):
    settings.SIGNALBOX_API_HOT_PATH = True
    url = "/api/message/orders.busy?type=queue&clientId=b&readTimeout=1000"
    await api.post(url, content="x", headers=basic)
    assert (await api.get(url, headers=basic)).text == "x"
    await api.post(url, content="y", headers=basic)
    destination = compat.compat_destination("orders.busy", {"type": ["queue"]})
    user_pk = (await _user_pk("amq"))
    ref = compat.consumer_ref(user_pk, "c:b", destination)
    assert await turns.begin_turn(runtime.async_broker(), ref, 10_000) == 0  # another request's turn
    django_path_calls.clear()
    busy = await api.get(url, headers=basic)
    assert busy.status_code == 409
    assert busy.json()["detail"] == "Concurrent access to consumer is not supported"
    assert django_path_calls == []
    await turns.end_turn(runtime.async_broker(), ref)
    assert (await api.get(url, headers=basic)).text == "y"


async def _user_pk(name: str) -> int:
    from django.contrib.auth.models import User

    return await blocking(lambda: User.objects.get(username=name).pk)()


@pytest.mark.parametrize("lean", [True, False])
async def test_a_body_in_another_charset_is_read_in_it(api, basic, settings, django_path_calls, lean):
    """A POST whose Content-Type names a charset other than UTF-8 is decoded by it, as the view does (the
    lean path reads UTF-8 only, so it leaves such a body to Django); UTF-8 named stays on the lean path."""
    settings.SIGNALBOX_API_HOT_PATH = lean
    url = "/api/message/orders.charset?type=queue&clientId=cs&readTimeout=1000"
    assert (await api.post(url, content="warm", headers=basic)).status_code == 200  # verifies the credentials
    latin = {**basic, "Content-Type": "text/plain; charset=ISO-8859-1"}
    utf8 = {**basic, "Content-Type": "text/plain; charset=UTF-8"}
    django_path_calls.clear()
    assert (await api.post(url, content="héllo".encode("latin-1"), headers=latin)).status_code == 200
    assert (await api.post(url, content="héllo".encode(), headers=utf8)).status_code == 200
    if lean:
        assert django_path_calls == ["POST /api/message/orders.charset"]  # the Latin-1 one
    got = [(await api.get(url, headers=basic)).text for _ in range(3)]
    assert got == ["warm", "héllo", "héllo"]
