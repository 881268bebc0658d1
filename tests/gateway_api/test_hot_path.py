"""The lean path of the hot endpoints (gateway/api/hot_path.py, HotPath): the same answers as Django's path,
and taken only when the request is the plain case. Each check makes the same requests with the hot
path on and off (SIGNALBOX_API_HOT_PATH) against the real ASGI app and Redis."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.api.asgi import GatewayASGIHandler
from tests.gateway_api.mixins import consumer, send

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def django_path_calls(monkeypatch: pytest.MonkeyPatch, credentials_settled: None) -> list[str]:
    """Paths of the API requests Django's handler served (a spy: the handler still runs)."""
    calls: list[str] = []
    original = GatewayASGIHandler.handle_api

    async def spy(self: Any, scope: dict[str, Any], receive: Any, send: Any) -> None:
        calls.append(scope["path"])
        await original(self, scope, receive, send)

    monkeypatch.setattr(GatewayASGIHandler, "handle_api", spy)
    return calls


def _comparable(response: httpx.Response) -> tuple[int, dict[str, str]]:
    headers = {k.lower(): v for k, v in response.headers.items() if k.lower() != "content-length"}
    return response.status_code, headers


async def _flow(api: httpx.AsyncClient, alice: dict[str, str], queue: str) -> list[httpx.Response]:
    """Send, receive, ack-and-receive, ack a message no longer in flight, and a bad ack mode."""
    await send(api, alice, {"body": "warm"}, destination=queue)  # the first request caches the token
    path = await consumer(api, alice, queue)
    sent = await api.post(f"/api/v1/queues/{queue}/messages", headers=alice,
                          json={"body": "héllo\u2028", "priority": 7, "properties": {"n": 1}})
    first = await api.post(f"{path}/receive?max_messages=1", headers=alice)
    ids = [m["message_id"] for m in first.json()["messages"]]
    acked = await api.post(f"{path}/ack?receive=5", headers=alice, json={"message_ids": ids})
    second_ids = [m["message_id"] for m in acked.json()["messages"]]
    done = await api.post(f"{path}/ack", headers=alice, json={"message_ids": second_ids})
    again = await api.post(f"{path}/ack", headers=alice, json={"message_ids": second_ids})
    bad_mode = await api.post(f"{path}/ack", headers=alice, json={"message_ids": ids, "mode": "some"})
    return [sent, first, acked, done, again, bad_mode]


async def test_hot_endpoints_answer_as_django_does(api, alice, settings, django_path_calls):
    settings.SIGNALBOX_API_HOT_PATH = True
    hot = await _flow(api, alice, "orders.hot")
    hot_django_calls = list(django_path_calls)
    settings.SIGNALBOX_API_HOT_PATH = False
    plain = await _flow(api, alice, "orders.plain")

    assert [_comparable(r) for r in hot] == [_comparable(r) for r in plain]
    assert [r.status_code for r in hot] == [201, 200, 200, 200, 409, 400]
    sent_hot, sent_plain = hot[0].json(), plain[0].json()
    assert sent_hot["destinations"] == ["queue://orders.hot"] and len(sent_hot["message_ids"]) == 1
    assert sent_plain["destinations"] == ["queue://orders.plain"]
    # the deliveries have the same fields and values but for ids, destination and timestamps
    delivered_hot = hot[1].json()["messages"] + hot[2].json()["messages"]
    delivered_plain = plain[1].json()["messages"] + plain[2].json()["messages"]
    varying = {"message_id", "destination", "timestamp"}
    assert [{k: v for k, v in m.items() if k not in varying} for m in delivered_hot] == \
        [{k: v for k, v in m.items() if k not in varying} for m in delivered_plain]
    assert delivered_hot[1]["body"] == "héllo\u2028" and delivered_hot[1]["priority"] == 7
    assert b"\\u2028" in hot[2].content  # escaped as DRF's JSONRenderer does
    assert hot[3].json() == plain[3].json() == {"acknowledged": 1, "messages": []}
    # the problems are identical but for the path they name
    for hot_problem, plain_problem in ((hot[4], plain[4]), (hot[5], plain[5])):
        a, b = hot_problem.json(), plain_problem.json()
        assert a.pop("instance").startswith("/api/v1/queues/orders.hot/consumers/")
        assert b.pop("instance").startswith("/api/v1/queues/orders.plain/consumers/")
        assert set(a) == set(b)
        fields = ("type", "title", "status", "code")
        assert [a[k] for k in fields] == [b[k] for k in fields]
    # With the hot path on, Django served the warm-up send (token not cached yet), the consumer's
    # creation (not a hot endpoint) and the refused bad ack mode (handed over before anything changed).
    assert hot_django_calls == ["/api/v1/queues/orders.hot/messages", "/api/v1/queues/orders.hot/consumers",
                                hot_django_calls[-1]]
    assert hot_django_calls[-1].endswith("/ack")


async def test_requests_that_are_not_the_plain_case_go_to_django(api, alice, bob, settings,
                                                                django_path_calls):
    settings.SIGNALBOX_API_HOT_PATH = True
    await send(api, alice, {"body": "warm"}, destination="orders.x")
    django_path_calls.clear()
    url = "/api/v1/queues/orders.x/messages"
    raw = await api.post(url, headers={**alice, "Content-Type": "text/plain", "Message-Priority": "7"},
                         content=b"raw body")
    keyed = await api.post(url, headers={**alice, "Idempotency-Key": "k1"}, json={"body": "once"})
    broken = await api.post(url, headers={**alice, "Content-Type": "application/json"}, content=b"{no")
    await send(api, alice, {"body": "warm"}, destination="orders.x")
    refused = await api.post(url, headers=bob, json={"body": "not yours"})  # first: token not cached
    refused_again = await api.post(url, headers=bob, json={"body": "not yours"})  # cached, no permission
    assert [raw.status_code, keyed.status_code, broken.status_code] == [201, 201, 400]
    assert broken.json()["code"] == "invalid_json"
    assert refused.status_code == refused_again.status_code == 403
    assert refused.json()["detail"] == refused_again.json()["detail"]
    assert django_path_calls == [url] * 3 + [url] * 2  # alice's second warm-up send took the hot path


async def _raw_sends(api: httpx.AsyncClient, alice: dict[str, str], queue: str) -> list[httpx.Response]:
    """Raw bodies (no JSON envelope): text, bytes, text that is not UTF-8, a +json type, then what they
    deliver."""
    await send(api, alice, {"body": "warm"}, destination=queue)  # the first request caches the token
    url = f"/api/v1/queues/{queue}/messages"
    answers = [await api.post(url, headers={**alice, "Content-Type": kind}, content=body) for kind, body in (
        ("text/plain", "héllo".encode()), ("application/octet-stream", b"\x00\xff"),
        ("text/plain", b"\xff not utf-8"), ("application/xml", b"<a/>"),
        ("application/vnd.x+json", b'{"body": "enveloped"}'))]
    path = await consumer(api, alice, queue)
    answers.append(await api.post(f"{path}/receive?max_messages=10", headers=alice))
    return answers


async def test_raw_bodies_answer_as_django_does(api, alice, settings, django_path_calls):
    settings.SIGNALBOX_API_HOT_PATH = True
    hot = await _raw_sends(api, alice, "orders.rawhot")
    hot_django_calls = list(django_path_calls)
    settings.SIGNALBOX_API_HOT_PATH = False
    plain = await _raw_sends(api, alice, "orders.rawplain")
    assert [_comparable(r) for r in hot] == [_comparable(r) for r in plain]
    assert [r.status_code for r in hot] == [201] * 5 + [200]
    varying = {"message_id", "destination", "timestamp"}
    delivered = [[{k: v for k, v in m.items() if k not in varying} for m in r.json()["messages"]]
                 for r in (hot[-1], plain[-1])]
    assert delivered[0] == delivered[1]
    assert [m.get("body") or m.get("body_base64") for m in delivered[0]] == \
        ["warm", "héllo", "AP8=", "/yBub3QgdXRmLTg=", "<a/>", "enveloped"]
    # Django served the warm-up send (token not cached), the +json body (a JSON envelope Django parses) and
    # the consumer's creation; the four raw bodies took the hot path
    assert hot_django_calls == ["/api/v1/queues/orders.rawhot/messages"] * 2 + \
        ["/api/v1/queues/orders.rawhot/consumers"]


async def test_the_rate_limit_holds_on_the_hot_path(api, alice, settings, django_path_calls):
    settings.SIGNALBOX_API_HOT_PATH = True
    await send(api, alice, {"body": "warm"}, destination="orders.rl")
    settings.SIGNALBOX_API_RATE_LIMIT = 2
    statuses = []
    for _ in range(10):
        response = await api.post("/api/v1/queues/orders.rl/messages", headers=alice, json={"body": "x"})
        statuses.append(response.status_code)
        if response.status_code == 429:
            assert response.json()["code"] == "rate_limited"
            assert int(response.headers["Retry-After"]) >= 1
            break
    assert 429 in statuses  # at most 2 a second
    assert len(django_path_calls) == 1  # only the warm-up send


async def test_a_long_poll_receive_goes_to_django(api, alice, settings, django_path_calls):
    settings.SIGNALBOX_API_HOT_PATH = True
    path = await consumer(api, alice, "orders.lp")
    django_path_calls.clear()
    waited = await api.post(f"{path}/receive?max_messages=1&wait=0.2", headers=alice)
    at_once = await api.post(f"{path}/receive?max_messages=1", headers=alice)
    assert waited.status_code == at_once.status_code == 200
    assert waited.json() == at_once.json() == {"messages": []}
    assert django_path_calls == [f"{path}/receive"]


async def test_a_body_over_the_request_limit_is_413_on_the_hot_path_too(api, alice, settings,
                                                                      django_path_calls):
    settings.SIGNALBOX_API_HOT_PATH = True
    await send(api, alice, {"body": "warm"}, destination="orders.big")  # the token is cached from here on
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = await api.post("/api/v1/queues/orders.big/messages", json={"body": "x" * 5000}, headers=alice)
    assert response.status_code == 413 and response.json()["code"] == "request_too_large"
    assert django_path_calls == ["/api/v1/queues/orders.big/messages"] * 2  # Django refused it
    messages = await api.post(f"{await consumer(api, alice, 'orders.big')}/receive?max_messages=5",
                              headers=alice)
    assert [m["body"] for m in messages.json()["messages"]] == ["warm"]


def test_both_lean_paths_read_headers_by_one_rule():
    """hot_path.request_headers, which HotPath and compat_hot.CompatHotPath share: the last of a repeated
    header, Cookie lines joined as Django joins them, and a second Authorization or a refused header
    leaves the request to Django (None)."""
    from gateway.api.hot_path import request_headers

    wanted, refused = frozenset({b"authorization", b"host", b"cookie"}), frozenset({b"sec-fetch-site"})
    headers = [(b"host", b"a"), (b"cookie", b"x=1"), (b"accept", b"*/*"), (b"host", b"b"),
               (b"cookie", b"y=2"), (b"authorization", b"Token t")]
    assert request_headers(headers, wanted, refused) == {b"host": b"b", b"cookie": b"x=1; y=2",
                                                         b"authorization": b"Token t"}
    assert request_headers([*headers, (b"authorization", b"Token u")], wanted, refused) is None
    assert request_headers([(b"sec-fetch-site", b"same-origin"), *headers], wanted, refused) is None
    assert request_headers([], wanted, refused) == {}


def test_the_lean_paths_render_json_as_drf_does():
    """HotPath.render (one encoder made once) gives DRF's JSONRenderer bytes: separators, non-ASCII text
    kept, U+2028/U+2029 escaped, NaN refused."""
    import math

    from rest_framework.renderers import JSONRenderer

    from gateway.api.hot_path import HotPath

    hot, drf = HotPath(), JSONRenderer()
    for data in ({"messages": [{"body": "h\u00e9llo \u2028 \u2029 \U0001f600", "n": 1.5, "ok": True,
                                "none": None, "ids": ["a", "b"]}], "acknowledged": None},
                 {"type": "about:blank", "detail": "x\ny\t\"z\""}, [], {}):
        assert hot.render(data) == drf.render(data)
    with pytest.raises(ValueError):
        hot.render({"x": math.nan})
    with pytest.raises(ValueError):
        drf.render({"x": math.nan})
