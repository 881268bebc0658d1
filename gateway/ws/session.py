"""What the STOMP and JSON sessions share: the socket's send buffer, the broker link opened at login, the
text of a permission refusal, and the end of a connection. The protocols (gateway/stomp/protocol.py,
gateway/ws/json_protocol.py) subclass `LinkedSession` and only translate frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from broker_core import scheduler
from broker_core.destinations import Destination
from broker_core.maintenance import AbortNotice
from broker_core.messages import Delivery, Message
from broker_core.model import Consumer
from gateway import connections, permissions
from gateway.unavailable import store_unavailable
from gateway.ws import auth
from gateway.ws.link import Link, LinkSettings, SendBuffer, Subscription

logger = logging.getLogger(__name__)


class LinkedSession:
    """One WebSocket connection's session. Subclasses implement `deliver` (deliveries to frames), `_lost`
    (the link cannot go on) and `_aborted` (the broker aborted a subscription, spec §8.4)."""

    protocol = ""  # how the client speaks ('stomp', 'json'), named in the Connection advisory
    client_id: str | None = None  # the JMS client id the client gave (STOMP's client-id header)
    remote_address = ""  # the client's address, when the transport knows it
    unique_ack_ids = False  # the client acks by the ack id alone: unique within the connection (Link)
    # logged in and registered (STOMP: CONNECTED sent); until then a WebSocket message is held to what a
    # login needs (gateway/ws/message_limits.py)
    established = False
    # whether the protocol's permission checks cover temporary destinations (STOMP's do not: ActiveMQ's
    # without a tempDestinationAuthorizationEntry); a BROWSE's reply-to is checked as its sends are
    checks_temporary = True

    def __init__(self, transport: Any, *, broker: Any, hub: Any, session_user: Any = None,
                 link_settings: LinkSettings | None = None) -> None:
        self.transport = transport
        self.broker = broker
        self.hub = hub
        self.session_user = session_user
        self.link_settings = link_settings or LinkSettings.from_django()
        self.user: Any = None
        self.link: Link | None = None
        self.buffer: SendBuffer | None = None
        self.closing = False
        self._tasks: list[asyncio.Task[None]] = []  # the session's timers; cancelled at the end
        self._advised = False  # a ConnectionInfo advisory went out, so a RemoveInfo is owed at the end
        self.record: Any = None  # the connection registry's record (gateway/connections.py), once connected

    @property
    def client_host(self) -> str:
        """The client's host alone (`remote_address` without scheme and port): whose failed logins count
        together (gateway/logins.py)."""
        where = self.remote_address.partition("://")[2] or self.remote_address
        return where.rpartition(":")[0] or where or "unknown"

    def open_buffer(self, coalesce: bool) -> None:
        self.buffer = SendBuffer(self.transport.write, self.link_settings.send_buffer_bytes,
                                 self.link_settings.slow_client_seconds, coalesce=coalesce,
                                 write_nowait=getattr(self.transport, "write_nowait", None),
                                 unsent=getattr(self.transport, "unsent", None),
                                 flush=getattr(self.transport, "flush", None))

    async def open_link(self, user: Any) -> Link:
        """The user logged in: open the connection's link to the broker."""
        self.user = user
        scheme, _, rest = self.remote_address.partition("://")
        link = Link(self.broker, self.hub, self.deliver, self._lost, self.link_settings,
                    aborted=self._aborted, buffer=self.buffer, unique_ack_ids=self.unique_ack_ids,
                    transport=scheme if rest else "ws", browsed=self._browsed)
        await link.open()
        self.link = link
        return link

    async def connected(self) -> None:
        """The connection is established (logged in, client id claimed): ActiveMQ.Advisory.Connection's
        ConnectionInfo (spec §11), published only while someone subscribes to that topic."""
        assert self.link is not None
        await self.broker.advise_connection(
            self.link.connection_id, added=True, client_id=self.client_id, user=auth.username(self.user),
            address=self.remote_address or None, protocol=self.protocol or None)
        self._advised = True
        record = connections.new_record(self, self.link.connection_id, auth.username(self.user))
        await connections.for_loop().register(self, record)  # ConnectionRegistryFull refuses the connection
        if self.closing:  # it ended while registering: release() found no record to forget
            connections.for_loop().forget(record.connection_id)
            return
        self.record = record

    def note_subscription(self, sub: Subscription, selector: str | None, prefetch: int | None) -> None:
        """SUBSCRIBE succeeded: the registry lists it (written within a moment, not on this path)."""
        if self.record is not None:
            self.record.subscribed(sub.key, [d.uri for d in sub.destinations], ack_mode=sub.ack_mode,
                                   selector=selector, prefetch=prefetch,
                                   consumer_ids=[c.consumer_id for c in sub.consumers],
                                   durable=sub.durable[1] if sub.durable else None)
            connections.for_loop().changed()

    def note_send(self, destinations: list[Destination], count: int = 1) -> None:
        """A SEND went through: counted for the registry's producer rows (a new destination is written
        within a moment, counts with the next poll)."""
        if self.record is not None:
            now = int(self.broker.clock.now_ms())
            new = [self.record.sent(d.uri, count, now) for d in destinations]
            if any(new):
                connections.for_loop().changed()

    async def close_by_operator(self, reason: str) -> None:  # pragma: no cover - interface
        """An administrator closed the connection (the console's Close): end it as the protocol does."""
        raise NotImplementedError

    async def refusal(self, destinations: list[Destination], action: str) -> str | None:
        """None when the user may `action` ('read' or 'write') every destination, else ActiveMQ's text."""
        if await permissions.allowed_async(self.user, destinations, action):  # type: ignore[arg-type]
            return None
        verb = "write to" if action == "write" else "read from"
        return (f"User {auth.username(self.user)} is not authorized to {verb}: "
                f"{', '.join(d.uri for d in destinations)}")

    async def may(self, dest: Destination, action: str) -> bool:
        """May the user `action` on the contents of `dest` (the scheduler management's jobs)? As every
        adapter asks it (permissions.contents_allowed): its own connection's temporary destination's, the
        grant's, and another connection's temporary destination a staff user's alone."""
        connection_id = self.link.connection_id if self.link is not None else None
        return await permissions.contents_allowed(self.user, dest, action,  # type: ignore[arg-type]
                                                  connection_id)

    async def _authorize(self, destinations: list[Destination], action: str
                         ) -> None:  # pragma: no cover - interface
        """Refuse (the protocol's error) unless the user may `action` on every destination."""
        raise NotImplementedError

    def refused(self, refusal: str) -> Exception:  # pragma: no cover - interface
        """The protocol's error for a permission refusal (its text: `refusal`)."""
        raise NotImplementedError

    async def manage_scheduler(self, destinations: list[Destination], messages: list[Message],
                               transaction: str | None = None) -> list[int]:
        """Messages sent to ActiveMQ.Scheduler.Management (the SEND's right to write there checked): acted
        on by the broker at once, in a transaction too (as ActiveMQ's SchedulerBroker), and delivered to
        nobody. The user's rights on each job's destination decide which jobs it sees
        (AsyncBroker.manage_scheduler); a BROWSE's reply-to needs the right to write. Every message of a
        batch is checked before any acts (a bad one changes nothing). Returns how many jobs each sent or
        cancelled."""
        requests = scheduler.scheduler_requests(destinations, messages)
        if transaction is not None:  # (acted on at once all the same; one never begun is refused as a SEND's)
            assert self.link is not None
            self.link.require_transaction(transaction)
        for request in requests:
            if request.reply_to is not None:
                refusal = await permissions.reply_to_refusal(self.user, request.reply_to,
                                                             temporary_checked=self.checks_temporary)
                if refusal is not None:
                    raise self.refused(refusal)
        return [await self.broker.manage_scheduler(request, self.may) for request in requests]

    async def deliver(self, sub: Subscription, consumer: Consumer, deliveries: list[Delivery]
                      ) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    async def _lost(self, reason: str, unavailable: bool = False) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    async def _aborted(self, sub: Subscription, notice: AbortNotice) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    async def _browsed(self, sub: Subscription) -> None:  # pragma: no cover - interface
        """A queue browser (Link.browse) delivered all it will: tell the client, as the protocol does."""
        raise NotImplementedError

    async def release(self, reason: str = "") -> None:
        """Stop the timers and close the link (subscriptions closed, their unacked messages go back), then
        advise the connection's end (RemoveInfo) once, however it ended: DISCONNECT, an error, the socket
        closing. A gateway process that dies sends none (ActiveMQ's broker would see the transport fail)."""
        self.closing = True
        if self.record is not None:
            connections.for_loop().forget(self.record.connection_id)
            self.record = None
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if self.link is not None:
            await self.link.close()
        if self._advised and self.link is not None:
            self._advised = False
            try:
                await self.broker.advise_connection(self.link.connection_id, added=False,
                                                    reason=reason or None)
            except Exception as exc:  # the connection is closing whatever happens: the advisory is lost
                if store_unavailable(exc):
                    logger.warning("Connection advisory for %s failed: Redis unavailable (%s)",
                                   self.link.connection_id, exc)
                else:
                    logger.exception("Connection advisory for %s failed", self.link.connection_id)

    async def shutdown(self, reason: str = "") -> None:
        """Release the broker side, flush what is queued (bounded), close the socket."""
        await self.release(reason)
        if self.buffer is not None:
            await self.buffer.flush(2.0)
            await self.buffer.close()
        with contextlib.suppress(Exception):
            await self.transport.close()

    async def connection_lost(self) -> None:
        """The socket closed: release the broker side; nothing more can be written."""
        await self.release("connection lost")
        if self.buffer is not None:
            await self.buffer.close()
