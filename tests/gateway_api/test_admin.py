"""Administration over HTTP: destinations, groups, browsing, message operations, policies, audit."""

from __future__ import annotations

import pytest

from gateway.models import AuditRecord
from tests.gateway_api.mixins import (
    EndpointTests,
    SuperuserEndpointTests,
    assert_problem,
    blocking,
    consumer,
    receive,
    send,
)

pytestmark = pytest.mark.django_db(transaction=True)

Q = "/api/v1/queues/orders.eu"


async def _root(make_user):
    return await blocking(make_user)("root", superuser=True)


class Seeded(EndpointTests):
    """orders.eu holds three messages (two in group g, one with region=us), put in by a superuser."""

    async def prepare(self, api, headers):
        from django.contrib.auth.models import User

        from tests.gateway_api.mixins import token_headers

        def seeder():
            user, _ = User.objects.get_or_create(username="seeder", is_superuser=True)
            return token_headers(user)

        root = await blocking(seeder)()
        ids = await send(api, root, {"body": "one", "group_id": "g"}, {"body": "two", "group_id": "g"},
                         {"body": "three", "properties": {"region": "us"}})
        await api.put("/api/v1/queues/orders.us", headers=root)
        return {"ids": ids, "id0": ids[0], "root": root}


class TestDestinationDetail(Seeded):
    method, action, path = "get", "read", Q

    async def check(self, api, response, context, inspector):
        body = response.json()
        assert body["queue_size"] == 3 and body["kind"] == "queue" and body["name"] == "orders.eu"
        assert body["policy"]["queuePrefetch"] == 1000 and body["consumers"] == []


class TestCreateDestination(Seeded):
    method, action, path, expected_status = "put", "admin", Q, 201

    async def prepare(self, api, headers):
        return {}

    async def check(self, api, response, context, inspector):
        assert response.json()["destination"] == "queue://orders.eu"
        assert await blocking(AuditRecord.objects.filter(action="create_destination",
                                                              succeeded=True).exists)()


class TestDeleteDestination(Seeded):
    method, action, path = "delete", "admin", Q

    async def check(self, api, response, context, inspector):
        assert response.json() == {"removed": 3}
        assert_problem(await api.get(Q, headers=inspector), 404, "unknown_destination")


class TestPause(Seeded):
    method, action, path = "post", "admin", f"{Q}/pause"

    async def check(self, api, response, context, inspector):
        assert response.json()["paused"] is True
        path = await consumer(api, inspector)
        assert await receive(api, inspector, path) == []
        assert (await api.post(f"{Q}/resume", headers=inspector)).json()["paused"] is False
        assert len(await receive(api, inspector, path, wait=2)) == 3


class TestPurge(Seeded):
    method, action, path = "post", "admin", f"{Q}/purge"

    async def check(self, api, response, context, inspector):
        assert response.json()["removed"] == 3 and response.json()["queue_size"] == 0


class TestGroups(Seeded):
    method, action, path = "get", "read", f"{Q}/groups"

    async def prepare(self, api, headers):
        context = await super().prepare(api, headers)
        context["consumer"] = await consumer(api, context["root"])
        await receive(api, context["root"], context["consumer"])
        return context

    async def check(self, api, response, context, inspector):
        [group] = response.json()["groups"]
        assert response.json()["next_cursor"] is None
        assert group["group_id"] == "g" and group["owner"] == context["consumer"].rsplit("/", 1)[1]


class TestRemoveAllGroups(TestGroups):
    method, action, path = "delete", "admin", f"{Q}/groups"

    async def check(self, api, response, context, inspector):
        assert response.json() == {"count": 1}
        assert (await api.get(f"{Q}/groups", headers=inspector)).json() == {"groups": [], "next_cursor": None}


class TestRemoveGroup(TestGroups):
    method, action, path = "delete", "admin", f"{Q}/groups/g"

    async def check(self, api, response, context, inspector):
        assert response.json() == {"count": 1}
        assert_problem(await api.delete(f"{Q}/groups/g", headers=inspector), 404, "unknown_group")


class TestBrowse(Seeded):
    method, action, path = "get", "read", f"{Q}/messages"
    params = {"limit": 2}

    async def check(self, api, response, context, inspector):
        page = response.json()
        assert [m["body"] for m in page["messages"]] == ["one", "two"]
        assert page["messages"][0]["state"] == "pending" and page["next_cursor"]
        rest = (await api.get(f"{Q}/messages", params={"cursor": page["next_cursor"]},
                              headers=inspector)).json()
        assert [m["body"] for m in rest["messages"]] == ["three"] and rest["next_cursor"] is None
        chosen = (await api.get(f"{Q}/messages", params={"selector": "region = 'us'"},
                                headers=inspector)).json()
        assert [m["body"] for m in chosen["messages"]] == ["three"]


class TestMessageDetail(Seeded):
    method, action, path = "get", "read", f"{Q}/messages/{{id0}}"

    async def check(self, api, response, context, inspector):
        assert response.json()["body"] == "one" and response.json()["group_id"] == "g"


class TestRemoveMessage(Seeded):
    method, action, path, expected_status = "delete", "admin", f"{Q}/messages/{{id0}}", 204

    async def check(self, api, response, context, inspector):
        assert_problem(await api.get(f"{Q}/messages/{context['id0']}", headers=inspector), 404,
                       "unknown_message")


class TestMoveMessage(Seeded):
    method, action, path = "post", "admin", f"{Q}/messages/{{id0}}/move"
    body = {"target": "orders.us"}
    extra_grants = [("queue://orders.us", "write")]

    async def check(self, api, response, context, inspector):
        assert response.json() == {"count": 1}
        moved = (await api.get("/api/v1/queues/orders.us/messages", headers=inspector)).json()["messages"]
        assert [m["message_id"] for m in moved] == [context["id0"]]
        assert (await api.get(Q, headers=inspector)).json()["queue_size"] == 2


class TestCopyMessage(TestMoveMessage):
    path = f"{Q}/messages/{{id0}}/copy"

    async def check(self, api, response, context, inspector):
        assert response.json() == {"count": 1}
        assert (await api.get(Q, headers=inspector)).json()["queue_size"] == 3
        assert (await api.get("/api/v1/queues/orders.us", headers=inspector)).json()["queue_size"] == 1


class TestMoveMatching(Seeded):
    method, action, path = "post", "admin", f"{Q}/move-matching"
    body = {"selector": "JMSXGroupID = 'g'", "target": "orders.us"}
    extra_grants = [("queue://orders.us", "write")]

    async def check(self, api, response, context, inspector):
        assert response.json() == {"count": 2}


class TestScheduled(Seeded):
    method, action, path = "get", "read", f"{Q}/scheduled"

    async def prepare(self, api, headers):
        context = await super().prepare(api, headers)
        await send(api, context["root"], {"body": "later", "delay": 60_000})
        return context

    async def check(self, api, response, context, inspector):
        assert [m["body"] for m in response.json()["messages"]] == ["later"]
        assert response.json()["messages"][0]["state"] == "parked"


class TestAudit(SuperuserEndpointTests):
    method, path = "get", "/api/v1/audit"

    async def prepare(self, api, headers):
        await api.post(f"{Q}/purge", headers=headers)  # audited whatever its outcome
        return {}

    async def check(self, api, response, context, inspector):
        [record] = response.json()["results"]
        assert record["action"] == "purge" and record["username"] == "root"


class TestDestinationList(EndpointTests):
    method, action, path = "get", "read", "/api/v1/destinations"

    async def prepare(self, api, headers):
        root = await blocking(__import__("tests.gateway_api.conftest", fromlist=["x"]).token_headers)(
            await blocking(lambda: __import__("django.contrib.auth.models", fromlist=["User"]).User
                                .objects.get_or_create(username="seeder", is_superuser=True)[0])())
        for name, count in (("orders.eu", 3), ("orders.us", 1), ("billing.x", 2)):
            await send(api, root, *[{"body": "x"}] * count, destination=name)
        return {}

    async def test_users_without_the_permission_are_refused(self, api, make_user):
        # A listing refuses nobody: it shows what the user may read.
        user = await blocking(make_user)("reader", [("queue://billing.>", "read")])
        await self.prepare(api, user)
        names = [r["name"] for r in (await self.call(api, user, {})).json()["results"]]
        assert names == ["billing.x"]

    async def check(self, api, response, context, inspector):
        assert [r["name"] for r in response.json()["results"]] == ["orders.eu"]
        listing = (await api.get("/api/v1/destinations", params={"ordering": "-queue_size", "limit": 2},
                                 headers=inspector)).json()
        assert listing["count"] == 3 and [r["name"] for r in listing["results"]] == ["orders.eu", "billing.x"]
        assert "offset=2" in listing["next"]
        following = (await api.get(listing["next"], headers=inspector)).json()
        assert [r["name"] for r in following["results"]] == ["orders.us"] and following["previous"]
        found = (await api.get("/api/v1/destinations", params={"search": "BILL"}, headers=inspector)).json()
        assert [r["name"] for r in found["results"]] == ["billing.x"]
        bad = await api.get("/api/v1/destinations", params={"ordering": "colour"}, headers=inspector)
        assert_problem(bad, 400, "invalid_parameter")


class TestPolicySet(EndpointTests):
    method, action, path = "put", "admin", "/api/v1/policies/queue/orders.eu"
    body = {"attributes": {"queuePrefetch": 7}}

    async def prepare(self, api, headers):
        return {}

    async def check(self, api, response, context, inspector):
        assert response.json()["id"] == "queue://orders.eu"
        await api.put(Q, headers=inspector)
        detail = (await api.get(Q, headers=inspector)).json()
        assert detail["policy"]["queuePrefetch"] == 7
        listed = (await api.get("/api/v1/policies", headers=inspector)).json()
        assert [e["id"] for e in listed] == ["queue://orders.eu"]
        bad = await api.put("/api/v1/policies/queue/orders.eu", json={"attributes": {"queuePrefetch": -3}},
                            headers=inspector)
        assert_problem(bad, 400, "invalid_policy")
        assert (await api.delete("/api/v1/policies/queue/orders.eu", headers=inspector)).status_code == 204


async def test_unknown_destinations_are_404(api, alice):
    assert_problem(await api.get("/api/v1/queues/orders.none", headers=alice), 404, "unknown_destination")
    response = await api.post("/api/v1/queues/orders.none/purge", headers=alice)
    assert_problem(response, 404, "unknown_destination")


async def test_every_administrative_action_is_audited_with_its_result(api, alice, make_user):
    await send(api, alice, {"body": "x"})
    await api.post(f"{Q}/pause", headers=alice)
    await api.post("/api/v1/queues/orders.none/purge", headers=alice)
    records = await blocking(lambda: list(AuditRecord.objects.order_by("pk").values(
        "username", "action", "destination", "succeeded", "status_code")))()
    assert records == [
        {"username": "alice", "action": "pause", "destination": "queue://orders.eu", "succeeded": True,
         "status_code": 200},
        {"username": "alice", "action": "purge", "destination": "queue://orders.none", "succeeded": False,
         "status_code": 404},
    ]


async def test_moving_to_a_destination_without_write_permission_is_refused(api, make_user):
    user = await blocking(make_user)("mover", [("queue://orders.>", "admin")])
    [message_id] = await send(api, user, {"body": "x"})
    response = await api.post(f"{Q}/messages/{message_id}/move", json={"target": "billing"}, headers=user)
    assert_problem(response, 403, "permission_denied")


async def test_retry_is_refused_outside_a_dead_letter_queue(api, alice):
    [message_id] = await send(api, alice, {"body": "x"})
    response = await api.post(f"{Q}/messages/{message_id}/retry", headers=alice)
    assert_problem(response, 409, "operation_refused")


async def test_a_dead_letter_is_retried_to_its_queue(api, make_user):
    root = await _root(make_user)
    [message_id] = await send(api, root, {"body": "bad"})
    path = await consumer(api, root)
    await receive(api, root, path)
    await api.post(f"{path}/nack", json={"message_ids": [message_id], "poison": True}, headers=root)
    dlq = (await api.get("/api/v1/destinations", params={"search": "DLQ"}, headers=root)).json()["results"]
    [dead] = dlq
    response = await api.post(f"/api/v1/queues/{dead['name']}/messages/{message_id}/retry", headers=root)
    assert response.json() == {"count": 1}
    [back] = await receive(api, root, path, wait=3)
    assert back["message_id"] == message_id


async def test_the_groups_of_a_queue_come_in_pages_with_a_cursor(api, alice):
    path = await consumer(api, alice, prefetch=1000)
    for start in range(0, 900, 300):
        await send(api, alice, *({"body": "x", "group_id": f"g{n}"} for n in range(start, start + 300)))
    owner = path.rsplit("/", 1)[1]
    seen, pages, cursor = [], 0, None
    while True:
        params = {"limit": 200, **({"cursor": cursor} if cursor else {})}
        response = await api.get(f"{Q}/groups", params=params, headers=alice)
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["groups"]) <= 400 and {g["owner"] for g in body["groups"]} <= {owner}
        seen += [g["group_id"] for g in body["groups"]]
        pages, cursor = pages + 1, body["next_cursor"]
        if cursor is None:
            break
    assert sorted(set(seen)) == sorted(f"g{n}" for n in range(900)) and pages >= 3
    for bad in ({"cursor": "x1"}, {"limit": 0}, {"limit": 1001}):
        assert (await api.get(f"{Q}/groups", params=bad, headers=alice)).status_code == 400


async def test_the_console_groups_view_lists_the_first_groups_and_says_it(api, alice, monkeypatch):
    from gateway.api import views_console

    monkeypatch.setattr(views_console, "GROUPS_SHOWN", 5)
    await consumer(api, alice, prefetch=100)
    await send(api, alice, *({"body": "x", "group_id": f"g{n}"} for n in range(40)))
    body = (await api.get("/api/v1/console/queues/orders.eu/groups", headers=alice)).json()
    assert len(body["groups"]) == 5 and body["group_count"] == 40 and body["groups_complete"] is False
    monkeypatch.setattr(views_console, "GROUPS_SHOWN", 1000)
    body = (await api.get("/api/v1/console/queues/orders.eu/groups", headers=alice)).json()
    assert len(body["groups"]) == 40 and body["groups_complete"] is True


async def test_a_browse_cursor_the_listing_did_not_give_is_refused_by_name(api, alice):
    """As the groups' cursor: 400 invalid_consumer naming `cursor`, never a 500 (Redis refusing a score or
    an HSCAN cursor) nor an empty last page that tells the client it has seen every message."""
    await send(api, alice, {"body": "one"}, {"body": "two"})
    first = (await api.get(f"{Q}/messages", params={"limit": 1}, headers=alice)).json()
    assert first["next_cursor"].startswith("p:")
    for bad in ("zzz", "x:1", "p:abc|ID:x", "p:1_0|ID:x", "p:nan|ID:x", "k:1|", "p:", "i:abc", "i:-5",
                "i:0", f"i:{2**64}"):
        for path in (f"{Q}/messages", f"{Q}/scheduled"):
            problem = assert_problem(await api.get(path, params={"cursor": bad}, headers=alice), 400,
                                     "invalid_consumer")
            assert problem["field"] == "cursor" and "cursor" in problem["detail"], (bad, problem)
    rest = (await api.get(f"{Q}/messages", params={"cursor": first["next_cursor"]}, headers=alice)).json()
    assert [m["body"] for m in rest["messages"]] == ["two"]


async def test_a_temporary_queue_is_browsed_only_by_an_operator(api, make_user):
    """A temporary queue's messages are its connection's: ActiveMQ's client refuses a browser of another
    connection's temporary queue as it refuses a consumer ("Cannot consume from a temporary destination
    created on another connection"), and Signalbox's STOMP browser and its consumers are refused so
    (Router.add_consumer, Broker.browser_limit). Over REST, which has no connection, a user whose grant
    covers its name may not browse it either; a staff user (the console's operator) may."""
    name = "ID:tcp-0123456789abcdef:1"
    user = await blocking(make_user)("carol", [("queue://>", "admin")])
    staff = await blocking(make_user)("olga", [("queue://>", "admin")], staff=True)
    [sent] = await send(api, user, {"body": "a reply"}, destination=name)
    for path in ("messages", f"messages/{sent}", "scheduled"):
        problem = assert_problem(await api.get(f"/api/v1/queues/{name}/{path}", headers=user), 403)
        assert "temporary" in problem["detail"] and name in problem["detail"], (path, problem)
    page = (await api.get(f"/api/v1/queues/{name}/messages", headers=staff)).json()
    assert [m["body"] for m in page["messages"]] == ["a reply"]


async def test_a_temporary_queue_s_messages_are_moved_or_copied_out_only_by_an_operator(api, make_user):
    """A user whose grant covers a temporary queue's name may not browse it (above), nor take its messages
    out to read them elsewhere: a copy or move of them (by id or by selector) to a queue of the user's own
    was a browse of them by another way. A staff user may."""
    name = "ID:tcp-0123456789abcdee:1"
    user = await blocking(make_user)("cora", [("queue://>", "admin")])
    staff = await blocking(make_user)("otto", [("queue://>", "admin")], staff=True)
    [sent] = await send(api, user, {"body": "a reply"}, destination=name)
    for target in ("cora.copy", "cora.move", "otto.copy"):  # (a target must exist)
        await send(api, staff, {"body": "before"}, destination=target)
    source = f"/api/v1/queues/{name}"
    for action, path in (("copy", f"messages/{sent}/copy"), ("move", f"messages/{sent}/move"),
                         ("copy", "copy-matching"), ("move", "move-matching")):
        response = await api.post(f"{source}/{path}", json={"target": f"queue://cora.{action}"}, headers=user)
        problem = assert_problem(response, 403)
        assert "temporary" in problem["detail"] and name in problem["detail"], (path, problem)
    for loot in ("cora.copy", "cora.move"):  # nothing reached them
        page = (await api.get(f"/api/v1/queues/{loot}/messages", headers=staff)).json()
        assert [m["body"] for m in page["messages"]] == ["before"], (loot, page)
    response = await api.post(f"{source}/copy-matching", json={"target": "queue://otto.copy"}, headers=staff)
    assert response.json()["count"] == 1, response.text
