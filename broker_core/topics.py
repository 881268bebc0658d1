"""Topics: subscriptions and what the Python side decides for them (docs/broker_core.md "Topics").

A topic consumer is a subscription (spec §7): non-durable ones live as long as their consumer, durable
ones are keyed by (client id, subscription name). Each subscription is run by the queue scripts under
its own key prefix inside the topic's hash tag (`<ns>:{t:name}:s:<key>`), while the message itself is
stored once on the topic with a reference count (scripts/lua/includes/topic.lua). A subscription's home
(keys.Home: the topic and the subscription key) names such a prefix, so every queue-level operation
(dispatch, sweeps, reaping, slow-consumer checks) runs on it unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

import msgpack

from .messages import ARRIVED, PUBLISHED_TO, RECORD_LENGTH, Message, TypedValue

RETAIN_PROPERTY = "ActiveMQ.Retain"
RETAINED_PROPERTY = "ActiveMQ.Retained"


def non_durable_key(consumer_id: str) -> str:
    return f"c.{consumer_id}"


def durable_key(client_id: str, subscription_name: str) -> str:
    """A key made only of safe characters, whatever the client id and name contain."""
    digest = hashlib.sha1(durable_registry_field(client_id, subscription_name).encode()).hexdigest()[:24]
    return f"d.{digest}"


def is_durable_key(key: str) -> bool:
    """Whether a subscription's key is a durable subscription's (durable_key), not a consumer's own."""
    return key.startswith("d.")


def durable_registry_field(client_id: str, subscription_name: str) -> str:
    """(client id, subscription name) as one string, told apart for every pair: the client id's length
    comes first, so no character the two may contain (NUL included) can make two pairs meet."""
    return f"{len(client_id)}:{client_id}{subscription_name}"


def wildcard_copy(blob: bytes, published_to: str) -> bytes:
    """The copy a wildcard subscription's pseudo-topic receives (scripts/lua/includes/wildcard.lua records
    it): the message as sent, plus the topic it was published to, which its consumers see as its
    destination (Delivery.destination, STOMP `destination`) while `original_destination` stays the
    message's own."""
    record = msgpack.unpackb(blob, raw=True)
    arrived = record[ARRIVED] if len(record) > ARRIVED else None  # (kept: the message's, ActiveMQ's too)
    record += [None] * (RECORD_LENGTH - len(record))
    del record[PUBLISHED_TO:]
    record.append(published_to)
    if arrived is not None:
        record.append(arrived)
    return msgpack.packb(record, use_bin_type=False)


def _is_true(value: Any) -> bool:
    if isinstance(value, TypedValue):
        value = value.value
    if isinstance(value, bool):
        return value
    return isinstance(value, str) and value.strip().lower() == "true"


def pack_for_topic(message: Message, now: int) -> tuple[str, bytes, str, bytes]:
    """(id, packed, retain, retained copy) for topic_send.lua.

    RetainedMessageSubscriptionRecoveryPolicy (§7.5): a message with `ActiveMQ.Retain=true` and a
    non-empty body becomes the topic's retained message ("set"), one with an empty body clears it
    ("clear"). The property is stripped from what is published; the retained copy, replayed to
    retroactive subscribers, carries `ActiveMQ.Retained=true`.
    """
    retain_value = message.properties.get(RETAIN_PROPERTY)
    if retain_value is None or not _is_true(retain_value):
        message_id, blob = message.pack(now)
        return message_id, blob, "", b""
    published = dict(message.properties)
    del published[RETAIN_PROPERTY]
    message_id, blob = dataclasses.replace(message, properties=published).pack(now)
    if not message.body:
        return message_id, blob, "clear", b""
    retained = dict(published)
    retained[RETAINED_PROPERTY] = True
    _, copy = dataclasses.replace(message, message_id=message_id, properties=retained).pack(now)
    return message_id, blob, "set", copy


@dataclass(frozen=True)
class SubscriptionStats:
    """A topic subscription as the console shows it (spec §14.4, DurableSubscriptionView)."""

    key: str
    durable: bool
    client_id: str | None
    subscription_name: str | None
    selector: str | None
    no_local: bool
    consumer_id: str | None  # the active consumer; None while a durable subscription is offline
    active: bool
    offline_since: int | None
    created: int
    pending: int  # waiting for the subscriber (ActiveMQ's PendingQueueSize)
    in_flight: int  # dispatched, not yet acknowledged
    parked: int  # waiting for a redelivery delay or a scheduled time
    enqueued: int
    dispatched: int
    dequeued: int
    evicted: int  # ActiveMQ's DiscardedCount: by the eviction strategy (§8.5), or expired while pending (§6)
    dropped: int  # dropped by a pending-message limit of 0, §8.5
    expired: int
    deadlettered: int
    discarded: int  # dead letters the strategy dropped
    prefetch: int
    slow_since: int | None
    retroactive: bool  # its consumer replayed the recovery policy when it attached (§7.5)
    # the pending-message limit in force (§8.5): the strategy's constant or prefetch × multiplier, or the
    # consumer's own smaller maximumPendingMessageLimit; -1 = unlimited (also every durable subscription)
    pending_message_limit: int
