"""Who is on a WebSocket connection and what they may do: the REST API's rules, for sockets.

A STOMP CONNECT (or the JSON protocol's `connect`) gives login and passcode: a user name and password
(Django's authenticate()), or an API token (rest_framework.authtoken) as the passcode, with or without
the login. Without credentials the browser's session user (AuthMiddlewareStack) counts. Per-destination
permissions are gateway.permissions' `allowed` (read to consume, write to produce).
"""

from __future__ import annotations

from typing import Any

from gateway.credentials import socket_login, verified
from gateway.logins import LoginRefused, failure_pause, in_login_thread


def _check_credentials(login: str | None, passcode: str | None, address: str) -> Any:
    from django.contrib.auth import authenticate
    from rest_framework.authtoken.models import Token

    # The token first: it needs no password hasher, so a client that logs in with its login and a token
    # costs no hash and no failure (gateway/logins.py counts failed password logins per address).
    if passcode:
        token = Token.objects.select_related("user").filter(key=passcode).first()
        if token is not None and token.user.is_active and (not login or token.user.get_username() == login):
            return token.user
    if login and passcode:
        return authenticate(username=login, password=passcode, address=address)
    return None


async def authenticate(login: str | None, passcode: str | None, session_user: Any = None,
                       address: str = "unknown") -> Any:
    """The authenticated user, or None. No credentials at all: the session's user if logged in. A password
    login from `address` (the client's host) may be refused first: LoginRefused (gateway/logins.py)."""
    if not login and not passcode:
        if session_user is not None and getattr(session_user, "is_authenticated", False):
            return session_user
        return None
    presented = socket_login(login, passcode)
    await verified.refresh()  # (another process's changes of users and tokens)
    hit = verified.lookup(presented)
    if hit is not None:
        return hit[0]
    try:
        user = await in_login_thread(_check_credentials, login, passcode, address)
    except LoginRefused:
        await failure_pause()
        raise
    if user is None:
        await failure_pause()
        return None
    verified.put(presented, user, None)
    return user


def username(user: Any) -> str:
    return user.get_username() if user is not None and hasattr(user, "get_username") else ""
