"""This process's part of the connection registry (broker_core/connections.py): the client connections it
holds, written to Redis so that the console lists them, and the operator's close requests it takes.

Sessions (gateway/ws/session.py, for STOMP over TCP and WebSocket and the JSON protocol) call
`register` once logged in, `note_subscription` / `note_send` as frames arrive (memory only) and `forget`
when they end. One task per event loop does the Redis work: every POLL seconds it takes the close
requests addressed to this process, writes what changed (a new subscription or a first send to a
destination wakes it at once) and, every third of the lease, renews all of its connections in a few
calls. So a SEND costs no Redis call here, and a process that dies stops renewing: its connections leave
the list within one lease (SIGNALBOX_CONNECTION_LEASE_MS).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from typing import Any

from django.conf import settings

from broker_core.connections import ConnectionRecord
from gateway import runtime
from gateway.unavailable import store_unavailable

logger = logging.getLogger(__name__)


def lease_ms() -> int:
    return int(getattr(settings, "SIGNALBOX_CONNECTION_LEASE_MS", 15_000))


def registry_limit() -> int:
    return int(getattr(settings, "SIGNALBOX_CONNECTION_REGISTRY_LIMIT", 100_000))


def poll_seconds() -> float:
    return float(getattr(settings, "SIGNALBOX_CONNECTION_POLL_SECONDS", 1.0))


def protocol_of(session: Any) -> str:
    """The registry's protocol name: stomp+tcp, stomp+ssl, stomp+ws, stomp+wss (the listener's TLS WebSocket
    port) or json-ws."""
    if session.protocol == "json":
        return "json-ws"
    address = session.remote_address or ""
    if getattr(session, "stream", False):
        return "stomp+ssl" if address.startswith("ssl://") else "stomp+tcp"
    return "stomp+wss" if address.startswith("wss://") else "stomp+ws"


class ProcessConnections:
    """The connections of one event loop of this process, and the task that keeps their entries."""

    def __init__(self, process: str) -> None:
        # the name close requests are addressed to: this process, and this loop when it has several
        self.process = process
        self.sessions: dict[str, Any] = {}
        self.records: dict[str, ConnectionRecord] = {}
        self._gone: list[str] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._renewed = time.monotonic()

    async def register(self, session: Any, record: ConnectionRecord) -> None:
        """Write the new connection's entry now (ConnectionRegistryFull refuses it), then keep it."""
        await runtime.async_broker().connection_put(record, lease_ms=lease_ms(), limit=registry_limit())
        self.sessions[record.connection_id] = session
        self.records[record.connection_id] = record
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def changed(self) -> None:
        self._wake.set()

    def forget(self, connection_id: str) -> None:
        if self.records.pop(connection_id, None) is not None:
            self.sessions.pop(connection_id, None)
            self._gone.append(connection_id)
            self._wake.set()

    async def _run(self) -> None:
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), poll_seconds())
                self._wake.clear()
                try:
                    await self.tick()
                except Exception as exc:  # Redis away: the sessions learn it themselves; try again next poll
                    if store_unavailable(exc):
                        logger.warning("connection registry: Redis unavailable (%s)", exc)
                    else:
                        logger.exception("connection registry update failed")
                if not self.records and not self._gone:
                    return
        finally:  # (also when its loop ends: then nothing here holds the loop)
            self._task = None

    async def tick(self) -> None:
        broker = runtime.async_broker()  # the loop's client (looked up each time: tests replace it)
        if self._gone:
            gone, self._gone = self._gone, []
            await broker.connection_drop(gone)
        for connection_id, reason in await broker.connection_closes(self.process):
            session = self.sessions.get(connection_id)
            if session is not None:
                task = asyncio.get_running_loop().create_task(session.close_by_operator(reason))
                _background.add(task)  # (held: the loop keeps only weak references to tasks)
                task.add_done_callback(_background.discard)
        dirty = []
        for connection_id, record in list(self.records.items()):
            session = self.sessions.get(connection_id)
            if session is not None:
                sync_subscriptions(record, session)
            if record.dirty:
                dirty.append(record)
        if dirty:
            try:
                failed = await broker.connection_put_many(dirty, lease_ms=lease_ms(), limit=registry_limit())
            except Exception:
                for record in dirty:  # what was taken for written may not be: all of it next time
                    record.registered = False
                raise
            if failed:  # lapsed, and the registry is full now: tried again whole at the next poll
                logger.warning("connection registry: %d connections not listed: %s", len(failed),
                               "the registry holds SIGNALBOX_CONNECTION_REGISTRY_LIMIT connections")
        if time.monotonic() - self._renewed >= lease_ms() / 3000:
            self._renewed = time.monotonic()
            missing = await broker.connection_renew(list(self.records), lease_ms())
            for connection_id in missing:  # it lapsed (this process stalled): written whole at the next poll
                record = self.records.get(connection_id)
                if record is not None:
                    record.registered = False
                    self._wake.set()


def sync_subscriptions(record: ConnectionRecord, session: Any) -> None:
    """Subscriptions the link ended (UNSUBSCRIBE, an abort) leave the record; each one the link holds is
    in it (with what `note_subscription` added: selector, prefetch)."""
    link = session.link
    if link is None:
        return
    for key in [k for k in record.subscriptions if k not in link.subscriptions]:
        record.unsubscribed(key)
    for key, sub in list(link.subscriptions.items()):
        known = record.subscriptions.get(key)
        ids = [c.consumer_id for c in sub.consumers]
        if known is None or known["consumers"] != ids:
            known = known or {}
            prefetch = known.get("prefetch") or next((c.prefetch for c in sub.consumers), None)
            record.subscribed(key, [d.uri for d in sub.destinations], ack_mode=sub.ack_mode,
                              selector=known.get("selector"), prefetch=prefetch,
                              consumer_ids=ids, durable=sub.durable[1] if sub.durable else None)


# weak: an event loop that ends (a test's) takes its registry with it
_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ProcessConnections] = (
    weakref.WeakKeyDictionary())


_loops_seen = 0


def for_loop() -> ProcessConnections:
    global _loops_seen
    loop = asyncio.get_running_loop()
    if loop not in _by_loop:
        _loops_seen += 1
        _by_loop[loop] = ProcessConnections(runtime.PROCESS_ID if _loops_seen == 1
                                            else f"{runtime.PROCESS_ID}.{_loops_seen}")
    return _by_loop[loop]


def new_record(session: Any, connection_id: str, user: str) -> ConnectionRecord:
    return ConnectionRecord(connection_id, protocol_of(session), for_loop().process, user=user,
                            client_id=session.client_id or "", address=session.remote_address or "",
                            since_ms=int(time.time() * 1000))


# -- REST consumers ------------------------------------------------------------------------------------
# An HTTP consumer is a connection of its own in the registry (protocol `rest`, its id the consumer id):
# it has no socket and no owning process (any gateway process serves its requests, and Close closes its
# broker consumer directly). Its entry's lease is the consumer's lease and a third more, renewed by the
# consumer's requests at most once per third of the lease per process, so it lives as long as the
# consumer (and at most a third of a lease longer); the renewal runs beside the request, never before it.

_rest_renewed: dict[str, float] = {}
_REST_RENEWED_KEPT = 10_000
_background: set[asyncio.Task[Any]] = set()


def rest_lease(consumer_lease_ms: int) -> int:
    return consumer_lease_ms * 4 // 3


async def register_rest(consumer_id: str, destination: str, *, ack_mode: str, lease_ms: int, user: str,
                        client_id: str | None, address: str, selector: str | None, prefetch: int | None,
                        durable: str | None = None) -> None:
    record = ConnectionRecord(consumer_id, "rest", "", user=user, client_id=client_id or "", address=address,
                              since_ms=int(time.time() * 1000))
    record.subscribed(consumer_id, [destination], ack_mode=ack_mode, selector=selector, prefetch=prefetch,
                      consumer_ids=[consumer_id], durable=durable)
    await runtime.async_broker().connection_put(record, lease_ms=rest_lease(lease_ms), limit=registry_limit())
    _rest_renewed[consumer_id] = time.monotonic()


def touch_rest(consumer_id: str, lease_ms: int) -> None:
    """A request of the consumer: renew its entry, at most once per third of the lease in this process."""
    now = time.monotonic()
    if now - _rest_renewed.get(consumer_id, 0.0) < lease_ms / 3000:
        return
    _rest_renewed[consumer_id] = now
    if len(_rest_renewed) > _REST_RENEWED_KEPT:
        _rest_renewed.pop(next(iter(_rest_renewed)))
    task = asyncio.get_running_loop().create_task(_renew_rest(consumer_id, lease_ms))
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _renew_rest(consumer_id: str, lease_ms: int) -> None:
    try:
        await runtime.async_broker().connection_renew([consumer_id], rest_lease(lease_ms))
    except Exception as exc:  # the entry lapses; the consumer's own request reports Redis being away
        logger.warning("connection registry: renewing REST consumer %s failed (%s)", consumer_id, exc)


async def forget_rest(consumer_id: str) -> None:
    _rest_renewed.pop(consumer_id, None)
    await runtime.async_broker().connection_drop([consumer_id])
