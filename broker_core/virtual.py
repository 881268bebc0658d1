"""Virtual destinations (spec §10): composite queues and topics, virtual topics, mirrored queues, and
client-side composites (`A,B,topic://C`).

The configuration (`[virtualDestinations]` in the TOML file, see signalbox.example.toml) lives in Redis
(`<ns>:virtual`, JSON, with `<ns>:virtual:version`) so every process routes alike. For each send this
module works out a routing plan: the destinations that get a copy (with a selector for a
filteredDestination) and whether the message is also kept where it was sent. The send script records each
copy in the destination's forwarding hash in the same atomic step that accepts the message
(scripts/includes/virtual.lua); `operations.forward` then delivers the copies, each target's send being its
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgpack

from .destinations import Destination, matches, parse_destination
from .errors import InvalidDestination, InvalidPolicy, InvalidSelector
from .messages import RECORD_LENGTH
from .policy import read_config_table
from .resp import reply_text as _text
from .selector import parse_selector

CHECK_INTERVAL_S = 1.0  # how often a process looks for a changed configuration
VIRTUAL_TOPIC_INDEX = "vtq"  # <ns>:vtq, zset of '<topic name>|<consumer queue name>' (score 0, by lex)
# A routing plan target's flags (its 6th element, includes/virtual.lua), set by a virtualTopic entry.
COPY_SELECTOR_AWARE = 1
COPY_DROP_ON_RESOURCE_LIMIT = 2


@dataclass(frozen=True)
class ForwardTo:
    """One `forwardTo` element: a queue or topic, or a filteredDestination with its selector."""

    destination: Destination
    selector: str | None = None
    filtered: bool = False  # a filteredDestination; without a selector it never matches (ActiveMQ)
    compiled: str = ""  # the selector compiled for the scripts (broker_core.selector), once


@dataclass(frozen=True)
class CompositeDestination:
    """`compositeQueue` / `compositeTopic` (spec §10.2). `destination` may be a wildcard pattern."""

    destination: Destination
    forward_to: tuple[ForwardTo, ...]
    forward_only: bool = True
    send_when_not_matched: bool = False


@dataclass(frozen=True)
class VirtualTopic:
    """`virtualTopic` (spec §10.3): a send to a topic matching `name` is copied to every existing queue
    named `prefix + topic + postfix` (`*` in the prefix is one path element)."""

    name: str = "VirtualTopic.>"
    prefix: str = "Consumer.*."
    postfix: str = ""
    # a copy only for a queue one of whose consumers' selectors matches it
    # (SelectorAwareVirtualTopicInterceptor)
    selector_aware: bool = False
    # a copy its full queue's flow control would fail is dropped and counted, the send goes on
    drop_on_resource_limit: bool = False

    @property
    def copy_flags(self) -> int:
        """The flags a consumer queue's target in a routing plan carries (includes/virtual.lua)."""
        return (COPY_SELECTOR_AWARE if self.selector_aware else 0) | (
            COPY_DROP_ON_RESOURCE_LIMIT if self.drop_on_resource_limit else 0)

    @property
    def pattern(self) -> Destination:
        return Destination("topic", self.name)

    def consumer_queues(self, topic: Destination) -> Destination:
        return Destination("queue", self.prefix + topic.name + self.postfix)

    def topic_of(self, queue: Destination) -> str | None:
        """The topic name a consumer queue of this virtual topic listens to, or None."""
        pre = [s for s in self.prefix.split(".") if s]
        post = [s for s in self.postfix.split(".") if s]
        segments = queue.name.split(".")
        if len(segments) <= len(pre) + len(post):
            return None
        rest = segments[len(pre):len(segments) - len(post)]
        topic = Destination("topic", ".".join(rest))
        if not matches(self.pattern, topic) or not matches(self.consumer_queues(topic), queue):
            return None
        return topic.name


@dataclass(frozen=True)
class MirroredQueue:
    """`mirroredQueue` (spec §10.4): every queue's messages are also sent to topic prefix + name + postfix
    (plain concatenation, no dot added)."""

    prefix: str = "VirtualTopic.Mirror."
    postfix: str = ""

    def topic_for(self, queue: Destination) -> Destination:
        return Destination("topic", self.prefix + queue.name + self.postfix)


@dataclass(frozen=True)
class VirtualConfig:
    composites: tuple[CompositeDestination, ...] = ()
    virtual_topics: tuple[VirtualTopic, ...] = (VirtualTopic(),)
    mirrored_queue: MirroredQueue | None = None
    # The configuration as written, kept so that it can be stored and read back unchanged.
    source: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_config(cls, data: Mapping[str, Any], *, source: str = "virtualDestinations") -> VirtualConfig:
        """From the `[virtualDestinations]` table; errors name the entry and the setting."""
        if not isinstance(data, Mapping):
            raise InvalidPolicy(f"{source} must be a table")
        known = {"useVirtualTopics", "useMirroredQueues", "virtualTopic", "compositeQueue", "compositeTopic",
                 "mirroredQueue"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidPolicy(f"{source}: unknown setting {unknown[0]!r} (expected one of "
                                f"{', '.join(sorted(known))})", key=unknown[0])
        explicit = any(k in data for k in ("virtualTopic", "compositeQueue", "compositeTopic",
                                           "mirroredQueue"))
        composites: list[CompositeDestination] = []
        for kind in ("queue", "topic"):
            key = "compositeQueue" if kind == "queue" else "compositeTopic"
            for number, raw in enumerate(_tables(data, key, source), start=1):
                composites.append(_composite(raw, kind, f"{source}.{key} #{number}"))
        if explicit:
            # ActiveMQ silently ignores these flags once interceptors are configured; say so instead.
            for flag, instead in (("useVirtualTopics", f"a [[{source}.virtualTopic]] entry"),
                                  ("useMirroredQueues", f"a [{source}.mirroredQueue] table")):
                if data.get(flag) is True:
                    raise InvalidPolicy(f"{source}: {flag} = true has no effect when virtual destinations "
                                        f"are configured explicitly (as in ActiveMQ); add {instead}",
                                        key=flag)
            topics = tuple(_virtual_topic(raw, f"{source}.virtualTopic #{n}")
                           for n, raw in enumerate(_tables(data, "virtualTopic", source), start=1))
            mirror_raw = data.get("mirroredQueue")
            mirror = (_mirrored_queue(mirror_raw, f"{source}.mirroredQueue") if mirror_raw is not None
                      else None)
        else:
            topics = (VirtualTopic(),) if _flag(data, "useVirtualTopics", True, source) else ()
            mirror = MirroredQueue() if _flag(data, "useMirroredQueues", False, source) else None
        config = cls(tuple(composites), topics, mirror, dict(data))
        config._check_cycles(source)
        return config

    def _check_cycles(self, source: str) -> None:
        """A composite that forwards back to itself, directly or through others, would forward for ever.
        Every composite whose name (a pattern too: `audit.>` forwarding to `audit.all`) matches a target
        applies to the copy (composites_for), so each of them is followed."""

        def visit(composite: CompositeDestination, path: list[CompositeDestination],
                  names: list[Destination]) -> None:
            for target in composite.forward_to:
                for nxt in self.composites_for(target.destination):
                    if nxt in path:
                        loop = " -> ".join(d.uri for d in [*names[path.index(nxt):], target.destination])
                        raise InvalidPolicy(f"{source}: composite destinations forward in a circle: {loop}"
                                            f" ({nxt.destination.uri} matches {target.destination.uri})")
                    visit(nxt, [*path, nxt], [*names, target.destination])

        for composite in self.composites:
            visit(composite, [composite], [composite.destination])

    # -- routing

    def composites_for(self, dest: Destination) -> list[CompositeDestination]:
        """Every composite whose name or pattern matches `dest`: as ActiveMQ's
        VirtualDestinationInterceptor, all of them intercept the send, not only the most exact one.
        A composite never applies to one of its own targets (`audit.>` forwarding to `audit.all`): its
        copy would be forwarded to the same target again, for ever (ActiveMQ loops there)."""
        return [c for c in self.composites if c.destination.kind == dest.kind and matches(c.destination, dest)
                and all(f.destination != dest for f in c.forward_to)]

    def virtual_topics_for(self, topic: Destination) -> list[VirtualTopic]:
        return [v for v in self.virtual_topics if topic.is_topic and matches(v.pattern, topic)]

    def index_entries(self, queue: Destination) -> list[str]:
        """The virtual-topic index members for a queue (its topic and its name), if it is a consumer queue."""
        if not queue.is_queue:
            return []
        return sorted({f"{t}|{queue.name}" for v in self.virtual_topics if (t := v.topic_of(queue))})


def _tables(data: Mapping[str, Any], key: str, source: str) -> list[Mapping[str, Any]]:
    raw = data.get(key, [])
    if isinstance(raw, Mapping):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(x, Mapping) for x in raw):
        raise InvalidPolicy(f"{source}.{key} must be an array of tables ([[{source}.{key}]])", key=key)
    return raw


def _flag(data: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise InvalidPolicy(f"{where}: {key} must be true or false, got {value!r}", key=key)
    return value


def _string(data: Mapping[str, Any], key: str, default: str | None, where: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise InvalidPolicy(f"{where}: {key} must be a string, got {value!r}", key=key)
    return value


def _only(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise InvalidPolicy(f"{where}: unknown setting {unknown[0]!r} (expected one of "
                            f"{', '.join(sorted(allowed))})", key=unknown[0])


def _composite(raw: Mapping[str, Any], kind: str, where: str) -> CompositeDestination:
    _only(raw, {"name", "forwardTo", "forwardOnly", "sendWhenNotMatched", "copyMessage", "concurrentSend"},
          where)
    try:
        dest = parse_destination(_string(raw, "name", None, where), kind, allow_wildcards=True)  # type: ignore[arg-type]
    except InvalidDestination as error:
        raise InvalidPolicy(f"{where}: name: {error.message}", key="name") from None
    if dest.kind != kind:
        raise InvalidPolicy(f"{where}: name {dest.uri} is not a {kind}", key="name")
    targets = raw.get("forwardTo")
    if not isinstance(targets, list) or not targets:
        raise InvalidPolicy(f"{where} ({dest.uri}): forwardTo must be a non-empty list of destinations",
                            key="forwardTo")
    forward_to = tuple(_forward_to(t, f"{where} ({dest.uri}) forwardTo #{n}")
                       for n, t in enumerate(targets, start=1))
    if any(f.destination == dest for f in forward_to):
        raise InvalidPolicy(f"{where}: {dest.uri} forwards to itself", key="forwardTo")
    return CompositeDestination(dest, forward_to, _flag(raw, "forwardOnly", True, where),
                                _flag(raw, "sendWhenNotMatched", False, where))


def _forward_to(raw: Any, where: str) -> ForwardTo:
    try:
        if isinstance(raw, str):
            return ForwardTo(parse_destination(raw, "queue"))
        if not isinstance(raw, Mapping):
            raise InvalidPolicy(f"{where}: expected \"name\", \"topic://name\" or a table "
                                "{ queue = \"name\", selector = \"...\" }")
        _only(raw, {"queue", "topic", "selector"}, where)
        kinds = [k for k in ("queue", "topic") if k in raw]
        if len(kinds) != 1:
            raise InvalidPolicy(f"{where}: name exactly one of queue = \"...\" or topic = \"...\"")
        dest = parse_destination(_string(raw, kinds[0], None, where), kinds[0])  # type: ignore[arg-type]
        if dest.kind != kinds[0]:
            raise InvalidPolicy(f"{where}: {kinds[0]} = {raw[kinds[0]]!r} names a {dest.kind}")
        if "selector" not in raw:
            return ForwardTo(dest)
        text = _string(raw, "selector", None, where)
        if not text.strip():
            return ForwardTo(dest, None, True)  # ActiveMQ: a filteredDestination without one never matches
        return ForwardTo(dest, text, True, parse_selector(text).compiled)  # refused here, not at a send
    except InvalidDestination as error:
        raise InvalidPolicy(f"{where}: {error.message}") from None
    except InvalidSelector as error:
        raise InvalidPolicy(f"{where}: selector: {error.message}", key="selector") from None


def _virtual_topic(raw: Mapping[str, Any], where: str) -> VirtualTopic:
    _only(raw, {"name", "prefix", "postfix", "selectorAware", "dropOnResourceLimit"}, where)
    topic = VirtualTopic(_string(raw, "name", "VirtualTopic.>", where),
                         _string(raw, "prefix", "Consumer.*.", where), _string(raw, "postfix", "", where),
                         _flag(raw, "selectorAware", False, where),
                         _flag(raw, "dropOnResourceLimit", False, where))
    try:
        parse_destination(topic.name, "topic", allow_wildcards=True)
        parse_destination("x" if not topic.prefix.strip(".") and not topic.postfix.strip(".") else
                          (topic.prefix + "x" + topic.postfix), "queue", allow_wildcards=True)
    except InvalidDestination as error:
        raise InvalidPolicy(f"{where}: {error.message}") from None
    return topic


def _mirrored_queue(raw: Any, where: str) -> MirroredQueue:
    if not isinstance(raw, Mapping):
        raise InvalidPolicy(f"{where} must be a table ([{where}])")
    _only(raw, {"prefix", "postfix"}, where)
    return MirroredQueue(_string(raw, "prefix", "VirtualTopic.Mirror.", where),
                         _string(raw, "postfix", "", where))


def load_virtual_config(path: str | Path) -> VirtualConfig:
    """The `[virtualDestinations]` table of a TOML configuration file (ActiveMQ's defaults without one)."""
    return read_config_table(path, "virtualDestinations", VirtualConfig.from_config)


# -- the configuration in Redis --------------------------------------------------------------------------

def config_key(namespace: str) -> str:
    return f"{namespace}:virtual"


def configure(broker: Any, config: VirtualConfig) -> None:
    """Store the configuration for every process and rebuild the virtual-topic index of existing queues."""
    ns = broker.namespace
    pipe = broker.redis.pipeline(transaction=True)
    pipe.set(config_key(ns), json.dumps(dict(config.source)))
    pipe.incr(f"{config_key(ns)}:version")
    pipe.delete(f"{ns}:{VIRTUAL_TOPIC_INDEX}")
    members = [m for uri in broker.destinations() for m in config.index_entries(parse_destination(uri))]
    if members:
        pipe.zadd(f"{ns}:{VIRTUAL_TOPIC_INDEX}", dict.fromkeys(members, 0))
    pipe.execute()
    broker.ops.virtual.set(config, None)


class VirtualCache:
    """A process's copy of the configuration, re-read when its version moves (checked every second)."""

    def __init__(self) -> None:
        self.config = VirtualConfig()
        self.version: int | None = None
        self.checked = float("-inf")

    def set(self, config: VirtualConfig, version: int | None) -> None:
        self.config, self.version, self.checked = config, version, time.monotonic()


def routing(ops: Any) -> Any:
    """The configuration in force as `describe` shows it (an operation)."""
    return describe((yield from current(ops)))


def current(ops: Any) -> Any:
    """The configuration in force (an operation: yields Redis commands at most once a second)."""
    from .operations import Command  # operations imports this module

    cache: VirtualCache = ops.virtual
    if time.monotonic() - cache.checked < CHECK_INTERVAL_S:
        return cache.config
    key = config_key(ops.namespace)
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


# -- routing plans (used by operations.py) -----------------------------------------------------------------

MAX_WEIGHT_DEPTH = 4  # how deep plan() follows a copy's own routing to count what it stores (flow.lua)


def _targets(ops: Any, config: VirtualConfig, dest: Destination, also: Sequence[Destination],
             depth: int) -> Any:
    """(kept whatever matched, sendWhenNotMatched composites, targets): each target
    [uri, compiled selector or "", original destination or "", further copies its own routing makes,
    sendWhenNotMatched composite number or 0, and for a virtual topic's consumer queue its flags
    (COPY_SELECTOR_AWARE, COPY_DROP_ON_RESOURCE_LIMIT)] (the plan's layout, includes/virtual.lua)."""
    from .operations import Command

    targets: list[list[Any]] = []
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
            _, _, nested = yield from _targets(ops, config, parse_destination(t[0]), (), depth + 1)
            t[3] = sum(1 + n[3] for n in nested)
    return keep, groups, unique


def plan(ops: Any, dest: Destination, also: Sequence[Destination] = ()) -> Any:
    """The packed routing plan for a send to `dest` (None: no copies), `also` being the other parts of a
    client-side composite (layout: _targets, includes/virtual.lua)."""
    config: VirtualConfig = yield from current(ops)
    keep, groups, targets = yield from _targets(ops, config, dest, also, 0)
    if not targets and keep and not groups:
        return None
    return msgpack.packb([0 if keep else 1, groups, *targets])


def origin(ops: Any, dest: Destination, kind: str, also: Sequence[Destination] = ()) -> Any:
    """The send script's origin argument for a send to `dest`: `kind`, with the routing plan if any."""
    packed = yield from plan(ops, dest, also)
    return kind if packed is None else kind.encode() + b"+" + packed


def on_created(ops: Any, dest: Destination) -> Any:
    """A new queue that is a virtual topic's consumer queue starts receiving the topic's copies now
    (messages sent before it existed are not kept for it, as in ActiveMQ)."""
    from .operations import Command

    config: VirtualConfig = yield from current(ops)
    members = config.index_entries(dest)
    if members:
        yield Command(("ZADD", f"{ops.namespace}:{VIRTUAL_TOPIC_INDEX}",
                       *[x for m in members for x in (0, m)]))


def on_deleted(ops: Any, dest: Destination) -> Any:
    from .operations import Command

    if dest.is_queue:
        config: VirtualConfig = yield from current(ops)
        members = config.index_entries(dest)
        if members:
            yield Command(("ZREM", f"{ops.namespace}:{VIRTUAL_TOPIC_INDEX}", *members))


def forward_copy(blob: bytes, original: str) -> bytes:
    """The copy a virtual destination's target receives: the message as sent, with its original
    destination set when the configuration says so (composites and virtual topics).

    A repeating scheduled message's copies are made each time its job fires (lifecycle.lua
    fire_scheduled), never at its send, so a copy that still carries a repeat is one firing: like the
    firing ActiveMQ's scheduler re-sends (SchedulerBroker.scheduledJob), it loses its delay, period and
    repeat, so its target delivers it now and schedules nothing again."""
    record = msgpack.unpackb(blob, raw=True)
    fired = len(record) >= RECORD_LENGTH and bool(record[19])
    if not original and not fired:
        return blob
    if original:
        record[16] = original
    if fired:
        record[17:20] = [0, 0, 0]
    return msgpack.packb(record, use_bin_type=False)


class CompositeParts(list):  # type: ignore[type-arg]
    """The parts of a client-side composite; `uri` names the composite itself (its messages' original
    destination, as CompositeDestinationBroker.send sets it)."""

    uri: str = ""


def split_composite(text: str) -> CompositeParts | None:
    """The parts of a client-side composite (`A,B,topic://C`), or None for a single destination."""
    from .destinations import parse_composite

    if "," not in text:
        return None
    parts = CompositeParts(dict.fromkeys(parse_composite(text)))  # ActiveMQ keeps them in a set
    if not parts:
        raise InvalidDestination(f"composite destination {text!r} names no destination")
    kind = "topic" if text.strip().startswith("topic://") else "queue"
    parts.uri = f"{kind}://" + ",".join(p.name if p.kind == kind else p.uri for p in parts)
    return parts


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


def send_composite(ops: Any, parts: list[Destination], messages: list[Any], now: int,
                   tx: str | None = None) -> Any:
    """A client-side composite send (spec §10.1). The first queue part (else the first topic) takes the
    send, and in the same atomic step records copies for the other parts, so a crash cannot leave some
    parts without it. Each part's message has the composite as its original destination."""
    uri = getattr(parts, "uri", "")
    if uri:
        messages = [replace(m, original_destination=uri) for m in messages]
    if tx:
        ids: list[str] = []
        for part in parts:
            ids = yield from ops.tx_send(tx, part, messages, now)
        return ids
    entry = next((p for p in parts if p.is_queue), parts[0])
    return (yield from ops.send(entry, messages, now, tuple(p for p in parts if p != entry)))
