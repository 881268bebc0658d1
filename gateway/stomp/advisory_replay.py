"""What ActiveMQ's AdvisoryBroker tells a new subscriber of an advisory topic about the present: one
ConsumerInfo per consumer that exists now (ActiveMQ.Advisory.Consumer.Queue.X, with the current
consumerCount; a queue's open browsers too, browser=true, at most REPLAY_LIMIT of them), one DestinationInfo
(operationType 0) per existing queue or topic (ActiveMQ.Advisory.Queue, ActiveMQ.Advisory.Topic), per
existing temporary queue or topic (ActiveMQ.Advisory.TempQueue, .TempTopic: each destination is advised on
its type's topic alone, advisory.destination_topic). Only the new subscriber gets them; they are built by
broker_core.ops.advisory.build, the one place advisory messages are made, from the state the broker reports
now.

Bounded: at most REPLAY_LIMIT destinations are read and replayed (broker.destination_names: one ZRANGE); a
broker with more replays the oldest REPLAY_LIMIT (the registry is ordered by creation)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgpack

from broker_core.broker import advisory
from broker_core.destinations import Destination, parse_destination
from broker_core.errors import BrokerError
from broker_core.messages import Delivery, unpack_delivery

REPLAY_LIMIT = 1000


async def replay(broker: Any, topic: Destination) -> list[Delivery]:
    """The advisories a new subscriber of `topic` gets at once (none for other advisory topics)."""
    if not advisory.is_advisory(topic):
        return []
    name = topic.name[len(advisory.PREFIX):]
    now = int(time.time() * 1000)
    events: list[dict[str, Any]] = []
    if name in advisory.DESTINATION_TOPICS.values():
        for uri in await broker.destination_names(REPLAY_LIMIT):
            dest = parse_destination(uri, allow_wildcards=True)
            if advisory.destination_topic(dest) == topic and not advisory.is_advisory(dest):
                events.append({"advisory": "Destination", "type": "destination_add", "uri": dest.uri,
                               "fields": {}, "ts": now})
    elif name.startswith(("Consumer.Queue.", "Consumer.Topic.")):
        kind = "queue" if name.startswith("Consumer.Queue.") else "topic"
        dest = Destination(kind, name.split(".", 2)[2])
        try:
            stats = await broker.stats(dest)
        except BrokerError:  # no such destination: nobody consumes from it
            stats = None
        consumers = stats.consumers if stats is not None else []
        # (a queue's count has its open browsers, as the advisories the scripts record: advisory.lua)
        count = stats.consumer_count if stats is not None and not dest.is_topic else len(consumers)
        for c in consumers:
            events.append(_consumer_add(dest, count, now, consumer=c.consumer_id, prefetch=str(c.prefetch),
                                        priority=str(c.priority), exclusive="1" if c.exclusive else "0",
                                        selector=c.selector or ""))
        # a queue's open browsers are consumers to ActiveMQ's AdvisoryBroker too (ConsumerInfo browser=true)
        for b in await broker.browsers(dest, REPLAY_LIMIT) if stats is not None and stats.browsers else ():
            events.append(_consumer_add(dest, count, now, consumer=b.browser_id, prefetch=str(b.prefetch),
                                        priority="0", exclusive="0", selector=b.selector or "", browser="1"))
    deliveries = []
    for event in events:
        advisory_id = f"ID:advisory:replay:{uuid.uuid4().hex[:16]}"
        blob = advisory.build(advisory_id, msgpack.packb(event), b"", now)
        deliveries.append(unpack_delivery(advisory_id, topic.uri, "", blob, 0, False))
    return deliveries


def _consumer_add(dest: Destination, count: int, now: int, **fields: str) -> dict[str, Any]:
    """A consumer_add event as the scripts record it (includes/advisory.lua), for advisory.build."""
    return {"advisory": "Consumer", "type": "consumer_add", "uri": dest.uri, "count": count, "ts": now,
            "fields": fields}
