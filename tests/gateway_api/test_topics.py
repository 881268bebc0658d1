"""Topics over HTTP: produce to topic://, leased consumers on topics (each subscription gets every
message), durable subscriptions with client id + subscription name that keep messages while offline, and
their listing and removal."""

from __future__ import annotations

import pytest

from tests.gateway_api.mixins import assert_problem, blocking, consumer, receive

pytestmark = pytest.mark.django_db(transaction=True)

T = "/api/v1/topics/prices"


@pytest.fixture
def trader(make_user):
    return make_user("trader", [("topic://prices", "admin")])


async def publish(api, headers, *bodies: str) -> None:
    response = await api.post(f"{T}/messages", json={"messages": [{"body": b} for b in bodies]},
                              headers=headers)
    assert response.status_code == 201, response.text
    assert response.json()["destinations"] == ["topic://prices"]


async def ack(api, headers, path, messages) -> None:
    response = await api.post(f"{path}/ack", json={"message_ids": [m["message_id"] for m in messages]},
                              headers=headers)
    assert response.status_code == 200, response.text


async def test_each_http_consumer_of_a_topic_gets_every_message(api, trader):
    paths = [await consumer(api, trader, "prices", kind="topics") for _ in range(2)]
    await publish(api, trader, "a", "b")
    for path in paths:
        got = await receive(api, trader, path)
        assert [m["body"] for m in got] == ["a", "b"]
        assert {m["destination"] for m in got} == {"topic://prices"}
        await ack(api, trader, path, got)


async def test_a_durable_subscription_keeps_messages_while_offline_and_is_removed_by_name(api, trader):
    durable = {"client_id": "app-1", "subscription_name": "audit"}
    path = await consumer(api, trader, "prices", kind="topics", **durable)
    assert (await api.delete(path, headers=trader)).status_code in (200, 204)  # offline now
    await publish(api, trader, "while away")

    (sub,) = (await api.get(f"{T}/subscriptions", headers=trader)).json()
    assert (sub["durable"], sub["active"], sub["client_id"], sub["subscription_name"], sub["pending"]) == (
        True, False, "app-1", "audit", 1)

    path = await consumer(api, trader, "prices", kind="topics", **durable)
    got = await receive(api, trader, path)
    assert [m["body"] for m in got] == ["while away"]
    await ack(api, trader, path, got)
    # removing it while its consumer is active is refused, as ActiveMQ does
    assert_problem(await api.delete(f"{T}/subscriptions/app-1/audit", headers=trader), 409, "durable_in_use")
    await api.delete(path, headers=trader)
    removed = await api.delete(f"{T}/subscriptions/app-1/audit", headers=trader)
    assert removed.json() == {"removed": 0}
    assert (await api.get(f"{T}/subscriptions", headers=trader)).json() == []
    gone = assert_problem(await api.delete(f"{T}/subscriptions/app-1/audit", headers=trader), 404,
                          "unknown_subscription")
    assert gone["detail"] == "No durable subscription exists for clientID: app-1 and subscriptionName: audit"


async def test_a_durable_name_on_a_queue_or_without_a_client_id_is_refused(api, make_user, trader):
    root = await blocking(make_user)("root", superuser=True)
    response = await api.post("/api/v1/queues/orders/consumers", json={"subscription_name": "audit",
                                                                       "client_id": "c"}, headers=root)
    assert assert_problem(response, 400, "invalid_consumer")["field"] == "subscription_name"
    response = await api.post(f"{T}/consumers", json={"subscription_name": "audit"}, headers=trader)
    assert_problem(response, 400, "invalid_consumer")


async def test_subscriptions_need_read_on_the_topic(api, make_user, trader):
    await consumer(api, trader, "prices", kind="topics")
    stranger = await blocking(make_user)("stranger", [("topic://other", "admin")])
    assert_problem(await api.get(f"{T}/subscriptions", headers=stranger), 403, "permission_denied")
    assert_problem(await api.delete(f"{T}/subscriptions/app-1/audit", headers=stranger), 403)
    assert_problem(await api.get(f"{T}/subscriptions"), 401, "not_authenticated")
