"""Authentication for the API: tokens (clients), sessions (the console), and HTTP Basic for the
ActiveMQ-compatible endpoints only (ActiveMQ's REST clients log in that way).

Verified tokens and Basic credentials are remembered in this process for
`SIGNALBOX_AUTH_CACHE_SECONDS` (default 30 s), so the hot paths (send, receive, ack) never touch the
database; deleting a token or changing a user forgets the entries of this process at once, other
processes within that time. Basic credentials are remembered only as a salted hash.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models.signals import post_delete, post_save
from rest_framework import authentication, exceptions
from rest_framework.authtoken.models import Token

_SALT = hashlib.sha256(settings.SECRET_KEY.encode()).digest()


class _Cache:
    def __init__(self) -> None:
        self.entries: dict[str, tuple[float, Any, Any]] = {}
        self.lock = threading.Lock()

    def ttl(self) -> float:
        return float(getattr(settings, "SIGNALBOX_AUTH_CACHE_SECONDS", 30.0))

    def get(self, key: str) -> tuple[Any, Any] | None:
        hit = self.entries.get(key)
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1], hit[2]

    def put(self, key: str, user: Any, auth: Any) -> None:
        with self.lock:
            if len(self.entries) > 10_000:
                self.entries.clear()
            self.entries[key] = (time.monotonic() + self.ttl(), user, auth)

    def clear(self, *_args: Any, **_kwargs: Any) -> None:
        with self.lock:
            self.entries.clear()


cache = _Cache()
post_delete.connect(cache.clear, sender=Token, dispatch_uid="gateway-token-deleted")
post_save.connect(cache.clear, sender=get_user_model(), dispatch_uid="gateway-user-saved")
post_delete.connect(cache.clear, sender=get_user_model(), dispatch_uid="gateway-user-deleted")


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
        return self.authenticate_credentials(key)

    def cached(self, request: Any) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).split()
        if len(header) == 2 and header[0].lower() in (b"token", b"bearer"):
            return cache.get("t:" + header[1].decode(errors="replace"))
        return None

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        hit = cache.get("t:" + key)
        if hit is not None:
            return hit
        user, token = super().authenticate_credentials(key)
        cache.put("t:" + key, user, token)
        return user, token


class BasicAuthentication(authentication.BasicAuthentication):
    """HTTP Basic, for ActiveMQ REST clients (`curl -u user:password`); password checks are remembered."""

    www_authenticate_realm = "signalbox"

    @staticmethod
    def _key(request: Any) -> str | None:
        header = authentication.get_authorization_header(request)
        if not header.lower().startswith(b"basic "):
            return None
        return "b:" + hashlib.sha256(_SALT + header).hexdigest()

    def cached(self, request: Any) -> tuple[Any, Any] | None:
        key = self._key(request)
        return cache.get(key) if key else None

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        key = self._key(request)
        if key is None:
            return None
        hit = cache.get(key)
        if hit is not None:
            return hit
        result = super().authenticate(request)
        if result is not None:
            cache.put(key, *result)
        return result


class SessionAuthentication(authentication.SessionAuthentication):
    """Django sessions (the console); unsafe methods need the CSRF token, as DRF enforces."""
