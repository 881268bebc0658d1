"""What the STOMP and JSON sessions share: the socket's send buffer, the broker link opened at login, the
text of a permission refusal, and the end of a connection. The protocols (gateway/stomp/protocol.py,
gateway/ws/json_protocol.py) subclass `LinkedSession` and only translate frames.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from broker_core.destinations import Destination
from broker_core.maintenance import AbortNotice
from broker_core.messages import Delivery
from broker_core.operations import Consumer
from gateway.ws import auth
from gateway.ws.link import Link, LinkSettings, SendBuffer, Subscription


class LinkedSession:
    """One WebSocket connection's session. Subclasses implement `deliver` (deliveries to frames), `_lost`
    (the link cannot go on) and `_aborted` (the broker aborted a subscription, spec §8.4)."""

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

    def open_buffer(self, coalesce: bool) -> None:
        self.buffer = SendBuffer(self.transport.write, self.link_settings.send_buffer_bytes,
                                 self.link_settings.slow_client_seconds, coalesce=coalesce)

    async def open_link(self, user: Any) -> Link:
        """The user logged in: open the connection's link to the broker."""
        self.user = user
        link = Link(self.broker, self.hub, self.deliver, self._lost, self.link_settings,
                    aborted=self._aborted)
        await link.open()
        self.link = link
        return link

    async def refusal(self, destinations: list[Destination], action: str) -> str | None:
        """None when the user may `action` ('read' or 'write') every destination, else ActiveMQ's text."""
        if await auth.may(self.user, destinations, action):
            return None
        verb = "write to" if action == "write" else "read from"
        return (f"User {auth.username(self.user)} is not authorized to {verb}: "
                f"{', '.join(d.uri for d in destinations)}")

    async def deliver(self, sub: Subscription, consumer: Consumer, deliveries: list[Delivery]
                      ) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    async def _lost(self, reason: str) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    async def _aborted(self, sub: Subscription, notice: AbortNotice) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    async def release(self) -> None:
        """Stop the timers and close the link (subscriptions closed, their unacked messages go back)."""
        self.closing = True
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if self.link is not None:
            await self.link.close()

    async def shutdown(self, reason: str = "") -> None:
        """Release the broker side, flush what is queued (bounded), close the socket."""
        await self.release()
        if self.buffer is not None:
            await self.buffer.flush(2.0)
            await self.buffer.close()
        with contextlib.suppress(Exception):
            await self.transport.close()

    async def connection_lost(self) -> None:
        """The socket closed: release the broker side; nothing more can be written."""
        await self.release()
        if self.buffer is not None:
            await self.buffer.close()
