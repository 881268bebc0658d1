"""Reusable endpoint tests, NetBox style: a test class names its endpoint (method, path, body, the
action it needs on which destination) and inherits the authentication, permission and problem-shape
tests every endpoint must pass.

    class TestSend(EndpointTests):
        method, path, action = "post", "/api/v1/queues/orders.eu/messages", "write"
        body = {"body": "hi"}
        expected_status = 201
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from asgiref.sync import sync_to_async
from rest_framework.authtoken.models import Token

PROBLEM = "application/problem+json"


def blocking(fn: Callable[..., Any]) -> Callable[..., Any]:
    """sync_to_async on a pool thread. Not asgiref's shared thread: Channels closes old database
    connections there, and a connection a test left there (SQLite in memory never really closes)
    would trip a later test that has no database access."""
    return sync_to_async(fn, thread_sensitive=False)


def token_headers(user: Any) -> dict[str, str]:
    token, _ = Token.objects.get_or_create(user=user)
    return {"Authorization": f"Token {token.key}"}


# The destination every endpoint test works on, and a grant that must not reach it.
DESTINATION = "queue://orders.eu"
OTHER = "queue://billing.>"


def assert_problem(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The response is RFC 9457 problem details with this status (and code)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body = response.json()
    assert body["status"] == status
    assert body["type"].startswith("urn:signalbox:problem:")
    assert body["title"] and body["detail"]
    if code is not None:
        assert body["code"] == code, body
    return body


class EndpointTests:
    """Anonymous, unprivileged and permitted users against one endpoint."""

    method = "get"
    path = ""  # may use {placeholders} filled from prepare()'s context
    action = "read"  # what the user needs on DESTINATION
    body: Any = None
    content: bytes | None = None
    params: dict[str, Any] | None = None
    expected_status = 200
    unprivileged_status = 403  # 404 for resources only their owner may see
    extra_grants: list[tuple[str, str]] = []  # what a permitted user needs beyond `action` (a move's target)

    async def prepare(self, api: httpx.AsyncClient, headers: dict[str, str]) -> dict[str, Any]:
        """Create what the request needs, as the user with `headers`; returns path placeholders."""
        return {}

    async def check(self, api: httpx.AsyncClient, response: httpx.Response, context: dict[str, Any],
                    inspector: dict[str, str]) -> None:
        """What a successful response must show (beyond its status); `inspector` is a superuser."""

    def request_body(self, context: dict[str, Any]) -> Any:
        return self.body

    async def call(self, api: httpx.AsyncClient, headers: dict[str, str] | None,
                   context: dict[str, Any]) -> httpx.Response:
        kwargs: dict[str, Any] = {"headers": headers or {}, "params": self.params}
        body = self.request_body(context)
        if body is not None:
            kwargs["json"] = body
        if self.content is not None:
            kwargs["content"] = self.content
        return await api.request(self.method.upper(), self.path.format(**context), **kwargs)

    async def test_anonymous_users_must_authenticate(self, api, make_user):
        owner = await blocking(make_user)("owner", [(DESTINATION, "admin")])
        context = await self.prepare(api, owner)
        response = await self.call(api, None, context)
        assert_problem(response, 401, "not_authenticated")
        assert response.headers.get("www-authenticate")

    async def test_a_bad_token_is_refused(self, api, make_user):
        owner = await blocking(make_user)("owner", [(DESTINATION, "admin")])
        context = await self.prepare(api, owner)
        response = await self.call(api, {"Authorization": "Token not-a-token"}, context)
        assert_problem(response, 401, "authentication_failed")

    async def test_users_without_the_permission_are_refused(self, api, make_user):
        owner = await blocking(make_user)("owner", [(DESTINATION, "admin")])
        # Everything elsewhere, and on this destination every action but the one needed.
        grants = [(OTHER, "admin")]
        if self.action == "admin":
            grants += [(DESTINATION, "read"), (DESTINATION, "write")]
        elif self.action == "read":
            grants += [(DESTINATION, "write")]
        else:
            grants += [(DESTINATION, "read")]
        stranger = await blocking(make_user)("stranger", grants)
        context = await self.prepare(api, owner)
        response = await self.call(api, stranger, context)
        assert_problem(response, self.unprivileged_status)

    async def test_permitted_users_succeed(self, api, make_user):
        user = await blocking(make_user)("permitted", [(DESTINATION, self.action), *self.extra_grants])
        context = await self.prepare(api, user)
        response = await self.call(api, user, context)
        assert response.status_code == self.expected_status, response.text
        inspector = await blocking(make_user)("inspector", superuser=True)
        await self.check(api, response, context, inspector)

    async def test_permission_through_a_group_is_enough(self, api, make_user):
        user = await blocking(make_user)("member", [(DESTINATION, self.action), *self.extra_grants],
                                              group="operators")
        context = await self.prepare(api, user)
        response = await self.call(api, user, context)
        assert response.status_code == self.expected_status, response.text


class SuperuserEndpointTests(EndpointTests):
    """Endpoints without a destination: staff only (the audit log)."""

    async def test_users_without_the_permission_are_refused(self, api, make_user):
        user = await blocking(make_user)("plain", [(">", "admin")])
        response = await self.call(api, user, await self.prepare(api, user))
        assert_problem(response, 403)

    async def test_permitted_users_succeed(self, api, make_user):
        user = await blocking(make_user)("root", superuser=True)
        context = await self.prepare(api, user)
        response = await self.call(api, user, context)
        assert response.status_code == self.expected_status, response.text
        await self.check(api, response, context, user)

    async def test_permission_through_a_group_is_enough(self, api, make_user):
        user = await blocking(make_user)("staffer", staff=True)
        response = await self.call(api, user, await self.prepare(api, user))
        assert response.status_code == self.expected_status, response.text


async def send(api: httpx.AsyncClient, headers: dict[str, str], *messages: dict[str, Any],
               destination: str = "orders.eu") -> list[str]:
    response = await api.post(f"/api/v1/queues/{destination}/messages", json={"messages": list(messages)},
                              headers=headers)
    assert response.status_code == 201, response.text
    return response.json()["message_ids"]


async def consumer(api: httpx.AsyncClient, headers: dict[str, str], destination: str = "orders.eu",
                   kind: str = "queues", **options: Any) -> str:
    """Create an HTTP consumer; returns its path (/api/v1/<kind>/<name>/consumers/<id>)."""
    response = await api.post(f"/api/v1/{kind}/{destination}/consumers", json=options, headers=headers)
    assert response.status_code == 201, response.text
    return f"/api/v1/{kind}/{destination}/consumers/{response.json()['consumer_id']}"


async def receive(api: httpx.AsyncClient, headers: dict[str, str], path: str, max_messages: int = 10,
                  wait: float = 0) -> list[dict[str, Any]]:
    response = await api.post(f"{path}/receive", params={"max_messages": max_messages, "wait": wait},
                              headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["messages"]
