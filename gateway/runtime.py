"""The broker as this process's adapters see it: one broker client per process (per event loop for
asyncio), and the wake-up hub that tells a waiting adapter its consumer got messages.

Dispatch runs inside Redis scripts; when a consumer's outbox goes from empty to non-empty the script
publishes the consumer id on the consumer's `notify` channel, and to a consumer its adapter armed for
pushes (docs/broker_core.md "The delivery path") it publishes the delivery itself. Every process (every
event loop of it) subscribes to one channel of its own, `<namespace>:wake:<process id>:<n>`, and gives it
as `notify` for the consumers it registers, so one subscription serves all of them. Its broker client names
the same channel in its sends, so pushes to its own consumers come back in the send's reply and go to the
hub directly: a message from a producer to a consumer of the same process never crosses pub/sub.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis
import redis.asyncio
from django.conf import settings

from broker_core import maintenance
from broker_core.broker import AsyncBroker, Broker
from broker_core.config.store import PolicyStore
from broker_core.keys import Home
from broker_core.model import MAX_CONSUMERS, ConsumerRef, Pushed, TransactionLimits, is_push, unpack_pushed
from broker_core.topics import non_durable_key

T = TypeVar("T")

PROCESS_ID = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


@functools.cache
def sync_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


@functools.cache
def policies() -> PolicyStore:
    return PolicyStore(sync_client(), settings.SIGNALBOX_NAMESPACE)


@functools.cache
def transaction_limits() -> TransactionLimits:
    """What one transaction may hold, for every adapter: the settings SIGNALBOX_MAX_TRANSACTION_SIZE,
    _BYTES and _DESTINATIONS, else broker_core's defaults."""
    default = TransactionLimits()
    return TransactionLimits(
        size=int(getattr(settings, "SIGNALBOX_MAX_TRANSACTION_SIZE", default.size)),
        body_bytes=int(getattr(settings, "SIGNALBOX_MAX_TRANSACTION_BYTES", default.body_bytes)),
        destinations=int(getattr(settings, "SIGNALBOX_MAX_TRANSACTION_DESTINATIONS", default.destinations)))


def max_consumers() -> int:
    """The consumers one queue may have, for every adapter: the setting SIGNALBOX_MAX_CONSUMERS (0: no
    limit), else broker_core's default (model.MAX_CONSUMERS)."""
    return int(getattr(settings, "SIGNALBOX_MAX_CONSUMERS", MAX_CONSUMERS))


@functools.cache
def broker() -> Broker:
    """The blocking broker client (Django views, Celery tasks)."""
    return Broker(sync_client(), settings.SIGNALBOX_NAMESPACE, policies=policies(),
                  transaction_limits=transaction_limits(), max_consumers=max_consumers())


@functools.cache
def _broker_for(namespace: str) -> Broker:
    """A blocking client of an async broker's namespace (for broker_core functions that only block)."""
    return Broker(sync_client(), namespace)


async def abort_notice(broker: AsyncBroker, consumer: ConsumerRef) -> maintenance.AbortNotice | None:
    """Why a slow-consumer strategy or an operator aborted `consumer` (broker_core.maintenance.abort_notice,
    run in a thread: it is blocking), or None if it was not aborted. Every adapter asks here when its
    consumer is gone: REST answers 410, WebSockets send the notice. A topic consumer's notice is kept by its
    subscription: the one the consumer was given, else its non-durable subscription."""
    where = Home(consumer.destination)
    if where.fans_out:
        key = getattr(consumer, "subscription", None) or non_durable_key(consumer.consumer_id)
        where = Home(consumer.destination, key)
    return await asyncio.to_thread(maintenance.abort_notice, _broker_for(broker.namespace), where,
                                   consumer.consumer_id)


_async: dict[asyncio.AbstractEventLoop, tuple[AsyncBroker, WakeupHub]] = {}
POOL_CONNECTIONS = 100  # connections to Redis an event loop's redis-py client holds at most
POOL_WAIT_SECONDS = 20  # how long a command waits for one of them when all are in use


def _for_loop() -> tuple[AsyncBroker, WakeupHub]:
    loop = asyncio.get_running_loop()
    if loop not in _async:
        # redis-py's asyncio pool refuses its 101st connection in use (MaxConnectionsError, a ConnectionError:
        # "Broker unavailable" while Redis is fine); a burst of commands (150 clients subscribing at once)
        # waits for a free connection instead, up to POOL_WAIT_SECONDS
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            settings.REDIS_URL, max_connections=POOL_CONNECTIONS, timeout=POOL_WAIT_SECONDS)
        client = redis.asyncio.Redis(connection_pool=pool)
        broker = AsyncBroker(client, settings.SIGNALBOX_NAMESPACE, policies=policies(),
                             transaction_limits=transaction_limits(), max_consumers=max_consumers())
        hub = WakeupHub(client, settings.SIGNALBOX_NAMESPACE)
        broker.push_locally(hub.channel, hub.pushed)  # the local short-cut
        _async[loop] = (broker, hub)
    return _async[loop]


def async_broker() -> AsyncBroker:
    """The asyncio broker client of the running event loop (async views, WebSocket consumers)."""
    return _for_loop()[0]


def async_redis() -> redis.asyncio.Redis:
    """The running event loop's redis-py client (the one its AsyncBroker was made from), for the gateway's
    own keys, never the broker's: rate-limit windows, Idempotency-Key records, the authentication cache's
    change counter, the console's statistics index, Redis's INFO and PING. Broker state is read and written
    through the broker's methods only (tests/test_adapter_boundary.py)."""
    return _for_loop()[1].client


def wakeups() -> WakeupHub:
    """The running event loop's wake-up hub."""
    return _for_loop()[1]


class _Expiry:
    """A wait's timeout: sets the waited event and remembers that it did. A wake-up that comes between the
    timeout and the waiter's next turn is not lost: what it announced is in the hub (`take`)."""

    __slots__ = ("event", "fired")

    def __init__(self, event: asyncio.Event) -> None:
        self.event, self.fired = event, False

    def __call__(self) -> None:
        if not self.event.is_set():  # (a wake-up that came first is the wait's answer)
            self.fired = True
            self.event.set()


class WakeupHub:
    """One pub/sub subscription per process and loop; `wait(consumer_id)` returns when dispatch put
    messages in that consumer's outbox or pushed it deliveries (or at the timeout). A wake-up that arrives
    while nobody waits is kept, so the next wait returns at once instead of missing it; pushed deliveries
    are kept for consumers this hub `watch`es until `take` (a push for a consumer nobody here watches is
    dropped: it stays in flight, and its adapter, or the lapse of its lease, finds it).

    The subscription survives Redis going away: the listener subscribes again (every RESUBSCRIBE_EVERY
    seconds until Redis answers). When the subscription drops, and again when it is back, every waiter is
    woken, because wake-ups published meanwhile are lost: they look at their outboxes at once, so the
    adapters learn of the outage from their next call (and tell their clients), and see what was
    dispatched during it."""

    RESUBSCRIBE_EVERY = 0.25
    _made = 0

    def __init__(self, client: redis.asyncio.Redis, namespace: str) -> None:
        self.client = client
        WakeupHub._made += 1  # (one channel per hub: each event loop's broker names its own in its sends)
        self.channel = f"{namespace}:wake:{PROCESS_ID}:{WakeupHub._made}"
        self._events: dict[str, asyncio.Event] = {}
        self._pushed: dict[str, list[Pushed]] = {}  # per watched consumer, in arrival order
        self._woken: set[str] = set()  # consumers told to look at their outboxes since their last take
        self._listener: asyncio.Task[None] | None = None
        self.subscribed = False
        self.failure: BaseException | None = None  # why the last attempt to subscribe failed
        self._changed = asyncio.Condition()

    async def start(self) -> None:
        """Subscribe (once); call before registering consumers with `notify=hub.channel`. Raises redis-py's
        ConnectionError while Redis cannot be reached (gateway/unavailable.py)."""
        if self._listener is None:
            self._listener = asyncio.get_running_loop().create_task(self._listen())
        async with self._changed:
            await self._changed.wait_for(lambda: self.subscribed or self.failure is not None)
        if not self.subscribed:
            raise redis.ConnectionError(f"the wake-up subscription is down: {self.failure}")

    async def _settle(self, subscribed: bool, failure: BaseException | None) -> None:
        self.subscribed, self.failure = subscribed, failure
        self._wake_all()
        async with self._changed:
            self._changed.notify_all()

    def _wake_all(self) -> None:
        self._woken.update(self._pushed)
        for event in self._events.values():
            event.set()

    async def _listen(self) -> None:
        while True:
            pubsub = self.client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                await self._settle(True, None)
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        data = message["data"]
                        if is_push(data):
                            self.pushed(data)
                        else:
                            cid = data.decode()
                            if cid in self._pushed:  # (watched: its adapter takes pushes, and wake-ups)
                                self._woken.add(cid)
                            self._event(cid).set()
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                await self._settle(False, exc)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(self.RESUBSCRIBE_EVERY)

    def _event(self, consumer_id: str) -> asyncio.Event:
        event = self._events.get(consumer_id)  # (not setdefault: that makes an Event on every call)
        if event is None:
            event = self._events[consumer_id] = asyncio.Event()
        return event

    async def wait(self, consumer_id: str, timeout: float) -> bool:
        """True if a wake-up came (now or since the last wait), False at the timeout."""
        event = self._event(consumer_id)
        if event.is_set():
            event.clear()
            return True
        # The timeout sets the event too, and says so: no wait_for (Python 3.11 runs the wait in a task of
        # its own, one more task and one more turn of the loop between a push and its pump) and no
        # asyncio.timeout (a Timeout object, its rescheduling and the cancellation it turns into
        # TimeoutError: a few microseconds of every pushed message)
        expired = _Expiry(event)
        handle = asyncio.get_running_loop().call_later(timeout, expired)
        try:
            await event.wait()
        finally:
            handle.cancel()
        event.clear()
        return not expired.fired

    def watch(self, consumer_id: str) -> None:
        """Keep pushes for `consumer_id` from now on (its adapter takes them)."""
        self._pushed.setdefault(consumer_id, [])
        self._event(consumer_id)

    def pushed(self, payload: bytes) -> None:
        """A push payload, from the subscription or from this process's own send (the local short-cut)."""
        pushed = unpack_pushed(payload)
        kept = self._pushed.get(pushed.consumer_id)
        if kept is not None:
            kept.append(pushed)
            self._event(pushed.consumer_id).set()

    def take(self, consumer_id: str) -> tuple[list[Pushed], bool]:
        """The pushes kept for the consumer, in order, and whether it was told to look at its outbox (or the
        subscription dropped, so pushes may be lost) since the last take."""
        kept = self._pushed.get(consumer_id)
        if kept:
            self._pushed[consumer_id] = []
        woken = consumer_id in self._woken
        self._woken.discard(consumer_id)
        return kept or [], woken

    def forget(self, consumer_id: str) -> None:
        """The consumer closed: drop its event and whatever was kept for it."""
        self._events.pop(consumer_id, None)
        self._pushed.pop(consumer_id, None)
        self._woken.discard(consumer_id)


async def uncancelled(call: Awaitable[T], undo: Callable[[T], Awaitable[None]]) -> T:
    """Await a broker call that makes or takes something (a consumer, a browser, leased messages). A cancel
    meanwhile (the client gone: its socket ended, Django's handler cancelled the request) does not stop the
    call in Redis, which may still do it: the call is waited for and what it made given to `undo`, rather
    than left unknown, holding messages or counting, until its lease lapses; then the cancel goes on."""
    call_task = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(call_task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await undo(await call_task)
        raise
