"""Consuming over HTTP with leases: create, long-poll receive, ack, nack, heartbeat, delete."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gateway import runtime
from tests.gateway_api.mixins import EndpointTests, assert_problem, blocking, consumer, receive, send

pytestmark = pytest.mark.django_db(transaction=True)


class _Seeded(EndpointTests):
    """Endpoints of one HTTP consumer: only its owner may use it (others get 404, not a hint).
    A superuser puts two messages in, so the user under test needs only the action it tests."""

    unprivileged_status = 404
    consumer_options: dict = {}
    needs_messages = False

    async def prepare(self, api, headers):
        from django.contrib.auth.models import User

        from tests.gateway_api.mixins import token_headers

        def seeder():
            user, _ = User.objects.get_or_create(username="seeder", is_superuser=True)
            return token_headers(user)

        root = await blocking(seeder)()
        await send(api, root, {"body": "a"}, {"body": "b"})
        path = await consumer(api, headers, **self.consumer_options)
        ids = [m["message_id"] for m in await receive(api, headers, path)] if self.needs_messages else []
        return {"consumer": path, "ids": ids}


class TestCreateConsumer(_Seeded):
    method, path, action, expected_status = "post", "/api/v1/queues/orders.eu/consumers", "read", 201
    unprivileged_status = 403
    body = {"selector": "JMSPriority > 3", "prefetch": 5, "ack_mode": "client-individual", "lease_ms": 10_000}

    async def prepare(self, api, headers):
        return {}

    async def check(self, api, response, context, inspector):
        created = response.json()
        assert created["prefetch"] == 5 and created["lease_ms"] == 10_000
        assert response.headers["Location"].endswith(created["consumer_id"])
        assert set(created["links"]) == {"self", "receive", "ack", "nack", "heartbeat"}


class TestReceive(_Seeded):
    method, action = "post", "read"
    path = "{consumer}/receive"
    params = {"max_messages": 10}

    async def check(self, api, response, context, inspector):
        messages = response.json()["messages"]
        assert [m["body"] for m in messages] == ["a", "b"]
        first = messages[0]
        assert first["redelivered"] is False and first["delivery_count"] == 1
        assert first["group_first_for_consumer"] is False


class TestAck(_Seeded):
    method, action, needs_messages = "post", "read", True
    path = "{consumer}/ack"

    def request_body(self, context):
        return {"message_ids": context.get("ids") or ["ID:none"]}

    async def check(self, api, response, context, inspector):
        assert response.json() == {"acknowledged": 2, "messages": []}
        stats = (await api.get("/api/v1/queues/orders.eu", headers=inspector)).json()
        assert stats["queue_size"] == 0 and stats["dequeued"] == 2


class TestNack(_Seeded):
    method, action, needs_messages = "post", "read", True
    path = "{consumer}/nack"

    def request_body(self, context):
        return {"message_ids": context.get("ids") or ["ID:none"]}

    async def check(self, api, response, context, inspector):
        assert response.json() == {"dead_lettered": 0, "redelivered": 2}


class TestHeartbeat(_Seeded):
    method, action, path = "post", "read", "{consumer}/heartbeat"

    async def check(self, api, response, context, inspector):
        assert response.json()["consumer_id"] == context["consumer"].rsplit("/", 1)[1]


class TestDeleteConsumer(_Seeded):
    method, action, path, expected_status = "delete", "read", "{consumer}", 204
    unprivileged_status = 403  # someone else's consumer: closing it takes admin on the destination

    async def check(self, api, response, context, inspector):
        stats = (await api.get("/api/v1/queues/orders.eu", headers=inspector)).json()
        assert stats["consumer_count"] == 0


class TestConsumerDetail(_Seeded):
    method, action, path = "get", "read", "{consumer}"
    unprivileged_status = 403

    async def check(self, api, response, context, inspector):
        detail = response.json()
        assert detail["consumer_id"] == context["consumer"].rsplit("/", 1)[1]
        assert {"prefetch", "in_flight", "dispatched", "acked", "lease_expires", "slow",
                "full"} <= set(detail)


class TestConsumerList(_Seeded):
    method, action, path = "get", "admin", "/api/v1/queues/orders.eu/consumers"
    unprivileged_status = 403

    async def check(self, api, response, context, inspector):
        assert [c["consumer_id"] for c in response.json()] == [context["consumer"].rsplit("/", 1)[1]]


# -- behaviour ----------------------------------------------------------------------------------------

async def test_a_long_poll_returns_as_soon_as_a_message_arrives(api, alice):
    path = await consumer(api, alice)
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiting = asyncio.create_task(receive(api, alice, path, wait=10))
    await asyncio.sleep(0.3)
    await send(api, alice, {"body": "wake"})
    got = await waiting
    assert [m["body"] for m in got] == ["wake"]
    assert loop.time() - started < 3


async def test_a_long_poll_waits_its_time_then_answers_empty(api, alice):
    path = await consumer(api, alice)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await receive(api, alice, path, wait=0.6) == []
    assert 0.5 < loop.time() - started < 3


async def test_the_wait_is_capped(api, alice, settings):
    settings.SIGNALBOX_MAX_RECEIVE_WAIT = 0.3
    path = await consumer(api, alice)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await receive(api, alice, path, wait=3600) == []
    assert loop.time() - started < 2


async def test_an_abandoned_consumers_messages_go_to_another_when_its_lease_lapses(api, alice):
    await send(api, alice, *[{"body": f"m{i}", "group_id": "g"} for i in range(3)])
    dead = await consumer(api, alice, lease_ms=1000)
    got = await receive(api, alice, dead, max_messages=10)
    assert len(got) == 3 and got[0]["group_first_for_consumer"] is True
    alive = await consumer(api, alice, lease_ms=30_000)
    await asyncio.sleep(1.2)  # the dead one never renews its lease
    again = await receive(api, alice, alive, max_messages=10, wait=5)
    assert [m["body"] for m in again] == ["m0", "m1", "m2"]
    assert all(m["redelivered"] and m["delivery_count"] == 2 for m in again)
    assert again[0]["group_first_for_consumer"] is True  # the group moved to the survivor
    response = await api.post(f"{dead}/receive", headers=alice)
    assert "lease lapsed" in assert_problem(response, 404, "unknown_consumer")["detail"]


async def test_heartbeats_keep_a_consumer_alive(api, alice):
    await send(api, alice, {"body": "x"})
    path = await consumer(api, alice, lease_ms=1000)
    await receive(api, alice, path)
    for _ in range(3):
        await asyncio.sleep(0.4)
        assert (await api.post(f"{path}/heartbeat", headers=alice)).status_code == 200
    assert await runtime.async_broker().reap_lapsed("orders.eu") == []
    assert (await api.get(path, headers=alice)).json()["in_flight"] == 1


async def test_acking_a_message_not_in_flight_is_a_conflict(api, alice):
    [message_id] = await send(api, alice, {"body": "x"})
    path = await consumer(api, alice)
    await receive(api, alice, path)
    first = await api.post(f"{path}/ack", json={"message_ids": [message_id]}, headers=alice)
    assert first.status_code == 200
    again = await api.post(f"{path}/ack", json={"message_ids": [message_id]}, headers=alice)
    assert message_id in assert_problem(again, 409, "not_in_flight")["detail"]


async def test_cumulative_acks_and_ack_then_receive(api, alice):
    ids = await send(api, alice, *[{"body": f"m{i}"} for i in range(4)])
    path = await consumer(api, alice, ack_mode="client", prefetch=2)
    got = await receive(api, alice, path, max_messages=2)
    response = await api.post(f"{path}/ack", params={"receive": 2},
                              json={"message_ids": [got[1]["message_id"]], "mode": "cumulative"},
                              headers=alice)
    assert [m["message_id"] for m in response.json()["messages"]] == ids[2:]


async def test_auto_consumers_need_no_ack(api, alice):
    await send(api, alice, {"body": "x"})
    path = await consumer(api, alice, ack_mode="auto")
    [got] = await receive(api, alice, path)
    stats = (await api.get("/api/v1/queues/orders.eu", headers=alice)).json()
    assert stats["queue_size"] == 0
    response = await api.post(f"{path}/ack", json={"message_ids": [got["message_id"]]}, headers=alice)
    assert_problem(response, 400, "invalid_consumer")


async def test_a_nacked_message_comes_back_and_a_poisoned_one_is_dead_lettered(api, alice):
    await blocking(runtime.policies().set_entry)("queue", "orders.>", {"initialRedeliveryDelay": 0,
                                                                             "redeliveryDelay": 0})
    await runtime.async_broker().refresh_policies()
    [first, second] = await send(api, alice, {"body": "retry me"}, {"body": "poison"})
    path = await consumer(api, alice)
    await receive(api, alice, path, max_messages=2)
    response = await api.post(f"{path}/nack", json={"message_ids": [first]}, headers=alice)
    assert response.json() == {"dead_lettered": 0, "redelivered": 1}
    response = await api.post(f"{path}/nack", json={"message_ids": [second], "poison": True}, headers=alice)
    assert response.json() == {"dead_lettered": 1, "redelivered": 0}
    [back] = await receive(api, alice, path, wait=3)
    assert back["message_id"] == first and back["redelivered"] is True


async def test_a_selector_filters_and_a_bad_one_says_where(api, alice):
    await send(api, alice, {"body": "eu", "properties": {"region": "eu"}}, {"body": "us",
                                                                              "properties": {"region": "us"}})
    path = await consumer(api, alice, selector="region = 'us'")
    assert [m["body"] for m in await receive(api, alice, path)] == ["us"]
    response = await api.post("/api/v1/queues/orders.eu/consumers", json={"selector": "region = = 'x'"},
                              headers=alice)
    problem = assert_problem(response, 400, "invalid_selector")
    assert problem["position"] == 10 and problem["expected"]


async def test_a_forged_or_foreign_consumer_id_is_unknown(api, alice, make_user):
    path = await consumer(api, alice)
    forged = path[:-4] + ("0000" if not path.endswith("0000") else "1111")
    assert_problem(await api.post(f"{forged}/receive", headers=alice), 404, "unknown_consumer")
    other = await blocking(make_user)("carol", [("queue://orders.>", "admin")])
    # carol may administer the queue but may not consume with alice's consumer
    assert_problem(await api.post(f"{path}/receive", headers=other), 404, "unknown_consumer")
    assert (await api.get(path, headers=other)).status_code == 200  # she may look at it
    assert (await api.delete(path, headers=other)).status_code == 204  # and close it (audited)


@pytest.mark.parametrize(("params", "name"), [({"max_messages": 0}, "max_messages"),
                                              ({"max_messages": "x"}, "max_messages"),
                                              ({"wait": "soon"}, "wait")])
async def test_bad_receive_parameters_are_problems(api, alice, params, name):
    path = await consumer(api, alice)
    response = await api.post(f"{path}/receive", params=params, headers=alice)
    assert assert_problem(response, 400, "invalid_parameter")["parameter"] == name


async def test_a_no_local_consumer_skips_what_its_own_user_sent(api, alice, make_user):
    other = await blocking(make_user)("olga", [("queue://orders.>", "write")])
    await send(api, alice, {"body": "mine"})
    await send(api, other, {"body": "theirs"})
    path = await consumer(api, alice, no_local=True)
    assert [m["body"] for m in await receive(api, alice, path)] == ["theirs"]


async def test_a_pull_consumer_gets_what_arrives_during_its_long_poll(api, alice):
    path = await consumer(api, alice, prefetch=0)
    assert path.rsplit("/", 1)[1].startswith("http-I")  # the id says it pulls
    waiting = asyncio.create_task(receive(api, alice, path, wait=5))
    await asyncio.sleep(0.3)
    await send(api, alice, {"body": "pulled"})
    assert [m["body"] for m in await waiting] == ["pulled"]
    assert await receive(api, alice, path, wait=0.2) == []
    await send(api, alice, {"body": "later"})  # nothing is dispatched to it between receives
    stats = (await api.get(path, headers=alice)).json()
    assert stats["in_flight"] == 1 and stats["undelivered"] == 0


async def test_an_aborted_consumer_answers_its_next_call_with_410_and_the_reason(api, alice):
    from broker_core.destinations import parse_destination
    from broker_core.maintenance import abort_consumer
    from broker_core.model import ConsumerRef

    await send(api, alice, {"body": "x"})
    path = await consumer(api, alice)
    assert len(await receive(api, alice, path)) == 1
    (held,) = (await blocking(runtime.broker().stats)("orders.eu")).consumers
    ref = ConsumerRef(parse_destination("orders.eu"), held.consumer_id)
    await blocking(abort_consumer)(runtime.broker(), ref, "stopped acknowledging for 30 s")
    problem = assert_problem(await api.post(f"{path}/receive", headers=alice), 410, "consumer_aborted")
    assert "stopped acknowledging for 30 s" in problem["detail"] and problem["strategy"] == "operator"


async def test_an_auto_receive_cancelled_while_its_messages_are_leased_leaves_none_in_flight(api, alice):
    """An ack-mode-auto consumer's messages are leased, unacknowledged, by the receive's script call and
    acknowledged once the answer is written (gateway/api/after_write.py); the receive is never handed them
    again. A request cancelled (its client gone) while that call's reply is on its way must give them back:
    kept in flight they were stuck there as long as the consumer lived, filling its window. The cancel is
    swept over the event loop's steps so that some land during the call."""
    from broker_core.destinations import parse_destination
    from gateway.api import after_write, views_messaging
    from gateway.api.consumer_ids import parse_consumer_id

    path = await consumer(api, alice, ack_mode="auto", prefetch=1000)
    queue = parse_destination("queue://orders.eu")
    held = parse_consumer_id(queue, path.rsplit("/", 1)[1])
    await send(api, alice, *[{"body": str(n)} for n in range(60)])
    for steps in range(60):
        scope: dict = {}
        after_write.open_slot(scope)
        task = asyncio.create_task(views_messaging.receive_messages(held, 1, 0.0, lambda got: got, scope))
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await after_write.finish(scope, None)  # as the handler does at the request's end: not written
    # nothing was written, so nothing acknowledged: the consumer is handed all 60 again (those given back
    # after their redelivery delay)
    got: list[int] = []
    for _ in range(30):
        got += [int(m["body"]) for m in await receive(api, alice, path, max_messages=1000, wait=1)]
        if len(got) >= 60:
            break
    assert sorted(got) == list(range(60))
    stats = await runtime.async_broker().stats(queue)
    assert (stats.queue_size, stats.in_flight) == (0, 0)


async def test_a_consumer_past_the_queues_limit_is_a_problem_naming_it(api, alice, settings):
    """SIGNALBOX_MAX_CONSUMERS (broker_core/model.py MAX_CONSUMERS): a queue's consumers bound what its
    dispatch reads; one more is refused, naming the setting and its value, and none is made."""
    settings.SIGNALBOX_MAX_CONSUMERS = 2
    paths = [await consumer(api, alice), await consumer(api, alice)]
    response = await api.post("/api/v1/queues/orders.eu/consumers", json={}, headers=alice)
    problem = assert_problem(response, 409, "too_many_consumers")
    assert "the limit is 2 (SIGNALBOX_MAX_CONSUMERS)" in problem["detail"]
    assert (problem["setting"], problem["limit"]) == ("SIGNALBOX_MAX_CONSUMERS", 2)
    listed = await api.get("/api/v1/queues/orders.eu/consumers", headers=alice)
    assert len(listed.json()) == 2
    assert (await api.delete(paths[0], headers=alice)).status_code == 204
    await consumer(api, alice)  # room again
