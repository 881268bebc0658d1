"""What a password login may cost: the one guard in front of Django's password hasher.

Every login by password goes through Django's authenticate() and so through `GuardedModelBackend`
(gateway/login_backend.py, settings.AUTHENTICATION_BACKENDS): STOMP CONNECT over TCP and WebSocket,
the JSON protocol's `connect`, HTTP Basic on the REST API, POST /api/v1/auth/token and the console's
login form. The hasher (PBKDF2, 1,000,000 iterations) costs about half a second of a core per check, on
purpose; only successes are remembered (gateway/credentials.py), so without this guard every wrong
password costs that again, and a client repeating wrong passwords, or many clients at once, would spend
the broker's cores on them and make everyone else's logins wait (docs/api.md, "Failed logins"). The
guard bounds it, per process:
- **failures per address**: after `SIGNALBOX_LOGIN_FAILURES` (10) failed password logins from one client
  address within `SIGNALBOX_LOGIN_FAILURE_SECONDS` (60), that address's password logins are refused at
  once, without the hasher, until the oldest of them is that old; a success clears the address. At most
  `ADDRESSES` addresses are followed (the least recently failed go first);
- **checks at once**: at most `SIGNALBOX_LOGIN_CONCURRENCY` (1) checks run at a time. Waiting logins go
  by their address: first those from addresses that logged in before (known), then from addresses never
  seen, last from addresses with failures within the window; at most `SIGNALBOX_LOGIN_QUEUE` (16) of each
  kind wait, and a login beyond that is refused at once. So wrong passwords spread over many addresses
  delay a known client's login by the one check running at most, and a new client's once each of their
  addresses has failed;
- **one check for the same credentials**: logins presenting exactly the credentials of a check already
  running (a service account's clients reconnecting together) wait for that check's answer instead of
  running the hasher again;
- **failures answered late**: a failed or refused login is answered after `SIGNALBOX_LOGIN_FAILURE_DELAY`
  (1 s; `failure_pause`, which costs no CPU), as login programs do: a client that guesses one password
  after another gets one answer a second per connection, and refusals, which cost next to nothing, do
  not come back so fast that they invite a flood of them.
Logins wait for their turn in threads of their own (`in_login_thread`): the sockets, HTTP Basic, the
token endpoint and the console's login page (console/login.py, a coroutine for that reason).
A refusal is `LoginRefused`, whose message names the limit; each adapter answers it in its protocol
(STOMP ERROR, 429 with Retry-After, the login form's error). API tokens need no hasher and are not
guarded here.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings

from gateway.db_steps import db
from gateway.metrics import PASSWORD_LOGINS

ADDRESSES = 10_000  # client addresses whose failures (and, apart, whose logins) are followed, per process
# Whose password checks go first: addresses that logged in before (and failed none since), addresses never
# seen, addresses that failed within the window.
KINDS = ("known", "unknown", "suspect")


class LoginRefused(Exception):
    """A password login refused before it was checked, by `limit` (the setting's name, which the message
    ends with); `retry_after` seconds until one may succeed."""

    def __init__(self, message: str, limit: str, retry_after: float) -> None:
        super().__init__(message)
        self.message = message
        self.limit = limit
        self.retry_after = max(1.0, retry_after)


class _Check:
    """One running check, which logins presenting the same credentials wait for."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.user: Any = None
        self.error: BaseException | None = None


class LoginGuard:
    def __init__(self) -> None:
        self.key = secrets.token_bytes(32)  # for the running checks' keys; this process's, never stored
        self.lock = threading.Condition()
        self.failures: collections.OrderedDict[str, collections.deque[float]] = collections.OrderedDict()
        self.running = 0  # checks running
        self.known: collections.OrderedDict[str, None] = collections.OrderedDict()  # addresses that logged in
        # checks waiting for their turn, by the kind of address they come from, in the order they go
        self.waiting = dict.fromkeys(KINDS, 0)
        self.checks: dict[bytes, _Check] = {}  # running or waiting, by their credentials' key

    @staticmethod
    def limits() -> tuple[int, float, int, int]:
        return (int(settings.SIGNALBOX_LOGIN_FAILURES), float(settings.SIGNALBOX_LOGIN_FAILURE_SECONDS),
                max(1, int(settings.SIGNALBOX_LOGIN_CONCURRENCY)),
                max(0, int(settings.SIGNALBOX_LOGIN_QUEUE)))

    def check(self, address: str, credentials: bytes, verify: Callable[[], Any]) -> Any:
        """`verify()` (a password check: the user, or None) for a login from `address` presenting
        `credentials`, within the limits; raises LoginRefused instead when one refuses it. Counted by
        outcome (gateway/metrics.py, signalbox_password_logins)."""
        try:
            user = self._check(address, credentials, verify)
        except LoginRefused as exc:
            PASSWORD_LOGINS.labels("refused_queue" if exc.limit == "SIGNALBOX_LOGIN_QUEUE"
                                   else "refused_failures").inc()
            raise
        PASSWORD_LOGINS.labels("ok" if user is not None else "failed").inc()
        return user

    def _check(self, address: str, credentials: bytes, verify: Callable[[], Any]) -> Any:
        failures, window, concurrency, queue = self.limits()
        key = hashlib.blake2b(credentials, key=self.key, digest_size=32).digest()
        with self.lock:
            kind = self._kind(address, failures, window)
            shared = self.checks.get(key)
            if shared is None:
                if self.running >= concurrency and self.waiting[kind] >= queue:
                    waiting = sum(self.waiting.values())
                    raise LoginRefused(f"Too many logins at once: {self.running} being checked and {waiting} "
                                       "waiting; try again in a moment (SIGNALBOX_LOGIN_QUEUE)",
                                       "SIGNALBOX_LOGIN_QUEUE", 1.0)
                own = self.checks[key] = _Check()
                self._wait_turn(own, key, address, kind, failures, window, concurrency)
        if shared is not None:
            shared.done.wait()
            if isinstance(shared.error, LoginRefused):  # (its address was refused, maybe not this one)
                return self._check(address, credentials, verify)
            if shared.error is not None:
                raise shared.error
            user = shared.user
        else:
            try:
                own.user = user = verify()
            except BaseException as exc:
                own.error = exc
                raise
            finally:
                self._done(own, key)
        with self.lock:
            self._record(address, user is not None, failures)
        return user

    def _wait_turn(self, own: _Check, key: bytes, address: str, kind: str, failures: int, window: float,
                   concurrency: int) -> None:
        """(Under the lock.) Wait until a check may run and none of a kind before this one waits. The
        address's kind is looked at again on each wake-up: one that failed meanwhile waits behind the
        others, and one refused meanwhile is refused here, unchecked."""
        self.waiting[kind] += 1
        try:
            while self.running >= concurrency or any(self.waiting[k] for k in KINDS[:KINDS.index(kind)]):
                self.lock.wait()
                now = self._kind(address, failures, window)
                self.waiting[kind] -= 1
                self.waiting[now] += 1
                kind = now
        except LoginRefused as exc:
            self.waiting[kind] -= 1
            own.error = exc
            self._done(own, key, running=False)
            raise
        self.waiting[kind] -= 1
        self.running += 1

    def _done(self, own: _Check, key: bytes, running: bool = True) -> None:
        with self.lock:  # (re-entered from _wait_turn: a Condition's lock is an RLock)
            if running:
                self.running -= 1
            del self.checks[key]
            self.lock.notify_all()  # (one woken first waits on while one of a kind before it waits)
        own.done.set()

    def _kind(self, address: str, failures: int, window: float) -> str:
        """Which kind of address a login comes from (KINDS); LoginRefused when it is past its failures."""
        recent = self.failures.get(address)
        if recent is not None and failures > 0:
            now = time.monotonic()
            while recent and recent[0] <= now - window:
                recent.popleft()
            if len(recent) >= failures:
                wait = recent[0] + window - now
                raise LoginRefused(f"Too many failed logins from {address}: {len(recent)} in {window:g} s; "
                                   f"try again in {wait:.0f} s (SIGNALBOX_LOGIN_FAILURES)",
                                   "SIGNALBOX_LOGIN_FAILURES", wait)
            if recent:
                return "suspect"
        return "known" if address in self.known else "unknown"

    def _record(self, address: str, succeeded: bool, failures: int) -> None:
        if succeeded:
            self.failures.pop(address, None)
            self.known[address] = None
            self.known.move_to_end(address)
            while len(self.known) > ADDRESSES:
                self.known.popitem(last=False)
            return
        if failures <= 0:
            return
        recent = self.failures.get(address)
        if recent is None:
            recent = self.failures[address] = collections.deque(maxlen=failures)
            while len(self.failures) > ADDRESSES:
                self.failures.popitem(last=False)
        else:
            self.failures.move_to_end(address)
        recent.append(time.monotonic())

    def forget(self) -> None:
        """Forget every address's failures and logins (tests; an operator restarts the process)."""
        with self.lock:
            self.failures.clear()
            self.known.clear()


guard = LoginGuard()


_threads: ThreadPoolExecutor | None = None


async def in_login_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a login's blocking step (a database lookup, authenticate()) in a thread of the logins' own
    (`db`: with a fresh database connection closed after it). A login waits for its turn at the guard in its
    thread: in the event loop's shared pool (a few threads) waiting logins would hold the threads every
    other database step needs, and take their turns in the pool's order, not the guard's. Here there are
    threads for every login the guard lets wait, so only the guard orders them."""
    global _threads
    if _threads is None:
        _, _, concurrency, queue = LoginGuard.limits()
        _threads = ThreadPoolExecutor(max_workers=concurrency + len(KINDS) * queue + 16,
                                      thread_name_prefix="login")

    return await db(fn, *args, executor=_threads)


async def failure_pause() -> None:
    """Wait before answering a failed or refused login (see above)."""
    await asyncio.sleep(max(0.0, float(settings.SIGNALBOX_LOGIN_FAILURE_DELAY)))


def client_address(request: Any) -> str:
    """The address a login came from: the request's REMOTE_ADDR (uvicorn's client, or the trusted
    proxy's X-Forwarded-For); "unknown" when there is none."""
    meta = getattr(request, "META", None) or {}
    return str(meta.get("REMOTE_ADDR") or "unknown")
