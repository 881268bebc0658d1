"""Socket logins (STOMP CONNECT, the JSON protocol's `connect`) share the REST API's cache of verified
credentials (gateway/credentials.py): a client reconnecting with the same login and passcode does not run
the password hasher again, and a changed or deactivated user, a deleted token or another process's change
is refused at once. In-process over the project's ASGI stack (Channels' WebsocketCommunicator), real
Redis; the STOMP TCP listener runs the same gateway.stomp.protocol login."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from rest_framework.authtoken.models import Token

from gateway import runtime
from gateway.credentials import socket_login, verified
from tests.helpers import hashers
from tests.helpers.channels import receive_json, send_json, websocket
from tests.helpers.stomp_channels import stomp
from tests.helpers.users import change_user

pytestmark = pytest.mark.usefixtures("ws_runtime", "stomp_user")


@pytest.fixture
def checks(ws_runtime, settings, credentials_settled) -> list[str]:
    """The password checks Django's hasher ran from here on (alice's hash is MD5, as the counting one)."""
    return hashers.counted(settings)


async def stomp_login(login: str, passcode: str) -> bool:
    """Did a STOMP CONNECT with these credentials get CONNECTED (else ActiveMQ's login ERROR)?"""
    async with stomp() as client:
        await client.send("CONNECT", {"accept-version": "1.2", "host": "x", "login": login,
                                      "passcode": passcode})
        frame = await client.receive()
        if frame.command == "ERROR":
            assert frame.get("message") == f"User name [{login}] or password is invalid."
            return False
        assert frame.command == "CONNECTED", frame
        await client.send("DISCONNECT", {"receipt": "bye"})
        await client.expect("RECEIPT")
        return True


async def json_login(login: str, passcode: str) -> bool:
    async with websocket("/ws/v1") as ws:
        await send_json(ws, {"type": "connect", "id": "c", "login": login, "passcode": passcode})
        answer = await receive_json(ws)
        assert answer["type"] in ("ok", "error"), answer
        return answer["type"] == "ok"




async def test_a_second_connect_with_the_same_credentials_does_not_run_the_hasher(checks):
    assert await stomp_login("alice", "secret")
    assert len(checks) == 1
    assert await stomp_login("alice", "secret")
    assert await json_login("alice", "secret")  # the same credentials over the JSON protocol
    assert len(checks) == 1


async def test_a_wrong_password_is_never_remembered(checks):
    entries = len(verified.entries)
    assert not await stomp_login("alice", "wrong")
    assert not await stomp_login("alice", "wrong")
    assert not await json_login("alice", "wrong")
    assert len(checks) == 3  # each attempt ran the hasher
    assert len(verified.entries) == entries


async def test_a_changed_password_refuses_the_old_one_at_once(checks):
    assert await stomp_login("alice", "secret")
    await change_user("alice", password="renewed")
    assert not await stomp_login("alice", "secret")
    assert not await json_login("alice", "secret")
    assert await stomp_login("alice", "renewed")
    assert await stomp_login("alice", "renewed")
    assert len(checks) == 4  # secret, secret again (refused), json's secret, renewed once


async def test_a_deactivated_user_is_refused_at_once(checks):
    assert await stomp_login("alice", "secret")
    assert await json_login("alice", "secret")
    await change_user("alice", is_active=False)
    assert not await stomp_login("alice", "secret")
    assert not await json_login("alice", "secret")


async def test_an_api_token_as_passcode_is_remembered_until_the_token_is_deleted(stomp_user, checks):
    _, token = stomp_user
    for login in ("", "alice", "", "alice"):
        assert await stomp_login(login, token)
        assert await json_login(login, token)
    # the token is looked up before any password check (gateway/ws/auth.py): no hasher ran, with the login
    # or without it (and no failed login was counted against the address, gateway/logins.py)
    assert checks == []
    await sync_to_async(Token.objects.filter(key=token).delete)()
    assert not await stomp_login("", token)
    assert not await json_login("alice", token)


async def test_another_processs_change_forgets_the_socket_logins(checks, settings, ws_runtime, monkeypatch):
    settings.SIGNALBOX_AUTH_CHANGES_SECONDS = 0.0  # look at the counter before every lookup
    monkeypatch.setattr(verified, "next_look", 0.0)  # (an earlier test's look waits out its second)
    assert await stomp_login("alice", "secret")
    assert await stomp_login("alice", "secret")
    assert len(checks) == 1
    # what `manage.py changepassword` in another process does after saving (gateway/credentials.py)
    await runtime.async_redis().incr(f"{ws_runtime}:auth:changes")
    assert await stomp_login("alice", "secret")
    assert len(checks) == 2


def test_a_socket_logins_key_is_unambiguous_and_no_http_header():
    assert socket_login("ab", "c") != socket_login("a", "bc")
    assert socket_login(None, "t") == socket_login("", "t")
    assert socket_login("a", "b").startswith(b"\x00")  # an HTTP header value never holds a NUL
    assert socket_login("a\x00", "b") != socket_login("a", "\x00b")
