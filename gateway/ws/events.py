"""The console's live feed at /ws/console/events: lifecycle events and statistics over a WebSocket.

The browser's session user (AuthMiddlewareStack) must be logged in. A handshake without one is accepted and
closed at once with code 4401 (a refused handshake reaches the browser as 1006, which it cannot tell from a
dead server); an open connection whose session ends (logged out in another tab, expired, password changed)
gets `{"type": "status", "session": "expired"}` and the same close within SESSION_EVERY, so the console
can ask the user to log in again rather than show numbers that no longer update.

- `?destination=queue://orders` (read permission needed, else the socket closes with 4403): the
  destination's lifecycle event stream (docs/broker_core.md) tailed with XREAD, sent as
  `{"type": "events", "counts": {type: n}, "recent": [event, ...]}` at most every 0.5 s, and
  `{"type": "stats", "stats": {...}}` (the REST destination detail: statistics and consumers) every
  second while something happens, every 5 s otherwise.
- no destination (overview, destination list): `{"type": "totals", "totals": {...}}` every 2 s (the
  same totals as GET /api/v1/console/overview), and `"rows"` for the destinations the client named with
  `{"watch": ["queue://a", ...]}` (at most 200; the rows of the page it shows), `"gone"` those of them
  that no longer exist.

Every message carries `ts` (server ms). Every connection also gets `{"type": "status", "broker": "ok"}`
twice a second, or `"broker": "unavailable"` with a `detail` while Redis cannot be reached (a PING bounded
by PING_TIMEOUT, on a fixed half-second cadence, so a Redis that stops answering is reported within
STATUS_EVERY + PING_TIMEOUT, 1.25 s: the console promises two, with room for a loaded machine); the
feed's own loops wait for Redis and go on by themselves. The client shows a disconnected indicator when
the socket drops (and reconnects by itself), "Broker unavailable" on such a status, "stale" when nothing
at all arrived for two seconds (a stalled server), and a log-in prompt on a `session` status or the 4401
close.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any
from urllib.parse import parse_qs

import redis.asyncio
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from broker_core import event_stream
from broker_core.destinations import parse_destination
from broker_core.errors import BrokerError, UnknownDestination
from broker_core.resp import reply_text as _text
from gateway import permissions, runtime
from gateway.api import json_input
from gateway.api.render import consumer_json, destination_json
from gateway.unavailable import STORE_ERRORS, explain

RECENT = 20  # events listed per batch; the rest are only counted
EVENTS_EVERY = 0.5
STATS_BUSY, STATS_IDLE, TOTALS_EVERY = 1.0, 5.0, 2.0
STATUS_EVERY = 0.5  # the broker status message, also the heartbeat the browser's staleness check watches
PING_TIMEOUT = 0.75  # a hung Redis (stopped, not dead) is reported after this: STATUS_EVERY + this < 2 s
SESSION_EVERY = 1.0  # how often an open connection's session is read again (one database query)
SESSION_EXPIRED = 4401  # the close code of a connection without (or no longer with) a logged-in session
MAX_WATCH = 200


async def _still_logged_in(scope: dict[str, Any]) -> bool:
    """Does the connection's session, read again from the session store, still log in its user? The
    scope's session object caches what it read at the handshake, so a fresh one is loaded by its key;
    channels' get_user applies Django's checks (expiry, the password hash)."""
    from importlib import import_module

    from channels.auth import get_user
    from channels.db import database_sync_to_async

    key = getattr(scope.get("session"), "session_key", None)
    if not key:
        return False
    fresh = import_module(settings.SESSION_ENGINE).SessionStore(key)
    try:
        # not thread-sensitive: every open feed asks each second, and must not queue behind (or hold up)
        # the one thread Django's other sync work of this process runs in
        user = await database_sync_to_async(get_user.func, thread_sensitive=False)({"session": fresh})
    except Exception:  # the database unreachable is not a logout: the next round asks again
        return True
    return bool(user.is_authenticated and user.pk == scope["user"].pk)


class ConsoleEventsConsumer(AsyncWebsocketConsumer):
    channel_layer_alias = "signalbox-no-channel-layer"  # no channel per connection: nothing sends to it

    task: asyncio.Task[None] | None = None
    status_task: asyncio.Task[None] | None = None
    session_task: asyncio.Task[None] | None = None
    watched: list[str]
    start_id: str = "$"  # the stream id the tail reads after: the handshake's, then the last one sent

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.accept()
            await self._send({"type": "status", "session": "expired"})
            await self.close(SESSION_EXPIRED)
            return
        self.watched = []
        query = parse_qs(_text(self.scope.get("query_string", b"")))
        text = (query.get("destination") or [""])[0]
        # The feed starts where the stream ends before the browser learns it is open, so an event written
        # after "open" is never missed (the page loads its tables before it opens the feed).
        with contextlib.suppress(BrokerError, *STORE_ERRORS):
            if text:
                newest = await runtime.async_broker().last_event_id(parse_destination(text))
                self.start_id = newest or "0-0"
        await self.accept()
        self.status_task = asyncio.get_running_loop().create_task(self._status())
        self.session_task = asyncio.get_running_loop().create_task(self._session_watch())
        if text:
            try:
                destination = parse_destination(text)
            except BrokerError as exc:
                await self._send({"type": "error", "detail": str(exc)})
                await self.close(4400)
                return
            if not await permissions.allowed_async(user, destination, "read"):
                await self._send({"type": "error", "detail": f"no read permission on {destination.uri}"})
                await self.close(4403)
                return
            self.task = asyncio.get_running_loop().create_task(self._outlasting(self._tail, destination))
        else:
            self.task = asyncio.get_running_loop().create_task(self._outlasting(self._totals))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            data = json_input.loads(text_data or "{}")
        except json_input.InvalidJSON:
            return
        watch = data.get("watch") if isinstance(data, dict) else None
        if isinstance(watch, list):
            user = self.scope["user"]
            allowed = []
            for uri in watch[:MAX_WATCH]:
                with contextlib.suppress(BrokerError, TypeError):
                    destination = parse_destination(str(uri))
                    if await permissions.allowed_async(user, destination, "read"):
                        allowed.append(destination.uri)
            self.watched = allowed

    async def disconnect(self, code: int) -> None:
        for task in (self.task, self.status_task, self.session_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _status(self) -> None:
        """Whether Redis answers, every STATUS_EVERY seconds (docstring above)."""
        client = runtime.async_redis()
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await asyncio.wait_for(client.ping(), PING_TIMEOUT)
                status: dict[str, Any] = {"type": "status", "broker": "ok"}
            except (*STORE_ERRORS, TimeoutError) as exc:
                status = {"type": "status", "broker": "unavailable", "detail": explain(exc)}
            await self._send(status)
            # a fixed cadence: a slow PING does not stretch the interval the browser's staleness check sees
            await asyncio.sleep(max(0.0, STATUS_EVERY - (loop.time() - started)))

    async def _session_watch(self) -> None:
        """Close the connection (SESSION_EXPIRED) once its session no longer logs its user in."""
        while True:
            await asyncio.sleep(SESSION_EVERY)
            if not await _still_logged_in(self.scope):
                await self._send({"type": "status", "session": "expired"})
                await self.close(SESSION_EXPIRED)
                return

    async def _outlasting(self, feed: Any, *args: Any) -> None:
        """Run `feed` again after STATUS_EVERY whenever Redis fails it; the status task tells the browser."""
        while True:
            try:
                await feed(*args)
                return
            except STORE_ERRORS:
                await asyncio.sleep(STATUS_EVERY)

    async def _send(self, payload: dict[str, Any]) -> None:
        payload["ts"] = int(time.time() * 1000)
        await self.send(text_data=json.dumps(payload, default=str))

    async def _totals(self) -> None:
        from gateway.api.base import db
        from gateway.api.destination_index import index, row, totals

        broker = runtime.async_broker()
        user = self.scope["user"]
        while True:
            patterns = await db(permissions.readable_patterns, user, "read")
            payload: dict[str, Any] = {"type": "totals", "totals": await totals(broker, patterns)}
            memory = await runtime.async_redis().info("memory")
            payload["totals"]["redis_memory"] = {"used": int(memory.get("used_memory", 0)),
                                                 "max": int(memory.get("maxmemory", 0))}
            if self.watched:
                idx = await index(broker, wait=False)
                fresh = await broker.stats_many(list(self.watched))
                payload["rows"] = [row(s, idx) for s in fresh if s is not None]
                # deleted since the page listed them: the page reads its list again rather than keep
                # their last figures on screen as if they were live
                payload["gone"] = [uri for uri, s in zip(self.watched, fresh, strict=True) if s is None]
            await self._send(payload)
            await asyncio.sleep(TOTALS_EVERY)

    async def _stats(self, destination: Any) -> dict[str, Any] | None:
        broker = runtime.async_broker()
        try:
            stats = await broker.stats(destination)
        except UnknownDestination:
            return None
        out = destination_json(stats)
        now = broker.clock.now_ms()
        out["consumers"] = [consumer_json(c, now) for c in stats.consumers]
        return out

    async def _tail(self, destination: Any) -> None:
        """XREAD the destination's event stream from now on (a connection of its own: it blocks)."""
        broker = runtime.async_broker()
        key = broker.events_key(destination)
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        last_id = self.start_id
        counts: dict[str, int] = {}
        recent: list[dict[str, Any]] = []
        sent_events = sent_stats = 0.0
        busy = False
        try:
            await self._send({"type": "stats", "stats": await self._stats(destination)})
            while True:
                reply = await client.xread({key: last_id}, count=100, block=int(EVENTS_EVERY * 1000))
                for _stream, entries in reply or []:
                    for entry_id, fields in event_stream.expand(entries):
                        last_id = _text(entry_id)
                        event = {_text(k): _text(v) for k, v in fields.items()}
                        event["id"] = last_id
                        kind = event.get("type", "?")
                        counts[kind] = counts.get(kind, 0) + 1
                        recent.append(event)
                        busy = True
                    del recent[:-RECENT]
                now = time.monotonic()
                if counts and now - sent_events >= EVENTS_EVERY:
                    await self._send({"type": "events", "counts": counts, "recent": recent})
                    counts, recent, sent_events = {}, [], now
                    # a run after a lost Redis connection (_outlasting) goes on from here: from the
                    # handshake's id it sent every event since the page opened again, as new ones
                    self.start_id = last_id
                if now - sent_stats >= (STATS_BUSY if busy else STATS_IDLE):
                    await self._send({"type": "stats", "stats": await self._stats(destination)})
                    sent_stats, busy = now, False
        finally:
            await client.aclose()
