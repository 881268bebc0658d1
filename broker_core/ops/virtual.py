"""Virtual destinations (spec §10): composite queues and topics, virtual topics, mirrored queues, and
client-side composites (`A,B,topic://C`).

The configuration (`[virtualDestinations]` in the TOML file, see signalbox.example.toml) lives in Redis
(`<ns>:virtual`, JSON, with `<ns>:virtual:version`) so every process routes alike. For each send this
module works out a routing plan: the destinations that get a copy (with a selector for a
filteredDestination) and whether the message is also kept where it was sent. The send script records each
copy in the destination's forwarding hash in the same atomic step that accepts the message
(scripts/lua/includes/virtual.lua); ops/forward.py then delivers the copies, each target's send being its
own atomic step together with the record's removal (one MULTI/EXEC), and a process that dies before it
leaves the records for the maintenance job: nothing is lost and nothing arrives twice.

As in ActiveMQ (BrokerService.createDefaultDestinationInterceptor), `useVirtualTopics` (default true, the
`VirtualTopic.>` topic fanned out to `Consumer.*.VirtualTopic.>` queues) and `useMirroredQueues` apply only
when no virtual destination is configured explicitly: configuring any `compositeQueue`, `compositeTopic`,
`virtualTopic` or `mirroredQueue` replaces the defaults, so list the virtual topic again if it is wanted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import msgpack

from ..config.virtual import VirtualConfig
from ..destinations import Destination, matches, parse_destination
from ..effects import Command, Op
from ..errors import InvalidPolicy
from ..keys import virtual_config_key
from ..resp import reply_text as _text
from .context import Context

CHECK_INTERVAL_S = 1.0  # how often a process looks for a changed configuration
VIRTUAL_TOPIC_INDEX = "vtq"  # <ns>:vtq, zset of '<topic name>|<consumer queue name>' (score 0, by lex)


# -- the configuration in Redis --------------------------------------------------------------------------

def configure(broker: Any, config: VirtualConfig) -> None:
    """Store the configuration for every process and rebuild the virtual-topic index of existing queues."""
    ns = broker.namespace
    pipe = broker.redis.pipeline(transaction=True)
    pipe.set(virtual_config_key(ns), json.dumps(dict(config.source)))
    pipe.incr(f"{virtual_config_key(ns)}:version")
    pipe.delete(f"{ns}:{VIRTUAL_TOPIC_INDEX}")
    members = [m for uri in broker.destinations() for m in config.index_entries(parse_destination(uri))]
    if members:
        pipe.zadd(f"{ns}:{VIRTUAL_TOPIC_INDEX}", dict.fromkeys(members, 0))
    pipe.execute()
    broker.ops.virtual.set(config, None)


def routing(ops: Context) -> Op:
    """The configuration in force as `describe` shows it (an operation)."""
    return describe((yield from current(ops)))


def current(ops: Context) -> Op:
    """The configuration in force (an operation: yields Redis commands at most once a second)."""
    cache = ops.virtual
    if time.monotonic() - cache.checked < CHECK_INTERVAL_S:
        return cache.config
    key = virtual_config_key(ops.namespace)
    version = yield Command(("GET", f"{key}:version"))
    version = int(version) if version is not None else 0
    if version != cache.version:
        raw = yield Command(("GET", key))
        try:
            config = VirtualConfig.from_config(json.loads(raw)) if raw else VirtualConfig()
        except (ValueError, InvalidPolicy) as error:
            raise InvalidPolicy(f"stored virtual destination configuration {key} is unreadable: "
                                f"{error}") from None
        cache.set(config, version)
    cache.checked = time.monotonic()
    return cache.config


# -- routing plans (used by the send operations) ------------------------------------------------------

MAX_WEIGHT_DEPTH = 4  # how deep plan() follows a copy's own routing to count what it stores (flow.lua)
MAX_PLANS = 10_000  # routing plans a process keeps (one per destination sent to)


def _targets(ops: Context, config: VirtualConfig, dest: Destination, also: Sequence[Destination],
             depth: int) -> Op:
    """(kept whatever matched, sendWhenNotMatched composites, targets, whether the virtual-topic index was
    read): each target [uri, compiled selector or "", original destination or "", further copies its own
    routing makes, sendWhenNotMatched composite number or 0, and for a virtual topic's consumer queue its
    flags (COPY_SELECTOR_AWARE, COPY_DROP_ON_RESOURCE_LIMIT)] (the plan's layout, includes/virtual.lua)."""
    targets: list[list[Any]] = []
    read_index = False
    composites = config.composites_for(dest)
    # Kept here unless every composite is forwardOnly; a sendWhenNotMatched one keeps it when none of
    # its own targets matched (each composite decides for itself, §10.2).
    keep = not composites or any(not c.forward_only and not c.send_when_not_matched for c in composites)
    groups = 0
    for composite in composites:
        group = 0
        if composite.send_when_not_matched:
            groups += 1
            group = groups
        for target in composite.forward_to:
            if target.filtered and not target.selector:
                continue  # a filteredDestination without a selector never matches
            targets.append([target.destination.uri, target.compiled, dest.uri, 0, group])
    if dest.is_queue and config.mirrored_queue is not None:
        targets.append([config.mirrored_queue.topic_for(dest).uri, "", "", 0, 0])
    for vt in config.virtual_topics_for(dest):
        index = f"{ops.namespace}:{VIRTUAL_TOPIC_INDEX}"
        members = yield Command(("ZRANGEBYLEX", index, f"[{dest.name}|", f"({dest.name}}}"))
        read_index = True
        wanted = vt.consumer_queues(dest)
        for member in members:
            queue = Destination("queue", _text(member).partition("|")[2])
            if matches(wanted, queue):
                targets.append([queue.uri, "", dest.uri, 0, 0, vt.copy_flags])
    # A client-side composite's other parts: their original destination is the composite, set on the
    # message itself (send_composite).
    targets += [[d.uri, "", "", 0, 0] for d in also if d != dest]
    seen: set[tuple[Any, ...]] = set()
    unique = []
    for t in targets:
        if (t[0], t[1], t[4]) not in seen:
            seen.add((t[0], t[1], t[4]))
            unique.append(t)
    if depth < MAX_WEIGHT_DEPTH:
        for t in unique:  # a copy's own copies count against the broker's limit too (flow.lua)
            _, _, nested, nested_read = yield from _targets(ops, config, parse_destination(t[0]), (),
                                                            depth + 1)
            t[3] = sum(1 + n[3] for n in nested)
            read_index = read_index or nested_read
    return keep, groups, unique, read_index


def plan(ops: Context, config: VirtualConfig, dest: Destination, also: Sequence[Destination]) -> Op:
    """The packed routing plan for a send to `dest` (None: no copies), `also` being the other parts of a
    client-side composite (layout: _targets, includes/virtual.lua). A plan made from the configuration
    alone is kept until the configuration changes (`origin` looks there first); one that read the
    virtual-topic index, which changes as consumer queues come and go, is made again each time."""
    keep, groups, targets, read_index = yield from _targets(ops, config, dest, also, 0)
    packed = None if not targets and keep and not groups else msgpack.packb([0 if keep else 1, groups,
                                                                             *targets])
    if not read_index:
        plans = ops.virtual.plans
        if len(plans) >= MAX_PLANS:  # (destinations come and go: temporary queues, say)
            plans.clear()
        plans[(dest.uri, tuple(also))] = packed
    return packed


def origin(ops: Context, dest: Destination, kind: str, also: Sequence[Destination] = ()) -> Op:
    """The send script's origin argument for a send to `dest`: `kind`, with the routing plan if any."""
    config: VirtualConfig = yield from current(ops)
    plans = ops.virtual.plans
    key = (dest.uri, tuple(also))
    packed = plans[key] if key in plans else (yield from plan(ops, config, dest, also))
    return kind if packed is None else kind.encode() + b"+" + packed


def on_created(ops: Context, dest: Destination) -> Op:
    """A new queue that is a virtual topic's consumer queue starts receiving the topic's copies now
    (messages sent before it existed are not kept for it, as in ActiveMQ)."""
    config: VirtualConfig = yield from current(ops)
    members = config.index_entries(dest)
    if members:
        yield Command(("ZADD", f"{ops.namespace}:{VIRTUAL_TOPIC_INDEX}",
                       *[x for m in members for x in (0, m)]))


def on_deleted(ops: Context, dest: Destination) -> Op:
    if dest.is_queue:
        config: VirtualConfig = yield from current(ops)
        members = config.index_entries(dest)
        if members:
            yield Command(("ZREM", f"{ops.namespace}:{VIRTUAL_TOPIC_INDEX}", *members))


def describe(config: VirtualConfig) -> list[dict[str, Any]]:
    """The routing as the console and APIs show it: one row per virtual destination."""
    rows: list[dict[str, Any]] = []
    for c in config.composites:
        rows.append({"type": f"composite{c.destination.kind.capitalize()}", "name": c.destination.uri,
                     "forwardTo": [{"destination": f.destination.uri, "selector": f.selector}
                                   for f in c.forward_to],
                     "forwardOnly": c.forward_only, "sendWhenNotMatched": c.send_when_not_matched})
    for v in config.virtual_topics:
        rows.append({"type": "virtualTopic", "name": v.pattern.uri, "prefix": v.prefix, "postfix": v.postfix,
                     "selectorAware": v.selector_aware, "dropOnResourceLimit": v.drop_on_resource_limit})
    if config.mirrored_queue:
        rows.append({"type": "mirroredQueue", "prefix": config.mirrored_queue.prefix,
                     "postfix": config.mirrored_queue.postfix})
    return rows
