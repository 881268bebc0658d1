"""Every failure is one problem-details shape (RFC 9457) with a clear message and the right status."""

from __future__ import annotations

import asyncio

import pytest
from django.contrib.auth.models import User

from broker_core import errors as broker_errors
from gateway.api.errors import describe
from tests.gateway_api.mixins import assert_problem, blocking

pytestmark = pytest.mark.django_db(transaction=True)


async def test_unknown_api_paths_and_methods(api, alice):
    assert_problem(await api.get("/api/v1/nothing", headers=alice), 404, "not_found")
    assert_problem(await api.patch("/api/v1/queues/orders.eu/messages", headers=alice), 405,
                   "method_not_allowed")


async def test_a_wrong_media_type_is_415(api, alice):
    response = await api.post("/api/v1/queues/orders.eu/consumers", content=b"selector=x",
                              headers={**alice, "Content-Type": "application/x-www-form-urlencoded"})
    assert_problem(response, 415, "unsupported_media_type")


async def test_validation_errors_name_their_fields(api, alice):
    response = await api.post("/api/v1/queues/orders.eu/consumers", json={"prefetch": -1, "ack_mode": "x"},
                              headers=alice)
    problem = assert_problem(response, 400, "validation_error")
    assert set(problem["errors"]) == {"prefetch", "ack_mode"}


async def test_rate_limits_answer_429_with_retry_after(api, alice, settings):
    settings.SIGNALBOX_API_RATE_LIMIT = 2
    # six at once: the limit counts in one-second windows, which requests one after another on a busy
    # machine may straddle; six in at most two windows of two each leave at least two over the limit
    responses = await asyncio.gather(*(api.get("/api/v1/destinations", headers=alice) for _ in range(6)))
    statuses = [response.status_code for response in responses]
    assert statuses.count(429) >= 2 and statuses.count(200) >= 2, statuses
    limited = next(response for response in responses if response.status_code == 429)
    assert_problem(limited, 429, "rate_limited")
    assert int(limited.headers["Retry-After"]) >= 1


async def test_a_request_body_over_the_limit_is_413(api, alice, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = await api.post("/api/v1/queues/orders.eu/messages", json={"body": "x" * 5000}, headers=alice)
    assert_problem(response, 413, "request_too_large")


def test_flow_control_refusals_are_503_with_retry_after():
    class FlowControl(broker_errors.BrokerError):
        code = "flow_control"

    status, body, headers = describe(FlowControl("queue://orders is full", retry_after=2.5))
    assert status == 503 and headers["Retry-After"] == "2" and body["retry_after"] == 2.5
    status, body, headers = describe(FlowControl("full"))
    assert status == 503 and headers["Retry-After"] == "1"


def test_every_broker_error_has_a_status():
    for kind in (broker_errors.InvalidSelector("x", position=3, expected="y"),
                 broker_errors.InvalidDestination("x"), broker_errors.MessageTooLarge("x"),
                 broker_errors.UnknownConsumer("x"), broker_errors.NotInFlight("x"),
                 broker_errors.UnknownMessage("x"), broker_errors.OperationRefused("x")):
        status, body, _ = describe(kind)
        assert status in (400, 404, 409, 413) and body["code"] == kind.code


async def test_anonymous_access_is_only_to_healthz(api):
    # /healthz answers anonymous users (200 or 503 by the health of its parts, never 401)
    assert (await api.get("/healthz")).status_code in (200, 503)
    for path in ("/api/v1/destinations", "/api/v1/policies", "/api/v1/audit"):
        assert_problem(await api.get(path), 401, "not_authenticated")


async def test_a_token_can_be_obtained_with_a_password(api):
    await blocking(User.objects.create_user)("dora", password="pw-123456")
    response = await api.post("/api/v1/auth/token", json={"username": "dora", "password": "pw-123456"})
    assert response.status_code == 200
    token = response.json()["token"]
    listing = await api.get("/api/v1/destinations", headers={"Authorization": f"Token {token}"})
    assert listing.status_code == 200
    bad = await api.post("/api/v1/auth/token", json={"username": "dora", "password": "nope"})
    assert_problem(bad, 400, "validation_error")


async def test_the_console_session_works_and_needs_csrf_for_changes(api, make_user):
    await blocking(make_user)("eve", [("queue://orders.>", "admin")])
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    await blocking(client.login)(username="eve", password="pw")
    api.cookies.set("sessionid", client.cookies["sessionid"].value)
    assert (await api.get("/api/v1/destinations")).status_code == 200
    refused = await api.put("/api/v1/queues/orders.eu")
    assert "CSRF" in assert_problem(refused, 403)["detail"]


async def test_a_url_that_is_not_utf8_once_percent_decoded_is_refused_and_creates_nothing(api, alice):
    """uvicorn and Django decode %XX with errors="replace": `orders.a%FFb` and `orders.a%FEb` would both
    name the queue `orders.a\ufffdb`, which no client asked for (a send created it). Refused by name,
    for the path and for each query parameter, on the hot path too (the token is cached by the first
    send); nothing is created."""
    ok = await api.post("/api/v1/queues/orders.%C3%A9/messages", json={"body": "x"}, headers=alice)
    assert ok.status_code == 201, ok.text  # real UTF-8 is fine
    for send in (lambda: api.post("/api/v1/queues/orders.a%FFb/messages", json={"body": "x"}, headers=alice),
                 lambda: api.post("/api/v1/queues/orders.a%ED%A0%80b/messages", content=b"x",
                                  headers={**alice, "Content-Type": "text/plain"}),
                 lambda: api.put("/api/v1/queues/orders.a%FEb", headers=alice),
                 lambda: api.post("/api/message?type=queue&destination=orders.a%FFb", content=b"x",
                                  headers={**alice, "Content-Type": "text/plain"}),
                 lambda: api.get("/api/message/orders.a%FFb?type=queue&readTimeout=0", headers=alice)):
        problem = assert_problem(await send(), 400, "invalid_parameter")
        assert "UTF-8" in problem["detail"], problem
    problem = assert_problem(await api.get("/api/message/orders.eu?type=queue&readTimeout=0&clientId=%FF",
                                           headers=alice), 400, "invalid_parameter")
    assert problem["parameter"] == "clientId", problem
    for name in ("orders.a%EF%BF%BDb", "orders.a%EF%BF%BD%EF%BF%BD%EF%BF%BDb"):  # U+FFFD itself: no queue
        assert_problem(await api.get(f"/api/v1/queues/{name}", headers=alice), 404, "unknown_destination")


@pytest.mark.parametrize("written", ["1_0", " 5", "5 ", "\uff15", "+", "2.0"])
async def test_a_number_parameter_is_plain_decimal_digits(api, alice, written):
    """Python's int() reads "1_0" as 10, " 5" as 5 and a fullwidth "５" as 5: a number the client did not
    write. Java's Long.parseLong (the servlet's) refuses the first two; every number parameter takes only an
    optional sign and ASCII digits, and is refused with its name otherwise, nothing sent."""
    sent = await api.post("/api/message/orders.eu", params={"type": "queue", "JMSPriority": written},
                          content=b"x", headers={**alice, "Content-Type": "text/plain"})
    problem = assert_problem(sent, 400, "invalid_parameter")
    assert problem["parameter"] == "JMSPriority", problem
    problem = assert_problem(await api.get("/api/v1/destinations", params={"limit": written}, headers=alice),
                             400, "invalid_parameter")
    assert problem["parameter"] == "limit", problem
    assert_problem(await api.get("/api/v1/queues/orders.eu", headers=alice), 404, "unknown_destination")
