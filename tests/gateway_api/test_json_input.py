"""Bad JSON gets a 400 that names what is wrong and changes nothing (issue 21 §4): lone UTF-16 surrogates
(`"\\ud800"`, which no UTF-8 encoder takes: a 500 before) and nesting beyond MAX_JSON_DEPTH (a
RecursionError, a 500 before), on every JSON input path of the REST API; then hypothesis throws
arbitrary JSON documents at the JSON endpoints: never a 5xx, always problem details."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.api.json_input import MAX_JSON_DEPTH, InvalidJSON, check, loads
from tests.gateway_api.mixins import PROBLEM, assert_problem

pytestmark = pytest.mark.django_db(transaction=True)

JSON = {"Content-Type": "application/json"}
SEND = "/api/v1/queues/orders.eu/messages"


def nested(depth: int, leaf: str = '"x"') -> str:
    return "[" * depth + leaf + "]" * depth


async def queue_size(api, headers) -> int:
    detail = await api.get("/api/v1/queues/orders.eu", headers=headers)
    assert detail.status_code == 200, detail.text
    return detail.json()["queue_size"]


def test_the_limits_name_themselves():
    with pytest.raises(InvalidJSON, match=r"properties\.p: a lone UTF-16 surrogate \(\\ud800\)"):
        loads(b'{"properties": {"p": "a\\ud800b"}}')
    with pytest.raises(InvalidJSON, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
        loads(nested(MAX_JSON_DEPTH + 1))
    with pytest.raises(InvalidJSON, match="nested deeper"):
        loads(nested(200_000))  # deeper than the interpreter's recursion limit
    with pytest.raises(InvalidJSON, match="NaN is not a JSON number"):
        loads("[NaN]")
    with pytest.raises(InvalidJSON, match="member name"):
        loads('{"\\udc00": 1}')
    # brackets inside strings neither hide depth nor add to it
    hiding = '[' * 10 + '"' + ']' * 8 + '",' + '[' * 30 + ']' * 30 + ',"\\\\\\"' + '[' * 8 + '"' + ']' * 10
    with pytest.raises(InvalidJSON, match="nested deeper"):
        loads(hiding)
    assert loads('["' + '[' * 100 + '"]') == ["[" * 100]
    assert loads(nested(MAX_JSON_DEPTH)) is not None  # the limit itself is fine
    assert loads('"\\ud83d\\ude00"') == "\U0001F600"  # a surrogate pair is one character
    assert loads("\"\xe9\"".encode()) == "\xe9"


@pytest.mark.parametrize("body,where", [
    ('{"body": "\\ud800"}', "body"),
    ('{"body": "x", "properties": {"p": "\\udfff"}}', "properties.p"),
    ('{"messages": [{"body": "ok"}, {"body": "\\ud800"}]}', "messages[1].body"),
    ('{"body": "x", "properties": {"\\ud800": 1}}', "properties"),
    ('{"body": "x", "properties": {"p": ' + nested(40) + "}}", "nested deeper than 32"),
    ('{"body": "x", "properties": {"p": ' + nested(100_000) + "}}", "nested deeper than 32"),
])
async def test_a_send_with_bad_json_is_400_and_sends_nothing(api, alice, body, where):
    assert (await api.put("/api/v1/queues/orders.eu", headers=alice)).status_code in (200, 201)
    response = await api.post(SEND, content=body, headers={**alice, **JSON})
    assert where in assert_problem(response, 400, "invalid_json")["detail"]
    assert await queue_size(api, alice) == 0


async def test_every_json_input_path_refuses_lone_surrogates(api, alice):
    bad = '"\\ud800"'
    assert (await api.put("/api/v1/queues/orders.eu", headers=alice)).status_code in (200, 201)
    header = await api.post(SEND, content=b"raw", headers={**alice, "Content-Type": "text/plain",
                                                          "Message-Properties": '{"p": ' + bad + "}"})
    assert "Message-Properties" in assert_problem(header, 400, "invalid_message")["detail"]
    consumer = await api.post("/api/v1/queues/orders.eu/consumers", content='{"selector": ' + bad + "}",
                              headers={**alice, **JSON})
    assert_problem(consumer, 400, "invalid_json")
    token = await api.post("/api/v1/auth/token", content='{"username": ' + bad + ', "password": "x"}',
                           headers=JSON)
    assert_problem(token, 400, "invalid_json")  # DRF's parser
    assert await queue_size(api, alice) == 0
    listing = await api.get("/api/v1/queues/orders.eu/consumers", headers=alice)
    assert listing.status_code == 200 and listing.json() == []


# -- hypothesis over the JSON endpoints ------------------------------------------------------------

# Text with every kind of code point, lone surrogates included (st.text leaves them out by default).
any_text = st.text(st.characters(codec=None, categories=None), max_size=8)
scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**63)
           | st.floats(allow_nan=False, allow_infinity=False) | any_text)
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(any_text, inner, max_size=3), max_leaves=12)


@st.composite
def bodies(draw) -> bytes:
    """A JSON object for a send (sometimes a plausible envelope), maybe wrapped deep."""
    doc = draw(st.dictionaries(st.sampled_from(["body", "properties", "priority", "messages", "ttl",
                                                "selector", "message_ids", "x"]) | any_text, documents,
                               max_size=4))
    depth = draw(st.sampled_from([0, 0, 0, MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH + 5, 5000]))
    for _ in range(depth):
        doc = {"properties": doc} if depth < 100 else [doc]
    text = json.dumps(doc if isinstance(doc, dict) else {"body": doc}, ensure_ascii=draw(st.booleans()),
                      allow_nan=False) if depth < 100 else '{"body": ' + nested(depth) + "}"
    return text.encode("utf-8", "surrogatepass")


bracket_text = st.text(st.sampled_from('[]{}"\\\\u:,a\u00e9'), max_size=12)
tricky = st.recursive(scalars | bracket_text, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(any_text | bracket_text, inner, max_size=3), max_leaves=12)


@given(doc=tricky, depth=st.integers(0, MAX_JSON_DEPTH + 3), ascii_only=st.booleans())
@settings(max_examples=300, deadline=None)
def test_the_fast_scan_agrees_with_the_walk(doc, depth, ascii_only):
    # loads() walks the document only when C-level scans of the text say it may be too deep or hold a
    # surrogate: it must refuse exactly what the full walk refuses
    for _ in range(depth):
        doc = {"k": doc} if depth % 2 else [doc]
    text = json.dumps(doc, ensure_ascii=ascii_only)
    try:
        check(json.loads(text))
        refused_by_walk = False
    except InvalidJSON:
        refused_by_walk = True
    try:
        loads(text.encode("utf-8", "surrogatepass"))
        refused = False
    except InvalidJSON:
        refused = True
    assert refused == refused_by_walk


@given(body=bodies(), path=st.sampled_from([SEND, "/api/v1/queues/orders.eu/consumers",
                                            "/api/v1/queues/orders.eu/move-matching",
                                            "/api/v1/auth/token"]))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
async def test_arbitrary_json_never_fails_the_server(api, alice, body, path):
    response = await api.post(path, content=body, headers={**alice, **JSON})
    assert response.status_code < 500, (body[:200], response.text)
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith(PROBLEM)
    try:
        check(json.loads(body))
        valid = True
    except (InvalidJSON, RecursionError):
        valid = False
    if not valid:
        assert_problem(response, 400, "invalid_json")
