"""Authentication for the API: tokens (clients), sessions (the console), and HTTP Basic for the
ActiveMQ-compatible endpoints only (ActiveMQ's REST clients log in that way).

Verified tokens and Basic logins are remembered in this process by the whole Authorization header, in
gateway.credentials' `verified` (the cache the STOMP and JSON socket logins share; its docstring says
what it keeps, for how long, and when it forgets), so the hot paths (send, receive, ack) neither touch
the database nor run the password hasher per request. Callers await `verified.refresh()` before a
lookup (another process's changes of users and tokens).
"""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions

from gateway.credentials import verified


def authorization_header(request: Any) -> bytes:
    return authentication.get_authorization_header(request)


def is_basic(header: bytes) -> bool:
    """An Authorization header of HTTP Basic (a user name and password)."""
    return header[:6].lower() == b"basic "


class TokenAuthentication(authentication.TokenAuthentication):
    """`Authorization: Token <key>` (also `Bearer <key>`), remembered after the first check."""

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() not in (b"token", b"bearer"):
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("invalid token header: give 'Token <key>'")
        try:
            key = header[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("invalid token header: the key is not text") from None
        return self.authenticate_header_key(authorization_header(request), key)

    def cached(self, request: Any) -> tuple[Any, Any] | None:
        header = authorization_header(request)
        if header[:6].lower() in (b"token ", b"bearer"):
            return verified.lookup(header)
        return None

    def authenticate_header_key(self, header: bytes, key: str) -> tuple[Any, Any]:
        """The token's check (DRF's authenticate_credentials: the database), remembered by the header."""
        hit = verified.lookup(header)
        if hit is not None:
            return hit
        user, token = super().authenticate_credentials(key)
        verified.put(header, user, token)
        return user, token


class BasicAuthentication(authentication.BasicAuthentication):
    """HTTP Basic, for ActiveMQ REST clients (`curl -u user:password`); password checks are remembered."""

    www_authenticate_realm = "signalbox"

    def cached(self, request: Any) -> tuple[Any, Any] | None:
        header = authorization_header(request)
        return verified.lookup(header) if is_basic(header) else None

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        header = authorization_header(request)
        if not is_basic(header):
            return None
        hit = verified.lookup(header)
        if hit is not None:
            return hit
        result = super().authenticate(request)  # the password hasher
        if result is not None:
            verified.put(header, *result)
        return result


class SessionAuthentication(authentication.SessionAuthentication):
    """Django sessions (the console); unsafe methods need the CSRF token, as DRF enforces."""
