"""Topics over HTTP: produce to topic://, leased consumers on topics (each subscription gets every
message), durable subscriptions with client id + subscription name that keep messages while offline, and
their listing and removal."""

from __future__ import annotations

import pytest

from broker_core.config.virtual import VirtualConfig
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


async def test_the_listing_shows_each_subscriptions_counters_and_slow_state(api, trader):
    durable = {"client_id": "app-1", "subscription_name": "audit", "selector": "region = 'eu'"}
    path = await consumer(api, trader, "prices", kind="topics", **durable)
    assert (await api.delete(path, headers=trader)).status_code in (200, 204)  # offline
    active = await consumer(api, trader, "prices", kind="topics", prefetch=5)
    await api.post(f"{T}/messages", json={"messages": [{"body": "x", "properties": {"region": "eu"}},
                                                         {"body": "y", "properties": {"region": "us"}}]},
                   headers=trader)
    got = await receive(api, trader, active, max_messages=1)
    assert [m["body"] for m in got] == ["x"]

    subs = {s["durable"]: s for s in (await api.get(f"{T}/subscriptions", headers=trader)).json()}
    offline, live = subs[True], subs[False]
    assert (offline["active"], offline["client_id"], offline["subscription_name"], offline["selector"],
            offline["consumer_id"], offline["pending"], offline["in_flight"]) == (
        False, "app-1", "audit", "region = 'eu'", None, 1, 0)
    assert offline["offline_since"] is not None and offline["slow_since"] is None
    assert live["active"] and live["consumer_id"] == active.rsplit("/", 1)[1]
    # both dispatched into its prefetch window (one received, none acknowledged): in flight, none pending
    assert (live["pending"], live["in_flight"], live["dispatched"], live["prefetch"]) == (0, 2, 2, 5)
    for sub in (offline, live):
        assert {"no_local", "dequeued", "evicted", "dropped", "discarded", "deadlettered", "expired",
                "parked", "enqueued", "created", "key"} <= set(sub)
        assert sub["evicted"] == sub["dropped"] == sub["discarded"] == 0


async def test_the_virtual_destination_routing_in_force_is_listed_for_staff(api, make_user, api_namespace):
    from broker_core.ops import virtual
    from gateway import runtime

    config = VirtualConfig.from_config({
        "compositeQueue": [{"name": "orders.all", "forwardOnly": False,
                            "forwardTo": ["orders.eu", {"topic": "orders.audit",
                                                        "selector": "amount > 100"}]}],
        "virtualTopic": [{"name": "VirtualTopic.>", "prefix": "Consumer.*."}]})
    await blocking(virtual.configure)(runtime.broker(), config)
    staff = await blocking(make_user)("ops", staff=True)
    rows = (await api.get("/api/v1/virtual-destinations", headers=staff)).json()
    assert rows == [
        {"type": "compositeQueue", "name": "queue://orders.all",
         "forwardTo": [{"destination": "queue://orders.eu", "selector": None},
                       {"destination": "topic://orders.audit", "selector": "amount > 100"}],
         "forwardOnly": False, "sendWhenNotMatched": False},
        {"type": "virtualTopic", "name": "topic://VirtualTopic.>", "prefix": "Consumer.*.", "postfix": "",
         "selectorAware": False, "dropOnResourceLimit": False}]


async def test_the_virtual_destination_routing_is_refused_to_non_staff(api, trader):
    assert_problem(await api.get("/api/v1/virtual-destinations", headers=trader), 403, "permission_denied")
    assert_problem(await api.get("/api/v1/virtual-destinations"), 401, "not_authenticated")


async def test_a_topics_scheduled_messages_are_listed_and_cancelled_on_the_topic(api, trader):
    """A delayed or repeating message sent to a topic waits on the topic as a job until it fires
    (ActiveMQ's scheduler): GET …/scheduled lists it there, DELETE …/messages/<id> cancels it."""
    path = await consumer(api, trader, "prices", kind="topics")
    response = await api.post(f"{T}/messages", json={"messages": [
        {"body": "later", "delay": 60_000}, {"body": "tick", "delay": 60_000, "period": 1_000, "repeat": 3}]},
        headers=trader)
    assert response.status_code == 201, response.text
    assert response.json()["statuses"] == ["ok", "scheduled"]
    later, job = response.json()["message_ids"]
    listed = (await api.get(f"{T}/scheduled", headers=trader)).json()["messages"]
    assert sorted((m["message_id"], m["repeats_left"]) for m in listed) == sorted([(job, 3), (later, None)])
    assert all(m["due"] for m in listed)
    assert (await api.get(T, headers=trader)).json()["parked"] == 2
    assert (await api.delete(f"{T}/messages/{job}", headers=trader)).status_code in (200, 204)
    remaining = (await api.get(f"{T}/scheduled", headers=trader)).json()["messages"]
    assert [m["message_id"] for m in remaining] == [later]
    assert await receive(api, trader, path) == []


async def test_a_topics_cron_job_is_listed_with_its_expression_and_next_time(api, trader):
    import time

    response = await api.post(f"{T}/messages", json={"body": "daily", "cron": "0 9 * * *"}, headers=trader)
    assert response.status_code == 201, response.text
    (job,) = response.json()["message_ids"]
    (listed,) = (await api.get(f"{T}/scheduled", headers=trader)).json()["messages"]
    assert (listed["message_id"], listed["cron"], listed["period"]) == (job, "0 9 * * *", None)
    # 09:00 UTC next: within a day, on the hour
    assert 0 < listed["due"] - time.time() * 1000 <= 86_400_000
    assert listed["due"] % 86_400_000 == 9 * 3_600_000
