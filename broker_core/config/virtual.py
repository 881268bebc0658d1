"""Virtual destinations' configuration (spec §10): composite queues and topics, virtual topics and mirrored
queues, from the `[virtualDestinations]` table of the configuration file. How sends are routed by it is
in broker_core/virtual.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_core.destinations import Destination, matches, parse_destination
from broker_core.errors import InvalidDestination, InvalidPolicy, InvalidSelector
from broker_core.selector import parse_selector

from .files import read_config_table

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
