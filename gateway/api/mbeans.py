"""The MBeans the Jolokia view shows (gateway/api/jolokia.py): ActiveMQ's broker view and destination
views (spec §14), named as ActiveMQ names them and with the attributes Signalbox's statistics give.

Names: `org.apache.activemq:type=Broker,brokerName=<SIGNALBOX_BROKER_NAME>` and, per destination,
`…,destinationType=Queue|Topic|TempQueue|TempTopic,destinationName=<name>`, each part encoded as
ActiveMQ's JMXSupport.encodeObjectNamePart does (`:`, `,`, `'` and `"` become `_`; `?` `&qe;`, `=`
`&amp;`, `*` `&ast;`). A name holding `_` (or `&`: `k&amp;v` is also a name as written) may stand for
several destinations' names: it designates every destination whose encoded name it is (ActiveMQ would
have registered only the first of them).

Values: a destination's from its summary (DestinationSummary, the counters the metrics scrape reads: one
small script call per page of destinations, fresh at the read); the broker's from the console's totals
over the destinations the user may read (gateway/api/destination_index.py, at most 5 s old). Attributes
ActiveMQ has that Signalbox keeps no figure for are not shown (a read naming one answers
AttributeNotFoundException, as for any unknown name), except ProducerCount: 0, which is what ActiveMQ
shows for the producers of STOMP and REST clients (anonymous producers, counted on no destination), the
only producers Signalbox has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker_core.broker import advisory
from broker_core.destinations import Destination, parse_destination
from broker_core.errors import BrokerError
from broker_core.model import DestinationSummary, percent
from gateway.api.destination_index import is_dead_letter_queue
from gateway.api.object_names import ObjectName, object_name

DOMAIN = "org.apache.activemq"
TYPES = {("queue", False): "Queue", ("topic", False): "Topic", ("queue", True): "TempQueue",
         ("topic", True): "TempTopic"}
_KINDS = {value: key for key, value in TYPES.items()}
# ActiveMQ's JMXSupport.encodeObjectNamePart, in its order
_ENCODED = ((":", "_"), (",", "_"), ("'", "_"), ('"', "_"), ("?", "&qe;"), ("=", "&amp;"), ("*", "&ast;"))
_DECODED = (("&qe;", "?"), ("&amp;", "="), ("&ast;", "*"))


def encode_part(text: str) -> str:
    for char, replacement in _ENCODED:
        text = text.replace(char, replacement)
    return text


def _decode_part(text: str) -> str:
    for encoded, char in _DECODED:
        text = text.replace(encoded, char)
    return text


BROKER = object_name(DOMAIN, [("type", "Broker"), ("brokerName", encode_part(advisory.BROKER_NAME))])
HEALTH = object_name(DOMAIN, [*BROKER.properties, ("service", "Health")])


def destination_bean(destination: Destination) -> ObjectName:
    kind = TYPES[destination.kind, destination.is_temporary]
    return object_name(DOMAIN, [*BROKER.properties, ("destinationType", kind),
                                ("destinationName", encode_part(destination.name))])


def named_destination(name: ObjectName) -> Destination | None:
    """The destination a name (no pattern) designates, read as written (None when it names none: another
    domain, broker or key). A name with `_` may also designate others (`encode_part`): the caller looks."""
    keys = {key for key, _value in name.properties}
    if any(value.startswith('"') for _key, value in name.properties):  # (JMX: `k="v"` is not `k=v`)
        return None
    if (name.domain != DOMAIN or keys != {"type", "brokerName", "destinationType", "destinationName"}
            or name.get("type") != "Broker" or name.get("brokerName") != BROKER.get("brokerName")):
        return None
    kind = _KINDS.get(name.get("destinationType") or "")
    if kind is None:
        return None
    try:
        destination = parse_destination(f"{kind[0]}://{_decode_part(name.get('destinationName') or '')}")
    except BrokerError:
        return None
    if destination.is_wildcard or destination.is_temporary != kind[1]:
        return None
    return destination


@dataclass(frozen=True)
class Bean:
    """An MBean the view shows: the broker's, its health's (ActiveMQ's HealthView), or a destination's."""

    name: ObjectName
    destination: Destination | None = None
    # a destination's counters when already read as it was found (an exact name's are, to know that it
    # exists): its values are made from them rather than asked again
    summary: DestinationSummary | None = field(default=None, compare=False)

    @property
    def attributes(self) -> frozenset[str] | None:
        """The names of its attributes when known without reading it (a destination's vary by kind)."""
        if self.name == BROKER:
            return BROKER_ATTRIBUTES
        if self.name == HEALTH:
            return HEALTH_ATTRIBUTES
        return None


def _count(field: str) -> Callable[[DestinationSummary, Destination], Any]:
    return lambda summary, _destination: getattr(summary, field)


# A destination's attributes (ActiveMQ's DestinationViewMBean names), from its summary
DESTINATION_ATTRIBUTES: dict[str, Callable[[DestinationSummary, Destination], Any]] = {
    "Name": lambda _summary, destination: destination.name,
    # (a topic's is always 0 in ActiveMQ, AMQ-2586: its messages wait per subscription)
    "QueueSize": lambda summary, destination: summary.queue_size if destination.is_queue else 0,
    "EnqueueCount": _count("enqueued"),
    "DequeueCount": _count("dequeued"),
    "DispatchCount": _count("dispatched"),
    "InFlightCount": _count("in_flight"),
    "ExpiredCount": _count("expired"),
    "ConsumerCount": _count("consumer_count"),
    "ProducerCount": lambda _summary, _destination: 0,
    "MemoryUsageByteCount": _count("memory_usage"),
    # the limit in force (the destination's memoryLimit, else the broker's) and the whole percent of it
    # used, as ActiveMQ's destination MemoryUsage (a child of the broker's, with its limit unless its own)
    "MemoryLimit": _count("memory_limit"),
    "MemoryPercentUsage": lambda summary, _destination: percent(summary.memory_usage, summary.memory_limit),
    "DLQ": lambda _summary, destination: destination.is_queue and is_dead_letter_queue(destination.name),
    # ActiveMQ's messageSize statistic (longs: the average's fraction dropped, as ActiveMQ's cast drops it):
    # the messages counted enqueued, each at the size its memory usage counts (DestinationSummary)
    "AverageMessageSize": lambda summary, _destination: summary.message_sizes.average,
    "MinMessageSize": lambda summary, _destination: summary.message_sizes.smallest,
    "MaxMessageSize": lambda summary, _destination: summary.message_sizes.largest,
    # ActiveMQ's processTime statistic (ms; the average a double): each dispatch's time since the message
    # last reached the broker (DestinationSummary.enqueue_times)
    "AverageEnqueueTime": lambda summary, _destination: summary.enqueue_times.average,
    "MinEnqueueTime": lambda summary, _destination: summary.enqueue_times.smallest,
    "MaxEnqueueTime": lambda summary, _destination: summary.enqueue_times.largest,
}
QUEUE_ATTRIBUTES: dict[str, Callable[[DestinationSummary, Destination], Any]] = {
    "Paused": _count("paused"),
}


def destination_attributes(summary: DestinationSummary, destination: Destination) -> dict[str, Any]:
    out = {name: get(summary, destination) for name, get in DESTINATION_ATTRIBUTES.items()}
    if destination.is_queue:
        out.update((name, get(summary, destination)) for name, get in QUEUE_ATTRIBUTES.items())
    return out


BROKER_ATTRIBUTES = frozenset({
    "BrokerName", "BrokerVersion", "TotalEnqueueCount", "TotalDequeueCount", "TotalMessageCount",
    "TotalConsumerCount", "TotalProducerCount", "CurrentConnectionsCount", "TotalConnectionsCount",
    "MemoryLimit", "MemoryPercentUsage", "StoreLimit", "StorePercentUsage", "TempPercentUsage", "Queues",
    "Topics", "TemporaryQueues", "TemporaryTopics", "Persistent", "Slave", "StatisticsEnabled",
    "AverageMessageSize", "MinMessageSize", "MaxMessageSize"})
HEALTH_ATTRIBUTES = frozenset({"CurrentStatus"})
STORE_WORRY_PERCENT = 90  # ActiveMQ's HealthView worries past 90 % of the store's limit


def health_attributes(checks: dict[str, dict[str, Any]], store_used: int, store_limit: int) -> dict[str, Any]:
    """ActiveMQ's HealthView: `CurrentStatus` "Good", or "Getting Worried {<id>: <level> <message> from
    <resource> , ... }" (its HealthStatus texts). The worries here: each of /healthz's checks that fails
    (`checks`, signalbox/health.py: Redis, the database, a Celery worker, the maintenance tick), and the
    store — Redis's memory against its maxmemory, where Redis refuses writes — past 90 % of its limit, as
    ActiveMQ's for its message store."""
    worries = [f"signalbox.{name}: ERROR {check.get('error', 'failed')} from {name}"
               for name, check in checks.items() if check.get("status") != "ok"]
    if percent(store_used, store_limit) > STORE_WORRY_PERCENT:
        worries.append(f"org.apache.activemq.StoreLimit: WARNING Message Store size is within "
                       f"{percent(store_used, store_limit)}% of its limit from redis")
    if not worries:
        return {"CurrentStatus": "Good"}
    return {"CurrentStatus": "Getting Worried {" + "".join(f"{w} , " for w in worries) + " }"}


def broker_attributes(totals: dict[str, Any], listed: dict[tuple[str, bool], list[dict[str, str]]],
                      memory: Any, store: tuple[int, int], connections: tuple[int, int],
                      version: str) -> dict[str, Any]:
    """The broker's attributes (ActiveMQ's BrokerViewMBean names): `totals` as destination_index.totals
    gives them, `listed` the destinations the user may read by (kind, temporary), each as its
    {"objectName": canonical name} (the caller makes them in slices of the event loop), `memory` the
    broker's (Broker.memory), `store` Redis's (used_memory, maxmemory: 0 none), `connections` (now, since
    the registry began: Broker.connection_counts), `version` Signalbox's. No temporary store (ActiveMQ's
    spools non-persistent messages to disk there): its usage is 0. No producer is registered on a
    destination by STOMP or REST (ActiveMQ's STOMP producer is anonymous, counted on none), so the total
    is 0, as each destination's ProducerCount."""

    return {
        "BrokerName": advisory.BROKER_NAME,
        "BrokerVersion": version,
        "TotalEnqueueCount": totals["enqueued"],
        "TotalDequeueCount": totals["dequeued"],
        "TotalMessageCount": totals["queue_size"],
        "TotalConsumerCount": totals["consumers"],
        "TotalProducerCount": 0,
        "CurrentConnectionsCount": connections[0],
        "TotalConnectionsCount": connections[1],
        "MemoryLimit": memory.limit,
        "MemoryPercentUsage": memory.percent_usage,
        "StoreLimit": store[1],
        "StorePercentUsage": percent(*store),  # (the store is Redis, its limit maxmemory)
        "TempPercentUsage": 0,
        "Queues": listed.get(("queue", False), []),
        "Topics": listed.get(("topic", False), []),
        "TemporaryQueues": listed.get(("queue", True), []),
        "TemporaryTopics": listed.get(("topic", True), []),
        "Persistent": True,
        "Slave": False,
        "StatisticsEnabled": True,
        # (over the destinations the user may read, as the totals: ActiveMQ's broker statistics are the
        # parent every destination's add to)
        "AverageMessageSize": totals["message_sizes"]["average"],
        "MinMessageSize": totals["message_sizes"]["smallest"],
        "MaxMessageSize": totals["message_sizes"]["largest"],
    }
