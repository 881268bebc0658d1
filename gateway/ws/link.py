"""A WebSocket connection's link to the broker, shared by the STOMP and JSON protocols.

It owns the connection's broker consumers (one per destination of a subscription), pushes what dispatch
assigns them (woken by the process's wake-up hub, gateway/runtime.py: no polling in the hot path), keeps
their leases alive while the socket lives, maps acknowledgements to the right consumer, holds the
connection's transactions, and closes everything when the connection ends. Protocols only translate.

`SendBuffer` sits between the protocol and the socket: bounded in bytes, so a client that does not read
stops the pumps (its messages stay in the broker, never in this process's memory) and, when it stays
stuck longer than the slow-client timeout, is disconnected and its messages go to other consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings as django_settings

from broker_core.destinations import Destination, covers
from broker_core.errors import (
    NotInFlight,
    TransactionError,
    UnknownConsumer,
    UnknownDestination,
    UnknownSubscription,
)
from broker_core.maintenance import AbortNotice
from broker_core.messages import Delivery, Message
from broker_core.model import Consumer, ConsumerSpec
from gateway import runtime
from gateway.unavailable import store_unavailable
from gateway.ws.client_ids import ClientIdClaim, ClientIdInUse

logger = logging.getLogger(__name__)


def _setting(name: str, default: Any) -> Any:
    return getattr(django_settings, name, default)


@dataclass(frozen=True)
class LinkSettings:
    """Knobs of the WebSocket gateway; each is a Django setting of the same name (defaults here)."""

    lease_ms: int = 30_000  # SIGNALBOX_WS_LEASE_MS: a consumer's lease; renewed every third of it
    send_buffer_bytes: int = 1024 * 1024  # SIGNALBOX_WS_SEND_BUFFER_BYTES
    slow_client_seconds: float = 30.0  # SIGNALBOX_WS_SLOW_CLIENT_SECONDS
    max_subscriptions: int = 1000  # SIGNALBOX_WS_MAX_SUBSCRIPTIONS (per connection)
    receive_batch: int = 500  # SIGNALBOX_WS_RECEIVE_BATCH: messages taken per receive call
    browse_page: int = 100  # SIGNALBOX_WS_BROWSE_PAGE: messages a queue browser takes per browse call
    # SIGNALBOX_WS_MAX_TRANSACTIONS: transactions open at once per connection. Each is a key the link renews
    # with its leases, all in one MULTI/EXEC: 100,000 held every other client of Redis 90-170 ms a renewal.
    max_transactions: int = 100
    @classmethod
    def from_django(cls) -> LinkSettings:
        return cls(
            lease_ms=int(_setting("SIGNALBOX_WS_LEASE_MS", cls.lease_ms)),
            send_buffer_bytes=int(_setting("SIGNALBOX_WS_SEND_BUFFER_BYTES", cls.send_buffer_bytes)),
            slow_client_seconds=float(_setting("SIGNALBOX_WS_SLOW_CLIENT_SECONDS", cls.slow_client_seconds)),
            max_subscriptions=int(_setting("SIGNALBOX_WS_MAX_SUBSCRIPTIONS", cls.max_subscriptions)),
            receive_batch=int(_setting("SIGNALBOX_WS_RECEIVE_BATCH", cls.receive_batch)),
            browse_page=int(_setting("SIGNALBOX_WS_BROWSE_PAGE", cls.browse_page)),
            max_transactions=int(_setting("SIGNALBOX_WS_MAX_TRANSACTIONS", cls.max_transactions)),
        )

    @property
    def renew_every(self) -> float:
        return self.lease_ms / 3000


@dataclass
class OpenTransaction:
    """A transaction the client has begun on this connection: the broker's id, and what its `client`
    mode ACKs so far hold, which go into the broker's transaction only at COMMIT (`Link.commit`, as
    ActiveMQ's STOMP sends them), yet count against its limits from the ACK on (broker_core
    TransactionLimits): the messages they acknowledge and their consumers. (A `client-individual` ACK
    goes into the broker's transaction at once, counted there.)"""

    tx: str
    acked: int = 0
    consumers: frozenset[str] = frozenset()
    # why a SEND or ACK of it was refused while the client did not wait for the answer (no receipt): its
    # COMMIT must fail, or the client would commit without the refused part unawares (ActiveMQ's
    # TransportConnection marks such a transaction rollback-only)
    rollback_only: str = ""


# An auto ack's call may wait this long to share the process's next write to Redis (`_ack_once_written`):
# about one tick of the event loop's timer, so a consumer alone on its process gets its acks within it
AUTO_ACK_HOLD_S = 0.001
# How long closing a consumer waits for its auto acks already on their way to Redis (`_acks_landed`).
ACKS_AT_CLOSE_S = 2.0
CLOSE_RETRY_SECONDS = 0.5  # a consumer whose close found Redis away is closed again this often
_CLOSING: set[asyncio.Task[None]] = set()  # those retries (a reference, so they are not collected)
# ack ids of unsubscribed or aborted subscriptions remembered per connection, the newest: each costs about
# 170 bytes, and a client that subscribes and unsubscribes over and over adds a window's worth each time
# (an older one's late ACK is then an ERROR, as any unknown id's)
ENDED_ACKS_KEPT = 10_000
# message ids a composite subscription with overlapping topic parts remembers (Link._one_copy)
COPIES_KEPT = 10_000
# what an ack takes from a subscription: (ack id, (consumer, message id)); no consumer for a message the
# broker does not hold (a replayed advisory)
Taken = tuple[str, tuple["Consumer | None", str]]


class SlowClient(Exception):
    """The client did not read for longer than the slow-client timeout."""


class LinkError(Exception):
    """A request the link refuses; `message` is short, `detail` explains."""

    def __init__(self, message: str, detail: str = "", code: str = "invalid_request") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or message
        self.code = code


Payload = bytes | str


class SendBuffer:
    """A bounded queue of outgoing WebSocket messages drained by one writer task.

    `put` waits while the buffer holds `max_bytes` (one message larger than that still goes through
    alone); after `slow_seconds` of waiting it raises SlowClient. With `coalesce`, consecutive text
    payloads (or bytes payloads) are joined into one WebSocket message, as STOMP allows.

    `write_nowait(payload)`, when the transport has one, hands a payload over without waiting, or says
    False when it would have to wait (its own buffer holds bytes the client has not taken). A `put` that
    finds nothing queued and the writer idle tries it first: the usual frame, a RECEIPT or a MESSAGE to a
    client that keeps up, goes out in the caller's turn of the event loop instead of waking the writer
    task (one turn fewer per frame). Anything else queues, so the order and the bound stay the writer's.

    `unsent()`, when the transport has one, is how many bytes handed to it are still in this process (a
    byte stream's write buffer, or the WebSocket server's: gateway/ws/uvicorn_ws.py, before the OS took
    them), and `flush()` waits until it has none (False when it never will: the connection is gone). A
    payload counts as written (`written`, `flushed_now`) only once it has left the process: bytes a
    killed process still held never reach the client.
    """

    def __init__(self, write: Callable[[Payload], Awaitable[None]], max_bytes: int, slow_seconds: float,
                 coalesce: bool = False, coalesce_limit: int = 8 * 1024,
                 write_nowait: Callable[[Payload], bool] | None = None,
                 unsent: Callable[[], int] | None = None,
                 flush: Callable[[], Awaitable[bool]] | None = None) -> None:
        self._write = write
        self._write_nowait = write_nowait
        self._unsent, self._flush = unsent, flush
        self.max_bytes = max_bytes
        self.slow_seconds = slow_seconds
        self.coalesce = coalesce
        self.coalesce_limit = coalesce_limit
        self._items: list[Payload] = []
        self._size = 0
        self._room = asyncio.Condition()
        self._waiting = 0  # puts waiting for room
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self.last_write = time.monotonic()
        self._writing_since: float | None = None
        # payloads put, and of those handed to the transport (in order: the first `handed` of them)
        self.puts = 0
        self.handed = 0
        self._task = asyncio.get_running_loop().create_task(self._run())

    @property
    def size(self) -> int:
        return self._size

    async def put(self, item: Payload, force: bool = False) -> None:
        """Queue one message; waits while the buffer is full (`force`: never waits, for the last ERROR)."""
        if self._closed:
            return
        if (self._write_nowait is not None and not self._items and self._writing_since is None
                and self._write_nowait(item)):
            self.last_write = time.monotonic()
            self.puts += 1
            self.handed += 1
            return
        n = len(item)
        if force or not self._size or self._size + n <= self.max_bytes:
            self._append(item, n)  # room now: the condition (and its lock) is only for waiting
            return
        async with self._room:
            await self._wait(lambda: self._closed or not self._size or self._size + n <= self.max_bytes)
            if self._closed:
                return
            self._append(item, n)

    async def _wait(self, done: Callable[[], bool]) -> None:
        """Wait (holding the condition's lock) until `done()` after a write; SlowClient when the client
        takes nothing for `slow_seconds`."""
        self._waiting += 1
        try:
            await asyncio.wait_for(self._room.wait_for(done), self.slow_seconds)
        except TimeoutError:
            raise SlowClient(f"the client read nothing for {self.slow_seconds:g} s with "
                             f"{self._size} bytes waiting") from None
        finally:
            self._waiting -= 1

    def _append(self, item: Payload, n: int) -> None:
        self._items.append(item)
        self.puts += 1
        self._size += n
        self._idle.clear()
        self._ready.set()

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._items:
                batch, count = self._take()
                self._writing_since = time.monotonic()
                await self._write(batch)
                self.last_write = time.monotonic()
                self._writing_since = None
                self._size -= len(batch)
                self.handed += count
                if self._waiting:  # a put waits for room, or `written` for this
                    async with self._room:
                        self._room.notify_all()
            self._idle.set()

    def _take(self) -> tuple[Payload, int]:
        """The next write, and how many payloads put it holds."""
        first = self._items.pop(0)
        if not self.coalesce:
            return first, 1
        parts = [first]
        total = len(first)
        while self._items and type(self._items[0]) is type(first) and total < self.coalesce_limit:
            item = self._items.pop(0)
            parts.append(item)
            total += len(item)
        if len(parts) == 1:
            return first, 1
        return ("".join(parts) if isinstance(first, str) else b"".join(parts)), len(parts)  # type: ignore[arg-type]

    def flushed_now(self) -> bool:
        """Every payload put has been handed to the transport and has left this process."""
        return self.handed >= self.puts and (self._unsent is None or not self._unsent())

    async def written(self, upto: int) -> bool:
        """Wait until the first `upto` payloads put have been handed to the transport and have left this
        process. False when they never will (the buffer closed, the connection gone); SlowClient when the
        client takes nothing for `slow_seconds`."""
        if self.handed < upto:
            await asyncio.sleep(0)  # the writer's turn first: a write that does not wait is done by then
        if self.handed < upto:
            async with self._room:
                await self._wait(lambda: self._closed or self.handed >= upto)
            if self.handed < upto:
                return False
        if self._unsent is not None and self._unsent() and self._flush is not None:
            return await self._flush()
        return True

    @property
    def stuck(self) -> bool:
        """The client has not taken a write for longer than the slow-client timeout."""
        since = self._writing_since
        return since is not None and time.monotonic() - since >= self.slow_seconds

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything put so far has been written (bounded; at once for a stuck client)."""
        if self.stuck:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)

    async def close(self) -> None:
        self._closed = True
        async with self._room:
            self._room.notify_all()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task


@dataclass
class Browser:
    """Where a queue browser's walk of its queue is: the broker's browse cursor, the page taken but not
    delivered yet, and how many more messages it may look at (the policy's maxBrowsePageSize), matching its
    selector or not: ActiveMQ's browser sees one page-in of the queue."""

    selector: str | None
    left: int
    page: list[Delivery] = field(default_factory=list)
    cursor: str | None = None
    done: bool = False  # the walk reached the end of the queue, or `left` reached 0
    # In a `client` ack mode, how many of its messages (and the end) may wait unacknowledged, as
    # ActiveMQ's browser counts them against its prefetch; None: no limit (auto acks). `room` is set by
    # an ACK that frees some (Subscription.take).
    window: int | None = None
    room: asyncio.Event = field(default_factory=asyncio.Event)
    # its id in the broker, which counts it among the queue's consumers while the link renews its lease
    # (Broker.open_browser), numbered as the connection's consumers: ActiveMQ's browser is a consumer; and
    # the prefetch its advisory names
    browser_id: str = ""
    prefetch: int = 0


def _one_copy_each(destinations: list[Destination]) -> list[Destination]:
    """The parts of a composite subscription that need a consumer of their own: a topic part that another
    topic part covers (`/topic/a.a` beside `/topic/a.*`) is left out, so that the subscription gets one copy
    of a message matching both, as ActiveMQ's one consumer on the composite does (each consumer is a topic
    subscription, with its own copy). A temporary topic is never covered: no pattern matches one."""
    topics = [d for d in destinations if d.is_topic]
    return [d for d in destinations
            if not d.is_topic or d.is_temporary
            or not any(other != d and covers(other, d) for other in topics)]


@dataclass
class Subscription:
    """One client subscription: its consumers (one per destination of a composite), its ack mode and the
    messages it delivered that wait for an acknowledgement, in delivery order."""

    key: str
    destinations: list[Destination]
    ack_mode: str
    consumers: list[Consumer] = field(default_factory=list)
    unacked: OrderedDict[str, tuple[Consumer | None, str]] = field(default_factory=OrderedDict)
    options: dict[str, Any] = field(default_factory=dict)  # protocol-specific (STOMP id, group headers...)
    durable: tuple[str, str] | None = None  # (client id, subscription name) of a durable topic subscription
    browser: Browser | None = None  # a queue browser's walk (no consumers): `Link.browse`
    # a composite whose topic parts may both match one message (`a.*.c`, `a.b.*`): message id -> the
    # consumer that delivered it, so the other's copy is dropped (`Link._one_copy`); None when they cannot
    copies: OrderedDict[str, str] | None = None
    # ack id -> the client's name of the open transaction whose ACK took it (`Link.ack`), until that
    # transaction ends: a second ACK of it is refused naming that transaction (`Link.transaction_of`)
    transacted: dict[str, str] = field(default_factory=dict)

    def track(self, consumer: Consumer | None, delivery: Delivery) -> str:
        """Remember a delivered message until it is acknowledged; returns its ack id (the message id,
        made unique within the subscription when a composite delivers the same id twice). No consumer:
        a message the broker does not hold (a replayed advisory), which an ack only forgets. (Ack ids
        unique within the connection: `Link.track`.)"""
        ack_id = delivery.message_id
        if ack_id in self.unacked:
            ack_id = f"{delivery.message_id}@{delivery.destination}"
        self.unacked[ack_id] = (consumer, delivery.message_id)
        return ack_id

    def take(self, ack_id: str, cumulative: bool) -> list[Taken]:
        """Remove and return (ack id, entry) for what an ack of `ack_id` covers: that message, or with
        `cumulative` every message this subscription delivered up to and including it (STOMP `client`
        mode)."""
        if ack_id not in self.unacked:
            raise KeyError(ack_id)
        if self.browser is not None:
            self.browser.room.set()  # (its walk may go on: Link._browser_room)
        if not cumulative:
            return [(ack_id, self.unacked.pop(ack_id))]
        taken = []
        while self.unacked:
            key, entry = self.unacked.popitem(last=False)
            taken.append((key, entry))
            if key == ack_id:
                break
        return taken

    def restore(self, taken: list[Taken]) -> None:
        """Put back what `take` removed (an aborted transaction's acks), first: a cumulative ack takes
        the oldest, so they go back where they were; individual acks have no order to keep."""
        kept = list(self.unacked.items())
        self.unacked.clear()
        self.unacked.update(taken)
        self.unacked.update(kept)


class Link:
    """The broker side of one WebSocket connection. Call `open()` first and `close()` at the end.

    `deliver(subscription, consumer, deliveries)` is the protocol's hook that turns deliveries (in order,
    up to one receive batch) into frames and puts them in the send buffer (it may wait: that is the
    backpressure). `lost(reason, unavailable)` is
    called when the link cannot go on (a lease lapsed, the client is slow, the broker failed);
    `unavailable` is true when the cause is Redis being unreachable (gateway/unavailable.py), so the
    protocol can say so and the client knows to reconnect.
    `buffer`: the protocol's SendBuffer that `deliver` puts frames in; ack mode auto acknowledges messages
    once it has handed them to the transport (none: once `deliver` returns).
    `aborted(subscription, notice)` is called when a slow-consumer strategy or an operator aborted one of
    the subscription's consumers (spec §8.4): the link has already closed the subscription; the protocol
    tells the client and, when `notice.abort_connection`, closes the connection.
    `transport`: the scheme the client came by (ws, tcp, ssl), the connection id's prefix.
    `browsed(subscription)` is called once a queue browser (`browse`) has delivered all it will.
    """

    def __init__(self, broker: Any, hub: Any,
                 deliver: Callable[[Subscription, Consumer | None, list[Delivery]], Awaitable[None]],
                 lost: Callable[[str, bool], Awaitable[None]], settings: LinkSettings | None = None,
                 aborted: Callable[[Subscription, AbortNotice], Awaitable[None]] | None = None,
                 buffer: SendBuffer | None = None, unique_ack_ids: bool = False,
                 transport: str = "ws", browsed: Callable[[Subscription], Awaitable[None]] | None = None
                 ) -> None:
        self.broker = broker
        self.browsed = browsed
        self.hub = hub
        self.deliver = deliver
        self.buffer = buffer
        self._ack_tasks: set[asyncio.Task[None]] = set()  # auto acks on their way
        self._acking: dict[asyncio.Task[None], str] = {}  # of those, the ones past the write: their consumer
        self._unacked: dict[str, int] = {}  # per consumer, the messages of those auto acks
        self.lost = lost
        self.aborted = aborted
        self.settings = settings or LinkSettings.from_django()
        # named for its transport (ws, tcp, ssl), as an operator reads it in the connections and advisories
        self.connection_id = f"{transport}-{uuid.uuid4().hex[:16]}"
        self.subscriptions: dict[str, Subscription] = {}
        self.transactions: dict[str, OpenTransaction] = {}  # by the client's name for it
        # what acks made in a transaction took, by its name, until it ends (`ack`): an ABORT gives the client
        # its ack ids back and the messages stay delivered to it (ActiveMQ's STOMP: not redelivered to the
        # live subscription); a `client` mode ACK's are acknowledged in the broker's transaction at COMMIT
        self._tx_acks: dict[str, list[tuple[Subscription, list[Taken]]]] = {}
        self._pumps: dict[str, asyncio.Task[None]] = {}
        # per consumer, the dispatch sequence of the last message its pump wrote or began to write (closing
        # passes it on: what was pushed after it never reached the client)
        self._written: dict[str, int] = {}
        self._keeper: asyncio.Task[None] | None = None
        self._consumer_seq = 0
        self._closed = False
        self._close_task: asyncio.Task[None] | None = None  # the one close every `close` waits for
        self._close_caller: asyncio.Task[Any] | None = None  # the task that started it
        self._lost_task: asyncio.Task[None] | None = None
        self._abort_tasks: set[asyncio.Task[None]] = set()
        # ack ids that aborted subscriptions had delivered: a late ACK of one is not the client's mistake
        # (the message already went back to the queue), so protocols let it pass
        self._ended_acks: OrderedDict[str, None] = OrderedDict()
        # `unique_ack_ids` (STOMP 1.2, whose ACK names its message by the ack id alone): every ack id the
        # connection's subscriptions hold, to the subscription holding it (whose `unacked` has the consumer
        # and the message id), as ActiveMQ's pending acks: one lookup per delivery and per ACK, whatever
        # the number of subscriptions. An id leaves it when its message is acknowledged, nacked or given
        # back (UNSUBSCRIBE, an aborted subscription, the close); one acknowledged inside a transaction
        # stays until COMMIT (an ABORT gives it back to the client). None: ids are unique per subscription
        # only, the ack names the subscription (JSON, STOMP 1.1) or `find` walks them (STOMP 1.0).
        self.pending_acks: dict[str, Subscription] | None = {} if unique_ack_ids else None
        self._client_id: ClientIdClaim | None = None

    def _report_lost(self, reason: str, unavailable: bool = False) -> None:
        """Tell the protocol once, from a task of its own (the caller may be a task the teardown cancels)."""
        if self._lost_task is None and not self._closed:
            self._lost_task = asyncio.get_running_loop().create_task(self.lost(reason, unavailable))

    def _report_failure(self, what: str, exc: Exception) -> None:
        """A broker call failed: Redis unreachable (logged as one line), or anything else (with its trace)."""
        if store_unavailable(exc):
            logger.warning("%s: Redis unavailable (%s)", what, exc)
        else:
            logger.exception("%s", what, exc_info=exc)
        self._report_lost(f"{what}: {exc}", store_unavailable(exc))

    async def open(self) -> None:
        await self.hub.start()
        self._keeper = asyncio.get_running_loop().create_task(self._keep_leases())

    async def claim_client_id(self, client_id: str, address: str) -> None:
        """Hold `client_id` for this connection while it lives (renewed with the consumers' leases); a
        connection elsewhere holding it: LinkError with ActiveMQ's InvalidClientIDException text."""
        claim = ClientIdClaim(self.broker, client_id, self.connection_id, address)
        try:
            await claim.take(self.settings.lease_ms)
        except ClientIdInUse as exc:
            raise LinkError(str(exc), f"{exc}: a client id names one connection at a time; close the other "
                                      "connection or give this one another client-id", "invalid_client_id"
                            ) from None
        self._client_id = claim

    # -- subscriptions ------------------------------------------------------------------------------

    def spec(self, **options: Any) -> ConsumerSpec:
        """A ConsumerSpec for this connection: lease, wake-up channel and connection id filled in."""
        return ConsumerSpec(lease_ms=self.settings.lease_ms, notify=self.hub.channel,
                            connection_id=self.connection_id, **options)

    def _check_room(self, key: str) -> None:
        if key in self.subscriptions:
            raise LinkError("Duplicate subscription", f"this connection already has a subscription {key!r}",
                            "duplicate_subscription")
        if len(self.subscriptions) >= self.settings.max_subscriptions:
            raise LinkError("Too many subscriptions",
                            f"a connection may hold at most {self.settings.max_subscriptions} subscriptions "
                            "(SIGNALBOX_WS_MAX_SUBSCRIPTIONS)", "too_many_subscriptions")

    async def subscribe(self, key: str, destinations: list[Destination], spec: ConsumerSpec,
                        options: dict[str, Any] | None = None, start: bool = True) -> Subscription:
        self._check_room(key)
        durable = (spec.client_id or "", spec.subscription_name) if spec.subscription_name else None
        sub = Subscription(key, destinations, spec.ack_mode, options=dict(options or {}), durable=durable)
        # retroactive means nothing for a queue (as in ActiveMQ); durable names are only for topics
        queue_spec = dataclasses.replace(spec, retroactive=False)
        try:
            for dest in _one_copy_each(destinations):
                self._consumer_seq += 1
                cid = f"{self.connection_id}-{self._consumer_seq}"
                dest_spec = spec if dest.is_topic else queue_spec
                sub.consumers.append(await self._add_consumer(dest, dest_spec, cid, sub.consumers))
        except BaseException:
            for consumer in sub.consumers:
                with contextlib.suppress(Exception):
                    await self.broker.close_consumer(consumer, "subscribe failed")
            raise
        topics = [c for c in sub.consumers if c.destination.is_topic]
        if len(topics) > 1 and any(c.destination.is_wildcard for c in topics):
            sub.copies = OrderedDict()
        self.subscriptions[key] = sub
        if start:
            self.start(sub)
        return sub

    async def _add_consumer(self, dest: Destination, spec: ConsumerSpec, cid: str,
                            made: list[Consumer]) -> Consumer:
        """The broker's new consumer. A cancel meanwhile (the client's socket ended) does not stop the call
        in Redis, which may still make the consumer: it is waited for and put in `made`, which the caller
        closes, rather than left unknown, holding messages in flight until its lease lapses."""
        async def keep(consumer: Consumer) -> None:
            made.append(consumer)

        return await runtime.uncancelled(self.broker.add_consumer(dest, spec, cid), keep)

    async def browse(self, key: str, dest: Destination, selector: str | None, ack_mode: str,
                     options: dict[str, Any] | None = None, prefetch: int = 500) -> Subscription:
        """A queue browser (ActiveMQ's QueueBrowserSubscription): `start` gives it the messages on the queue
        now, selector applied, without taking them (pending in dispatch order, then in flight; not parked
        ones), at most the policy's maxBrowsePageSize, then calls `browsed`. It has no consumer: it holds
        nothing, and receives nothing more until it is unsubscribed; the broker counts it among the queue's
        consumers until then (Broker.open_browser, its lease renewed with the consumers'). The first page
        is taken here, so a bad selector is the SUBSCRIBE's error; the rest one page
        (SIGNALBOX_WS_BROWSE_PAGE) per broker call as the send buffer takes them, so a slow client holds
        back the walk, not the gateway's memory. In a `client` ack mode at most `prefetch` messages wait
        unacknowledged (the end counts as one), as ActiveMQ's browser is a consumer with a prefetch (500
        unless the client says)."""
        self._check_room(key)
        limit = await self.broker.browser_limit(dest, self.connection_id)  # (refuses another's temp queue)
        await self.broker.ensure_destination(dest)  # (browsing creates the queue, as a consumer does)
        browser = Browser(selector, limit, window=None if ack_mode == "auto" else prefetch, prefetch=prefetch)
        await self._browse_page(dest, browser)
        self._consumer_seq += 1
        browser.browser_id = f"{self.connection_id}-{self._consumer_seq}"
        await self._open_browser(dest, browser)
        sub = Subscription(key, [dest], ack_mode, options=dict(options or {}), browser=browser)
        self.subscriptions[key] = sub
        return sub

    async def _open_browser(self, dest: Destination, browser: Browser) -> None:
        """Have the broker count the browser among the queue's consumers. A cancel meanwhile (the socket
        ended) does not stop the call in Redis: it is waited for and the browser closed, rather than left
        counted until its lease lapses."""
        async def close(_: None) -> None:
            await self.broker.close_browsers(dest, [browser.browser_id], "subscribe failed")

        await runtime.uncancelled(self.broker.open_browser(dest, browser.browser_id, self.settings.lease_ms,
                                                    browser.prefetch, browser.selector), close)

    async def _browse_page(self, dest: Destination, browser: Browser) -> None:
        """One broker call of the walk: its page (none when nothing in the part it examined matched) into
        `browser.page`."""
        if browser.left <= 0:
            browser.done = True
            return
        page = await self.broker.browse(dest, selector=browser.selector, cursor=browser.cursor,
                                        limit=min(self.settings.browse_page, browser.left), parked=False,
                                        examine=browser.left)
        browser.page = [b.message for b in page.messages]
        # (what it looked at: a selector matching none of a long queue ends the walk at its page, as
        # ActiveMQ's, not after a call per 400 messages of the whole queue)
        browser.left -= max(page.examined, len(browser.page))
        browser.cursor = page.next_cursor
        browser.done = page.next_cursor is None or browser.left <= 0

    async def _walk(self, sub: Subscription) -> None:
        """Deliver a queue browser's pages, taking each only once the last one is in the send buffer."""
        browser = sub.browser
        assert browser is not None
        try:
            while True:
                page, browser.page = browser.page, []
                while page:
                    room = await self._browser_room(sub, browser, len(page))
                    await self.deliver(sub, None, page[:room])
                    page = page[room:]
                if browser.done:
                    break
                try:
                    await self._browse_page(sub.destinations[0], browser)
                except UnknownDestination:  # deleted meantime: the browse ends with what it gave
                    break
            if self.browsed is not None:
                await self._browser_room(sub, browser, 1)
                await self.browsed(sub)
        except asyncio.CancelledError:
            raise
        except SlowClient as exc:
            self._report_lost(f"slow client: {exc}")
        except Exception as exc:  # the broker failed: the browse cannot finish
            self._report_failure(f"browsing {sub.destinations[0].uri} failed", exc)

    @staticmethod
    async def _browser_room(sub: Subscription, browser: Browser, most: int) -> int:
        """How many of `most` the browser may be given now: all without a window, else once fewer than
        its window wait unacknowledged, as many as fit (waiting for an ACK until one does)."""
        if browser.window is None:
            return most
        while len(sub.unacked) >= browser.window:
            browser.room.clear()
            await browser.room.wait()
        return min(most, browser.window - len(sub.unacked))

    def start(self, sub: Subscription) -> None:
        """Start pushing the subscription's messages (after a RECEIPT, so that it comes first)."""
        loop = asyncio.get_running_loop()
        if sub.browser is not None and _walk_key(sub) not in self._pumps:
            self._pumps[_walk_key(sub)] = loop.create_task(self._walk(sub))
        for consumer in sub.consumers:
            if consumer.consumer_id not in self._pumps:
                self._pumps[consumer.consumer_id] = loop.create_task(self._pump(sub, consumer))

    async def unsubscribe(self, key: str) -> Subscription:
        sub = self.subscriptions.pop(key, None)
        if sub is None:
            raise LinkError("No subscription matched.", f"this connection has no subscription {key!r}",
                            "unknown_subscription")
        await self._close_subscription(sub, "unsubscribed")  # (its pumps stopped: what it holds is final)
        self._remember_ended(sub)
        return sub

    async def unsubscribe_durable(self, client_id: str, name: str, topic: Destination | None = None,
                                  end_own: bool = True) -> int:
        """Remove the durable subscription (client id, name) and its messages (ActiveMQ's
        RemoveSubscriptionInfo), first ending this connection's own subscription holding it (`end_own`;
        without it that subscription makes it in use, as in ActiveMQ's STOMP). Without `topic`, the
        broker's registry of durable subscriptions says which topic it is on. Returns how many messages
        went with it; UnknownSubscription when there is none, DurableSubscriptionInUse while another
        connection consumes from it."""
        for sub in list(self.subscriptions.values()):
            if sub.durable == (client_id, name):
                if not end_own:
                    raise LinkError("Durable consumer is in use",
                                    f"subscription {sub.key} of this connection consumes from durable "
                                    f"subscription {name}; UNSUBSCRIBE its id first", "durable_in_use")
                await self.unsubscribe(sub.key)
        if topic is None:
            topic = await self.durable_topic(client_id, name)
        return int(await self.broker.unsubscribe(topic, client_id=client_id, subscription_name=name))

    async def durable_topic(self, client_id: str, name: str) -> Destination:
        """The topic the durable subscription (client id, name) is on (a durable key is broker-wide)."""
        where = await self.broker.durable_topic(client_id, name)
        if where is None:
            raise UnknownSubscription(f"No durable subscription exists for clientID: {client_id} and "
                                      f"subscriptionName: {name}")
        return where  # (a wildcard subscription's pattern)

    async def _close_subscription(self, sub: Subscription, reason: str) -> None:
        walk = self._pumps.pop(_walk_key(sub), None) if sub.browser is not None else None
        if walk is not None and not self._is_caller(walk):
            walk.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await walk
        if sub.browser is not None:
            try:
                await self.broker.close_browsers(sub.destinations[0], [sub.browser.browser_id], reason)
            except Exception as exc:  # it stops counting once its lease lapses
                logger.warning("closing browser %s failed (%s)", sub.browser.browser_id, exc)
        for consumer in sub.consumers:
            task = self._pumps.pop(consumer.consumer_id, None)
            if task is not None and not self._is_caller(task):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await self._acks_landed({consumer.consumer_id for consumer in sub.consumers})
        for consumer in sub.consumers:
            # (what was pushed after the last message written goes back as never received)
            written = self._written.pop(consumer.consumer_id, None)
            try:
                with contextlib.suppress(UnknownConsumer):
                    await self.broker.close_consumer(consumer, reason, written=written)
            except Exception as exc:
                if store_unavailable(exc):
                    self._close_later(consumer, reason, written)
                raise
            finally:
                self.hub.forget(consumer.consumer_id)

    async def _pump(self, sub: Subscription, consumer: Consumer) -> None:
        """Deliver the consumer's messages in dispatch order. Between receive calls the consumer is armed for
        pushes (docs/broker_core.md "The delivery path"): a dispatch hands it messages itself, which the hub
        keeps for this pump, so a message sent while the consumer has room reaches the socket with no
        receive call. `upto` is the dispatch sequence of the last message delivered: a push that does not
        follow it (one was lost, or a receive already delivered it) sends the pump back to `receive_after`,
        which hands over again whatever came after `upto`, so nothing is missed or delivered twice. Ack mode
        auto: messages (pushed or received) are acknowledged once the send buffer has handed them to the
        transport (`written`): a client cut off as too slow before that, or a process that dies, leaves
        them in flight, and closing the consumer (or the lapse of its lease) returns them."""
        batch = self.settings.receive_batch
        idle = self.settings.renew_every
        cid = consumer.consumer_id
        push = batch if consumer.prefetch > 0 else 0  # a pull consumer asks for each message
        auto = consumer.ack_mode == "auto"
        upto = 0
        self._written[cid] = 0
        self.hub.watch(cid)
        try:
            while True:
                deliveries, upto = await self.broker.receive_after(consumer, upto, batch, push)
                # (counted as written once the writing starts: a close in the middle marks them redelivered)
                self._written[cid] = upto
                if deliveries and sub.copies is not None:
                    deliveries = await self._one_copy(sub, consumer, deliveries)
                if deliveries:
                    await self.deliver(sub, consumer, deliveries)
                    if auto:
                        await self._ack_once_written(consumer, [d.message_id for d in deliveries])
                if len(deliveries) == batch:
                    continue  # more are waiting
                # the outbox is empty and the consumer armed: pushes, or a wake-up once the credit is spent;
                # the timeout only guards against a lost one
                while True:
                    woken = not await self.hub.wait(cid, idle)  # (the timeout: look anyway)
                    pushes, told = self.hub.take(cid)
                    woken = woken or told
                    written: list[str] = []  # (auto: acknowledged together, one call for what one take had)
                    for pushed in pushes:
                        if pushed.last <= upto:
                            continue  # a receive_after delivered these already
                        if pushed.after != upto:
                            woken = True  # one before it was lost: receive_after finds it
                            break
                        delivered = pushed.deliveries(consumer)
                        upto = self._written[cid] = pushed.last
                        if sub.copies is not None:
                            delivered = await self._one_copy(sub, consumer, delivered)
                        if delivered:
                            await self.deliver(sub, consumer, delivered)
                        written += [d.message_id for d in delivered]
                    if auto and written:
                        await self._ack_once_written(consumer, written)
                    if woken:
                        break
        except asyncio.CancelledError:
            raise
        except UnknownConsumer:
            self._consumer_gone(sub, consumer)
        except SlowClient as exc:
            self._report_lost(f"slow client: {exc}")
        except Exception as exc:  # the broker failed: the connection cannot keep its promises
            self._report_failure(f"delivery to {cid} failed", exc)

    async def _one_copy(self, sub: Subscription, consumer: Consumer,
                        deliveries: list[Delivery]) -> list[Delivery]:
        """The deliveries a composite subscription has not had yet from another of its topic consumers: one
        message matching two of its parts reaches it once, as ActiveMQ's one consumer on the composite. The
        other copy is acknowledged at once (it is that consumer's topic copy, nobody else's). A copy from
        the consumer that delivered it first (a redelivery) passes. The last COPIES_KEPT ids are kept: the
        two copies of one message are dispatched by one send, so they come close together."""
        copies = sub.copies
        if copies is None:
            return deliveries
        fresh: list[Delivery] = []
        dropped: list[Delivery] = []
        for delivery in deliveries:
            first = copies.setdefault(delivery.message_id, consumer.consumer_id)
            (fresh if first == consumer.consumer_id else dropped).append(delivery)
        while len(copies) > COPIES_KEPT:
            copies.popitem(last=False)
        if dropped:
            await self._ack_in_flight(consumer, [d.message_id for d in dropped])
        return fresh

    def _close_later(self, consumer: Consumer, reason: str, written: int | None) -> None:
        """Redis was unreachable when the consumer should have closed: try again until it answers, for at most
        one lease (then the reaper closes it). Until then the consumer stays armed and a dispatch may push
        messages to it that nobody writes: closed with `written`, they go back as never received."""
        async def retry() -> None:
            deadline = time.monotonic() + self.settings.lease_ms / 1000
            while time.monotonic() < deadline:
                await asyncio.sleep(CLOSE_RETRY_SECONDS)
                try:
                    await self.broker.close_consumer(consumer, reason, written=written)
                    return
                except UnknownConsumer:
                    return
                except Exception as exc:
                    if not store_unavailable(exc):
                        logger.warning("closing consumer %s failed: %s", consumer.consumer_id, exc)
                        return

        task = asyncio.get_running_loop().create_task(retry())
        _CLOSING.add(task)  # (outlives this link: a task of the process)
        task.add_done_callback(_CLOSING.discard)

    async def _ack_once_written(self, consumer: Consumer, ids: list[str]) -> None:
        """Ack mode auto: acknowledge `ids`, just delivered, once the send buffer has handed them to the
        transport (after the write, never before: Redis's work on the ack does not sit before the client's
        copy, and a client cut off as too slow before loses nothing). From a task of its own, so the pump
        goes on taking messages meanwhile (waiting here held a stream to one batch at a time), unless the
        unacknowledged ones would fill the consumer's window: then the pump waits for the ack, which lets
        the next messages through. While the window keeps room the ack's call may wait AUTO_ACK_HOLD_S to go
        out with this process's next call (drivers/multiplexed.py): in a request/reply exchange that is the
        reply's SEND, and Redis then runs and syncs both in one turn instead of syncing the ack on the
        reply's way. The messages stay in flight under the lease until the ack lands.
        A lone message already written, with no other ack of the consumer on its way, is acknowledged here,
        without a task, when the broker is known not to hold acks (Redis does not sync every write:
        `AsyncBroker.holds_acks`): in a request/reply exchange the task only cost instructions and a turn
        of the event loop. Not in a stream (several messages a take, or acks still on their way): a pump
        that waited for each ack let the pushes run past the consumer's push credit, so it pulled its
        messages instead (docs/benchmarks.md, "Session 22")."""
        cid = consumer.consumer_id
        before = self._unacked.get(cid, 0)
        unacked = before + len(ids)
        buffer = self.buffer
        written = buffer is None or buffer.flushed_now()
        if written and (unacked >= consumer.prefetch
                        or (unacked == 1 and not before and self.broker.holds_acks is False)):
            await self._ack_in_flight(consumer, ids)
            return
        self._unacked[cid] = unacked
        mark = buffer.puts if buffer is not None else 0

        async def later() -> None:
            try:
                if written or await buffer.written(mark):  # type: ignore[union-attr]
                    self._acking[task] = cid  # (the client has them: a close waits for this, `_acks_landed`)
                    await self._ack_in_flight(consumer, ids, AUTO_ACK_HOLD_S if written else 0.0)
            except (SlowClient, UnknownConsumer):
                pass  # the pump or the close deals with it: closing the consumer gives these back
            except Exception as exc:
                self._report_failure(f"acknowledging messages of {consumer.consumer_id} failed", exc)
            finally:
                left = self._unacked.get(cid, 0) - len(ids)
                if left > 0:
                    self._unacked[cid] = left
                else:
                    self._unacked.pop(cid, None)

        task = asyncio.get_running_loop().create_task(later())
        self._ack_tasks.add(task)
        task.add_done_callback(self._ack_tasks.discard)
        task.add_done_callback(lambda done: self._acking.pop(done, None))

    async def _acks_landed(self, consumer_ids: set[str]) -> None:
        """Let the auto acks of these consumers that are on their way to Redis land before the consumers
        close: their messages were written to the client, and a close first gives them back, to be
        delivered again (a client that reads one MESSAGE and DISCONNECTs got it twice). Bounded: an ack
        Redis does not answer leaves its messages to the close, as before."""
        tasks = [task for task, cid in self._acking.items()
                 if cid in consumer_ids and not self._is_caller(task)]
        if tasks:
            await asyncio.wait(tasks, timeout=ACKS_AT_CLOSE_S)

    async def _ack_in_flight(self, consumer: Consumer, ids: list[str], hold: float = 0.0) -> None:
        """Acknowledge messages no client waits on (ack mode auto's, once the send buffer wrote them; a
        composite subscription's second copies, `_one_copy`). One an operator removed (or moved) meanwhile
        is not in flight any more: the others are acknowledged one by one."""
        try:
            await self.broker.ack(consumer, ids, mode="individual", hold=hold)
        except NotInFlight:
            for message_id in ids:
                with contextlib.suppress(NotInFlight):
                    await self.broker.ack(consumer, message_id, mode="individual")

    async def _keep_leases(self) -> None:
        while True:
            await asyncio.sleep(self.settings.renew_every)
            if self._client_id is not None and not await self._renew_client_id():
                return
            by_destination: dict[Destination, list[str]] = {}
            browsers: dict[Destination, dict[str, Browser]] = {}
            for sub in list(self.subscriptions.values()):
                for consumer in sub.consumers:
                    by_destination.setdefault(consumer.destination, []).append(consumer.consumer_id)
                if sub.browser is not None:
                    browsers.setdefault(sub.destinations[0], {})[sub.browser.browser_id] = sub.browser
            try:
                for dest, open_ones in browsers.items():
                    # One that lapsed meanwhile (this process stalled past its lease) was removed and no
                    # longer counts; it is still open for its client, so it is counted again (it holds
                    # nothing: its walk went on).
                    lease_ms = self.settings.lease_ms
                    for lapsed in await self.broker.renew_browsers(dest, list(open_ones), lease_ms):
                        logger.warning("browser %s of connection %s lapsed before it was renewed: counted "
                                       "again", lapsed, self.connection_id)
                        await self._open_browser(dest, open_ones[lapsed])
                if self.transactions:  # (one that lapsed meanwhile: its COMMIT is refused, its ABORT a no-op)
                    for tx in await self.broker.renew_transactions([t.tx for t in self.transactions.values()],
                                                                   self.settings.lease_ms):
                        logger.warning("transaction %s of connection %s lapsed before it was renewed",
                                       tx, self.connection_id)
                for dest, ids in by_destination.items():
                    gone = set(await self.broker.renew_leases(dest, ids, self.settings.lease_ms))
                    for sub in list(self.subscriptions.values()):  # not those unsubscribed meanwhile
                        for consumer in sub.consumers:
                            if consumer.consumer_id in gone:
                                self._consumer_gone(sub, consumer)
                    if self._lost_task is not None:
                        return
                    # Consumers of gateway processes that died lapse here: the surviving processes reap
                    # them, so their messages go to live consumers within about one lease.
                    await self.broker.reap_lapsed(dest)
            except Exception as exc:
                self._report_failure("lease renewal failed", exc)
                return

    async def _renew_client_id(self) -> bool:
        assert self._client_id is not None
        try:
            renewed = await self._client_id.renew(self.settings.lease_ms)
        except Exception as exc:
            self._report_failure(f"renewing client id {self._client_id.client_id} failed", exc)
            return False
        if not renewed:
            self._report_lost(f"the claim on client id {self._client_id.client_id} lapsed")
        return renewed

    # -- consumers closed by the broker ------------------------------------------------------------------

    def _consumer_gone(self, sub: Subscription, consumer: Consumer) -> None:
        """The broker closed one of the subscription's consumers. Aborted (a slow-consumer strategy or an
        operator, spec §8.4): the subscription ends and the protocol tells the client. Otherwise its lease
        lapsed (this process stalled): the connection cannot keep its promises and ends. Runs in a task
        of its own (the caller may be a pump that closing the subscription cancels)."""
        if self._closed or self._lost_task is not None:
            return
        task = asyncio.get_running_loop().create_task(self._handle_gone(sub, consumer))
        self._abort_tasks.add(task)
        task.add_done_callback(self._abort_tasks.discard)

    async def _handle_gone(self, sub: Subscription, consumer: Consumer) -> None:
        try:
            notice = await runtime.abort_notice(self.broker, consumer)
        except Exception as exc:
            self._report_failure(f"subscription {sub.key} lost its consumer {consumer.consumer_id}", exc)
            return
        if notice is None or self.aborted is None:
            self._report_lost(f"subscription {sub.key} lost its consumer {consumer.consumer_id} "
                              "(its lease lapsed)")
            return
        if self.subscriptions.get(sub.key) is not sub:
            return  # already ended (unsubscribed, or a second consumer of a composite reported it)
        del self.subscriptions[sub.key]
        self._remember_ended(sub)
        # a composite's other consumers go too: ActiveMQ aborts the one consumer the subscription is
        await self._close_subscription(sub, "aborted")
        await self.aborted(sub, notice)

    def _remember_ended(self, sub: Subscription) -> None:
        """The subscription ended (UNSUBSCRIBE, or the broker aborted it) and its unacknowledged messages go
        back: a late ACK or NACK of one of them is accepted and does nothing, as ActiveMQ's STOMP keeps
        its pending ack entries after the consumer is gone (the client had no way to know in time)."""
        for ack_id in sub.unacked:
            self._ended_acks[ack_id] = None
        self._forget_pending(sub.unacked)
        while len(self._ended_acks) > ENDED_ACKS_KEPT:
            self._ended_acks.popitem(last=False)
        sub.unacked.clear()

    def was_ended(self, ack_id: str) -> bool:
        """`ack_id` was delivered by a subscription that was unsubscribed or aborted since."""
        return ack_id in self._ended_acks

    # -- acknowledgements -----------------------------------------------------------------------------

    def track(self, sub: Subscription, consumer: Consumer | None, delivery: Delivery) -> str:
        """Remember a message `sub` delivered until it is acknowledged; returns its ack id. With
        `unique_ack_ids` the id is unique within the connection: the message id, or when the connection
        holds that id already (a composite send, two subscriptions on one topic: one message id delivered
        several times) the subscription's key added, and a number after a second clash (ActiveMQ makes an
        ack id per delivery). Shared, the ACK of one copy took another's."""
        pending = self.pending_acks
        if pending is None:
            return sub.track(consumer, delivery)
        ack_id = message_id = delivery.message_id
        clashes = 0
        while ack_id in pending:
            clashes += 1
            ack_id = f"{message_id}@{sub.key}" + (f"#{clashes}" if clashes > 1 else "")
        sub.unacked[ack_id] = (consumer, message_id)
        pending[ack_id] = sub
        return ack_id

    def find(self, ack_id: str) -> Subscription | None:
        """The subscription holding `ack_id` unacknowledged (for protocols whose ack does not name it): one
        lookup with `unique_ack_ids`; else (STOMP 1.0) the first that holds it, as ActiveMQ's converter."""
        if self.pending_acks is not None:
            sub = self.pending_acks.get(ack_id)
            return sub if sub is not None and ack_id in sub.unacked else None  # (not one a transaction took)
        for sub in self.subscriptions.values():
            if ack_id in sub.unacked:
                return sub
        return None

    def transaction_of(self, ack_id: str, sub: Subscription | None = None) -> str | None:
        """The name of the open transaction whose ACK took `ack_id` (of `sub`, or of whichever
        subscription delivered it), if one did: an ACK or NACK of it is refused, naming that transaction
        (`acknowledged_in`), not as an id the connection never had."""
        if sub is None and self.pending_acks is not None:
            sub = self.pending_acks.get(ack_id)  # (a transaction's ids stay pending until it ends)
        subs = [sub] if sub is not None else list(self.subscriptions.values())
        return next((s.transacted[ack_id] for s in subs if ack_id in s.transacted), None)

    @staticmethod
    def acknowledged_in(ack_id: str, tx: str) -> str:
        """Why an ACK or NACK of `ack_id`, which an ACK in open transaction `tx` took, is refused."""
        return (f"message-id [{ack_id}] is acknowledged in transaction {tx} already: nothing was done "
                f"(COMMIT or ABORT {tx} first; an ABORT gives it back to the subscription)")

    def _forget_pending(self, ack_ids: Iterable[str]) -> None:
        """Their messages were acknowledged, nacked or given back: the ids leave the connection's map."""
        if self.pending_acks is not None:
            for ack_id in ack_ids:
                self.pending_acks.pop(ack_id, None)

    async def ack(self, sub: Subscription, ack_ids: list[str], tx: str | None = None) -> int:
        """Acknowledge by the subscription's ack mode: `client` is cumulative over the subscription,
        `client-individual` the listed messages only. Several ids (in delivery order) are checked first
        and acknowledged in one broker call per consumer, so a list is acknowledged whole or not at all.
        Inside a transaction the ack happens on commit and the prefetch window grows at once, as
        ActiveMQ's STOMP does it: a `client-individual` ACK goes into the broker's transaction now
        (`_ack_in_transaction`), a `client` one is a `delivered` ack now (`_delivered`) and goes into the
        broker's transaction at COMMIT, for subscriptions still open (`commit`)."""
        if sub.ack_mode == "auto":
            raise LinkError("Unexpected ACK", f"subscription {sub.key} acknowledges automatically",
                            "not_in_flight")
        if tx is None:  # ('' is a name, as ActiveMQ's: a transaction may be begun under it)
            taken = self._take(sub, ack_ids)
            self._forget_pending(key for key, _entry in taken)
            return await self._ack_entries(sub, [entry for _key, entry in taken], None)
        open_tx = self._open(tx)
        if sub.ack_mode == "client-individual":
            taken = await self._ack_in_transaction(sub, ack_ids, tx, open_tx)
        else:  # held here until COMMIT; counted now (`OpenTransaction`), with the transaction's sends
            acked = open_tx.acked + self._covered(sub, ack_ids)
            consumers = open_tx.consumers.union(c.consumer_id for c in sub.consumers)
            await self.broker.check_transaction(open_tx.tx, acked, places=consumers)
            taken = self._take(sub, ack_ids)
            await self._delivered(sub, taken)
            open_tx.acked, open_tx.consumers = acked, consumers
        self._tx_acks.setdefault(tx, []).append((sub, taken))  # (their ids stay pending: ABORT)
        sub.transacted.update((key, tx) for key, _entry in taken)
        return len(taken)

    async def _ack_in_transaction(self, sub: Subscription, ack_ids: list[str], tx: str,
                                  open_tx: OpenTransaction) -> list[Taken]:
        """A `client-individual` ACK in transaction `tx` goes into the broker's transaction now, one call
        per consumer (broker_core's transacted individual ack: the window grows by its messages, which
        are marked as the transaction's), as ActiveMQ's STOMP sends it to its broker at once: should the
        subscription end before the transaction does (UNSUBSCRIBE, or the broker aborts it), the broker
        holds those messages for the transaction (the COMMIT consumes them, an ABORT or its lapse
        returns them). The broker checks one call against the transaction's limits; this connection's
        `client` ACKs held for the COMMIT, or a composite's several calls, are checked with it first."""
        if open_tx.acked or len(sub.consumers) > 1:
            await self.broker.check_transaction(
                open_tx.tx, open_tx.acked + len(ack_ids),
                places=open_tx.consumers.union(c.consumer_id for c in sub.consumers))
        taken = self._take(sub, ack_ids)
        left = [entry for _key, entry in taken]
        try:
            for consumer, ids in self._by_consumer(left):
                await self.broker.ack(consumer, ids, mode="individual", tx=open_tx.tx)
                left = [entry for entry in left if entry[0] is not consumer]
        except BaseException as exc:
            recorded = [(key, entry) for key, entry in taken if entry not in left]
            sub.restore([(key, entry) for key, entry in taken if entry in left])
            if recorded:  # (a composite's: one consumer's part is in the transaction, another's refused)
                self._tx_acks.setdefault(tx, []).append((sub, recorded))
                sub.transacted.update((key, tx) for key, _entry in recorded)
                self.mark_rollback_only(tx, f"an ACK was applied in part ({exc})")
            if isinstance(exc, NotInFlight):
                raise LinkError("Unexpected ACK", exc.message, "not_in_flight") from None
            raise
        return taken

    async def _delivered(self, sub: Subscription, taken: list[Taken]) -> None:
        """A transacted `client` ACK's messages reached the client: the consumer's prefetch window grows by
        them now (broker_core's `delivered` ack), as ActiveMQ's STOMP sends a DELIVERED ack at a
        transacted client ACK, so that a client holding a full window gets its next messages within the
        same transaction; the COMMIT's acks shrink it back. Without this a client with prefetch 1 that
        acknowledges in a transaction waits for a next message that only its COMMIT would let through.
        After an ABORT it stays grown until those messages are acknowledged or the consumer closes, as
        ActiveMQ's. (A `client-individual` ACK's broker call grows it itself: `_ack_in_transaction`.)
        Refused (a message no longer in flight: expired, or removed by an operator), the ACK takes
        nothing."""
        try:
            for consumer, ids in self._by_consumer([entry for _key, entry in taken]):
                await self.broker.ack(consumer, ids, mode="delivered")
        except NotInFlight as exc:
            sub.restore(taken)
            raise LinkError("Unexpected ACK", exc.message, "not_in_flight") from None
        except BaseException:
            sub.restore(taken)
            raise

    @staticmethod
    def _covered(sub: Subscription, ack_ids: list[str]) -> int:
        """How many messages acks of `ack_ids` acknowledge: in `client` mode every one the subscription
        was given up to the latest listed (up to its prefetch, 32,767), which its transaction's commit
        applies in its one MULTI/EXEC, so they count against its size limit as many. (An id it
        does not hold counts one: `_take` refuses it.)"""
        if sub.ack_mode != "client":
            return len(ack_ids)
        wanted, covered = set(ack_ids), 0
        for n, ack_id in enumerate(sub.unacked, 1):
            if ack_id in wanted:
                covered = n
                wanted.discard(ack_id)
                if not wanted:
                    break
        return covered + len(wanted)

    async def _ack_entries(self, sub: Subscription, entries: list[tuple[Consumer | None, str]],
                           tx_id: str | None) -> int:
        count = 0
        # in a transaction (a `client` mode ACK's, at COMMIT), by id: it names the messages it covers
        # (`_take` took them), so a commit acknowledges one consumer's messages in calls of 100
        # (ops/transactions.py _steps), where each cumulative ACK was a step of its own in the commit's one
        # MULTI/EXEC (500: 80-120 ms)
        by_id = sub.ack_mode != "client" or tx_id is not None
        for consumer, ids in self._by_consumer(entries):
            try:
                mode = "individual" if tx_id is not None else None
                # (a transaction's: marked delivered at its ACK already, `_delivered`)
                result = await self.broker.ack(consumer, ids if by_id else ids[-1], mode=mode, tx=tx_id,
                                               mark_delivered=False)
            except NotInFlight as exc:
                raise LinkError("Unexpected ACK", exc.message, "not_in_flight") from None
            count += result if isinstance(result, int) else len(ids)
        return count

    async def nack(self, sub: Subscription, ack_ids: list[str], tx: str | None = None) -> int:
        """Poison: those messages go to the dead-letter queue at once (ActiveMQ's STOMP NACK, in every
        ack mode: in `client` mode the messages before them stay unacknowledged and a later ACK covers
        them), in one broker call per consumer. Not allowed in a transaction."""
        if tx is not None:
            raise LinkError("Poison ack cannot be transacted",
                            "NACK inside a transaction is rejected, as ActiveMQ does", "transaction_error")
        if sub.ack_mode == "auto":
            raise LinkError("Unexpected NACK", f"subscription {sub.key} acknowledges automatically",
                            "not_in_flight")
        taken = self._take(sub, ack_ids, cumulative=False, verb="NACK")
        self._forget_pending(key for key, _entry in taken)
        entries = [entry for _key, entry in taken]
        count = 0
        for consumer, ids in self._by_consumer(entries):
            dead_lettered, _redelivered = await self.broker.nack(consumer, ids, poison=True)
            count += int(dead_lettered)
        return count

    def _take(self, sub: Subscription, ack_ids: list[str],
              cumulative: bool = True, verb: str = "ACK") -> list[Taken]:
        """What acks of `ack_ids` cover, taken from the subscription once every one is known to be held by
        it, each once (nothing is taken otherwise). Taken in delivery order, so that a cumulative ack of a
        later id does not take an earlier listed one before its turn. `verb` names the frame in the
        refusal, as ActiveMQ's ProtocolConverter does (ACK or NACK)."""
        listed: set[str] = set()
        for ack_id in ack_ids:
            if ack_id not in sub.unacked or ack_id in listed:
                held = sub.transacted.get(ack_id) if ack_id not in listed else None
                raise LinkError(f"Unexpected {verb}",
                                (self.acknowledged_in(ack_id, held) if held is not None else
                                 f"Unexpected {verb} received for message-id [{ack_id}]"
                                 + (" (listed twice)" if ack_id in listed else ""))
                                + ("; nothing was acknowledged" if len(ack_ids) > 1 else ""), "not_in_flight")
            listed.add(ack_id)
        if len(ack_ids) > 1:
            order = {ack_id: n for n, ack_id in enumerate(sub.unacked)}
            ack_ids = sorted(ack_ids, key=order.__getitem__)
        cumulative = cumulative and sub.ack_mode == "client"
        return [taken for ack_id in ack_ids for taken in sub.take(ack_id, cumulative=cumulative)]

    @staticmethod
    def _by_consumer(entries: list[tuple[Consumer | None, str]]) -> list[tuple[Consumer, list[str]]]:
        grouped: dict[str, tuple[Consumer, list[str]]] = {}
        for consumer, message_id in entries:
            if consumer is None:  # nothing for the broker to acknowledge
                continue
            grouped.setdefault(consumer.consumer_id, (consumer, []))[1].append(message_id)
        return list(grouped.values())

    # -- transactions ---------------------------------------------------------------------------------

    def transaction(self, name: str) -> str:
        """The broker's id of the client's transaction `name`."""
        return self._open(name).tx

    def _open(self, name: str) -> OpenTransaction:
        try:
            return self.transactions[name]
        except KeyError:
            raise LinkError(f"Invalid transaction id: {name}",
                            f"transaction {name!r} was not begun on this connection (or already ended)",
                            "transaction_error") from None

    def require_transaction(self, name: str) -> None:
        """Refuse (LinkError, as any SEND in it) a transaction `name` not open on this connection."""
        self._open(name)

    async def transaction_for_send(self, name: str, messages: list[Message], places: list[str]) -> str:
        """The broker's id of transaction `name`, to which the caller sends `messages` to the destinations
        `places` (a message once per destination). The broker checks each send against the transaction's
        limits, refusing it whole (TransactionTooLarge); checked here first, in one call, when it cannot
        alone: the transaction's ACKs, held here until COMMIT, must fit with it, or the caller sends to
        several destinations in several calls, which must fit together."""
        open_tx = self._open(name)
        if open_tx.acked or len(places) > 1:
            await self.broker.check_transaction(
                open_tx.tx, open_tx.acked + len(messages) * len(places),
                sum(message.body_size for message in messages) * len(places),
                open_tx.consumers.union(places))
        return open_tx.tx

    def mark_rollback_only(self, name: str, reason: str) -> None:
        """A SEND or ACK in transaction `name` was refused unanswered: its COMMIT fails (OpenTransaction).
        The first reason is kept; a name not open is left alone (its own refusal said so)."""
        open_tx = self.transactions.get(name)
        if open_tx is not None and not open_tx.rollback_only:
            open_tx.rollback_only = reason

    async def begin(self, name: str) -> None:
        if name in self.transactions:
            raise LinkError(f"The transaction was already started: {name}",
                            f"transaction {name!r} was already begun on this connection", "transaction_error")
        most = self.settings.max_transactions
        if len(self.transactions) >= most:
            raise LinkError("Too many transactions",
                            f"a connection may hold at most {most} open transactions "
                            "(SIGNALBOX_WS_MAX_TRANSACTIONS): commit or abort one first",
                            "too_many_transactions")
        # open for one lease, renewed with the consumers' (_keep_leases): a process that dies with it open
        # holds its reserved space and its transacted acks' messages no longer than its consumers
        self.transactions[name] = OpenTransaction(await self.broker.begin(self.settings.lease_ms))

    async def commit(self, name: str) -> None:
        """The name ends here whatever happens (ActiveMQ's ProtocolConverter forgets it before it commits).
        A commit the broker refuses applied nothing (broker_core ops/transactions.py commit); it is rolled
        back, as ActiveMQ's LocalTransaction rolls back a commit that fails ("COMMIT FAILED: Transaction
        rolled back"): its SENDs dropped, the messages it ACKed redelivered."""
        tx = self.transaction(name)
        rollback_only = self.transactions.pop(name).rollback_only
        acks = self._tx_acks.pop(name, [])
        for sub, taken in acks:  # (acknowledged now, or refused with the transaction: they are done)
            self._forget_pending(key for key, _entry in taken)
            for key, _entry in taken:
                sub.transacted.pop(key, None)
        # a `client` subscription's ACKs go into the broker transaction together: by id
        # (`_ack_entries`), in the order they were taken (a `client` ACK takes the oldest), one call per
        # consumer, not per ACK; those of a subscription ended since are not acknowledged, as ActiveMQ's
        # STOMP: its messages went back with it. (A `client-individual` ACK is in it already.)
        by_sub: dict[int, tuple[Subscription, list[tuple[Consumer | None, str]]]] = {}
        for sub, taken in acks:
            if sub.ack_mode == "client" and self.subscriptions.get(sub.key) is sub:
                by_sub.setdefault(id(sub), (sub, []))[1].extend(entry for _key, entry in taken)
        try:
            # into the broker transaction, to commit with its sends; a rollback-only one's too, so that
            # its rollback gives their messages back (the link forgot their ids: kept in flight, they
            # could never be acknowledged, and would hold their consumer's window until it closed)
            for sub, entries in by_sub.values():
                await self._ack_entries(sub, entries, tx)
            if rollback_only:
                raise LinkError("COMMIT FAILED: Transaction marked rollback only xaErrorCode:100",
                                f"transaction {name!r} was not committed, nothing was applied: "
                                f"{rollback_only}; it was rolled back: its SENDs dropped, the messages it "
                                "ACKed redelivered", "transaction_error")
            await self.broker.commit(tx)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await self.broker.rollback(tx)
            if isinstance(exc, TransactionError) and exc.details.get("applied") is False:
                raise LinkError("COMMIT FAILED: Transaction rolled back",
                                f"transaction {name!r} was not committed, nothing was applied: "
                                f"{exc.details['refused']} was refused ({exc.details['reason']}); it was "
                                "rolled back: its SENDs dropped, the messages it ACKed redelivered",
                                "transaction_error") from None
            raise

    async def abort(self, name: str) -> None:
        """The transaction's SENDs are dropped; its ACKs' messages stay delivered to their subscription,
        unacknowledged, their ack ids valid again (ActiveMQ's STOMP: not redelivered to the live
        subscription). The broker's rollback leaves a `client-individual` ACK's messages with their
        consumer (`redeliver=False`) and shrinks back the window the ACK grew, as ActiveMQ's rollback of
        an individual ack contracts it (left grown, a client retrying a message in transactions got one
        more message past its prefetch at each ABORT); it returns those it held for the transaction, the
        subscription ended since. A `client` ACK's window stays grown (a delivered ack, not undone in
        ActiveMQ either) until those messages are acknowledged or the subscription ends."""
        tx = self.transaction(name)
        del self.transactions[name]
        for sub, taken in reversed(self._tx_acks.pop(name, [])):
            for key, _entry in taken:
                sub.transacted.pop(key, None)
            if self.subscriptions.get(sub.key) is sub:
                sub.restore(taken)  # (their ids are pending still)
            else:  # the subscription ended since: its messages went back with it, or are the broker's
                self._forget_pending(key for key, _entry in taken)
        await self.broker.rollback(tx, redeliver=False)

    # -- the end --------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Roll back open transactions, close every consumer (their unacked messages go back for
        redelivery) and stop the tasks. Idempotent: the first call starts the close as a task of its own,
        which every call waits for, so a caller cancelled meanwhile does not stop it half-way (the frame
        task handling a DISCONNECT is cancelled when the client's socket ends while the close waits for
        auto acks: stopped there, the connection's subscriptions stayed open, their leases renewed)."""
        if self._close_task is None:
            self._closed = True
            self._close_caller = asyncio.current_task()
            self._close_task = asyncio.get_running_loop().create_task(self._close())
        await asyncio.shield(self._close_task)

    def _is_caller(self, task: asyncio.Task[Any]) -> bool:
        """The task running this code, or the one that started the close (an abort's task, a pump's): the
        close must not cancel (nor wait for) the task that waits for it, which goes on after it."""
        return task is asyncio.current_task() or task is self._close_caller

    async def _close(self) -> None:
        # (an auto ack still waiting for its messages' hand-over: closing the consumer gives them back;
        # one whose messages were written is let land first)
        await self._acks_landed(set(self._acking.values()))
        for task in [self._keeper, *self._abort_tasks, *self._ack_tasks]:
            if task is not None and not self._is_caller(task):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._tx_acks.clear()  # their messages are still delivered: closing the consumers returns them
        if self.pending_acks is not None:
            self.pending_acks.clear()
        for name in list(self.transactions):
            tx = self.transactions.pop(name).tx
            with contextlib.suppress(Exception):  # (left delivered: the consumers' close returns them once)
                await self.broker.rollback(tx, redeliver=False)
        subs = list(self.subscriptions.values())
        self.subscriptions.clear()
        for sub in subs:
            try:
                await self._close_subscription(sub, "connection closed")
            except Exception as exc:  # the consumer's lease will lapse and the reaper returns its messages
                if store_unavailable(exc):
                    logger.warning("closing subscription %s failed: Redis unavailable (%s)", sub.key, exc)
                else:
                    logger.exception("closing subscription %s failed", sub.key)
        if self._client_id is not None:  # last: the id is free once its consumers are gone
            with contextlib.suppress(Exception):  # else it lapses with its lease
                await self._client_id.release()


def _walk_key(sub: Subscription) -> str:
    """A queue browser's walk among the pumps (which are by consumer id: `browse:` is no consumer id)."""
    return f"browse:{sub.key}"
