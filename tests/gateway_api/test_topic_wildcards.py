"""Wildcard topic subscriptions over HTTP (issue #5): an HTTP consumer created on topics/<pattern> gets what
is sent to every matching topic, each message naming the topic it was sent to; sending to a pattern and a
consumer on a wildcard queue are refused with the reason."""

from __future__ import annotations

import pytest

from tests.gateway_api.mixins import assert_problem, consumer, receive

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def trader(make_user):
    return make_user("trader", [("topic://prices.>", "admin"), ("queue://prices.>", "admin")])


async def test_an_http_consumer_on_a_wildcard_gets_every_matching_topic(api, trader):
    path = await consumer(api, trader, "prices.>", kind="topics", ack_mode="auto")
    for name, body in (("prices.eu", "a"), ("prices.us.west", "b")):
        response = await api.post(f"/api/v1/topics/{name}/messages", json={"messages": [{"body": body}]},
                                  headers=trader)
        assert response.status_code == 201, response.text
    got = await receive(api, trader, path)
    assert [(m["body"], m["destination"]) for m in got] == [("a", "topic://prices.eu"),
                                                            ("b", "topic://prices.us.west")]


async def test_sending_to_a_wildcard_and_a_wildcard_queue_consumer_are_refused(api, trader):
    response = await api.post("/api/v1/topics/prices.>/messages", json={"messages": [{"body": "x"}]},
                              headers=trader)
    assert "not one to send to" in assert_problem(response, 400, "invalid_destination")["detail"]
    response = await api.post("/api/v1/queues/prices.>/consumers", json={}, headers=trader)
    assert "wildcard queue destinations are not supported" in assert_problem(
        response, 400, "invalid_destination")["detail"]
