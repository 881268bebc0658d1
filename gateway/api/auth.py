"""Authentication for the API: tokens (clients), sessions (the console), and HTTP Basic for the
ActiveMQ-compatible endpoints only (ActiveMQ's REST clients log in that way).

Verified credentials are remembered in this process (`cache`), so the hot paths (send, receive, ack)
neither touch the database nor run the password hasher per request (Django's PBKDF2-SHA256, 1,000,000
iterations: slow by design, about 1 s of CPU measured on the loaded 2-core machine):
- keyed by a MAC of the whole Authorization header (keyed BLAKE2b, 32 bytes) under a key made at random
  when the process starts: neither a password nor a token is kept, and the key is never stored anywhere.
  BLAKE2b's keyed mode is a MAC by design, and costs about a fifth of OpenSSL 3's HMAC-SHA256 per call
  (~1.7 µs against ~8.7 µs, once per API request);
- bounded: at most `SIGNALBOX_AUTH_CACHE_ENTRIES` (10,000) entries, the least recently used dropped
  first; only successes are kept, so wrong passwords cannot fill it (each still costs the hasher);
- for at most `SIGNALBOX_AUTH_CACHE_SECONDS` (30 s) after the check;
- forgotten at once in this process when the user is saved (a new password, deactivation, superuser
  status, a new username) or deleted, or the token deleted: the user's entries, Basic and tokens
  alike (every entry when a user is created). Other processes (`manage.py changepassword`, a second
  web process) forget everything within `SIGNALBOX_AUTH_CHANGES_SECONDS` (1 s): the change also
  increments a counter in Redis (`<namespace>:auth:changes`), which each process reads at most once
  a second (`refresh`, awaited before a lookup) and empties its cache when it moved. With Redis away
  the counter cannot move; the TTL still bounds the entries.
  Per-destination permissions are not part of an entry: they are checked on every request against
  their own snapshot (gateway/permissions.py).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import secrets
import threading
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models.signals import post_delete, post_save
from rest_framework import authentication, exceptions
from rest_framework.authtoken.models import Token

DEFAULT_ENTRIES = 10_000


class _Cache:
    def __init__(self) -> None:
        self.key = secrets.token_bytes(32)  # this process's; never stored
        # key -> (valid until, user, auth); in use order, the most recent last
        self.entries: collections.OrderedDict[bytes, tuple[float, Any, Any]] = collections.OrderedDict()
        self.lock = threading.Lock()

    def ttl(self) -> float:
        return float(getattr(settings, "SIGNALBOX_AUTH_CACHE_SECONDS", 30.0))

    def limit(self) -> int:
        return int(getattr(settings, "SIGNALBOX_AUTH_CACHE_ENTRIES", DEFAULT_ENTRIES))

    def digest(self, authorization: bytes) -> bytes:
        return hashlib.blake2b(authorization, key=self.key, digest_size=32).digest()

    def lookup(self, authorization: bytes) -> tuple[Any, Any] | None:
        """(user, auth) for an Authorization header verified within the TTL, else None."""
        key = self.digest(authorization)
        with self.lock:
            hit = self.entries.get(key)
            if hit is None:
                return None
            if hit[0] < time.monotonic():
                del self.entries[key]
                return None
            self.entries.move_to_end(key)
        return hit[1], hit[2]

    def put(self, authorization: bytes, user: Any, auth: Any) -> None:
        key = self.digest(authorization)
        with self.lock:
            self.entries[key] = (time.monotonic() + self.ttl(), user, auth)
            self.entries.move_to_end(key)
            while len(self.entries) > max(1, self.limit()):
                self.entries.popitem(last=False)

    def forget_user(self, user_pk: Any) -> None:
        with self.lock:
            for key in [k for k, (_, user, _a) in self.entries.items() if user.pk == user_pk]:
                del self.entries[key]

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()

    async def refresh(self) -> None:
        """Empty the cache when another process changed a user or token since the last look (at most
        one Redis GET per SIGNALBOX_AUTH_CHANGES_SECONDS)."""
        now = time.monotonic()
        if now < self.next_look:
            return
        self.next_look = now + float(getattr(settings, "SIGNALBOX_AUTH_CHANGES_SECONDS", 1.0))
        from gateway import runtime

        try:
            changes = await runtime.async_redis().get(_changes_key())
        except Exception:  # noqa: BLE001 - Redis away: the requests say so themselves; the TTL still holds
            return
        if self.looked and changes != self.changes:
            self.clear()
        self.changes, self.looked = changes, True

    next_look = 0.0
    changes: Any = None
    looked = False


cache = _Cache()


def _changes_key() -> str:
    return f"{settings.SIGNALBOX_NAMESPACE}:auth:changes"


def _tell_other_processes() -> None:
    from gateway import runtime

    # a change of a user must not fail for Redis being away; the TTL bounds the entries then
    with contextlib.suppress(Exception):
        runtime.sync_client().incr(_changes_key())


def _user_changed(sender: Any, instance: Any, created: bool = False, **_kwargs: Any) -> None:
    if created:  # (rare) a new user may reuse the id of one whose rows went without signals (a flush)
        cache.clear()
    else:
        cache.forget_user(instance.pk)
        _tell_other_processes()  # (a new user invalidates nothing elsewhere)


def _token_deleted(sender: Any, instance: Any, **_kwargs: Any) -> None:
    cache.forget_user(instance.user_id)
    _tell_other_processes()


def connect_signals() -> None:
    """Forget changed users' and deleted tokens' entries (called from GatewayConfig.ready)."""
    post_delete.connect(_token_deleted, sender=Token, dispatch_uid="gateway-token-deleted")
    post_save.connect(_user_changed, sender=get_user_model(), dispatch_uid="gateway-user-saved")
    post_delete.connect(_user_changed, sender=get_user_model(), dispatch_uid="gateway-user-deleted")


connect_signals()  # (also on import, as before: idempotent by dispatch_uid)


def authorization_header(request: Any) -> bytes:
    return authentication.get_authorization_header(request)


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
            return cache.lookup(header)
        return None

    def authenticate_header_key(self, header: bytes, key: str) -> tuple[Any, Any]:
        """The token's check (DRF's authenticate_credentials: the database), remembered by the header."""
        hit = cache.lookup(header)
        if hit is not None:
            return hit
        user, token = super().authenticate_credentials(key)
        cache.put(header, user, token)
        return user, token


class BasicAuthentication(authentication.BasicAuthentication):
    """HTTP Basic, for ActiveMQ REST clients (`curl -u user:password`); password checks are remembered."""

    www_authenticate_realm = "signalbox"

    def cached(self, request: Any) -> tuple[Any, Any] | None:
        header = authorization_header(request)
        return cache.lookup(header) if header[:6].lower() == b"basic " else None

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        header = authorization_header(request)
        if header[:6].lower() != b"basic ":
            return None
        hit = cache.lookup(header)
        if hit is not None:
            return hit
        result = super().authenticate(request)  # the password hasher
        if result is not None:
            cache.put(header, *result)
        return result


class SessionAuthentication(authentication.SessionAuthentication):
    """Django sessions (the console); unsafe methods need the CSRF token, as DRF enforces."""
