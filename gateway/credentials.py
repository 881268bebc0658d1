"""The credentials this process verified: one cache for every login, the REST API's (an `Authorization`
header: a token, or HTTP Basic) and the sockets' (STOMP CONNECT over TCP and WebSocket, the JSON
protocol's `connect`: login and passcode), so that neither the hot REST paths nor a reconnecting client
touch the database or run the password hasher again (Django's PBKDF2-SHA256, 1,000,000 iterations:
slow by design, about 0.5-1 s of CPU on the loaded 2-core machine):
- keyed by a MAC (keyed BLAKE2b, 32 bytes) of what the client presented (the whole Authorization
  header; for a socket, `socket_login(login, passcode)`) under a key made at random when the process
  starts: neither a password nor a token is kept, and the key is never stored anywhere. BLAKE2b's keyed
  mode is a MAC by design and costs about a fifth of OpenSSL 3's HMAC-SHA256 per call (~1.7 µs against
  ~8.7 µs, once per API request). A socket login's bytes start with
  a NUL, which no HTTP header value holds, so the two kinds can never share a key;
- bounded: at most `SIGNALBOX_AUTH_CACHE_ENTRIES` (10,000) entries, the least recently used dropped
  first; only successes are kept, so wrong passwords cannot fill it (each still costs the hasher);
- for at most `SIGNALBOX_AUTH_CACHE_SECONDS` (30 s) after the check;
- forgotten at once in this process when the user is saved (a new password, deactivation, superuser
  status, a new username) or deleted, or the token deleted: the user's entries, Basic, tokens and
  socket logins alike (every entry when a user is created). Other processes (`manage.py
  changepassword`, a second web process) forget everything within `SIGNALBOX_AUTH_CHANGES_SECONDS`
  (1 s): the change also increments a counter in Redis (`<namespace>:auth:changes`), which each process
  reads at most once a second (`refresh`, awaited before a lookup) and empties its cache when it moved.
  With Redis away the counter cannot move; the TTL still bounds the entries.
  Per-destination permissions are not part of an entry: they are checked on every request and
  subscription against their own snapshot (gateway/permissions.py).
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

DEFAULT_ENTRIES = 10_000


class VerifiedCredentials:
    def __init__(self) -> None:
        self.key = secrets.token_bytes(32)  # this process's; never stored
        # key -> (valid until, user, auth); in use order, the most recent last
        self.entries: collections.OrderedDict[bytes, tuple[float, Any, Any]] = collections.OrderedDict()
        self.lock = threading.Lock()

    def ttl(self) -> float:
        return float(getattr(settings, "SIGNALBOX_AUTH_CACHE_SECONDS", 30.0))

    def limit(self) -> int:
        return int(getattr(settings, "SIGNALBOX_AUTH_CACHE_ENTRIES", DEFAULT_ENTRIES))

    def digest(self, presented: bytes) -> bytes:
        return hashlib.blake2b(presented, key=self.key, digest_size=32).digest()

    def lookup(self, presented: bytes) -> tuple[Any, Any] | None:
        """(user, auth) for credentials verified within the TTL, else None."""
        key = self.digest(presented)
        with self.lock:
            hit = self.entries.get(key)
            if hit is None:
                return None
            if hit[0] < time.monotonic():
                del self.entries[key]
                return None
            self.entries.move_to_end(key)
        return hit[1], hit[2]

    def put(self, presented: bytes, user: Any, auth: Any) -> None:
        """Remember a success (never a failure: the callers put only a verified user)."""
        key = self.digest(presented)
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
        except Exception:  # noqa: BLE001 - Redis away: the logins say so themselves; the TTL still holds
            return
        if self.looked and changes != self.changes:
            self.clear()
        self.changes, self.looked = changes, True

    next_look = 0.0
    changes: Any = None
    looked = False


verified = VerifiedCredentials()

# A socket login's bytes begin with NUL (an HTTP header value never holds one) and give the login's length,
# so ("ab", "c") and ("a", "bc") differ, and no Authorization header can stand for a socket login.
_SOCKET_LOGIN = b"\x00socket-login\x00"


def socket_login(login: str | None, passcode: str | None) -> bytes:
    """What a STOMP CONNECT or a JSON `connect` presented, as the cache's bytes (no login = empty)."""
    name = (login or "").encode("utf-8", "surrogatepass")
    secret = (passcode or "").encode("utf-8", "surrogatepass")
    return _SOCKET_LOGIN + len(name).to_bytes(4, "big") + name + secret


def _changes_key() -> str:
    return f"{settings.SIGNALBOX_NAMESPACE}:auth:changes"


def _tell_other_processes() -> None:
    from gateway import runtime

    # a change of a user must not fail for Redis being away; the TTL bounds the entries then
    with contextlib.suppress(Exception):
        runtime.sync_client().incr(_changes_key())


def _user_changed(sender: Any, instance: Any, created: bool = False, **_kwargs: Any) -> None:
    if created:  # (rare) a new user may reuse the id of one whose rows went without signals (a flush)
        verified.clear()
    else:
        verified.forget_user(instance.pk)
        _tell_other_processes()  # (a new user invalidates nothing elsewhere)


def _token_deleted(sender: Any, instance: Any, **_kwargs: Any) -> None:
    verified.forget_user(instance.user_id)
    _tell_other_processes()


def connect_signals() -> None:
    """Forget changed users' and deleted tokens' entries (called from GatewayConfig.ready, once the
    models can be imported: this module is imported before, by the STOMP and WebSocket code)."""
    from django.contrib.auth import get_user_model
    from django.db.models.signals import post_delete, post_save
    from rest_framework.authtoken.models import Token

    post_delete.connect(_token_deleted, sender=Token, dispatch_uid="gateway-token-deleted")
    post_save.connect(_user_changed, sender=get_user_model(), dispatch_uid="gateway-user-saved")
    post_delete.connect(_user_changed, sender=get_user_model(), dispatch_uid="gateway-user-deleted")
