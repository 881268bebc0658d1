"""One destination's policy: ActiveMQ's PolicyEntry for Signalbox, its attributes and their checks, the
class defaults and the prefetch a consumer gets (spec §13, §5.3, §5.4, §1.5). The map of entries is in
policy_map.py, the Redis-backed store in store.py, the TOML file in files.py.

Names. Python attributes are snake_case; configuration files, the API and Redis use ActiveMQ's camelCase
attribute names. `ATTRIBUTE_NAMES` (camelCase -> snake_case) is the one mapping between them. Strategy
beans that ActiveMQ nests in XML are flattened: the strategy is chosen by a type attribute
(`deadLetterStrategy = "individual"`) and its properties are ordinary attributes (`queuePrefix = "DLQ."`).
Where a strategy property's own name would be ambiguous among all attributes it carries a prefix
(`expiration` -> `deadLetterExpiration`). Each type attribute also accepts ActiveMQ's `type?prop=value`
form, e.g. `messageGroupMapFactoryType = "bucket?bucketCount=256&cacheSize=32"`, and ActiveMQ's XML element
names as type names (`individualDeadLetterStrategy`).

Redis. `PolicyEntry.to_redis_hash()` writes every attribute below under its camelCase name as a string
(ints in decimal, floats as Python `repr`, booleans "1"/"0", `sendFailIfNoSpace` "-1" when unset). Lua
scripts HMGET these names from a per-destination hash, so they are a stable interface:

  flow control and limits   producerFlowControl memoryLimit minimumMessageSize storeUsageHighWaterMark
                            sendFailIfNoSpace sendFailIfNoSpaceAfterTimeout blockedProducerWarningInterval
                            maxMessageSize maxPropertyCount maxDestinations eventsMaxLen
  paging and expiry         maxPageSize maxBrowsePageSize maxExpirePageSize expireMessagesPeriod
  dispatch                  useConsumerPriority strictOrderDispatch prioritizedMessages
                            allConsumersExclusiveByDefault consumersBeforeDispatchStarts
                            timeBeforeDispatchStarts dispatchPolicy
  prefetch                  queuePrefetch queueBrowserPrefetch topicPrefetch durableTopicPrefetch
                            usePrefetchExtension
  message groups            messageGroupMapFactoryType groupMapCacheSize groupMapBucketCount
  duplicate detection       enableAudit maxQueueAuditDepth maxAuditDepth maxProducersToAudit
                            topicSubscriptionAudit (derived: enableAudit and policyApplied)
  redelivery                maximumRedeliveries initialRedeliveryDelay redeliveryDelay
                            useExponentialBackOff backOffMultiplier maximumRedeliveryDelay
                            useCollisionAvoidance
  dead letters              deadLetterStrategy deadLetterQueue queuePrefix topicPrefix queueSuffix
                            topicSuffix useQueueForQueueMessages useQueueForTopicMessages
                            destinationPerDurableSubscriber processExpired processNonPersistent
                            deadLetterExpiration deadLetterEnableAudit
  slow consumers            slowConsumerStrategy checkPeriod maxSlowDuration maxSlowCount
                            abortConnection maxTimeSinceLastAck ignoreIdleConsumers
  advisories                advisoryForSlowConsumers advisoryForFastProducers
                            advisoryForDiscardingMessages advisoryWhenFull advisoryForDelivery
                            advisoryForConsumed advisoryForDispatched includeBodyForAdvisory
                            sendAdvisoryIfNoConsumers
  topics                    subscriptionRecoveryPolicy subscriptionRecoveryMaximumSize recoverDuration
                            alwaysRetroactive pendingMessageLimitStrategy pendingMessageLimit
                            pendingMessageLimitMultiplier messageEvictionStrategy
                            evictExpiredMessagesHighWatermark evictionPropertyName
                            offlineDurableSubscriberTimeout offlineDurableSubscriberTaskSchedule
  destination lifecycle     gcInactiveDestinations inactiveTimeoutBeforeGC
  provenance                policyApplied ("0" = no entry matched, class defaults) policyOrigin
                            (the entry that applied: "queue://orders.>", "default", or "")

Type-dependent attributes are "0" where they do not apply (groupMapBucketCount unless the group map is
"bucket"; groupMapCacheSize for "simple"; subscriptionRecoveryMaximumSize unless "fixedCount"/"fixedSized").

Signalbox's own limits (not in ActiveMQ): maxMessageSize, default 1 MiB (1048576 bytes, the packed message
as stored; at most 512 MiB, Redis's string limit): a script call copies a message whole two or three
times, about 6-13 ms a MiB on this machine's Redis 7, so the default keeps every call under the 20 ms
bound (4 MiB took 27-70 ms: bench/adversarial.py, "largest message"); a larger limit trades that bound
for size; maxPropertyCount, default 256 properties per message; and
eventsMaxLen, default 100000 (at most 1000000), the cap on the events the destination's event stream holds
(checked once per script call that wrote events: exactly after a call that packed several events into one
stream entry, else when the entries alone are over it, so a stream may hold up to its packed entries' extra
events more; its oldest entries are trimmed, at most 10 more than the events the call wrote); what it
trims is counted (DestinationStats.events_trimmed).
"""

from __future__ import annotations

import difflib
import math
import types
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from broker_core.destinations import (
    Destination,
)
from broker_core.errors import InvalidConsumer, InvalidDestination, InvalidPolicy

#: ActiveMQPrefetchPolicy.MAX_PREFETCH_SIZE: the client caps every prefetch at Short.MAX_VALUE.
MAX_PREFETCH = 32767
#: Upper bound for page sizes: a script handles at most one page per call, so this bounds the work.
MAX_PAGE = 10_000
MAX_MESSAGE_SIZE_LIMIT = 512 * 1024 * 1024

PrefetchKind = Literal["queue", "browser", "topic", "durable"]
#: Client-side prefetch defaults (ActiveMQPrefetchPolicy, spec §1.5).
CLIENT_DEFAULT_PREFETCH: Mapping[str, int] = types.MappingProxyType(
    {"queue": 1000, "browser": 500, "topic": 32767, "durable": 100}
)
#: DEFAULT_OPTIMIZE_DURABLE_TOPIC_PREFETCH also counts as "kept the default" for durable subscribers.
_OPTIMIZE_DURABLE_TOPIC_PREFETCH = 1000

DEFAULT_ENTRY_ID = "default"


def _attr(default: Any, *, camel: str | None = None, minimum: float | None = None,
          maximum: float | None = None, off: int | None = None, choices: tuple[str, ...] = ()) -> Any:
    """A configuration attribute. `off` is a sentinel allowed below `minimum` (e.g. -1 = disabled)."""
    return field(
        default=default,
        metadata={"camel": camel, "min": minimum, "max": maximum, "off": off, "choices": choices},
    )


_DISPATCH_POLICIES = ("simple", "roundRobin", "strictOrder", "priority")
_GROUP_MAPS = ("cached", "simple", "bucket")
_DEAD_LETTER_STRATEGIES = ("shared", "individual", "discarding")
_SLOW_CONSUMER_STRATEGIES = ("none", "abortSlowConsumer", "abortSlowAckConsumer")
_RECOVERY_POLICIES = ("retainedMessage", "none", "lastImage", "fixedCount", "fixedSized", "timed")
_PENDING_LIMIT_STRATEGIES = ("none", "constant", "prefetchRate")
_EVICTION_STRATEGIES = ("oldestMessage", "oldestMessageWithLowestPriority", "uniquePropertyMessage")


@dataclass(frozen=True)
class PolicyEntry:
    """The policy values in force for one destination; defaults are ActiveMQ's PolicyEntry defaults.

    `CLASS_DEFAULTS` is what a destination gets when no entry (and no default entry) matches: the same
    values except maxQueueAuditDepth 2048 and maxProducersToAudit 1024 (BaseDestination), and no
    per-subscription audit on non-durable topic subscriptions (TopicSubscription), see
    `topic_subscription_audit`. Construct from configuration with `from_attributes`.
    """

    # Producer flow control and limits (§9); memory values are bytes of Redis memory.
    producer_flow_control: bool = _attr(True)
    memory_limit: int = _attr(0, minimum=0)  # 0 = the broker-wide limit
    minimum_message_size: int = _attr(1024, minimum=0)  # a message counts at least this much
    store_usage_high_water_mark: int = _attr(100, minimum=1, maximum=100)
    send_fail_if_no_space: bool | None = _attr(None)  # None = inherit the broker setting (false)
    send_fail_if_no_space_after_timeout: int = _attr(-1, minimum=0, off=-1)  # -1 = inherit (0)
    blocked_producer_warning_interval: int = _attr(30000, minimum=0)
    max_message_size: int = _attr(1024 * 1024, minimum=1, maximum=MAX_MESSAGE_SIZE_LIMIT)
    max_property_count: int = _attr(256, minimum=0, maximum=65535)
    max_destinations: int = _attr(-1, minimum=1, off=-1)  # destinations this entry's pattern may create
    events_max_len: int = _attr(100_000, minimum=1, maximum=1_000_000)  # cap (events) of the event stream
    # Paging and expiry (§1.6, §6).
    max_page_size: int = _attr(200, minimum=1, maximum=MAX_PAGE)
    max_browse_page_size: int = _attr(400, minimum=1, maximum=MAX_PAGE)
    max_expire_page_size: int = _attr(400, minimum=1, maximum=MAX_PAGE)
    expire_messages_period: int = _attr(30000, minimum=0)  # 0 = no periodic expiry sweep
    # Dispatch (§1, §2, §3.6, §7.1).
    use_consumer_priority: bool = _attr(True)
    strict_order_dispatch: bool = _attr(False)
    prioritized_messages: bool = _attr(False)
    all_consumers_exclusive_by_default: bool = _attr(False)
    consumers_before_dispatch_starts: int = _attr(0, minimum=0)
    time_before_dispatch_starts: int = _attr(0, minimum=0)
    dispatch_policy: str = _attr("simple", choices=_DISPATCH_POLICIES)  # topics only
    # Prefetch (§1.5): applied only to consumers that kept the client default, see effective_prefetch.
    queue_prefetch: int = _attr(1000, minimum=0, maximum=MAX_PREFETCH)
    queue_browser_prefetch: int = _attr(500, minimum=0, maximum=MAX_PREFETCH)
    topic_prefetch: int = _attr(32767, minimum=0, maximum=MAX_PREFETCH)
    durable_topic_prefetch: int = _attr(100, minimum=0, maximum=MAX_PREFETCH)
    use_prefetch_extension: bool = _attr(True)
    # Message groups (§3.1). None = the default for the map type (cached 1024; bucket 1024 buckets, 64).
    message_group_map_factory_type: str = _attr("cached", choices=_GROUP_MAPS)
    group_map_cache_size: int | None = _attr(None, minimum=1)
    group_map_bucket_count: int | None = _attr(None, minimum=1)
    # Duplicate detection (§12).
    enable_audit: bool = _attr(True)
    max_queue_audit_depth: int = _attr(10000, minimum=0, maximum=1_000_000)  # ids per destination
    max_audit_depth: int = _attr(10000, minimum=0)
    max_producers_to_audit: int = _attr(64, minimum=0)
    # Redelivery (§5.3, RedeliveryPolicy); Signalbox applies it on the broker.
    maximum_redeliveries: int = _attr(6, minimum=-1)  # -1 = unlimited
    initial_redelivery_delay: int = _attr(1000, minimum=0)
    redelivery_delay: int = _attr(1000, minimum=0)
    use_exponential_back_off: bool = _attr(False)
    back_off_multiplier: float = _attr(5.0, minimum=1.0)
    maximum_redelivery_delay: int = _attr(-1, minimum=0, off=-1)  # -1 = no cap
    use_collision_avoidance: bool = _attr(False)
    # Dead letters (§5.4).
    dead_letter_strategy: str = _attr("shared", choices=_DEAD_LETTER_STRATEGIES)
    dead_letter_queue: str = _attr("ActiveMQ.DLQ")
    queue_prefix: str = _attr("ActiveMQ.DLQ.Queue.")
    topic_prefix: str = _attr("ActiveMQ.DLQ.Topic.")
    queue_suffix: str = _attr("")
    topic_suffix: str = _attr("")
    use_queue_for_queue_messages: bool = _attr(True)
    use_queue_for_topic_messages: bool = _attr(True)
    destination_per_durable_subscriber: bool = _attr(False)
    process_expired: bool = _attr(True)
    process_non_persistent: bool = _attr(False)
    dead_letter_expiration: int = _attr(0, minimum=0)  # the strategy's `expiration`; 0 = never expires
    dead_letter_enable_audit: bool = _attr(True)  # the strategy's own `enableAudit`
    # Slow consumers (§8); none by default.
    slow_consumer_strategy: str = _attr("none", choices=_SLOW_CONSUMER_STRATEGIES)
    check_period: int = _attr(30000, minimum=1)
    max_slow_duration: int = _attr(30000, minimum=0, off=-1)
    max_slow_count: int = _attr(-1, minimum=1, off=-1)
    abort_connection: bool = _attr(False)
    max_time_since_last_ack: int = _attr(30000, minimum=0, off=-1)
    ignore_idle_consumers: bool = _attr(True)
    # Advisories (§11).
    advisory_for_slow_consumers: bool = _attr(False)
    advisory_for_fast_producers: bool = _attr(False)
    advisory_for_discarding_messages: bool = _attr(False)
    advisory_when_full: bool = _attr(False)
    advisory_for_delivery: bool = _attr(False)
    advisory_for_consumed: bool = _attr(False)
    advisory_for_dispatched: bool = _attr(False)
    include_body_for_advisory: bool = _attr(False)
    send_advisory_if_no_consumers: bool = _attr(False)
    # Topics (§7.4, §7.5, §8.5).
    # Any policy is wrapped in the retained-message one (Topic.setSubscriptionRecoveryPolicy), so
    # ActiveMQ.Retain keeps working and "none" behaves like "retainedMessage".
    subscription_recovery_policy: str = _attr("retainedMessage", choices=_RECOVERY_POLICIES)
    # None = the default for the policy type: fixedCount 100 messages, fixedSized 65536 bytes.
    subscription_recovery_maximum_size: int | None = _attr(None, minimum=1)
    recover_duration: int = _attr(60000, minimum=1)
    always_retroactive: bool = _attr(False)
    pending_message_limit_strategy: str = _attr("none", choices=_PENDING_LIMIT_STRATEGIES)
    pending_message_limit: int = _attr(-1, minimum=-1)
    pending_message_limit_multiplier: float = _attr(0.5, minimum=0.0)
    message_eviction_strategy: str = _attr("oldestMessage", choices=_EVICTION_STRATEGIES)
    evict_expired_messages_high_watermark: int = _attr(1000, minimum=0)
    eviction_property_name: str = _attr("")
    offline_durable_subscriber_timeout: int = _attr(-1, minimum=0, off=-1)
    offline_durable_subscriber_task_schedule: int = _attr(300000, minimum=1, off=-1)
    # Destination lifecycle.
    gc_inactive_destinations: bool = _attr(False)
    inactive_timeout_before_gc: int = _attr(60000, minimum=0, camel="inactiveTimeoutBeforeGC")
    # Provenance, not configuration: False only for CLASS_DEFAULTS; origin names the entry that applied.
    applied: bool = field(default=True, metadata={"internal": True})
    origin: str = field(default="", compare=False, metadata={"internal": True})

    def __post_init__(self) -> None:
        not_applicable = _fill_type_defaults(self)
        for spec in _SPECS:
            if spec.camel in not_applicable:
                continue
            value = getattr(self, spec.snake)
            _check_value(spec, value)
            if spec.type == "float":
                object.__setattr__(self, spec.snake, float(value))
        _check_cross_field(self)

    @classmethod
    def from_attributes(cls, attributes: Mapping[str, Any], *, origin: str = "") -> PolicyEntry:
        """Build from camelCase configuration attributes; unset ones keep their PolicyEntry defaults."""
        explicit = normalize_attributes(attributes)
        return cls(**{_BY_CAMEL[name].snake: value for name, value in explicit.items()}, origin=origin)

    def to_attributes(self) -> dict[str, Any]:
        """Every configuration attribute under its camelCase name, with its Python value (including the
        properties of strategy types not chosen, so this is for display, not for `from_attributes`)."""
        return {spec.camel: getattr(self, spec.snake) for spec in _SPECS}

    def to_redis_hash(self) -> dict[str, str]:
        """Every attribute as a string under its camelCase name, for the per-destination Redis hash."""
        out = {spec.camel: _redis_string(getattr(self, spec.snake)) for spec in _SPECS}
        out["topicSubscriptionAudit"] = _redis_string(self.topic_subscription_audit)
        out["policyApplied"] = _redis_string(self.applied)
        out["policyOrigin"] = self.origin
        return out

    @property
    def topic_subscription_audit(self) -> bool:
        """Whether non-durable topic subscriptions keep their own duplicate audit (§12.2).

        TopicSubscription's class default is off; a matching policy turns it on with its enableAudit.
        """
        return self.applied and self.enable_audit

    def dead_letter_destination_for(
        self, destination: Destination, *, durable_subscription: str | None = None
    ) -> Destination | None:
        """Where a dead message from `destination` goes under this policy's strategy (§5.4), or None
        when the strategy discards. `durable_subscription` is `clientId:subscriptionName` for messages
        dead-lettered from a durable subscription; it is used only with destinationPerDurableSubscriber.
        Raises InvalidDestination if the resulting name is not a valid destination name (e.g. too long).
        """
        if self.dead_letter_strategy == "discarding":
            return None
        if self.dead_letter_strategy == "shared":
            return Destination("queue", self.dead_letter_queue)
        if destination.is_queue:
            prefix, suffix = self.queue_prefix, self.queue_suffix
            use_queue = self.use_queue_for_queue_messages
        else:
            prefix, suffix = self.topic_prefix, self.topic_suffix
            use_queue = self.use_queue_for_topic_messages
        name = prefix + destination.name
        if self.destination_per_durable_subscriber and durable_subscription:
            name += "." + durable_subscription
        return Destination("queue" if use_queue else "topic", name + suffix)

    def dead_letter_per_subscriber(self, destination: Destination) -> tuple[str, str] | None:
        """The dead-letter destination of a durable subscription on topic `destination` under
        destinationPerDurableSubscriber, as the URI before and after its `clientId:subscriptionName`
        (IndividualDeadLetterStrategy.createDestination:
        `<topicPrefix><topic>.<clientId>:<subscriptionName><topicSuffix>`);
        the scripts put the key between them (includes/forward.lua). None when it does not apply: another
        strategy, the flag off, a queue (only DurableTopicSubscriptions have a key), or a wildcard
        subscription's pattern (its dead letters go to the DLQ of the topic each was sent to)."""
        if (self.dead_letter_strategy != "individual" or not self.destination_per_durable_subscriber
                or not destination.is_topic or destination.is_wildcard):
            return None
        uri = self.dead_letter_destination_for(destination).uri  # ends with the suffix
        return uri[:len(uri) - len(self.topic_suffix)] + ".", self.topic_suffix


@dataclass(frozen=True)
class _Spec:
    snake: str
    camel: str
    type: str  # "bool", "int", "float", "str", "bool | None", "int | None"
    default: Any
    minimum: float | None
    maximum: float | None
    off: int | None
    choices: tuple[str, ...]


def _camel(snake: str) -> str:
    first, *rest = snake.split("_")
    return first + "".join(part.capitalize() for part in rest)


_SPECS: tuple[_Spec, ...] = tuple(
    _Spec(
        snake=f.name,
        camel=f.metadata["camel"] or _camel(f.name),
        type=str(f.type),
        default=f.default,
        minimum=f.metadata["min"],
        maximum=f.metadata["max"],
        off=f.metadata["off"],
        choices=f.metadata["choices"],
    )
    for f in fields(PolicyEntry)
    if not f.metadata.get("internal")
)
_BY_CAMEL: dict[str, _Spec] = {spec.camel: spec for spec in _SPECS}
_BY_SNAKE: dict[str, _Spec] = {spec.snake: spec for spec in _SPECS}
#: The single mapping between configuration names (camelCase, ActiveMQ's) and Python attribute names.
ATTRIBUTE_NAMES: Mapping[str, str] = types.MappingProxyType({s.camel: s.snake for s in _SPECS})

# Strategy type attributes: type -> {ActiveMQ property name in "type?prop=value" -> flat attribute}.
_DLQ_COMMON = {
    "processExpired": "processExpired",
    "processNonPersistent": "processNonPersistent",
    "expiration": "deadLetterExpiration",
    "enableAudit": "deadLetterEnableAudit",
}
_ABORT_SLOW = {
    "checkPeriod": "checkPeriod",
    "maxSlowDuration": "maxSlowDuration",
    "maxSlowCount": "maxSlowCount",
    "abortConnection": "abortConnection",
}
_EVICTION_COMMON = {"evictExpiredMessagesHighWatermark": "evictExpiredMessagesHighWatermark"}
_STRATEGIES: dict[str, dict[str, dict[str, str]]] = {
    "messageGroupMapFactoryType": {
        "cached": {"cacheSize": "groupMapCacheSize"},
        "simple": {},
        "bucket": {"bucketCount": "groupMapBucketCount", "cacheSize": "groupMapCacheSize"},
    },
    "deadLetterStrategy": {
        "shared": {"deadLetterQueue": "deadLetterQueue", **_DLQ_COMMON},
        "individual": {
            "queuePrefix": "queuePrefix",
            "topicPrefix": "topicPrefix",
            "queueSuffix": "queueSuffix",
            "topicSuffix": "topicSuffix",
            "useQueueForQueueMessages": "useQueueForQueueMessages",
            "useQueueForTopicMessages": "useQueueForTopicMessages",
            "destinationPerDurableSubscriber": "destinationPerDurableSubscriber",
            **_DLQ_COMMON,
        },
        "discarding": {},
    },
    "slowConsumerStrategy": {
        "none": {},
        "abortSlowConsumer": dict(_ABORT_SLOW),
        "abortSlowAckConsumer": {
            **_ABORT_SLOW,
            "maxTimeSinceLastAck": "maxTimeSinceLastAck",
            "ignoreIdleConsumers": "ignoreIdleConsumers",
        },
    },
    "subscriptionRecoveryPolicy": {
        "retainedMessage": {},
        "none": {},
        "lastImage": {},
        "fixedCount": {"maximumSize": "subscriptionRecoveryMaximumSize"},
        "fixedSized": {"maximumSize": "subscriptionRecoveryMaximumSize"},
        "timed": {"recoverDuration": "recoverDuration"},
    },
    "pendingMessageLimitStrategy": {
        "none": {},
        "constant": {"limit": "pendingMessageLimit"},
        "prefetchRate": {"multiplier": "pendingMessageLimitMultiplier"},
    },
    "messageEvictionStrategy": {
        "oldestMessage": dict(_EVICTION_COMMON),
        "oldestMessageWithLowestPriority": dict(_EVICTION_COMMON),
        "uniquePropertyMessage": {**_EVICTION_COMMON, "propertyName": "evictionPropertyName"},
    },
    "dispatchPolicy": {name: {} for name in _DISPATCH_POLICIES},
}
# ActiveMQ's XML element names, accepted as type names.
_TYPE_ALIASES: dict[str, dict[str, str]] = {
    "messageGroupMapFactoryType": {
        "cachedMessageGroupMapFactory": "cached",
        "simpleMessageGroupMapFactory": "simple",
        "messageGroupHashBucketFactory": "bucket",
    },
    "deadLetterStrategy": {
        "sharedDeadLetterStrategy": "shared",
        "individualDeadLetterStrategy": "individual",
        "discardingDeadLetterStrategy": "discarding",
    },
    "slowConsumerStrategy": {
        "abortSlowConsumerStrategy": "abortSlowConsumer",
        "abortSlowAckConsumerStrategy": "abortSlowAckConsumer",
    },
    "subscriptionRecoveryPolicy": {
        "retainedMessageSubscriptionRecoveryPolicy": "retainedMessage",
        "noSubscriptionRecoveryPolicy": "none",
        "lastImageSubscriptionRecoveryPolicy": "lastImage",
        "fixedCountSubscriptionRecoveryPolicy": "fixedCount",
        "fixedSizedSubscriptionRecoveryPolicy": "fixedSized",
        "timedSubscriptionRecoveryPolicy": "timed",
    },
    "pendingMessageLimitStrategy": {
        "constantPendingMessageLimitStrategy": "constant",
        "prefetchRatePendingMessageLimitStrategy": "prefetchRate",
    },
    "messageEvictionStrategy": {
        "oldestMessageEvictionStrategy": "oldestMessage",
        "oldestMessageWithLowestPriorityEvictionStrategy": "oldestMessageWithLowestPriority",
        "uniquePropertyMessageEvictionStrategy": "uniquePropertyMessage",
    },
    "dispatchPolicy": {
        "simpleDispatchPolicy": "simple",
        "roundRobinDispatchPolicy": "roundRobin",
        "strictOrderDispatchPolicy": "strictOrder",
        "priorityDispatchPolicy": "priority",
    },
}
# Attributes whose default depends on a type attribute; 0 where the type does not use them.
_TYPE_DEFAULTS: dict[str, tuple[str, dict[str, int]]] = {
    "groupMapCacheSize": ("messageGroupMapFactoryType", {"cached": 1024, "bucket": 64}),
    "groupMapBucketCount": ("messageGroupMapFactoryType", {"bucket": 1024}),
    "subscriptionRecoveryMaximumSize": (
        "subscriptionRecoveryPolicy",
        {"fixedCount": 100, "fixedSized": 65536},
    ),
}
# Which strategy owns each flat property attribute.
_OWNER: dict[str, str] = {
    prop: strategy
    for strategy, by_type in _STRATEGIES.items()
    for props in by_type.values()
    for prop in props.values()
}

# attributes accepted at their default (false) only; true is refused with the reason. None today:
# sendAdvisoryIfNoConsumers, the last one, is honoured (docs/broker_core.md, Advisory topics).
_ONLY_FALSE: dict[str, str] = {}

def _temporary_only(kind: str) -> str:
    return (f"it makes an entry for temporary {kind}s only, and Signalbox has no such entries; a temporary "
            f"{kind} (STOMP /temp-{kind}/) takes the {kind} entries that match its name, "
            f"ID:<connection id>:<n> ({kind} = \">\" does)")


# ActiveMQ attributes that Signalbox accepts knowingly and rejects with the reason.
_NOT_SUPPORTED = {
    "cursorMemoryHighWaterMark": "there are no in-memory cursors; pending messages are paged from Redis",
    "useCache": "there are no in-memory cursors; pending messages are paged from Redis",
    "lazyDispatch": "dispatch already fills only free prefetch slots",
    "optimizedDispatch": "there is no dispatch thread to optimise away",
    "pendingQueuePolicy": "pending messages always live in Redis",
    "pendingSubscriberPolicy": "pending messages always live in Redis",
    "pendingDurableSubscriberPolicy": "pending messages always live in Redis",
    "sendDuplicateFromStoreToDLQ": "there is no store cursor that can page in duplicates",
    "persistJMSRedelivered": "the redelivery counter always lives in Redis (as if it were true)",
    "reduceMemoryFootprint": "there is no separate message store or broker heap",
    "doOptimzeMessageStorage": "there is no separate message store or broker heap",
    "optimizeMessageStoreInFlightLimit": "there is no separate message store or broker heap",
    "gcWithNetworkConsumers": "there are no networks of brokers",
    "advancedNetworkStatisticsEnabled": "there are no networks of brokers",
    "networkBridgeFilterFactory": "there are no networks of brokers",
    "advancedMessageStatisticsEnabled": "statistics come from the lifecycle event streams",
    "useTopicSubscriptionInflightStats": "statistics come from the lifecycle event streams",
    # (a PolicyEntry attribute since ActiveMQ 5.19; Signalbox's behaviour is its default, false)
    "allowTempDestinationStealing": "only the connection that made a temporary destination may consume "
                                    "from it (as with ActiveMQ's default, false)",
    # tempQueue / tempTopic = true make an entry apply to every temporary queue / topic and to nothing else
    # (ActiveMQ's DestinationMapEntry: the pattern `>` of the temporary type)
    "tempQueue": _temporary_only("queue"),
    "tempTopic": _temporary_only("topic"),
    "messageInterceptorStrategy": "it takes a Java object",
    "messageGroupMapFactory": "it takes a Java object; use messageGroupMapFactoryType",
}


def _fail(message: str, **details: Any) -> InvalidPolicy:
    return InvalidPolicy(message, **details)


def _fill_type_defaults(entry: PolicyEntry) -> set[str]:
    """Give type-dependent attributes their type's default (0 where the type does not use them).

    Returns the attributes that do not apply, which are not range-checked.
    """
    not_applicable = set()
    for camel, (strategy, defaults) in _TYPE_DEFAULTS.items():
        spec = _BY_CAMEL[camel]
        chosen = getattr(entry, _BY_CAMEL[strategy].snake)
        if camel not in _STRATEGIES[strategy].get(chosen, {}).values():
            object.__setattr__(entry, spec.snake, 0)
            not_applicable.add(camel)
        elif getattr(entry, spec.snake) is None:
            object.__setattr__(entry, spec.snake, defaults[chosen])
    return not_applicable


def _type_name(spec: _Spec) -> str:
    return {"bool": "a boolean", "bool | None": "a boolean", "int": "an integer", "int | None": "an integer",
            "float": "a number", "str": "a string"}[spec.type]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _range_text(spec: _Spec) -> str:
    lo, hi = spec.minimum, spec.maximum
    if lo is not None and hi is not None:
        text = f"between {_number(lo)} and {_number(hi)}"
    elif lo is not None:
        text = f">= {_number(lo)}"
    else:
        text = f"<= {_number(hi)}"
    text = f"{_type_name(spec)} {text}"
    return f"{spec.off} (off) or {text}" if spec.off is not None else text


def _check_value(spec: _Spec, value: Any) -> None:
    """Check one attribute's type and range; raises InvalidPolicy naming the attribute and the value."""

    def bad(expected: str) -> InvalidPolicy:
        return _fail(f"{spec.camel} must be {expected}, got {value!r}", attribute=spec.camel, value=value)

    if spec.type in ("bool", "bool | None"):
        if not (isinstance(value, bool) or (value is None and spec.type == "bool | None")):
            raise bad("a boolean (true or false)")
        if value is True and spec.camel in _ONLY_FALSE:  # accepted only as the default
            raise _fail(f"ActiveMQ's {spec.camel} = true is not supported by Signalbox: "
                        f"{_ONLY_FALSE[spec.camel]}", attribute=spec.camel, value=value)
        return
    if spec.type == "str":
        if not isinstance(value, str):
            raise bad("a string")
        if spec.choices and value not in spec.choices:
            raise bad("one of " + ", ".join(repr(c) for c in spec.choices))
        return
    if spec.type == "float":
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise bad("a finite number")
    elif isinstance(value, bool) or not isinstance(value, int):
        raise bad("an integer")
    if spec.off is not None and value == spec.off:
        return
    too_low = spec.minimum is not None and value < spec.minimum
    if too_low or (spec.maximum is not None and value > spec.maximum):
        raise bad(_range_text(spec))


def _check_fragment(attribute: str, value: str, make_name: str) -> None:
    try:
        Destination("queue", make_name)
    except InvalidDestination as error:
        raise _fail(
            f"{attribute} {value!r} would give invalid destination names: {error.message}",
            attribute=attribute,
            value=value,
        ) from None


def _check_cross_field(entry: PolicyEntry) -> None:
    try:
        Destination("queue", entry.dead_letter_queue)
    except InvalidDestination as error:
        raise _fail(
            f"deadLetterQueue must be a queue name without a scheme: {error.message}",
            attribute="deadLetterQueue",
            value=entry.dead_letter_queue,
        ) from None
    _check_fragment("queuePrefix", entry.queue_prefix, entry.queue_prefix + "x")
    _check_fragment("topicPrefix", entry.topic_prefix, entry.topic_prefix + "x")
    _check_fragment("queueSuffix", entry.queue_suffix, "x" + entry.queue_suffix)
    _check_fragment("topicSuffix", entry.topic_suffix, "x" + entry.topic_suffix)
    name = entry.eviction_property_name
    if name and (name.strip() != name or any(unicodedata.category(c)[0] in "CZ" for c in name)):
        raise _fail(
            f"evictionPropertyName must be a message property name, got {name!r}",
            attribute="evictionPropertyName",
            value=name,
        )
    if entry.message_eviction_strategy == "uniquePropertyMessage" and not name:
        raise _fail(
            "messageEvictionStrategy 'uniquePropertyMessage' needs evictionPropertyName "
            "(the property whose newest message is kept)",
            attribute="evictionPropertyName",
            value=name,
        )


def _redis_string(value: Any) -> str:
    if value is None:
        return "-1"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def attribute_refusal(name: str) -> InvalidPolicy:
    """Why `name` is not a policy attribute: ActiveMQ's that Signalbox refuses, a snake_case or misspelt
    name (the one meant), or an unknown one."""
    if name in ("queue", "topic"):
        return _fail(f"{name!r} names the entry's pattern, not an attribute; give it as the pattern",
                     attribute=name)
    if name in _NOT_SUPPORTED:
        return _fail(
            f"ActiveMQ's {name} is not supported by Signalbox: {_NOT_SUPPORTED[name]}", attribute=name
        )
    if name in _BY_SNAKE:
        camel = _BY_SNAKE[name].camel
        return _fail(f"unknown policy attribute {name!r}; use the camelCase name {camel!r}",
                     attribute=name, suggestion=camel)
    known = list(_BY_CAMEL)
    folded = {k.lower(): k for k in known}
    suggestion = folded.get(name.lower())
    if suggestion is None:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        suggestion = close[0] if close else None
    hint = f"; did you mean {suggestion!r}?" if suggestion else ""
    return _fail(f"unknown policy attribute {name!r}{hint}", attribute=name, suggestion=suggestion)


def _convert_text(spec: _Spec, text: str, source: str) -> Any:
    """A property value from a `type?prop=value` string, converted to the attribute's type."""
    try:
        if spec.type in ("bool", "bool | None"):
            lowered = text.strip().lower()
            if lowered in ("true", "false"):
                return lowered == "true"
            raise ValueError(text)
        if spec.type in ("int", "int | None"):
            return int(text.strip())
        if spec.type == "float":
            return float(text.strip())
    except ValueError:
        raise _fail(
            f"{source}: {text!r} is not {_type_name(spec)} (for {spec.camel})",
            attribute=spec.camel,
            value=text,
        ) from None
    return text


def _parse_type(strategy: str, value: Any) -> tuple[str, dict[str, Any]]:
    """Split `type` or `type?prop=value&...` into the canonical type and flat attribute assignments."""
    spec = _BY_CAMEL[strategy]
    if not isinstance(value, str):
        raise _fail(f"{strategy} must be a string, got {value!r}", attribute=strategy, value=value)
    type_name, _, query = value.partition("?")
    type_name = type_name.strip()
    type_name = _TYPE_ALIASES.get(strategy, {}).get(type_name, type_name)
    by_type = _STRATEGIES[strategy]
    if type_name not in by_type:
        close = difflib.get_close_matches(type_name, list(by_type), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise _fail(
            f"{strategy} must be one of {', '.join(repr(t) for t in spec.choices)}, got {value!r}{hint}",
            attribute=strategy,
            value=value,
        )
    assignments: dict[str, Any] = {}
    if not query:
        return type_name, assignments
    props = by_type[type_name]
    for item in query.split("&"):
        prop, equals, text = item.partition("=")
        if not equals or not prop:
            raise _fail(
                f"{strategy} {value!r}: expected prop=value, got {item!r}", attribute=strategy, value=value
            )
        if prop not in props:
            allowed = ", ".join(props) or "no properties"
            raise _fail(
                f"{strategy} {value!r}: {type_name!r} has no property {prop!r} (it takes {allowed})",
                attribute=strategy,
                value=value,
            )
        target = props[prop]
        if target in assignments:
            raise _fail(f"{strategy} {value!r}: {prop} is given twice", attribute=strategy, value=value)
        assignments[target] = _convert_text(_BY_CAMEL[target], text, f"{strategy} {value!r}")
    return type_name, assignments


def normalize_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Validate camelCase policy attributes and return them in canonical form (flat, type names short).

    Raises InvalidPolicy for unknown names (suggesting the closest known one), wrong types, values out of
    range, properties of a strategy type other than the one chosen, and conflicting duplicate settings.
    """
    if not isinstance(attributes, Mapping):
        raise _fail(f"policy attributes must be a table/mapping, got {type(attributes).__name__}")
    explicit: dict[str, Any] = {}
    from_types: dict[str, tuple[str, Any]] = {}  # flat attribute -> (strategy, value) from type?props
    for name, value in attributes.items():
        if not isinstance(name, str):
            raise _fail(f"policy attribute names must be strings, got {name!r}", attribute=name)
        if name not in _BY_CAMEL:
            raise attribute_refusal(name)
        if name in _STRATEGIES:
            type_name, assignments = _parse_type(name, value)
            explicit[name] = type_name
            for target, target_value in assignments.items():
                from_types[target] = (name, target_value)
            continue
        spec = _BY_CAMEL[name]
        _check_value(spec, value)
        explicit[name] = float(value) if spec.type == "float" else value
    for target, (strategy, value) in from_types.items():
        spec = _BY_CAMEL[target]
        _check_value(spec, value)
        if target in explicit and explicit[target] != value:
            raise _fail(
                f"{target} is set to {explicit[target]!r} and to {value!r} (in {strategy}); give it once",
                attribute=target,
                value=value,
            )
        explicit[target] = value
    for target in explicit:
        owner = _OWNER.get(target)
        if owner is None or target == owner:
            continue
        chosen = explicit.get(owner, _BY_CAMEL[owner].default)
        if target not in _STRATEGIES[owner][chosen].values():
            using = [t for t, props in _STRATEGIES[owner].items() if target in props.values()]
            raise _fail(
                f"{target} applies only when {owner} is {' or '.join(repr(t) for t in using)}, "
                f"but {owner} is {chosen!r}",
                attribute=target,
                value=explicit[target],
            )
    return explicit


def _class_defaults() -> PolicyEntry:
    return PolicyEntry(max_queue_audit_depth=2048, max_producers_to_audit=1024, applied=False)


#: What a destination gets when no policy entry matches and there is no default entry (§13 "class default").
CLASS_DEFAULTS = _class_defaults()


def effective_prefetch(entry: PolicyEntry, kind: PrefetchKind, requested: int | None) -> int:
    """The prefetch a consumer gets (§1.5, PolicyEntry.configurePrefetch).

    `kind` is "queue", "browser" (queue browser), "topic" (non-durable) or "durable". The policy value
    replaces the consumer's only when the consumer kept the client default (`requested` is None or equals
    the default; for durable subscribers 1000, the "optimize acknowledge" default, counts too). Requests
    above 32767 are capped first, as ActiveMQ's client does, so they count as the topic default.
    """
    if kind not in CLIENT_DEFAULT_PREFETCH:
        expected = ", ".join(CLIENT_DEFAULT_PREFETCH)
        raise ValueError(f"unknown consumer kind {kind!r}; expected one of {expected}")
    default = CLIENT_DEFAULT_PREFETCH[kind]
    if requested is None:
        requested = default
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
        raise InvalidConsumer(f"prefetch must be an integer >= 0, got {requested!r}", prefetch=requested)
    requested = min(requested, MAX_PREFETCH)
    policy_value = {
        "queue": entry.queue_prefetch,
        "browser": entry.queue_browser_prefetch,
        "topic": entry.topic_prefetch,
        "durable": entry.durable_topic_prefetch,
    }[kind]
    kept_default = requested == default or (
        kind == "durable" and requested == _OPTIMIZE_DURABLE_TOPIC_PREFETCH
    )
    return policy_value if kept_default else requested


__all__ = [
    "ATTRIBUTE_NAMES",
    "CLASS_DEFAULTS",
    "CLIENT_DEFAULT_PREFETCH",
    "MAX_PREFETCH",
    "PolicyEntry",
    "attribute_refusal",
    "effective_prefetch",
    "normalize_attributes",
]
