"""Fixtures of the REST gateway tests: the real ASGI app over httpx, users with tokens, grants.

Each test gets its own broker namespace (settings.SIGNALBOX_NAMESPACE) and fresh runtime clients for
its event loop, so tests never see each other's queues."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import Group, User

from gateway import runtime
from gateway.models import DestinationPermission
from tests.gateway_api.mixins import token_headers


def _reset_runtime() -> None:
    runtime.policies.cache_clear()
    runtime.broker.cache_clear()
    runtime.sync_client.cache_clear()
    runtime._async.clear()


@pytest.fixture
def api_namespace(namespace: str, settings: Any) -> Iterator[str]:
    settings.SIGNALBOX_NAMESPACE = namespace
    _reset_runtime()
    yield namespace
    _reset_runtime()


@pytest.fixture
async def api(api_namespace: str, transactional_db: None) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the project's ASGI application (no server; the full Django stack)."""
    from signalbox.asgi import application

    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield client
    for broker, hub in list(runtime._async.values()):
        if hub._listener is not None:
            hub._listener.cancel()
        await broker.redis.aclose()
    runtime._async.clear()



@pytest.fixture
def make_user(transactional_db: None) -> Callable[..., dict[str, str]]:
    """make_user(name, grants=[(pattern, "read"|"write"|"admin"), ...], superuser=False) -> headers."""

    def make(name: str, grants: list[tuple[str, str]] = (), *, superuser: bool = False,
             staff: bool = False, group: str | None = None) -> dict[str, str]:
        if superuser:
            user = User.objects.create_superuser(name, password="pw")
        else:
            user = User.objects.create_user(name, password="pw", is_staff=staff)
        target_group = Group.objects.get_or_create(name=group)[0] if group else None
        if target_group:
            user.groups.add(target_group)
        for pattern, action in grants:
            rule = DestinationPermission.objects.create(destination=pattern, **{f"can_{action}": True})
            if target_group:
                rule.groups.add(target_group)
            else:
                rule.users.add(user)
        return token_headers(user)

    return make


@pytest.fixture
def alice(make_user: Callable[..., dict[str, str]]) -> dict[str, str]:
    """A user who may do everything on queue://orders.> (read, write, admin)."""
    return make_user("alice", [("queue://orders.>", "admin")])


@pytest.fixture
def bob(make_user: Callable[..., dict[str, str]]) -> dict[str, str]:
    """An authenticated user with no grant at all."""
    return make_user("bob")


