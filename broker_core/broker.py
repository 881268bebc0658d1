"""The broker_core API: `Broker` (blocking) and `AsyncBroker` (asyncio) over one implementation.

Both run the operations of ops/ (through their router, ops/router.py) with the one driver loop of
drivers/loop.py, each saying only how one request is done; gateway, console and Celery tasks call these
methods and nothing else (and the few values named at the end of this module's imports).
Time comes from the clock given (a FakeClock in tests), never from Redis.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import redis
import redis.asyncio

from . import client_ids, connections, errors, scheduler
from .clock import Clock, SystemClock
from .config.store import PolicyStore
from .destinations import Destination, parse_destination, require_concrete, split_composite
from .drivers import multiplexed
from .drivers.coalesce import Coalescer
from .drivers.direct import DirectConnections
from .drivers.loop import Driver, Io, Transaction, resumed, run, run_async, typed_error
from .drivers.multiplexed import MultiplexedConnection
from .due import DueTimers
from .effects import Command, Eval, Op, Policy, Sleep
from .errors import ResourceAllocationError
from .keys import Home, durables_key, temp_tally_key, usage_key
from .messages import Delivery, Message
from .model import (
    AckRequest,
    Browsed,
    BrowsePage,
    BrowserInfo,
    Consumer,
    ConsumerRef,
    ConsumerSpec,
    DestinationStats,
    DispatchResult,
    GroupCounts,
    GroupInfo,
    GroupPage,
    ScheduledPage,
    SweepResult,
    TransactionLimits,
)
from .ops import advisory, flow, virtual  # noqa: F401 - for the adapters, which import only this facade
from .ops.queues import BROWSE_EXAMINE
from .ops.router import Router
from .resp import reply_text
from .scripts import calls
from .scripts.library import call_args, script
from .topics import SubscriptionStats, durable_registry_field

T = TypeVar("T")
# `receive_after`'s `after` past any dispatch sequence: nothing handed over is handed over again
_HANDED_OVER_ALL = 2**53

SCHEDULED_PAGE = 100  # scheduled jobs a scheduler management call reads (and sends or cancels) at a time
# Destinations scheduler management asks at once whether they have anything parked (a MULTI of ZCARDs)
SCHEDULER_WALK_CHUNK = 1_000
Packed = list[tuple[str, bytes]]  # messages as Message.pack gives them: (id, bytes)


def _send_refused(error: Exception) -> bool:
    """Whether the send script refused a send at once, storing nothing (drivers/coalesce.py): a size or
    property
    limit, or a memory limit it fails on without waiting (a send that waited in vain has waited its time;
    one whose earlier parts were stored, flow.send_parts, has stored something)."""
    if isinstance(error, ResourceAllocationError):
        return not error.details.get("waited_ms") and not error.details.get("sent")
    return isinstance(error, errors.InvalidMessage)


# Queues per summary_many call: 1,000 took 19 ms of Redis on the 2-core machine, 50 take about 1 ms.
SUMMARY_CHUNK = 50
# open transactions an AsyncBroker remembers delayed sends of, to arm their timers at the commit: past it
# the oldest is forgotten, and its delayed messages wait for the maintenance tick (at most a second late)
TX_DELAYS_KEPT = 10_000
_ACK_MODE_FOR = {"client": "cumulative", "client-individual": "individual", "transacted": "individual"}


def _dest(destination: str | Destination, refuse_pattern: str | None = None) -> Destination:
    """A destination from its text (or as given). Topic patterns (`topic://orders.>`) are what a wildcard
    subscription subscribes to; their pseudo-topics are no destinations (docs/broker_core.md "Wildcard
    subscriptions"). Only the APIs that act on a pattern's subscriptions take one: subscribing, stats,
    subscriptions, unsubscribing, deleting, and the upkeep of its consumers (lease renewal, reaping,
    dispatch, forwards, expiry sweeps) that the gateway and maintenance run. The others pass
    `refuse_pattern`, what they do, and get InvalidDestination naming the pattern before any state changes
    (ensure_destination would otherwise write keys nothing lists or cleans). Sends are refused by the
    operation (destinations.require_concrete); queue patterns are refused everywhere."""
    dest = destination if isinstance(destination, Destination) else parse_destination(destination,
                                                                                       allow_wildcards=True)
    if dest.is_wildcard:
        if dest.is_queue:
            require_concrete(dest, refuse_pattern or "use")
        elif refuse_pattern is not None:
            raise errors.InvalidDestination(
                f"cannot {refuse_pattern} {dest.uri}: a wildcard names topics to subscribe to, not a "
                "destination (only subscribing, stats, subscriptions, unsubscribing and deleting take one)",
                destination=dest.uri)
    return dest


def _home(destination: str | Destination | Home) -> Home:
    """What the upkeep methods (sweeps, leases, reaping, dispatch) run on: a destination's own keys, or a
    `Home` as given (maintenance names one subscription of a topic this way)."""
    return destination if isinstance(destination, Home) else Home(_dest(destination))


def _topic(destination: str | Destination) -> Destination:
    dest = _dest(destination)
    if not dest.is_topic:
        raise errors.InvalidDestination(f"{dest.uri} is not a topic; durable subscriptions are on topics",
                                        destination=dest.uri)
    return dest


def _ids(message_id: str | list[str]) -> list[str]:
    return [message_id] if isinstance(message_id, str) else list(message_id)


def _is_composite(destination: str | Destination) -> bool:
    """Whether a send names several destinations (`A,B,topic://C`: destinations.split_composite)."""
    return isinstance(destination, str) and "," in destination


def _messages(message: Message | str | bytes | Iterable[Message]) -> list[Message]:
    if isinstance(message, Message):
        return [message]
    if isinstance(message, str | bytes):
        return [Message(body=message)]
    return list(message)


def _int_reply(command: Command) -> Op[int]:
    return int((yield command))


def _memory(namespace: str) -> Op[flow.MemoryUsage]:
    used, limit = yield Command(("HMGET", usage_key(namespace), "used", "limit"))
    return flow.memory_usage(used, limit)


def _durable_topic(namespace: str, client_id: str, subscription_name: str) -> Op[Destination | None]:
    where = yield Command(("HGET", durables_key(namespace), durable_registry_field(client_id,
                                                                                   subscription_name)))
    # (a wildcard subscription's is its pattern)
    return None if where is None else parse_destination(reply_text(where), allow_wildcards=True)


def _durable_topics_page(namespace: str, cursor: int, count: int) -> Op[tuple[int, list[Destination]]]:
    next_cursor, found = yield Command(("HSCAN", durables_key(namespace), cursor, "COUNT", count))
    return int(next_cursor), [parse_destination(reply_text(uri), allow_wildcards=True)
                              for uri in found.values()]


def _destination_names(registry: str, limit: int, page: int) -> Op[list[str]]:
    ranges = [("ZRANGE", registry, start, min(start + page, limit) - 1) for start in range(0, limit, page)]
    if not ranges:
        return []
    parts = [(yield Command(ranges[0]))] if len(ranges) == 1 else (yield ranges)
    for part in parts:
        if isinstance(part, Exception):
            raise part
    return [reply_text(name) for part in parts for name in part]


def _temp_refusal(namespace: str, registry: str, dest: Destination, now: int) -> Op[str | None]:
    owner = dest.temporary_owner
    if owner is None:
        return f"{dest.uri} is not a temporary destination"
    # one round trip: the destination registry's entry and the owner's lease in the connection registry
    exists, expires = yield [("ZSCORE", registry, dest.uri),
                             ("ZSCORE", connections.lease_key(namespace), owner)]
    if exists is None:
        return f"no temporary destination {dest.uri}: its connection never created it, or ended"
    if not connections.lease_live(expires, now):
        return f"the connection {owner} that created {dest.uri} ended"
    return None


def _temp_tally(key: str) -> Op[dict[str, int]]:
    values = yield Command(("HMGET", key, "destinations", "messages"))
    return {"destinations": int(values[0] or 0), "messages": int(values[1] or 0)}


def _last_event_id(stream: str) -> Op[str | None]:
    newest = yield Command(("XREVRANGE", stream, "+", "-", "COUNT", 1))
    return reply_text(newest[0][0]) if newest else None


class _Api:
    """The methods both brokers share; `_run` (how drivers/loop.py's loop is run: blocking or awaited) is the
    only difference between them. Each method is annotated with its operation's result: what a Broker call
    returns, and what an AsyncBroker call's awaitable gives (type checkers see AsyncBroker's inherited
    methods with these sync annotations: typing those as awaitables would repeat every signature)."""

    def __init__(self, namespace: str, clock: Clock | None,
                 transaction_limits: TransactionLimits | None = None,
                 max_consumers: int | None = None) -> None:
        self.ops = Router(namespace, transaction_limits=transaction_limits, max_consumers=max_consumers)
        self.namespace = namespace
        self.clock = clock or SystemClock()
        # How an operation is run (drivers/loop.py); the two brokers only say how one request is done.
        self.driver = Driver()

    def _now(self) -> int:
        return self.clock.now_ms()

    def _run(self, op: Op[T]) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def send(self, destination: str | Destination, message: Message | str | bytes | Iterable[Message],
             *, tx: str | None = None) -> list[str]:
        """Send one message, or several in order in one call; returns the message ids. A client-side
        composite (`A,B,topic://C`) sends to every part (broker_core/ops/virtual.py)."""
        parts = split_composite(destination) if _is_composite(destination) else None
        if parts is not None:
            return self._run(self.ops.send_composite(parts, _messages(message), self._now(), tx))
        dest, batch = _dest(destination), _messages(message)
        if tx:
            return self._run(self.ops.tx_send(tx, dest, batch, self._now()))
        return self._run(self.ops.send(dest, batch, self._now()))

    def add_consumer(self, destination: str | Destination, spec: ConsumerSpec | None = None,
                     consumer_id: str | None = None) -> Consumer:
        return self._run(self.ops.add_consumer(_dest(destination), spec or ConsumerSpec(), self._now(),
                                               consumer_id))

    def receive(self, consumer: ConsumerRef, max_messages: int = 1, lease_ms: int = 0) -> list[Delivery]:
        """Messages dispatched to the consumer, oldest first (a prefetch-0 consumer pulls them). The call
        renews the consumer's lease (by lease_ms, or by its own lease length when 0)."""
        return self._run(self.ops.receive(consumer, max_messages, self._now(), lease_ms))

    def receive_after(self, consumer: ConsumerRef, after: int, max_messages: int = 1, push: int = 0,
                      lease_ms: int = 0) -> tuple[list[Delivery], int]:
        """`receive` for an adapter that takes pushed deliveries (docs/broker_core.md "The delivery path"):
        returns (deliveries, dispatch sequence of the last one) with whatever was handed over after `after`
        first; arms the consumer for up to `push` pushed messages when its outbox is left empty. Ack mode
        auto: the caller acknowledges what it got once written (`ack(..., mode="individual")`), as pushed
        messages; until then they are in flight (a connection cut first gives them back)."""
        return self._run(self.ops.receive_after(consumer, after, max_messages, push, self._now(), lease_ms))

    def receive_unacked(self, consumer: ConsumerRef, max_messages: int = 1,
                        lease_ms: int = 0) -> list[Delivery]:
        """`receive`, but an ack-mode-auto consumer's messages stay in flight: the caller acknowledges them
        once it has written them (`ack(..., mode="individual")`), so a process that dies first leaves them
        leased instead of acknowledged (the REST API's receive, gateway/api/after_write.py). What was handed
        over before is not handed over again (`receive_after` with nothing after the last handed over)."""
        return self._run(self._first(self.ops.receive_after(consumer, _HANDED_OVER_ALL, max_messages, 0,
                                                            self._now(), lease_ms)))

    def cancel_pull(self, consumer: ConsumerRef) -> None:
        return self._run(self.ops.cancel_pull(consumer, self._now()))

    def _ack_mode(self, consumer: ConsumerRef, mode: str | None, tx: str | None) -> str:
        if mode is None:
            if consumer.ack_mode == "auto":
                raise errors.InvalidConsumer(
                    f"consumer {consumer.consumer_id} acknowledges automatically; it takes no acks")
            mode = _ACK_MODE_FOR[consumer.ack_mode]
        if not tx and consumer.ack_mode == "transacted" and mode != "delivered":
            raise errors.TransactionError(
                f"consumer {consumer.consumer_id} is transacted: ack inside a transaction")
        return mode

    def ack(self, consumer: ConsumerRef, message_id: str | list[str], *, mode: str | None = None,
            tx: str | None = None, mark_delivered: bool = True) -> int | None:
        """Acknowledge by the consumer's ack mode (client: cumulative; client-individual: that message)
        or by an explicit mode: 'individual', 'cumulative' or 'delivered' (ack.lua).
        Returns how many. In a transaction `tx` the messages are marked delivered now (their window
        grows) and acknowledged on commit; `mark_delivered=False` when the caller marked them delivered
        itself, earlier (ops/transactions.py `ack`)."""
        ids = _ids(message_id)
        mode = self._ack_mode(consumer, mode, tx)
        if tx:
            return self._run(self.ops.tx_ack(tx, consumer, ids, mode, self._now(), mark_delivered))
        return self._run(self._first(self.ops.ack(consumer, ids, mode, self._now())))

    def ack_and_receive(self, consumer: ConsumerRef, message_id: str | list[str], max_messages: int = 1,
                        *, mode: str | None = None) -> list[Delivery]:
        """Acknowledge, then hand over up to max_messages next messages in the same call (one round trip
        for an adapter that acks and forwards what the freed window brought)."""
        ids = _ids(message_id)
        mode = self._ack_mode(consumer, mode, None)
        return self._run(self._second(self.ops.ack(consumer, ids, mode, self._now(), max_messages)))

    @staticmethod
    def _was_one(op: Op) -> Op:
        return (yield from op) == 1

    @staticmethod
    def _first(op: Op) -> Op:
        return (yield from op)[0]

    @staticmethod
    def _second(op: Op) -> Op:
        return (yield from op)[1]

    def nack(self, consumer: ConsumerRef, message_id: str | list[str], *,
             poison: bool = False) -> tuple[int, int]:
        """Negative acknowledgement: the message comes back after the policy's redelivery delay with its
        counter raised, or goes to the dead-letter queue when poison (STOMP NACK) or past
        maximumRedeliveries. Returns (dead-lettered, redelivered) counts."""
        ids = _ids(message_id)
        return self._run(self.ops.nack(consumer, ids, poison, self._now(), random.uniform(-1.0, 1.0)))

    def sweep_expired(self, destination: str | Destination | Home) -> SweepResult:
        """One bounded page of the expiry sweep; returns SweepResult (call again until .done)."""
        return self._run(self.ops.sweep_expired(_home(destination), self._now()))

    def forward(self, destination: str | Destination) -> int:
        """Deliver what a crashed process left in the destination's outbox (its forwarding hash)."""
        return self._run(self.ops.forward(_dest(destination), self._now()))

    def browse(self, destination: str | Destination, *, selector: str | None = None,
               cursor: str | None = None, limit: int = 100, parked: bool = True,
               examine: int = BROWSE_EXAMINE) -> BrowsePage:
        """A page of stored messages (never changes anything); BrowsePage(messages, next_cursor, examined).
        `parked=False`: without parked messages (scheduled, delayed), as a queue browser sees the queue.
        `examine`: looking at no more messages than that, matching or not (at most BROWSE_EXAMINE a call)."""
        return self._run(self.ops.browse(_dest(destination, "browse"), selector, cursor, limit, self._now(),
                                         parked, examine))

    def scheduled(self, destination: str | Destination, *, cursor: str | None = None,
                  limit: int = 100) -> ScheduledPage:
        """A page of the destination's scheduled jobs (delayed messages, repeating and cron jobs; a topic's
        own), soonest due first, without the messages waiting for a redelivery delay: those the stats'
        `scheduled` counts. ScheduledPage(jobs, next_cursor); a page may hold fewer than `limit` with a
        cursor (each call examines at most BROWSE_EXAMINE parked entries)."""
        return self._run(self.ops.scheduled_page(_dest(destination, "read from"), cursor, None, None, limit,
                                                 self._now()))

    def browser_limit(self, destination: str | Destination, connection_id: str | None = None) -> int:
        """How many messages a queue browser of connection `connection_id` is given at most (the policy's
        maxBrowsePageSize); a topic, or another connection's temporary queue, is refused."""
        return self._run(self.ops.browser_limit(_dest(destination, "browse"), connection_id))

    def open_browser(self, destination: str | Destination, browser_id: str, lease_ms: int = 30_000,
                     prefetch: int = 0, selector: str | None = None) -> None:
        """Count an adapter's queue browser among the queue's consumers (ActiveMQ's ConsumerCount counts its
        QueueBrowserSubscriptions) until `close_browsers`, or until its lease lapses unrenewed
        (`renew_browsers`): a browser of a process that died stops counting within one lease. It takes no
        part in dispatch; opening and closing it are advised as a consumer's (ConsumerInfo browser=true)."""
        return self._run(self.ops.open_browser(_dest(destination, "browse"), browser_id, lease_ms, prefetch,
                                               selector, self._now()))

    def renew_browsers(self, destination: str | Destination, browser_ids: list[str],
                       lease_ms: int = 30_000) -> list[str]:
        """Renew open browsers' leases; returns the ids that are not open (closed, or lapsed and removed)."""
        return self._run(self.ops.renew_browsers(_dest(destination, "browse"), list(browser_ids), lease_ms,
                                                 self._now()))

    def close_browsers(self, destination: str | Destination, browser_ids: list[str],
                       reason: str = "closed") -> int:
        """Stop counting these browsers; returns how many were open."""
        return self._run(self.ops.close_browsers(_dest(destination, "browse"), list(browser_ids), reason,
                                                 self._now()))

    def browsers(self, destination: str | Destination, most: int = 1000) -> list[BrowserInfo]:
        """At most `most` of a queue's open browsers (those `open_browser` counts), for a consumer
        advisory's replay (ActiveMQ's AdvisoryBroker replays a browser's ConsumerInfo as any consumer's)."""
        return self._run(self.ops.browsers(_dest(destination, "browse"), most, self._now()))

    def get_message(self, destination: str | Destination, message_id: str) -> Browsed:
        return self._run(self.ops.get_message(_dest(destination, "read from"), message_id, self._now()))

    def remove_message(self, destination: str | Destination, message_id: str) -> bool:
        """Remove one message, wherever it is (in flight too); True if it was there."""
        return self._run(self._was_one(self.ops.remove(_dest(destination, "remove from"), [message_id],
                                                       self._now())))

    def parked_times(self, destination: str | Destination, message_ids: list[str]) -> Any:
        """id -> {"due" (ms), "period", "repeats_left", "cron"} of parked messages (None where not parked)."""
        return self._run(self.ops.parked_times(_dest(destination, "read from"), list(message_ids)))

    def remove_matching(self, destination: str | Destination, selector: str | None = None,
                        limit: int | None = None, progress: Callable[[int, int], None] | None = None) -> Any:
        """Remove the messages a selector matches (in flight too), in bounded calls; returns how many."""
        return self._run(self.ops.remove_matching(_dest(destination, "remove messages from"), selector, limit,
                                                  self._now(), progress))

    def purge(self, destination: str | Destination,
              progress: Callable[[int, int], None] | None = None) -> int:
        """Remove every message the destination holds now, in bounded calls; returns how many.
        `progress(removed, total)` is told after each call."""
        return self._run(self.ops.purge(_dest(destination, "purge"), self._now(), progress))

    def move_message(self, destination: str | Destination, message_id: str, target: str | Destination) -> int:
        return self._transfer(destination, "move", target, [message_id], None, None)

    def copy_message(self, destination: str | Destination, message_id: str, target: str | Destination) -> int:
        return self._transfer(destination, "copy", target, [message_id], None, None)

    def move_matching(self, destination: str | Destination, selector: str | None, target: str | Destination,
                      limit: int | None = None) -> int:
        return self._transfer(destination, "move", target, [], selector, limit)

    def copy_matching(self, destination: str | Destination, selector: str | None, target: str | Destination,
                      limit: int | None = None) -> int:
        return self._transfer(destination, "copy", target, [], selector, limit)

    def retry_message(self, dlq: str | Destination, message_id: str) -> int:
        """Send a dead letter back to its original destination (only from a dead-letter queue)."""
        return self._transfer(dlq, "retry", None, [message_id], None, None)

    def retry_messages(self, dlq: str | Destination, selector: str | None = None) -> int:
        return self._transfer(dlq, "retry", None, [], selector, None)

    def _transfer(self, destination: str | Destination, mode: str, target: str | Destination | None,
                  ids: list[str], selector: str | None, limit: int | None) -> int:
        return self._run(self.ops.transfer(_dest(destination, f"{mode} messages from"), mode,
                                           _dest(target, f"{mode} messages to") if target else None, ids,
                                           selector, limit, self._now()))

    def delete_destination(self, destination: str | Destination) -> int:
        return self._run(self.ops.delete_destination(_dest(destination), self._now()))

    # -- temporary destinations (docs/broker_core.md "Temporary destinations")

    def temp_destination_refusal(self, destination: str | Destination) -> str | None:
        """None when a producer may send to the temporary destination (it exists and the connection that
        created it lives), else why not. ActiveMQ refuses such a send (DestinationDoesNotExistException)."""
        dest = _dest(destination)
        return self._run(_temp_refusal(self.namespace, self.ops.registry_key, dest, self._now()))

    def delete_temp_destination(self, destination: str | Destination) -> int:
        """Delete a temporary destination whose connection ended, with its messages, counted in
        `temp_tally` in the same step; returns how many messages it held (0 when it was gone already)."""
        return self._run(self.ops.delete_temporary(_dest(destination), self._now()))

    def connection_live(self, connection_id: str) -> bool:
        """Whether the connection registry holds the connection with a lease that has not lapsed."""
        return self._run(connections.live(self.namespace, connection_id, self._now()))

    def connection_counts(self) -> tuple[int, int]:
        """(connections registered now with a live lease, connections registered since the registry began):
        ActiveMQ's CurrentConnectionsCount and TotalConnectionsCount (connections.counts)."""
        return self._run(connections.counts(self.namespace, self._now()))

    def temp_tally(self) -> dict[str, int]:
        """How many temporary destinations were deleted because their connection ended, and their messages."""
        return self._run(_temp_tally(temp_tally_key(self.namespace)))

    def release(self, consumer: ConsumerRef, message_ids: list[str]) -> int:
        """Give in-flight messages back at once with the redelivery counter raised (recover/rollback)."""
        return self._run(self.ops.release(consumer, message_ids, self._now()))

    def close_consumer(self, consumer: ConsumerRef, reason: str = "closed",
                       written: int | None = None) -> DispatchResult:
        """Close the consumer; `written` (adapters taking pushed deliveries): the dispatch sequence of the
        last message it wrote, so messages pushed after it go back as never received."""
        return self._run(self.ops.close_consumer(consumer, self._now(), reason, written))

    def renew_leases(self, destination: str | Destination | Home, consumer_ids: list[str],
                     lease_ms: int = 30_000) -> list[str]:
        return self._run(self.ops.renew(_home(destination), consumer_ids, lease_ms, self._now()))

    def reap_lapsed(self, destination: str | Destination | Home, limit: int = 100) -> list[str]:
        return self._run(self.ops.reap(_home(destination), self._now(), limit))

    def dispatch(self, destination: str | Destination | Home) -> DispatchResult:
        return self._run(self.ops.dispatch(_home(destination), self._now()))

    def pause(self, destination: str | Destination) -> None:
        return self._run(self.ops.pause(_dest(destination, "pause"), True, self._now()))

    def resume(self, destination: str | Destination) -> None:
        return self._run(self.ops.pause(_dest(destination, "resume"), False, self._now()))

    def remove_message_group(self, destination: str | Destination, group_id: str) -> int:
        return self._run(self.ops.remove_message_groups(_dest(destination, "reset groups of"), group_id,
                                                        self._now()))

    def remove_all_message_groups(self, destination: str | Destination) -> int:
        return self._run(self.ops.remove_message_groups(_dest(destination, "reset groups of"), None,
                                                        self._now()))

    def message_groups(self, destination: str | Destination) -> list[GroupInfo]:
        return self._run(self.ops.message_groups(_dest(destination, "list groups of"), self._now()))

    def message_groups_page(self, destination: str | Destination, *, cursor: str | None = None,
                            limit: int = 100) -> GroupPage:
        """A page of about `limit` message groups: GroupPage(groups, next_cursor), None at the end."""
        return self._run(self.ops.message_groups_page(_dest(destination, "list groups of"), self._now(),
                                                      cursor, limit))

    def stats(self, destination: str | Destination) -> DestinationStats:
        return self._run(self.ops.stats(_dest(destination), self._now()))

    def group_counts(self, destination: str | Destination, pending_limit: int = 10_000,
                     in_flight_limit: int = 10_000) -> GroupCounts:
        """`GroupCounts`: pending and in-flight messages per message group (the console's groups view)."""
        return self._run(self.ops.group_counts(_dest(destination, "count groups of"), self._now(),
                                               pending_limit, in_flight_limit))

    # -- topics (docs/broker_core.md "Topics") -------------------------------------------------------

    def unsubscribe(self, destination: str | Destination, *, client_id: str, subscription_name: str) -> int:
        """Delete an offline durable subscription and its messages; returns how many messages went.
        DurableSubscriptionInUse while a consumer is attached, UnknownSubscription if there is none."""
        return self._run(self.ops.unsubscribe(_topic(destination), client_id, subscription_name,
                                              self._now()))

    def subscriptions(self, destination: str | Destination) -> list[SubscriptionStats]:
        """Every subscription of a topic with its counters (list of SubscriptionStats)."""
        return self._run(self.ops.subscriptions(_topic(destination), self._now()))

    def expire_offline_durables(self, destination: str | Destination,
                                timeout_ms: int | None = None) -> list[str]:
        """Remove durable subscriptions offline for offlineDurableSubscriberTimeout (or `timeout_ms`) or
        more, with their messages; returns their keys. Nothing when the timeout is off (-1)."""
        return self._run(self.ops.expire_offline_durables(_topic(destination), timeout_ms, self._now()))

    def destinations(self) -> list[str]:
        return self._run(self.ops.destinations())

    def advise_connection(self, connection_id: str, *, added: bool, client_id: str | None = None,
                          user: str | None = None, address: str | None = None, protocol: str | None = None,
                          reason: str | None = None) -> None:
        """Publish ActiveMQ.Advisory.Connection's ConnectionInfo (`added`) or RemoveInfo for a client
        connection the gateway opened or closed, if anybody subscribed to it (advisory.connection_changed:
        a record in the advisory topic's outbox, delivered at once or by maintenance)."""
        info = {"connection": connection_id, "client": client_id, "user": user, "address": address,
                "protocol": protocol, "reason": reason}
        return self._run(self.ops.connection_changed(info, self._now(), added))

    # -- the connection registry (connections.py): what every adapter registers, the console lists

    def connection_put(self, record: connections.ConnectionRecord, *,
                       lease_ms: int = connections.DEFAULT_LEASE_MS, limit: int = connections.DEFAULT_LIMIT,
                       full: bool = False) -> connections.ConnectionRecord:
        """Register `record` (its first call) or write what changed since; ConnectionRegistryFull past
        `limit`."""
        return self._run(connections.put(self.namespace, record, self._now(), lease_ms=lease_ms, limit=limit,
                                         full=full))

    def connection_put_many(self, records: list[connections.ConnectionRecord], *,
                            lease_ms: int = connections.DEFAULT_LEASE_MS,
                            limit: int = connections.DEFAULT_LIMIT) -> list[connections.ConnectionRecord]:
        """`connection_put` for many records, in MULTI/EXEC chunks; returns those whose write failed."""
        return self._run(connections.put_many(self.namespace, records, self._now(), lease_ms=lease_ms,
                                              limit=limit))

    def connection_renew(self, connection_ids: list[str],
                         lease_ms: int = connections.DEFAULT_LEASE_MS) -> list[str]:
        """Extend the leases; returns the ids no longer registered (to be written again whole)."""
        return self._run(connections.renew(self.namespace, connection_ids, self._now(), lease_ms))

    def connection_drop(self, connection_ids: list[str]) -> int:
        return self._run(connections.drop(self.namespace, connection_ids, self._now()))

    def connection_list(self, cursor: str = "", count: int = 100, filters: dict[str, str] | None = None,
                        with_destinations: bool = False) -> connections.Page:
        """One cursor page of registered connections (connections.Page)."""
        return self._run(connections.list_page(self.namespace, self._now(), cursor, count, filters,
                                               with_destinations))

    def connection_get(self, connection_id: str) -> connections.ConnectionInfo | None:
        """A connection with its subscriptions and producers (connections.ConnectionInfo), or None."""
        return self._run(connections.get(self.namespace, connection_id, self._now()))

    def connection_close(self, connection_id: str, reason: str) -> tuple[str, str] | None:
        """Ask the connection's process to close it; (process, protocol), or None when not registered."""
        return self._run(connections.request_close(self.namespace, connection_id, reason, self._now()))

    def connection_closes(self, process: str) -> list[tuple[str, str]]:
        """(connection id, reason) pairs `process` was asked to close, each handed out once."""
        return self._run(connections.take_closes(self.namespace, process, self._now()))

    def push_locally(self, channel: str, push: Callable[[bytes], None]) -> None:
        """This process's wake-up channel: a send's pushes to consumers listening on `channel` come back in
        the send's reply and go to `push`, not through Redis pub/sub (the local short-cut,
        gateway/runtime.py)."""
        self.ops.local_channel, self.ops.local_push = channel, push

    # -- what the adapters read or hold beside the operations (issue #22: adapters call the facade only)

    def durable_topic(self, client_id: str, subscription_name: str) -> Destination | None:
        """The topic (a wildcard subscription's pattern) the durable subscription (client id, name) is
        registered on, None when there is none (a durable key is broker-wide)."""
        return self._run(_durable_topic(self.namespace, client_id, subscription_name))

    def durable_topics_page(self, cursor: int = 0, count: int = 500) -> tuple[int, list[Destination]]:
        """A page of the durable subscription registry (one HSCAN of about `count` entries): (the cursor to
        go on from, 0 at the end; the topic, or a wildcard subscription's pattern, of each subscription)."""
        return self._run(_durable_topics_page(self.namespace, cursor, count))

    def memory(self) -> flow.MemoryUsage:
        """The broker-wide memory usage against its limit (BrokerView's MemoryPercentUsage, MemoryLimit):
        what producer flow control counts, read in one HMGET."""
        return self._run(_memory(self.namespace))

    def destination_count(self) -> int:
        """How many destinations the registry holds (one ZCARD)."""
        return self._run(_int_reply(Command(("ZCARD", self.ops.registry_key))))

    def destination_names(self, limit: int, page: int = 1000) -> list[str]:
        """The URIs of the registry's first `limit` destinations in creation order: ZRANGEs of `page` names
        in one MULTI/EXEC (one ZRANGE when `limit` <= `page`). `destinations()` reads them all."""
        return self._run(_destination_names(self.ops.registry_key, limit, page))

    def last_event_id(self, destination: str | Destination) -> str | None:
        """The id of the newest entry of the destination's event stream (`events_key`), None when it is
        empty: where a live feed that XREADs the stream from now on starts."""
        return self._run(_last_event_id(self.ops.events_key(_dest(destination))))

    def claim_client_id(self, client_id: str, holder: str, lease_ms: int) -> str | None:
        """Hold `client_id` for `holder` (a connection) for `lease_ms` (client_ids.py); None when taken,
        else the value the connection holding it gave."""
        return self._run(client_ids.claim(self.namespace, client_id, holder, lease_ms))

    def renew_client_id(self, client_id: str, holder: str, lease_ms: int) -> bool:
        """Extend `holder`'s claim; False when it lapsed."""
        return self._run(client_ids.renew(self.namespace, client_id, holder, lease_ms))

    def release_client_id(self, client_id: str, holder: str) -> None:
        return self._run(client_ids.release(self.namespace, client_id, holder))

    def virtual_routing(self) -> list[dict[str, Any]]:
        """The virtual destinations every send routes by, one row each (`virtual.describe`)."""
        return self._run(self.ops.virtual_routing())

    def ensure_destination(self, destination: str | Destination) -> None:
        return self._run(self.ops.ensure_destination(_dest(destination, "create"), self._now()))

    def refresh_policies(self) -> None:
        """Apply the policy store's current entries to every existing destination."""
        return self._run(self.ops.refresh_policies(self._now()))

    def begin(self, ttl_ms: int = 3_600_000) -> str:
        """A new transaction, open for `ttl_ms` unless renewed (`renew_transactions`): an adapter gives its
        connection's lease and renews it with its consumers', so a transaction whose owner died ends with
        its lease (its reserved space freed, its transacted acks' messages back with the consumer's)."""
        return self._run(self.ops.tx_begin(ttl_ms))

    def renew_transactions(self, txs: list[str], ttl_ms: int) -> list[str]:
        """Keep these transactions open `ttl_ms` longer; returns those already gone."""
        return self._run(self.ops.tx_renew(txs, ttl_ms))

    def check_transaction(self, tx: str, size: int = 0, body_bytes: int = 0,
                          places: Iterable[str] = ()) -> None:
        """Whether `size` more messages sent or acknowledged, `body_bytes` of bodies and the destinations
        (uri) and consumers (id) `places` would fit in the transaction: TransactionTooLarge naming the limit
        if not (`transaction_limits`). Every send and ack with `tx` is checked so; this is for a caller
        that holds what it adds later (an adapter's acks, added at commit) or adds in several calls."""
        return self._run(self.ops.tx_check(tx, size, body_bytes, list(places)))

    def commit(self, tx: str) -> None:
        return self._run(self.ops.tx_commit(tx, self._now()))

    def rollback(self, tx: str, *, redeliver: bool = True) -> None:
        """Undo the transaction: its sends dropped, its acks' messages back for redelivery, counter raised.
        `redeliver=False`: those still in flight with their consumer stay delivered to it, unacknowledged,
        the window their acks opened closing again (STOMP's ABORT, as ActiveMQ's); those held for it
        (their consumer closed since its ack) go back either way (ops/transactions.py `rollback`)."""
        return self._run(self.ops.tx_rollback(tx, self._now(), redeliver))


class Broker(_Api):
    """Blocking API over a redis.Redis client (decode_responses must be False)."""

    def __init__(self, client: redis.Redis, namespace: str = "sb", clock: Clock | None = None,
                 policies: PolicyStore | None = None,
                 transaction_limits: TransactionLimits | None = None,
                 max_consumers: int | None = None) -> None:
        super().__init__(namespace, clock, transaction_limits, max_consumers)
        self.redis = client
        self.policies = policies or PolicyStore(client, namespace)
        # Script calls and transactions go over this broker's own connections (drivers/direct.py), or through
        # redis-py for a client those cannot copy.
        self.link = DirectConnections.for_client(client)

    def close(self) -> None:
        """Close this broker's own idle connections (the redis-py client given stays the caller's)."""
        if self.link is not None:
            self.link.close()

    def _perform(self, io: Io) -> Any:
        """Do one request of the driver (drivers/loop.py) blocking."""
        if type(io) is tuple:  # a script call: over this broker's own connections
            return self.link.call(*io) if self.link is not None else self.redis.execute_command(*io)
        if isinstance(io, Command):
            return self.redis.execute_command(*io.args)
        if isinstance(io, Policy):
            return self.policies.resolve(io.destination)
        if isinstance(io, Sleep):  # a send waiting for space
            time.sleep(io.ms / 1000)
            return self._now()
        if isinstance(io, Transaction):
            if self.link is not None:
                return self.link.transaction(io.commands)
            pipe = self.redis.pipeline(transaction=True)
            for command in io.commands:
                pipe.execute_command(*command)
            return pipe.execute(raise_on_error=False)
        return self.redis.info(io.section)  # Info

    def _step(self, request: Any) -> Any:
        """One request of an operation to its reply (tests drive operations by hand with it)."""
        return run(self.driver.step(request), self._perform)

    def _run(self, op: Op[T]) -> T:
        return run(self.driver.drive(op), self._perform)


class _BrowseReplies:
    """Where one BROWSE's messages go (AsyncBroker.manage_scheduler): the first under producer flow
    control, which admits the BROWSE or refuses it before anything is sent; the rest without, as
    SchedulerBroker's sendScheduledJob turns it off, so a full reply-to neither holds an admitted BROWSE
    (and its connection) up nor cuts it short."""

    def __init__(self, broker: AsyncBroker, reply_to: Destination) -> None:
        self.broker, self.reply_to = broker, reply_to
        self.admitted = False

    async def send(self, messages: list[Message]) -> None:
        broker = self.broker
        if not self.admitted:
            await broker._run(broker.ops.send(self.reply_to, messages[:1], broker._now()))
            self.admitted = True
            messages = messages[1:]
        if messages:
            await broker._run(broker.ops.send(self.reply_to, messages, broker._now(), kind="exempt"))


class AsyncBroker(_Api):
    """The same API for asyncio callers (Channels consumers, async views); every method is awaitable."""

    def __init__(self, client: redis.asyncio.Redis, namespace: str = "sb", clock: Clock | None = None,
                 policies: PolicyStore | None = None,
                 transaction_limits: TransactionLimits | None = None,
                 max_consumers: int | None = None) -> None:
        super().__init__(namespace, clock, transaction_limits, max_consumers)
        self.redis = client
        self.policies = policies  # resolved in a thread: it uses a blocking client, and only on first use
        # Script calls and transactions share one connection (drivers/multiplexed.py), or go through redis-py
        # for a client that connection cannot copy.
        self.link = MultiplexedConnection.for_client(client)
        # concurrent sends, and acks of different consumers, to one queue share script calls
        # (drivers/coalesce.py)
        self._sends: Coalescer[Packed, list[str]] = Coalescer(self._send_groups, _send_refused, size=len)
        self._acks: Coalescer[AckRequest, tuple[int, list[Delivery]]] = Coalescer(
            self._ack_groups, lambda e: isinstance(e, errors.UnknownConsumer | errors.NotInFlight),
            size=lambda r: len(r[1]), tag=lambda r: r[0].consumer_id)
        # Whether an `ack` given a `hold` waits for the next call: Redis syncs every write (True) or not
        # (False); None until the first such ack asks (_syncs_each_write). Read-only for callers: one that
        # knows the ack goes at once may await it where it is instead of giving it a task of its own
        # (gateway/ws/link.py).
        self.holds_acks: bool | None = None
        # a delayed message's destination dispatched when it is due, not only at the next tick (due.py)
        self.due = DueTimers(self.dispatch, self._now)
        # open transactions' delayed sends: transaction -> destination -> the shortest delay (ms), armed
        # again at the commit, which schedules them (`commit`); dropped at the commit or the rollback, or
        # past TX_DELAYS_KEPT transactions (one that lapsed ends neither here)
        self._tx_delays: dict[str, dict[Destination, int]] = {}

    async def send(self, destination: str | Destination, message: Message | str | bytes | Iterable[Message],
                   *, tx: str | None = None) -> list[str]:
        """As Broker.send; concurrent sends to one queue share a script call (drivers/coalesce.py). A
        delayed message's destination is dispatched when it is due (`due`); a cron job's is dispatched at
        once, after its delay (its first time is later still), and the dispatch reports that first time,
        for which the timer is armed again (due.py), as for each time after."""
        if (tx is None and type(message) is Message and type(destination) is Destination
                and destination.is_queue and not destination.is_wildcard):  # (a STOMP SEND's: no helpers)
            now = self._now()
            sent = await self._sends.run(destination, [message.pack(now)])
            if message.delay_ms or message.cron is not None:  # (a job due now came back in the send's call)
                self.due.arm(destination, now + (message.delay_ms or 0))
            return sent
        if _is_composite(destination):
            return await super().send(destination, message, tx=tx)
        dest, batch = _dest(destination), _messages(message)
        now = self._now()
        if tx is None and dest.is_queue and batch:
            sent = await self._sends.run(dest, [m.pack(now) for m in batch])  # (a bad one fails here)
        else:
            sent = await super().send(dest, batch, tx=tx)
        delay = min((m.delay_ms or 0 for m in batch if m.delay_ms or m.cron is not None), default=None)
        if delay is not None:  # (in a transaction: dispatched then, and again when due if committed later)
            self.due.arm(dest, now + delay)
            if tx is not None:  # (committed after the delay, the timer above has fired already: `commit`)
                delays = self._tx_delays.setdefault(tx, {})
                delays[dest] = min(delay, delays.get(dest, delay))
                if len(self._tx_delays) > TX_DELAYS_KEPT:  # (the oldest: most likely one never ended here)
                    del self._tx_delays[next(iter(self._tx_delays))]
        return sent

    async def commit(self, tx: str) -> None:
        """As Broker.commit. The commit schedules the transaction's delayed sends, their delay counted from
        it (send.lua, as ActiveMQ's SchedulerBroker schedules them after the commit): their destinations'
        timers are armed for then (a COMMIT later than the delay found the SEND's timer fired already, and
        the message waited for the maintenance tick)."""
        now = self._now()
        await self._run(self.ops.tx_commit(tx, now))
        for dest, delay in self._tx_delays.pop(tx, {}).items():
            self.due.arm(dest, now + delay)

    async def rollback(self, tx: str, *, redeliver: bool = True) -> None:
        """As Broker.rollback."""
        self._tx_delays.pop(tx, None)
        await self._run(self.ops.tx_rollback(tx, self._now(), redeliver))

    async def manage_scheduler(self, request: scheduler.SchedulerRequest,
                               may: Callable[[Destination, str], Awaitable[bool]]) -> int:
        """Carry out a message sent to ActiveMQ.Scheduler.Management (broker_core/scheduler.py), which is
        not delivered: BROWSE sends each scheduled job to `request.reply_to`, REMOVE cancels one job,
        REMOVEALL every job (due from `start` to `end` when given); cancelled jobs count as `cancelled`,
        as remove_message's. Only the jobs of destinations `may(destination, action)` allows are seen
        (scheduler.NEEDS: 'read' to browse, 'admin' to cancel). Destination by destination, a page of at
        most SCHEDULED_PAGE jobs a script call, each bounded as browse's and remove's, so a walk over
        100,000 jobs holds nobody up. Returns how many jobs it sent or cancelled; a REMOVE of an id no such
        destination has as a job raises UnknownMessage.

        A BROWSE is admitted as a producer's send: its first message goes to the reply-to under producer
        flow control (waiting or failing as the reply-to's policy says: ResourceAllocationError naming the
        limit, nothing sent), the others without, as SchedulerBroker sends them, so an admitted BROWSE is
        never cut short. A reply-to (and the broker) so ends at most one BROWSE's messages past its memory
        limit per BROWSE under way, where BROWSEs repeated without flow control filled Redis without
        bound (ActiveMQ's copies past the memory limit go to its temp store, which has a limit of its own;
        Redis is Signalbox's only store)."""
        need = scheduler.NEEDS[request.action]
        done = 0
        replies = _BrowseReplies(self, request.reply_to) if request.reply_to is not None else None
        registry = [parse_destination(uri) for uri in await self.destinations()]
        for first in range(0, len(registry), SCHEDULER_WALK_CHUNK):
            # only destinations with anything parked can have jobs: asked a chunk a round trip, so 10,000
            # destinations without any cost 10 calls, not 10,000 (and as many permission checks)
            chunk = [d for d in registry[first:first + SCHEDULER_WALK_CHUNK]
                     if not scheduler.is_management(d)]
            for dest in await self._run(self.ops.with_parked(chunk)):
                if not await may(dest, need):
                    continue
                try:
                    found = await self._manage_jobs_of(dest, request, replies)
                except errors.UnknownDestination:  # deleted since the registry was read: no jobs there
                    continue
                if request.job_id is not None and found:  # REMOVE: the one job
                    return 1
                done += found
        if request.job_id is not None:
            raise errors.UnknownMessage(f"no scheduled job {request.job_id} (scheduledJobId) on a "
                                        "destination you may administer", message_id=request.job_id)
        return done

    async def _manage_jobs_of(self, dest: Destination, request: scheduler.SchedulerRequest,
                              replies: _BrowseReplies | None) -> int:
        """`manage_scheduler` on one destination: how many of its jobs it sent (to `replies`: a BROWSE)
        or cancelled."""
        if request.job_id is not None:  # REMOVE
            return await self._run(self.ops.cancel_scheduled(dest, [request.job_id], self._now()))
        done, cursor = 0, None
        while True:
            page = await self._run(self.ops.scheduled_page(dest, cursor, request.start, request.end,
                                                           SCHEDULED_PAGE, self._now()))
            if page.jobs and replies is not None:  # BROWSE
                for sending in scheduler.in_sends([scheduler.browsed_job(d, s) for d, s in page.jobs]):
                    await replies.send(sending)
                done += len(page.jobs)
            elif page.jobs:  # REMOVEALL
                done += await self._run(self.ops.cancel_scheduled(
                    dest, [d.message_id for d, _ in page.jobs], self._now()))
            cursor = page.next_cursor
            if not cursor:
                return done

    async def ack(self, consumer: ConsumerRef, message_id: str | list[str], *, mode: str | None = None,
                  tx: str | None = None, mark_delivered: bool = True, hold: float = 0.0) -> int:
        """As Broker.ack; acks of different consumers of one queue share a script call
        (drivers/coalesce.py). `hold` (seconds): its script call may wait that long to go out with this
        broker's next call (drivers/multiplexed.py); for an ack no client waits for (ack mode auto)."""
        token = multiplexed.hold(hold) if hold and await self._syncs_each_write() else None
        try:
            ids = _ids(message_id)
            if tx is None and ids and consumer.destination.is_queue:
                request = (consumer, ids, self._ack_mode(consumer, mode, tx), 0)
                return (await self._acks.run(consumer.destination, request))[0]
            return await super().ack(consumer, message_id, mode=mode, tx=tx, mark_delivered=mark_delivered)
        finally:
            if token is not None:
                multiplexed.release_hold(token)

    async def ack_and_receive(self, consumer: ConsumerRef, message_id: str | list[str], max_messages: int = 1,
                              *, mode: str | None = None) -> list[Delivery]:
        """As Broker.ack_and_receive; grouped like `ack`."""
        ids = _ids(message_id)
        if ids and consumer.destination.is_queue:
            request = (consumer, ids, self._ack_mode(consumer, mode, None), max_messages)
            return (await self._acks.run(consumer.destination, request))[1]
        return await super().ack_and_receive(consumer, message_id, max_messages, mode=mode)

    async def _syncs_each_write(self) -> bool:
        """Whether Redis syncs its AOF before every reply (appendonly yes, appendfsync always), asked once.
        Only then does an ack gain by waiting for the next call: Redis runs both in one turn and syncs
        once. Otherwise the ack that waits only puts its script before the next call's reply."""
        if self.holds_acks is None:
            try:
                found = await self.redis.config_get("append*")
                conf = {reply_text(k): reply_text(v) for k, v in found.items()}
                self.holds_acks = conf.get("appendonly") == "yes" and conf.get("appendfsync") == "always"
            except redis.RedisError:  # CONFIG renamed or refused (a managed Redis): no holding
                self.holds_acks = False
        return self.holds_acks

    async def _send_groups(self, dest: Destination, groups: list[Packed]) -> list[list[str]]:
        """One send of the grouped sends' messages; each its own ids."""
        if len(groups) == 1:  # (a lone send, the usual case)
            return [await self._run(self.ops.send_packed(dest, groups[0], self._now()))]
        sent = await self._run(self.ops.send_packed(dest, [m for packed in groups for m in packed],
                                                    self._now()))
        out, start = [], 0
        for packed in groups:
            out.append(sent[start:start + len(packed)])
            start += len(packed)
        return out

    def _ack_groups(self, dest: Destination,
                    requests: list[AckRequest]) -> Awaitable[list[tuple[int, list[Delivery]]]]:
        return self._run(self.ops.ack_many(dest, requests, self._now()))  # (awaited by the coalescer)

    async def aclose(self) -> None:
        """Close this broker's own connection (the redis-py client given stays the caller's to close)."""
        if self.link is not None:
            self.link.close()

    def _perform(self, io: Io) -> Awaitable[Any]:
        """Do one request of the driver (drivers/loop.py) with asyncio: an awaitable of its reply. A script
        call's is the connection's own future (no coroutine here to make and resume: there are one or two
        on every message's path)."""
        if type(io) is tuple:  # a script call: over this broker's one connection
            return self.link.request(io) if self.link is not None else self.redis.execute_command(*io)
        return self._perform_other(io)

    async def _perform_other(self, io: Io) -> Any:
        if isinstance(io, Command):
            return await self.redis.execute_command(*io.args)
        if isinstance(io, Policy):
            if self.policies is None:
                raise errors.InvalidPolicy("AsyncBroker needs a PolicyStore to create destinations")
            return await asyncio.to_thread(self.policies.resolve, io.destination)
        if isinstance(io, Sleep):  # a send waiting for space
            await asyncio.sleep(io.ms / 1000)
            return self._now()
        if isinstance(io, Transaction):
            if self.link is not None:
                return await self.link.transaction(io.commands)
            pipe = self.redis.pipeline(transaction=True)
            for command in io.commands:
                pipe.execute_command(*command)
            return await pipe.execute(raise_on_error=False)
        return await self.redis.info(io.section)  # Info

    async def _eval(self, call: Eval) -> Any:
        return await run_async(self.driver.eval(call), self._perform)

    async def _load(self, names: Iterable[str]) -> bool:
        return await run_async(self.driver.load(names), self._perform)

    def _run(self, op: Op[T]) -> Awaitable[T]:  # type: ignore[override]
        return run_async(self.driver.drive(op), self._perform)  # (awaited by the caller: no layer of its own)

    # -- many destinations' statistics at once -------------------------------------

    async def stats_many(self, destinations: list[str | Destination]) -> list[DestinationStats | None]:
        """`stats` of many destinations in one pipelined round trip per 1,000 (None for one that is
        gone). The console's destination list sorts 10,000 destinations by a statistic with this."""
        out: list[DestinationStats | None] = []
        source = script("stats")
        functions = await self._load(["stats"])  # once, so no call in the pipeline meets NOSCRIPT
        for start in range(0, len(destinations), 1000):
            now = self._now()
            chunk = [_dest(d) for d in destinations[start:start + 1000]]
            # a topic's stats read each subscription, so topics are not pipelined here.
            ops = [self.ops.stats(d, now) for d in chunk if not d.is_topic]
            calls = [next(op) for op in ops]
            pipe = self.redis.pipeline(transaction=False)
            for call in calls:
                pipe.execute_command(*call_args(source, functions, call.keys, call.args))
            queue_stats: list[DestinationStats | None] = []
            for op, reply in zip(ops, await pipe.execute(raise_on_error=False), strict=True):
                try:
                    if isinstance(reply, redis.ResponseError):
                        op.throw(typed_error(reply))
                    request = op.send(reply)
                    # a queue of more than calls.STATS_PAGE consumers: the rest of them a call at a time
                    queue_stats.append(await self._run(resumed(op, request)))
                except StopIteration as stop:
                    queue_stats.append(stop.value)
                except errors.UnknownDestination:
                    queue_stats.append(None)
            queued = iter(queue_stats)
            for d in chunk:
                if not d.is_topic:
                    out.append(next(queued))
                    continue
                try:
                    out.append(await self.stats(d))
                except errors.UnknownDestination:
                    out.append(None)
        return out

    _summary_many = True  # one script over many queues, until a Redis Cluster refuses it

    async def summaries(self, destinations: list[str | Destination], page: int = SUMMARY_CHUNK,
                        oldest: bool = False, concurrency: int = 1) -> list[Any]:
        """`DestinationSummary` (main counters) of many destinations, one script call per `page` queues
        (SUMMARY_CHUNK keeps a call to a millisecond or two); None for one that is gone. A page's topics
        are read by ops/topics.summaries (topic_summary_many calls of bounded work: a topic's subscriptions
        added up as its full `stats` would). With `oldest`, also each queue's oldest pending message (up
        to ten lookups per queue: pages smaller). `concurrency` pages are asked at once (pipelined on the
        connection, so this process's decoding overlaps Redis's work); each call stays as small."""
        await self._load(["summary_many", "topic_summary_many"])
        chunks = [[_dest(d) for d in destinations[start:start + page]]
                  for start in range(0, len(destinations), page)]
        if concurrency <= 1 or len(chunks) <= 1:
            return [s for chunk in chunks for s in await self._summary_page(chunk, oldest)]
        out: list[list[Any]] = [[] for _ in chunks]
        following = iter(range(len(chunks)))

        async def worker() -> None:
            for i in following:  # (one iterator shared: each page taken once)
                out[i] = await self._summary_page(chunks[i], oldest)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(chunks)))))
        return [s for part in out for s in part]

    async def _summaries_one_by_one(self, queues: list[Destination], now: int,
                                    oldest: bool) -> dict[str, Any]:
        """summary_many per queue, pipelined in one round trip (a Redis Cluster's slots; the oldest lookups
        a page had no room for)."""
        source, functions = script("summary_many"), await self._load(["summary_many"])
        pipe = self.redis.pipeline(transaction=False)
        ops = [self.ops.summary(d, now, oldest) for d in queues]
        for op in ops:
            call = next(op)
            pipe.execute_command(*call_args(source, functions, call.keys, call.args))
        found: dict[str, Any] = {}
        for d, op, reply in zip(queues, ops, await pipe.execute(), strict=True):
            try:
                op.send(reply)
            except StopIteration as stop:
                found[d.uri] = stop.value
        return found

    async def _summary_page(self, chunk: list[Destination], oldest: bool) -> list[Any]:
        now = self._now()
        found: dict[str, Any] = {}
        queues = [d for d in chunk if not d.is_topic]
        if queues and self._summary_many:
            try:
                call = calls.SummaryMany.call([self.ops.prefix(d) for d in queues], now, oldest)
                read = calls.SummaryMany.parse(await self._eval(call), [d.uri for d in queues])
            except redis.ResponseError:  # a Redis Cluster: the queues are on several slots
                self._summary_many = False
            else:
                found.update(zip([d.uri for d in queues], read, strict=True))
        if queues and not self._summary_many:
            found.update(await self._summaries_one_by_one(queues, now, oldest))
        elif oldest and len(queues) > 1:
            # a call reads at most OLDEST_BYTES of messages for the oldest lookups (summary_many.lua): the
            # queues it had no room for are asked again one per call, so only a queue whose own head
            # messages pass the bound stays unknown
            again = [d for d in queues if found[d.uri] is not None and found[d.uri].oldest_unknown]
            if again:
                found.update(await self._summaries_one_by_one(again, now, oldest))
        topics = [d for d in chunk if d.is_topic]
        if topics and self._summary_many:
            try:
                read = await self._run(self.ops.summaries(topics, now))
            except redis.ResponseError:  # a Redis Cluster: the topics are on several slots
                self._summary_many = False
            else:
                found.update(zip([t.uri for t in topics], read, strict=True))
        if topics and not self._summary_many:
            for t in topics:
                (found[t.uri],) = await self._run(self.ops.summaries([t], now))
        return [found[d.uri] for d in chunk]

    def events_key(self, destination: str | Destination) -> str:
        """The Redis stream of the destination's lifecycle events (docs/broker_core.md), for XREAD."""
        return self.ops.events_key(_dest(destination))

