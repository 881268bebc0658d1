"""The JSON WebSocket protocol refuses lone surrogates and deep nesting with an `invalid_json` error that
names the place, keeps the connection and changes nothing (issue 21 §4: they were `internal_error`s);
hypothesis sends arbitrary JSON documents as requests: never an `internal_error`."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_core.errors import UnknownDestination
from gateway import runtime
from gateway.api.json_input import MAX_JSON_DEPTH
from tests.helpers.channels import receive_json, send_json, websocket

pytestmark = pytest.mark.usefixtures("ws_runtime", "stomp_user")


async def raw_request(ws, text: str) -> dict:
    await ws.send_to(text_data=text)
    return await receive_json(ws)


async def login(ws) -> None:
    await send_json(ws, {"type": "connect", "id": "c", "login": "alice", "passcode": "secret"})
    assert (await receive_json(ws))["type"] == "ok"


@pytest.mark.parametrize("text,where", [
    ('{"type": "send", "id": 1, "destination": "queue://ws.bad", "message": {"body": "\\ud800"}}',
     "message.body"),
    ('{"type": "send", "id": 1, "destination": "queue://ws.bad", "message": {"body": "x", "properties": '
     '{"p": "\\udc01"}}}', "message.properties.p"),
    ('{"type": "subscribe", "id": 1, "subscription": "\\ud800", "destination": "queue://ws.bad"}',
     "subscription"),
    ('{"type": "send", "id": 1, "destination": "queue://ws.bad", "message": {"body": "x", "properties": '
     '{"p": ' + "[" * (MAX_JSON_DEPTH + 5) + "]" * (MAX_JSON_DEPTH + 5) + "}}}", "nested deeper than 32"),
    ('{"type": "send", "id": 1, "destination": "queue://ws.bad", "message": ' + "[" * 100_000
     + "]" * 100_000 + "}", "nested deeper than 32"),
])
async def test_bad_json_is_a_clear_error_and_changes_nothing(text, where):
    async with websocket("/ws/v1") as ws:
        await login(ws)
        error = await raw_request(ws, text)
        assert error["type"] == "error" and error["code"] == "invalid_json", error
        assert where in error["message"]
        # the connection is still usable, and nothing was sent or subscribed
        ok = await raw_request(ws, json.dumps({"type": "send", "id": 2, "destination": "queue://ws.good",
                                               "message": {"body": "fine"}}))
        assert ok["type"] == "ok" and ok["id"] == 2
    with pytest.raises(UnknownDestination):  # neither sent to nor subscribed
        await runtime.async_broker().stats("queue://ws.bad")


any_text = st.text(st.characters(codec=None, categories=None), max_size=6)
scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**63)
           | st.floats(allow_nan=False, allow_infinity=False) | any_text)
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(any_text, inner, max_size=3), max_leaves=10)
requests = st.fixed_dictionaries(
    {"type": st.sampled_from(["send", "subscribe", "ack", "nack", "unsubscribe", "begin", "commit"])},
    optional={"id": scalars, "destination": st.just("queue://ws.fuzz") | any_text, "message": documents,
              "messages": documents, "subscription": documents, "message_id": documents,
              "message_ids": documents, "transaction": documents, "prefetch": documents,
              "selector": documents})


@given(st.lists(requests, min_size=1, max_size=4))
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
async def test_arbitrary_requests_never_fail_internally(batch):
    async with websocket("/ws/v1") as ws:
        await login(ws)
        for request in batch:
            request["id"] = "r"  # every request gets an answer to wait for
            await ws.send_to(text_data=json.dumps(request, ensure_ascii=True))
            while True:
                answer = await receive_json(ws)
                if answer.get("id") == "r" or answer["type"] == "error":
                    break
            assert answer.get("code") != "internal_error", (request, answer)
