"""The broker's values as its callers see them: how a consumer asks for messages (ConsumerSpec), the handles
of a consumer, and what operations return (statistics, browse pages, message groups, dispatch results)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgpack

from .destinations import Destination
from .errors import InvalidConsumer
from .messages import Delivery, unpack_delivery
from .resp import reply_text
from .topics import SubscriptionStats

AckMode = Literal["auto", "client", "client-individual", "transacted"]
ACK_MODES: tuple[str, ...] = ("auto", "client", "client-individual", "transacted")
DEFAULT_LEASE_MS = 30_000
# SIGNALBOX_MAX_CONSUMERS: the consumers one queue may have (0: no limit, as ActiveMQ); an add past it is
# refused (TooManyConsumers). The dispatch pass (a chunk of it bounded by its work budget: dispatch.lua
# CONSUMER_STEPS) and an add that sorts the order read every consumer: at 1,000 the largest such call took
# 5-23 ms of server CPU (on a loaded machine), at 2,000 before the budget 17-104 ms, at 5,000 35-214 ms
# (bench/adversarial.py "consumers: "; docs/benchmarks.md "Session 32"). A topic's subscriptions are not
# counted: each has its own dispatch, and a send's fan-out to them is cut into bounded calls.
MAX_CONSUMERS = 1_000


@dataclass(frozen=True)
class TransactionLimits:
    """What one transaction may hold (ops/transactions.py checks each send and ack against them, for every
    adapter and direct caller). Its commit is one MULTI/EXEC, which holds Redis for every client while it
    runs: each step costs about 20-40 us, each MiB of bodies about 10-20 ms (50 sends of 1 MB held every
    other client 1.3 s), each destination or consumer a check and a step of about 0.1-0.2 ms (250 queues:
    20-46 ms). All three reached: 9-17 ms (bench/adversarial.py "largest message"; docs/benchmarks.md
    "Session 22"). Each is the setting named beside it (gateway/runtime.py reads them)."""

    # SIGNALBOX_MAX_TRANSACTION_SIZE: messages sent and acknowledged (a cumulative ack counts the ids it
    # names: the commit reads what it covers, bounded by its consumer's window)
    size: int = 250
    # SIGNALBOX_MAX_TRANSACTION_BYTES: the bodies its sends carry (a text body in UTF-8; a send to a
    # composite destination counts once per destination)
    body_bytes: int = 512 * 1024
    # SIGNALBOX_MAX_TRANSACTION_DESTINATIONS: the destinations it sends to and the consumers it acks for
    destinations: int = 16


@dataclass(frozen=True)
class ConsumerSpec:
    """How a consumer wants messages (spec §1.3-1.5, §2, §4, §5.2)."""

    prefetch: int | None = None  # None: the client default (1000 for queues), which the policy may replace
    priority: int = 0
    exclusive: bool = False
    selector: str | None = None
    stomp_selector: bool = False  # STOMP's convert_string_expressions coercion mode
    no_local: bool = False
    connection_id: str | None = None
    client_id: str | None = None
    ack_mode: AckMode = "client"
    lease_ms: int = DEFAULT_LEASE_MS
    notify: str | None = None  # Redis pub/sub channel told when the consumer's outbox gets messages
    # (§7.4, §7.5) with client_id, a durable subscription; replay what the recovery policy kept.
    subscription_name: str | None = None
    retroactive: bool = False
    # (§8.5) the consumer's own maximumPendingMessageLimit (STOMP's
    # activemq.maximumPendingMessageLimit); with a pendingMessageLimitStrategy it wins when > 0 and smaller.
    maximum_pending_message_limit: int | None = None

    def validate(self) -> None:
        if self.prefetch is not None and (isinstance(self.prefetch, bool) or not 0 <= self.prefetch <= 32767):
            raise InvalidConsumer(f"prefetch must be 0-32767, got {self.prefetch!r}", field="prefetch")
        if isinstance(self.priority, bool) or not -128 <= self.priority <= 127:
            raise InvalidConsumer(f"consumer priority must be -128..127, got {self.priority!r}",
                                  field="priority")
        if self.ack_mode not in ACK_MODES:
            raise InvalidConsumer(f"ack mode must be one of {', '.join(ACK_MODES)}, got {self.ack_mode!r}",
                                  field="ack_mode")
        if self.subscription_name is not None and (not self.subscription_name or not self.client_id):
            raise InvalidConsumer("a durable subscription needs a client id and a non-empty "
                                  "subscription name", field="subscription_name")
        if not 1_000 <= self.lease_ms <= 3_600_000:
            raise InvalidConsumer(f"lease must be 1000-3600000 ms, got {self.lease_ms!r}", field="lease_ms")
        limit = self.maximum_pending_message_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidConsumer(f"maximum pending message limit must be an integer >= 0, got {limit!r}",
                                  field="maximum_pending_message_limit")


@dataclass(frozen=True)
class ConsumerRef:
    destination: Destination
    consumer_id: str
    ack_mode: AckMode = "client"


@dataclass(frozen=True)
class Consumer(ConsumerRef):
    prefetch: int = 0
    hold_until: int = 0
    subscription: str | None = None  # the subscription's key (topics.py)


# One consumer's part of an ack call (homes.ack_many): the consumer, message ids, mode, how many next
# messages to hand over.
AckRequest = tuple[ConsumerRef, list[str], str, int]


@dataclass(frozen=True)
class DispatchResult:
    dispatched: int = 0
    # When to run dispatch again (ms): a delayed start ends, or a parked message (redelivery delay,
    # scheduled delivery) becomes visible. 0: nothing waits for time.
    hold_until: int = 0


class SentId(str):
    """A sent message's id, saying what became of it: `status` is "ok" (enqueued), "scheduled" (a
    repeating scheduled message: delivered as `id`, then `id#2`, `id#3`...), "duplicate" (the id is still
    stored or was enqueued within the audit window: accepted, not enqueued again) or "expired" (expired
    on arrival: not enqueued; dead-lettered or dropped per the policy)."""

    status: str

    def __new__(cls, message_id: str, status: str) -> SentId:
        sent = super().__new__(cls, message_id)
        sent.status = status
        return sent


@dataclass(frozen=True)
class Browsed:
    """A stored message as an operator sees it: `state` is pending, parked or inflight (then
    `message.consumer_id` names the consumer holding it)."""

    message: Delivery
    state: str


@dataclass(frozen=True)
class BrowsePage:
    messages: list[Browsed]
    next_cursor: str | None  # None: nothing more
    examined: int = 0  # messages the page's call looked at, matching or not


@dataclass(frozen=True)
class ScheduledPage:
    """A page of scheduled jobs (scheduler management): each as delivered, with its schedule as sent
    (delay, period, repeat, cron expression)."""

    jobs: list[tuple[Delivery, tuple[int, int, int, str | None]]]
    next_cursor: str | None  # None: nothing more


@dataclass(frozen=True)
class SweepResult:
    examined: int
    expired: int
    done: bool  # the sweep reached the end of the queue; the next call starts at the head


@dataclass(frozen=True)
class ConsumerStats:
    consumer_id: str
    client_id: str | None
    connection_id: str | None
    selector: str | None
    priority: int
    exclusive: bool
    ack_mode: str
    prefetch: int
    prefetch_extension: int
    in_flight: int
    undelivered: int  # dispatched but not yet handed to the adapter (receive)
    dispatched: int
    acked: int
    groups: int
    lease_expires: int | None
    added: int
    last_ack: int | None
    slow_since: int | None  # §8.1: found full while the queue had a message to dispatch to it
    is_exclusive_owner: bool


@dataclass(frozen=True)
class BrowserInfo:
    """An open queue browser as its consumer advisory tells it (ActiveMQ's ConsumerInfo, browser=true)."""

    browser_id: str
    prefetch: int
    selector: str | None


@dataclass(frozen=True)
class Tally:
    """What a destination's meta keeps as "<count> <sum> <smallest> <largest>" (ActiveMQ's size and time
    statistics: MessageSizes, EnqueueTimes). 0s when none."""

    count: int = 0
    total: int = 0
    smallest: int = 0
    largest: int = 0

    @classmethod
    def parse(cls, stored: Any) -> Any:
        """From the meta field as Redis gives it (unset: none)."""
        if not stored:
            return cls()
        text = stored.decode() if isinstance(stored, bytes) else stored
        return cls(*(int(v) for v in text.split()))


@dataclass(frozen=True)
class MessageSizes(Tally):
    """ActiveMQ's DestinationStatistics messageSize (a SizeStatisticImpl): the sizes of the messages the
    destination counted enqueued, each as its memory usage counts it (packed bytes, at least
    minimumMessageSize; scripts/lua/includes/message.lua size_note): the meta field msgsize."""

    @property
    def average(self) -> int:
        """The MBeans' AverageMessageSize: the mean, its fraction dropped (ActiveMQ casts it to a long)."""
        return self.total // self.count if self.count else 0

    def combined(self, other: MessageSizes) -> MessageSizes:
        """Both together (the broker's: ActiveMQ's destinations add theirs to the broker's as they go)."""
        if not other.count:
            return self
        if not self.count:
            return other
        return MessageSizes(self.count + other.count, self.total + other.total,
                            min(self.smallest, other.smallest), max(self.largest, other.largest))


NO_SIZES = MessageSizes()


@dataclass(frozen=True)
class EnqueueTimes(Tally):
    """ActiveMQ's DestinationStatistics processTime (a TimeStatisticImpl: the MBeans' AverageEnqueueTime,
    MinEnqueueTime, MaxEnqueueTime): at each dispatch, redeliveries and each topic subscriber's included,
    the ms since the message last reached the broker (scripts/lua/includes/message.lua times_added): the
    meta field enqtime. The smallest is TimeStatisticImpl's: a 0 holds only until the next time."""

    @property
    def average(self) -> float:
        """AverageEnqueueTime: a double in ActiveMQ (the fraction kept)."""
        return self.total / self.count if self.count else 0.0


NO_TIMES = EnqueueTimes()


@dataclass(frozen=True)
class DestinationStats:
    """ActiveMQ's queue view (spec §14.2): QueueSize counts pending plus in-flight messages."""

    destination: str
    queue_size: int
    pending: int
    in_flight: int
    enqueued: int
    dequeued: int
    dispatched: int
    expired: int
    expired_on_arrival: int
    deadlettered: int  # left for the dead-letter queue (poison, past maximumRedeliveries, expired)
    discarded: int  # dead letters dropped by the strategy (discarding, non-persistent, a DLQ's own)
    parked: int  # waiting for a redelivery delay or a scheduled time: scheduled + redelivery_delayed
    forwarding: int  # dead letters on their way to the dead-letter queue
    purged: int  # removed by an operator (remove, purge)
    moved: int  # moved or retried to another destination
    cancelled: int  # repeating scheduled messages cancelled before their last delivery
    duplicates: int
    skipped: int
    last_pass_skipped: int
    consumer_count: int  # the consumers, and a queue's open browsers
    group_count: int
    paused: bool
    exclusive_owner: str | None
    consumers: list[ConsumerStats] = field(default_factory=list)
    browsers: int = 0  # a queue's open browsers (counted in consumer_count, not in `consumers`)
    # (ops/topics.stats) the subscriptions, messages no subscription matched (dropped), durable
    # subscriptions active and offline, evictions (§8.5), messages dropped with a removed subscription.
    subscriptions: list[SubscriptionStats] = field(default_factory=list)
    no_subscription: int = 0
    durable_active: int = 0
    durable_offline: int = 0
    evicted: int = 0
    removed_with_subscription: int = 0
    # (discard_counts) a topic's messages dropped by a pending-message limit of 0 (or a non-durable
    # subscription's poison), and `discards`: evicted + dropped + discarded, the rate history's "discarded"
    dropped: int = 0
    discards: int = 0
    # `parked` told apart: scheduled jobs not yet due (delayed messages, repeating and cron jobs; a topic's
    # are its own), and messages waiting for a redelivery delay (a topic's: its subscriptions')
    scheduled: int = 0
    redelivery_delayed: int = 0
    # Selectors that failed on a message, which they then did not match (an evaluation error, such as
    # one over limits.MAX_EVALUATION_BYTES), counted by the dispatch (a topic: by the send).
    selector_errors: int = 0
    # FLOW (spec §9, §14.2): bytes held, the limit in force (memoryLimit, else the broker's), the percent
    # ActiveMQ reports as MemoryPercentUsage, sends refused or held by flow control and the time held.
    memory_usage: int = 0
    memory_limit: int = 0
    memory_percent_usage: int = 0
    blocked_sends: int = 0
    total_blocked_time: int = 0
    # Virtual destinations (spec §10): copies made here that a target refused for good, and copies for a
    # full dropOnResourceLimit consumer queue that were dropped instead of failing the send.
    forward_refused: int = 0
    forward_dropped: int = 0
    message_sizes: MessageSizes = NO_SIZES
    enqueue_times: EnqueueTimes = NO_TIMES
    # What the destination keeps beside its messages, each bounded (docs/broker_core.md "Memory bounds"):
    # the lifecycle event stream's length (eventsMaxLen) and the events trimmed off it so far, and the ids
    # in the duplicate audit (maxQueueAuditDepth).
    events: int = 0
    events_trimmed: int = 0
    audit_size: int = 0


def discard_counts(evicted: int, dropped: int, discarded: int) -> dict[str, int]:
    """The stats' discard fields: messages the broker gave up without delivering them or putting them on a
    dead-letter queue, by cause (evicted by the eviction strategy, dropped by a pending
    limit of 0 or a non-durable subscription's poison, dead letters discarded), and `discards`, their sum,
    which is what the rate history's "discarded" series counts (rate_sample.lua reads the same counters: a
    topic's own, its subscriptions' and its ended subscriptions'). A queue has only dead letters
    discarded."""
    return {"evicted": evicted, "dropped": dropped, "discarded": discarded,
            "discards": evicted + dropped + discarded}


@dataclass(frozen=True)
class DestinationSummary:
    """The counters of DestinationStats that lists sort and total and the metrics scrape reads (same
    names), read in one small call."""

    destination: str
    queue_size: int
    pending: int
    in_flight: int
    parked: int
    group_count: int
    consumer_count: int
    enqueued: int
    dequeued: int
    dispatched: int
    expired: int
    deadlettered: int
    paused: bool
    memory_usage: int = 0  # bytes held (DestinationStats.memory_usage)
    # the timestamp (ms) of the oldest message waiting for dispatch (when asked for); None when none
    # waits (or a topic, whose messages wait per subscription), or when unknown: `oldest_unknown`, the
    # lookup would have read more message bytes than one call may (summary_many.lua OLDEST_BYTES)
    oldest_timestamp: int | None = None
    oldest_unknown: bool = False
    memory_limit: int = 0  # the limit in force (DestinationStats.memory_limit)
    message_sizes: MessageSizes = NO_SIZES
    enqueue_times: EnqueueTimes = NO_TIMES


def percent(used: int, limit: int) -> int:
    """ActiveMQ's MemoryPercentUsage (and its store's, its temporary store's): whole percent of the limit
    used, 0 when there is no limit."""
    return used * 100 // limit if limit > 0 else 0


def summary_of(stats: DestinationStats) -> DestinationSummary:
    """The summary of a destination read in full (a topic: its counters are its subscriptions' sums)."""
    return DestinationSummary(
        stats.destination, stats.queue_size, stats.pending, stats.in_flight, stats.parked, stats.group_count,
        stats.consumer_count, stats.enqueued, stats.dequeued, stats.dispatched, stats.expired,
        stats.deadlettered, stats.paused, stats.memory_usage, None, memory_limit=stats.memory_limit,
        message_sizes=stats.message_sizes, enqueue_times=stats.enqueue_times)


@dataclass(frozen=True)
class GroupCounts:
    """Messages per group: {group: (pending, in flight)}, and how much of the queue was examined."""

    groups: dict[str, tuple[int, int]]
    pending_examined: int
    all_pending: bool
    in_flight_examined: int
    all_in_flight: bool


@dataclass(frozen=True)
class GroupInfo:
    group_id: str
    owner: str
    assigned_at: int


@dataclass(frozen=True)
class GroupPage:
    groups: list[GroupInfo]
    next_cursor: str | None


@dataclass(frozen=True, init=False)
class Pushed:
    """Deliveries a dispatch pushed to a consumer (scripts/lua/includes/outbox.lua push_*): `after` is the
    dispatch
    sequence of the consumer's last message handed over before them, `last` that of the last of them; an
    adapter that has not handed over everything up to `after` missed a push and asks `receive_after`."""

    consumer_id: str
    after: int
    last: int
    entries: list[tuple[str, bytes, int, bool]]  # (id, packed message, redeliveries, group first)

    def __init__(self, consumer_id: str, after: int, last: int,
                 entries: list[tuple[str, bytes, int, bool]]) -> None:
        # The fields written into the instance's dict (which the frozen __setattr__ does not guard): the
        # generated __init__'s object.__setattr__ per field took twice the instructions, on every push
        fields = self.__dict__
        fields["consumer_id"], fields["after"], fields["last"] = consumer_id, after, last
        fields["entries"] = entries

    def deliveries(self, consumer: ConsumerRef) -> list[Delivery]:
        uri, cid = consumer.destination.uri, consumer.consumer_id
        return [unpack_delivery(message_id, uri, cid, blob, redeliveries, first)
                for message_id, blob, redeliveries, first in self.entries]


def unpack_pushed(payload: bytes) -> Pushed:
    """A push payload: msgpack [consumer id, rcv before, then per message: dispatch sequence, id, packed
    message, redeliveries, group first]."""
    p = msgpack.unpackb(payload, raw=True)
    entries = [(reply_text(p[i + 1]), p[i + 2], int(p[i + 3]), bool(p[i + 4])) for i in range(2, len(p), 5)]
    return Pushed(reply_text(p[0]), int(p[1]), int(p[len(p) - 5]) if len(p) > 2 else int(p[1]), entries)


def is_push(payload: bytes) -> bool:
    """A message on a wake-up channel is a push payload (a msgpack array) or a consumer id (text)."""
    return bool(payload) and (0x90 <= payload[0] <= 0x9F or payload[0] in (0xDC, 0xDD))
