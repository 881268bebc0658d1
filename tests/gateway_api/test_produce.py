"""Producing over HTTP: one message, batches, raw bodies, composites, idempotency keys, limits."""

from __future__ import annotations

import asyncio
import base64

import pytest

from broker_core.errors import UnknownDestination
from gateway import runtime
from tests.gateway_api.mixins import EndpointTests, assert_problem, blocking, consumer, receive, send

pytestmark = pytest.mark.django_db(transaction=True)


class TestSendOne(EndpointTests):
    method, path, action, expected_status = "post", "/api/v1/queues/orders.eu/messages", "write", 201
    body = {"body": "hello", "priority": 7, "properties": {"region": "eu", "n": 3, "big": {"type": "long",
                                                                                           "value": 5}},
            "correlation_id": "c-1", "type": "order", "reply_to": "queue://replies", "group_id": "cart-1",
            "group_seq": 1, "ttl": 60_000, "persistent": False}

    async def check(self, api, response, context, headers):
        result = response.json()
        assert result["destinations"] == ["queue://orders.eu"] and result["statuses"] == ["ok"]
        [message_id] = result["message_ids"]
        [got] = await receive(api, headers, await consumer(api, headers))
        assert got["message_id"] == message_id
        assert (got["body"], got["priority"]) == ("hello", 7)
        assert (got["correlation_id"], got["type"]) == ("c-1", "order")
        assert got["properties"] == {"region": "eu", "n": 3, "big": 5, "JMSXGroupFirstForConsumer": True}
        assert got["group_id"] == "cart-1" and got["group_seq"] == 1 and got["persistent"] is False
        assert got["expiration"] > got["timestamp"]


class TestSendBatch(EndpointTests):
    method, path, action, expected_status = "post", "/api/v1/queues/orders.eu/messages", "write", 201
    body = {"messages": [{"body": f"m{i}"} for i in range(5)]}

    async def check(self, api, response, context, headers):
        ids = response.json()["message_ids"]
        assert len(ids) == 5
        got = await receive(api, headers, await consumer(api, headers), max_messages=10)
        assert [m["body"] for m in got] == [f"m{i}" for i in range(5)]
        assert [m["message_id"] for m in got] == ids


class TestSendComposite(EndpointTests):
    method, path, action, expected_status = "post", "/api/v1/messages", "write", 201
    params = {"destination": "orders.eu,orders.us"}
    body = {"body": "both"}

    async def test_users_without_the_permission_are_refused(self, api, make_user):
        # write on orders.eu only: the composite also names orders.us, so nothing is sent
        user = await blocking(make_user)("half", [("queue://orders.eu", "write")])
        response = await self.call(api, user, {})
        assert_problem(response, 403, "permission_denied")

    async def test_permitted_users_succeed(self, api, make_user):
        user = await blocking(make_user)("both", [("queue://orders.>", "admin")])
        response = await self.call(api, user, {})
        assert response.status_code == 201, response.text
        result = response.json()
        assert result["destinations"] == ["queue://orders.eu", "queue://orders.us"]
        for name in ("orders.eu", "orders.us"):
            [got] = await receive(api, user, await consumer(api, user, name))
            assert got["body"] == "both" and got["message_id"] == result["message_ids"][0]

    async def test_permission_through_a_group_is_enough(self, api, make_user):
        user = await blocking(make_user)("member", [("queue://orders.>", "write")], group="producers")
        assert (await self.call(api, user, {})).status_code == 201


async def test_a_raw_body_is_sent_with_its_headers(api, alice):
    response = await api.post("/api/v1/queues/orders.eu/messages", content=b"<order id='1'/>",
                              headers={**alice, "Content-Type": "application/xml", "Message-Priority": "9",
                                       "Message-Group-Id": "g", "Message-Properties": '{"region": "eu"}'})
    assert response.status_code == 201, response.text
    [got] = await receive(api, alice, await consumer(api, alice))
    assert got["body"] == "<order id='1'/>" and got["priority"] == 9 and got["group_id"] == "g"
    assert got["content_type"] == "application/xml" and got["properties"]["region"] == "eu"


async def test_binary_bodies_travel_as_base64(api, alice):
    payload = bytes(range(256))
    response = await api.post("/api/v1/queues/orders.eu/messages", content=payload,
                              headers={**alice, "Content-Type": "application/octet-stream"})
    assert response.status_code == 201
    await send(api, alice, {"body_base64": base64.b64encode(b"\x00\xff").decode()})
    got = await receive(api, alice, await consumer(api, alice))
    assert [base64.b64decode(m["body_base64"]) for m in got] == [payload, b"\x00\xff"]
    assert all(m["body"] is None for m in got)


async def test_a_retry_with_the_same_idempotency_key_sends_nothing_again(api, alice):
    headers = {**alice, "Idempotency-Key": "order-17"}
    first = await api.post("/api/v1/queues/orders.eu/messages", json={"body": "once"}, headers=headers)
    again = await api.post("/api/v1/queues/orders.eu/messages", json={"body": "once"}, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
    got = await receive(api, alice, await consumer(api, alice))
    assert [m["body"] for m in got] == ["once"]

    other = await api.post("/api/v1/queues/orders.eu/messages", json={"body": "different"}, headers=headers)
    assert_problem(other, 422, "idempotency_key_reused")


async def test_a_refused_send_does_not_use_up_its_idempotency_key(api, alice):
    headers = {**alice, "Idempotency-Key": "k"}
    bad = {"body": "x", "priority": 10}
    first = await api.post("/api/v1/queues/orders.eu/messages", json=bad, headers=headers)
    assert_problem(first, 400, "invalid_message")
    again = await api.post("/api/v1/queues/orders.eu/messages", json=bad, headers=headers)
    assert_problem(again, 400, "invalid_message")  # evaluated again, not replayed from a record


@pytest.mark.parametrize(("body", "field"), [
    ({"body": "x", "priority": 10}, "priority"),
    ({"body": "x", "colour": "red"}, "colour"),
    ({"body": 5}, "body"),
    ({"body_base64": "***"}, "body_base64"),
    ({"body": "x", "ttl": 5, "expiration": 5}, "expiration"),
    ({"body": "x", "properties": {"p": [1]}}, "properties.p"),
    ({"body": "x", "properties": {"p": {"type": "int", "value": 2**40}}}, None),
    ({"messages": []}, None),
])
async def test_invalid_messages_are_refused_with_the_field_named(api, alice, body, field):
    response = await api.post("/api/v1/queues/orders.eu/messages", json=body, headers=alice)
    problem = assert_problem(response, 400, "invalid_message")
    if field:
        assert field in problem["detail"]


async def test_a_body_over_the_policys_limit_is_413(api, alice):
    await blocking(runtime.policies().set_entry)("queue", "orders.>", {"maxMessageSize": 100})
    response = await api.post("/api/v1/queues/orders.eu/messages", json={"body": "x" * 1000}, headers=alice)
    assert_problem(response, 413, "message_too_large")


async def test_malformed_json_and_bad_names_are_problems(api, alice):
    response = await api.post("/api/v1/queues/orders.eu/messages", content=b"{nope",
                              headers={**alice, "Content-Type": "application/json"})
    assert_problem(response, 400, "invalid_json")
    response = await api.post("/api/v1/queues/orders..eu/messages", json={"body": "x"}, headers=alice)
    assert_problem(response, 400, "invalid_destination")


async def test_a_composite_reaches_a_queue_and_a_topics_subscribers(api, make_user):
    user = await blocking(make_user)("t", [(">", "admin"), ("topic://>", "admin")])
    path = await consumer(api, user, "prices", kind="topics")
    response = await api.post("/api/v1/messages", params={"destination": "orders,topic://prices"},
                              json={"body": "x"}, headers=user)
    assert response.status_code == 201, response.text
    assert response.json()["destinations"] == ["queue://orders", "topic://prices"]
    (got,) = await receive(api, user, path)
    assert (got["body"], got["destination"]) == ("x", "topic://prices")
    browse = (await api.get("/api/v1/queues/orders/messages", headers=user)).json()["messages"]
    assert [m["body"] for m in browse] == ["x"]


async def test_a_scheduled_message_is_delivered_after_its_delay(api, alice):
    path = await consumer(api, alice)
    await send(api, alice, {"body": "later", "delay": 400})
    assert await receive(api, alice, path) == []
    loop = asyncio.get_running_loop()
    started = loop.time()
    got = await receive(api, alice, path, wait=5)
    assert [m["body"] for m in got] == ["later"] and loop.time() - started < 4


async def test_a_delay_of_0_or_a_period_alone_makes_a_job_delivered_at_once(api, alice):
    """ActiveMQ's SchedulerBroker makes a job of every message sent with a delay or a period, 0 and a period
    without a repeat included: delivered at once, once, with scheduledJobId. The broker's rule
    (broker_core/messages.py), so the REST send applies it as STOMP's does: the envelope's `delay` /
    `period`, and a raw body's `Message-Delay` header."""
    path = await consumer(api, alice)
    ids = await send(api, alice, {"body": "zero", "delay": 0}, {"body": "period", "period": 200},
                     {"body": "plain"})
    response = await api.post("/api/v1/queues/orders.eu/messages", content=b"raw",
                              headers={**alice, "Content-Type": "text/plain", "Message-Delay": "0"})
    assert response.status_code == 201, response.text
    ids += response.json()["message_ids"]
    got = await receive(api, alice, path, wait=2)
    assert [(m["body"], m["properties"].get("scheduledJobId")) for m in got] == [
        ("zero", ids[0]), ("period", ids[1]), ("plain", None), ("raw", ids[3])]
    assert await receive(api, alice, path, wait=0.5) == []  # (once: the period without a repeat)


async def test_a_repeating_schedule_delivers_every_period(api, alice):
    path = await consumer(api, alice)
    await send(api, alice, {"body": "tick", "delay": 100, "period": 200, "repeat": 2})
    bodies = []
    for _ in range(3):
        for m in await receive(api, alice, path, wait=3):
            bodies.append(m["body"])
            await api.post(f"{path}/ack", json={"message_ids": [m["message_id"]]}, headers=alice)
    assert bodies == ["tick"] * 3


async def test_a_cron_schedule_parks_a_job_and_an_invalid_one_is_refused(api, alice):
    response = await api.post("/api/v1/queues/orders.eu/messages", json={"body": "x", "cron": "0 9 * * 1-5"},
                              headers=alice)
    assert response.status_code == 201, response.text
    response = await api.post("/api/v1/queues/orders.eu/messages", json={"body": "x", "cron": "0 9 * * MON"},
                              headers=alice)
    detail = assert_problem(response, 400, "invalid_message")["detail"]
    assert "(AMQ_SCHEDULED_CRON) '0 9 * * MON': the day of week field: 'MON' is not a number" in detail


async def test_a_send_to_the_scheduler_management_topic_browses_and_cancels_jobs(api, make_user):
    """The broker's scheduler management (docs/websocket.md, as over STOMP) from the REST send: BROWSE sends
    the jobs of the destinations the user may read to its reply_to, REMOVEALL cancels those it may
    administer; nothing is published on the topic."""
    carol = await blocking(make_user)("carol", [("queue://orders.>", "admin"),
                                                ("topic://ActiveMQ.Scheduler.Management", "write")])
    root = await blocking(make_user)("root", superuser=True)
    await send(api, root, {"body": "hers", "delay": 3_600_000}, destination="orders.sched")
    await send(api, root, {"body": "not hers", "delay": 3_600_000}, destination="billing.sched")
    replies = await consumer(api, carol, "orders.replies")
    path = "/api/v1/topics/ActiveMQ.Scheduler.Management/messages"
    response = await api.post(path, json={"properties": {"AMQ_SCHEDULER_ACTION": "BROWSE"},
                                          "reply_to": "queue://orders.replies"}, headers=carol)
    assert response.status_code == 201, response.text
    assert (response.json()["message_ids"], response.json()["jobs"]) == ([], [1])
    (job,) = await receive(api, carol, replies)
    assert (job["body"], job["type"]) == ("hers", "Advisory")
    assert job["properties"]["AMQ_SCHEDULED_DELAY"] == 3_600_000
    response = await api.post(path, json={"properties": {"AMQ_SCHEDULER_ACTION": "REMOVE"}}, headers=carol)
    assert "REMOVE needs scheduledJobId" in assert_problem(response, 400)["detail"]
    response = await api.post(path, json={"properties": {"AMQ_SCHEDULER_ACTION": "REMOVEALL"}}, headers=carol)
    assert response.json()["jobs"] == [1]
    broker = runtime.async_broker()
    assert ((await broker.stats("queue://orders.sched")).cancelled,
            (await broker.stats("queue://billing.sched")).parked) == (1, 1)


async def test_a_browse_needs_write_on_its_reply_to(api, make_user):
    """A BROWSE's replies are sends to its reply_to: 403 naming it where the user may not write there
    (gateway.permissions.reply_to_refusal, the STOMP and JSON sessions' check too: the same text), nothing
    sent."""
    carol = await blocking(make_user)("carol", [("queue://orders.>", "admin"),
                                                ("topic://ActiveMQ.Scheduler.Management", "write")])
    await send(api, carol, {"body": "hers", "delay": 3_600_000}, destination="orders.sched")
    response = await api.post("/api/v1/topics/ActiveMQ.Scheduler.Management/messages",
                              json={"properties": {"AMQ_SCHEDULER_ACTION": "BROWSE"},
                                    "reply_to": "queue://elsewhere.replies"}, headers=carol)
    assert assert_problem(response, 403, "permission_denied")["detail"] == (
        "User carol is not authorized to write to: queue://elsewhere.replies (the BROWSE's reply-to, where "
        "its jobs go)")
    with pytest.raises(UnknownDestination):  # (nothing was ever sent there)
        await runtime.async_broker().stats("queue://elsewhere.replies")


async def test_a_temporary_queues_jobs_are_managed_by_a_staff_user_with_the_grant(api, make_user):
    """One rule for a temporary destination's contents, the REST views' (permissions.contents_allowed): over
    REST (no connection) its jobs are a staff user's who also has the grant, as its messages are to browse.
    A staff user without a grant on it neither sees nor cancels them (the management's copy let staff see
    any); a user with the grant but no staff neither; a superuser (staff or not) does."""
    from django.contrib.auth.models import User

    name = "ID:tcp-0123456789abcdab:1"
    manage = [("topic://ActiveMQ.Scheduler.Management", "write"), ("queue://olga.replies", "admin")]
    olga = await blocking(make_user)("olga", manage, staff=True)  # staff, no grant on the queue
    carol = await blocking(make_user)("carol", [*manage, ("queue://>", "admin")])  # the grant, no staff
    otto = await blocking(make_user)("otto", [*manage, ("queue://>", "admin")], staff=True)
    root = await blocking(make_user)("root", superuser=True)
    await blocking(lambda: User.objects.filter(username="root").update(is_staff=False))()
    await send(api, root, {"body": "a reply, later", "delay": 3_600_000}, destination=name)
    path = "/api/v1/topics/ActiveMQ.Scheduler.Management/messages"

    async def jobs(user: dict[str, str], action: str) -> list[int]:
        response = await api.post(path, json={"properties": {"AMQ_SCHEDULER_ACTION": action},
                                              "reply_to": "queue://olga.replies"}, headers=user)
        assert response.status_code == 201, response.text
        return response.json()["jobs"]

    for user in (olga, carol):
        assert (await jobs(user, "BROWSE"), await jobs(user, "REMOVEALL")) == ([0], [0])
    assert await jobs(otto, "BROWSE") == [1]
    page = (await api.get(f"/api/v1/queues/{name}/scheduled", headers=root)).json()
    assert [m["body"] for m in page["messages"]] == ["a reply, later"]
    assert await jobs(root, "REMOVEALL") == [1]


async def test_a_browse_to_a_full_reply_to_is_a_503_naming_its_limit(api, make_user):
    """A BROWSE is admitted as a send to its reply_to (docs/broker_core.md "A BROWSE's replies and memory"):
    to a full one it is refused as a send there is, and nothing is sent."""
    root = await blocking(make_user)("root", superuser=True)
    await blocking(runtime.broker().policies.set_entry)("queue", "orders.full", {"memoryLimit": 2048,
                                                                                 "sendFailIfNoSpace": True})
    await send(api, root, {"body": "later", "delay": 3_600_000}, destination="orders.sched")
    await send(api, root, {"body": "x" * 1500}, destination="orders.full")
    response = await api.post("/api/v1/topics/ActiveMQ.Scheduler.Management/messages",
                              json={"properties": {"AMQ_SCHEDULER_ACTION": "BROWSE"},
                                    "reply_to": "queue://orders.full"}, headers=root)
    detail = assert_problem(response, 503, "resource_limit")["detail"]
    assert detail.startswith("Usage Manager Memory Limit reached on queue://orders.full")
    assert (await runtime.async_broker().stats("queue://orders.full")).enqueued == 1


async def test_a_batch_of_management_messages_with_a_bad_one_changes_nothing(api, make_user):
    """Bad input changes no state: a batch whose second management message is refused must not have
    carried out the first (a REMOVEALL that cancelled every job, answered with a 400)."""
    root = await blocking(make_user)("root", superuser=True)
    await send(api, root, {"body": "kept", "delay": 3_600_000}, destination="orders.sched")
    path = "/api/v1/topics/ActiveMQ.Scheduler.Management/messages"
    response = await api.post(path, json={"messages": [
        {"properties": {"AMQ_SCHEDULER_ACTION": "REMOVEALL"}},
        {"properties": {"AMQ_SCHEDULER_ACTION": "REMOVE"}}]}, headers=root)
    assert "REMOVE needs scheduledJobId" in assert_problem(response, 400)["detail"]
    stats = await runtime.async_broker().stats("queue://orders.sched")
    assert (stats.parked, stats.cancelled) == (1, 0)


def test_ids_derived_from_an_idempotency_key_sort_in_the_batchs_order():
    """Jobs due in the same millisecond fire in id order (the parked set's tie rule), so a batch's ids sort
    as its messages came; the first ten are as they always were (a retry across an upgrade stays a
    duplicate)."""
    from gateway.api.common import message_ids_for

    ids = message_ids_for("ID:idem-k", 1000)
    assert ids == sorted(ids) and len(set(ids)) == 1000
    assert ids[:10] == [f"ID:idem-k-{i}" for i in range(10)]
