"""Typed errors raised by broker_core; each names what is wrong so adapters can show it as is."""

from __future__ import annotations


class BrokerError(Exception):
    """Base class. `code` is a stable machine-readable name used by the adapters."""

    code = "broker_error"

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class InvalidSelector(BrokerError):
    """A selector that does not parse or type-check; `position` is the 1-based column."""

    code = "invalid_selector"

    def __init__(self, message: str, position: int | None = None, expected: str | None = None) -> None:
        where = f" at position {position}" if position is not None else ""
        super().__init__(f"{message}{where}", position=position, expected=expected)
        self.position = position
        self.expected = expected


class InvalidDestination(BrokerError):
    code = "invalid_destination"


class InvalidMessage(BrokerError):
    code = "invalid_message"


class MessageTooLarge(InvalidMessage):
    code = "message_too_large"


class UnknownConsumer(BrokerError):
    code = "unknown_consumer"


class UnknownDestination(BrokerError):
    code = "unknown_destination"


class NotInFlight(BrokerError):
    """An acknowledgement for a message the consumer does not hold."""

    code = "not_in_flight"


class InvalidConsumer(BrokerError):
    code = "invalid_consumer"


class InvalidPolicy(BrokerError):
    code = "invalid_policy"


class TransactionError(BrokerError):
    code = "transaction_error"


class TransactionTooLarge(TransactionError):
    """A send or ack that would take its transaction past one of its limits (ops/transactions.py
    TransactionLimits): refused before anything changed, the transaction as it was. `details` name the
    `setting`, its `limit`, what it counts (`what`) and what the transaction would have held (`held`)."""

    code = "transaction_too_large"


class TooManyConsumers(BrokerError):
    """A queue consumer's add past the queue's limit (SIGNALBOX_MAX_CONSUMERS, Context.max_consumers): the
    dispatch pass and an add that sorts the order read every consumer, so their number bounds a call's
    work. Refused before anything changed; `details` name the `setting`, its `limit` and the
    `destination`. ActiveMQ has no such limit."""

    code = "too_many_consumers"


class UnknownMessage(BrokerError):
    code = "unknown_message"


class OperationRefused(BrokerError):
    """An operator's operation that cannot apply here (not a DLQ, message in flight, same target...)."""

    code = "operation_refused"


class DurableSubscriptionInUse(BrokerError):
    """A durable subscription that has an active consumer (ActiveMQ's "Durable consumer is in use")."""

    code = "durable_in_use"


class UnknownSubscription(BrokerError):
    """No durable subscription with that client id and name (ActiveMQ's InvalidDestinationException)."""

    code = "unknown_subscription"


class ConnectionRegistryFull(BrokerError):
    """The connection registry holds its limit (SIGNALBOX_CONNECTION_REGISTRY_LIMIT): a new connection is
    refused rather than left out of the list (broker_core/connections.py)."""

    code = "connection_registry_full"


RETRY_AFTER_S = 1.0  # what adapters tell a refused producer (HTTP Retry-After)


class ResourceAllocationError(BrokerError):
    """A send refused by producer flow control (ActiveMQ's ResourceAllocationException). `details` name
    the destination, which limit (`scope` "destination" or "broker"), the limit and usage in bytes, what
    the send needed, how long it waited, and `retry_after` (seconds) for the adapters (HTTP 503)."""

    code = "resource_limit"

    @property
    def retry_after(self) -> float:
        return float(self.details.get("retry_after", RETRY_AFTER_S))


class RedisMaxMemory(ResourceAllocationError):
    """Redis itself refused the call's first write: its used memory is over its `maxmemory`, and with
    `maxmemory-policy noeviction` (the embedded server's, signalbox/embedded_redis.py) it refuses writes
    rather than evict a key. The backstop behind the limits above, which count message bytes only: the
    call changed nothing (a script is refused before its first write), nothing stored is lost, and
    consumers can still drain what is there."""

    code = "redis_maxmemory"


REDIS_MAXMEMORY_TEXT = (
    "Redis is at its maxmemory (maxmemory-policy noeviction): the call was refused and stored nothing; "
    "nothing already stored is lost. Consume or purge messages, or give Redis more memory "
    "(SIGNALBOX_REDIS_MAXMEMORY for the embedded server)")


def is_redis_maxmemory(text: str) -> bool:
    """Whether a Redis error reply is its maxmemory refusal (a command's, or a script's first write's). The
    reply starts "OOM command not allowed when used memory > 'maxmemory'"; redis-py's OutOfMemoryError
    keeps the text without its "OOM" code, so the words after it are what is looked for."""
    return "command not allowed when used memory" in text
