"""The policy map: configured entries by destination pattern, resolved the way ActiveMQ's PolicyMap does
(spec §10.5), and the `[policy]` table of the configuration file."""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_core.destinations import (
    Destination,
    DestinationKind,
    covers,
    matches,
    parse_composite,
    parse_destination,
)
from broker_core.errors import InvalidDestination, InvalidPolicy

from .entry import CLASS_DEFAULTS, DEFAULT_ENTRY_ID, PolicyEntry, attribute_refusal, normalize_attributes
from .files import read_config_table


@dataclass(frozen=True)
class PolicyMapEntry:
    """One configured entry: a (possibly wildcard) destination pattern and the attributes it sets."""

    destination: Destination
    attributes: Mapping[str, Any]
    policy: PolicyEntry

    @classmethod
    def create(cls, kind: str, pattern: str, attributes: Mapping[str, Any]) -> PolicyMapEntry:
        """Validate and build; errors are prefixed with the entry (`policy entry queue://orders.>: ...`)."""
        destination = pattern_destination(kind, pattern)
        try:
            return cls._build(destination, attributes)
        except InvalidPolicy as error:
            raise in_context(error, f"policy entry {destination.uri}") from None

    @classmethod
    def _build(cls, destination: Destination, attributes: Mapping[str, Any]) -> PolicyMapEntry:
        explicit = normalize_attributes(attributes)
        policy = PolicyEntry.from_attributes(explicit, origin=destination.uri)
        return cls(destination, types.MappingProxyType(explicit), policy)

    @property
    def id(self) -> str:
        """Stable identity (the Redis hash field): the pattern's URI, e.g. `queue://orders.>`."""
        return self.destination.uri

    @property
    def kind(self) -> DestinationKind:
        return self.destination.kind

    @property
    def pattern(self) -> str:
        return self.destination.name


def pattern_destination(kind: str, pattern: str) -> Destination:
    """The destination pattern an entry is for (checked: its kind, its wildcards)."""
    if kind not in ("queue", "topic"):
        raise InvalidPolicy(f"policy entry kind must be 'queue' or 'topic', got {kind!r}", kind=kind)
    destination = parse_destination(pattern, kind, allow_wildcards=True)
    if destination.kind != kind:
        raise InvalidDestination(
            f"pattern {pattern!r} names a {destination.kind} but the entry is for a {kind}",
            pattern=pattern,
            kind=kind,
        )
    return destination


def in_context(error: InvalidPolicy, context: str) -> InvalidPolicy:
    """The same error, its message prefixed with where it was found."""
    return InvalidPolicy(f"{context}: {error.message}", **{**error.details, "context": context})


def _java_order(entry: PolicyMapEntry) -> bytes:
    # ActiveMQ breaks ties with String.compareTo, which compares UTF-16 code units.
    return entry.destination.name.encode("utf-16-be")


class PolicyMap:
    """Policy entries keyed by destination pattern, resolved the way ActiveMQ's PolicyMap does.

    Resolution (ActiveMQ `DestinationMap.chooseValue` and `PolicyMap.getEntryFor`, spec §10.5):

    1. Candidates are the entries of the destination's kind whose pattern matches it (`matches`).
    2. An entry naming exactly the destination wins.
    3. Otherwise the most specific pattern wins: an entry whose pattern covers another candidate's is
       passed over (`orders.eu.>` beats `orders.>`, which beats `>`). Between candidates where neither
       covers the other (`orders.*` and `*.eu`) the smaller name in Java's String order wins, because
       ActiveMQ sorts candidates with `ActiveMQDestination.compare` and takes the first.
    4. Exactly one entry applies: attributes of less specific entries are NOT merged in; whatever the
       winning entry does not set has the PolicyEntry default.
    5. No candidate: the default entry if there is one, else `CLASS_DEFAULTS`.

    Where ActiveMQ differs: it decides "more specific" by running one pattern's filter over the other's
    name, which treats `*` in the other pattern as matching anything. Under that test `orders.>` and
    `*.>` (or `a.*` and `a.>`) "match" each other and ActiveMQ's choice depends on hash-set order; Signalbox
    uses true pattern inclusion (`covers`), so the choice is deterministic: `orders.>` and `a.*` win.
    """

    def __init__(self, entries: Iterable[PolicyMapEntry] = (), default: Mapping[str, Any] | None = None):
        self._entries: tuple[PolicyMapEntry, ...] = tuple(entries)
        seen: set[str] = set()
        for entry in self._entries:
            if entry.id in seen:
                raise InvalidPolicy(
                    f"two policy entries for {entry.id}; give each pattern once", entry=entry.id
                )
            seen.add(entry.id)
        self._by_kind: dict[str, list[PolicyMapEntry]] = {"queue": [], "topic": []}
        for entry in self._entries:
            self._by_kind[entry.kind].append(entry)
        self._default_attributes: Mapping[str, Any] | None = None
        self._default: PolicyEntry | None = None
        if default is not None:
            try:
                explicit = normalize_attributes(default)
            except InvalidPolicy as error:
                raise in_context(error, "default policy entry") from None
            self._default_attributes = types.MappingProxyType(explicit)
            self._default = PolicyEntry.from_attributes(explicit, origin=DEFAULT_ENTRY_ID)
        self._cache: dict[Destination, PolicyEntry] = {}

    @classmethod
    def from_config(cls, data: Mapping[str, Any], *, source: str = "policy") -> PolicyMap:
        """Build from the `[policy]` table of a configuration file (see signalbox.example.toml):
        `default` (a table of attributes) and `entry` (an array of tables, each with `queue` or `topic`).
        A composite pattern (`queue = "a.>,b.>"`) makes one entry per part, as ActiveMQ's DestinationMap does.
        """
        if not isinstance(data, Mapping):
            raise InvalidPolicy(f"{source} must be a table, got {type(data).__name__}")
        for key in data:
            if key not in ("default", "entry"):
                close = difflib.get_close_matches(str(key), ["default", "entry"], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise InvalidPolicy(
                    f"{source}: unknown key {key!r}{hint} (expected 'default' and 'entry')", key=key
                )
        default = data.get("default")
        if default is not None and not isinstance(default, Mapping):
            raise InvalidPolicy(f"{source}.default must be a table of attributes", key="default")
        raw_entries = data.get("entry", [])
        if not isinstance(raw_entries, list):
            raise InvalidPolicy(f"{source}.entry must be an array of tables ([[policy.entry]])", key="entry")
        entries: list[PolicyMapEntry] = []
        for number, raw in enumerate(raw_entries, start=1):
            where = f"{source}.entry #{number}"
            if not isinstance(raw, Mapping):
                raise InvalidPolicy(f"{where} must be a table", entry=number)
            kinds = [k for k in ("queue", "topic") if k in raw]
            temporary = [k for k in ("tempQueue", "tempTopic") if k in raw]
            if not kinds and temporary:  # ActiveMQ's entry for temporary destinations only
                refusal = attribute_refusal(temporary[0])
                raise InvalidPolicy(
                    f"{where}: {refusal.message}; an entry names queue = \"pattern\" or topic = \"pattern\"",
                    **{**refusal.details, "entry": number},
                )
            if len(kinds) != 1:
                raise InvalidPolicy(
                    f"{where} must name exactly one of queue = \"pattern\" or topic = \"pattern\"",
                    entry=number,
                )
            kind = kinds[0]
            pattern = raw[kind]
            attributes = {k: v for k, v in raw.items() if k != kind}
            try:
                if not isinstance(pattern, str):
                    raise InvalidDestination(f"{kind} must be a string pattern, got {pattern!r}")
                parts = parse_composite(pattern, kind, allow_wildcards=True)
                for part in parts:
                    if part.kind != kind:
                        raise InvalidDestination(f"{kind} = {pattern!r} names a {part.kind} ({part.uri})")
                    entries.append(PolicyMapEntry._build(part, attributes))
            except (InvalidPolicy, InvalidDestination) as error:
                raise InvalidPolicy(
                    f"{where} ({kind} = {pattern!r}): {error.message}", **{**error.details, "entry": number}
                ) from None
        try:
            return cls(entries, default)
        except InvalidPolicy as error:
            raise InvalidPolicy(f"{source}: {error.message}", **error.details) from None

    def to_config(self) -> dict[str, Any]:
        """The `[policy]` table for this map; `PolicyMap.from_config(m.to_config())` rebuilds it."""
        data: dict[str, Any] = {}
        if self._default_attributes is not None:
            data["default"] = dict(self._default_attributes)
        data["entry"] = [{e.kind: e.pattern, **e.attributes} for e in self._entries]
        return data

    @property
    def entries(self) -> tuple[PolicyMapEntry, ...]:
        return self._entries

    @property
    def default(self) -> PolicyEntry | None:
        return self._default

    @property
    def default_attributes(self) -> Mapping[str, Any] | None:
        return self._default_attributes

    def __len__(self) -> int:
        return len(self._entries)

    def matching_entries(self, destination: Destination) -> list[PolicyMapEntry]:
        """Every entry that matches `destination`, the one that applies first, then in resolution order.

        A temporary destination takes the entries that match its name as an ordinary queue or topic
        (`with_temporary`), unlike ActiveMQ's PolicyMap, where only tempQueue / tempTopic entries apply to
        one: those entries are not supported here, and without them a temporary destination could only
        ever have the default entry's values (docs/broker_core.md "Temporary destinations")."""
        rest = [e for e in self._by_kind[destination.kind]
                if matches(e.destination, destination, with_temporary=True)]
        ranked = [e for e in rest if e.destination == destination]
        rest = [e for e in rest if e.destination != destination]
        while rest:
            most_specific = [
                e for e in rest
                if not any(o is not e and covers(e.destination, o.destination) for o in rest)
            ]
            best = min(most_specific, key=_java_order)
            ranked.append(best)
            rest.remove(best)
        return ranked

    def entry_for(self, destination: Destination) -> PolicyMapEntry | None:
        """The entry that applies to `destination`, or None (then the default entry or class defaults)."""
        candidates = self.matching_entries(destination)
        return candidates[0] if candidates else None

    def resolve(self, destination: Destination) -> PolicyEntry:
        """The policy values in force for `destination` (see the class docstring for the rule)."""
        cached = self._cache.get(destination)
        if cached is not None:
            return cached
        entry = self.entry_for(destination)
        if entry is not None:
            result = entry.policy
        else:
            result = self._default if self._default is not None else CLASS_DEFAULTS
        if len(self._cache) >= 10_000:
            self._cache.clear()
        self._cache[destination] = result
        return result

    def with_entry(self, kind: str, pattern: str, attributes: Mapping[str, Any]) -> PolicyMap:
        """A copy with the entry for (kind, pattern) set to exactly `attributes` (added or replaced)."""
        new = PolicyMapEntry.create(kind, pattern, attributes)
        kept = [e for e in self._entries if e.id != new.id]
        return PolicyMap([*kept, new], self._default_attributes)

    def without_entry(self, kind: str, pattern: str) -> PolicyMap:
        target = pattern_destination(kind, pattern).uri
        return PolicyMap([e for e in self._entries if e.id != target], self._default_attributes)

    def with_default(self, attributes: Mapping[str, Any] | None) -> PolicyMap:
        return PolicyMap(self._entries, attributes)


def load_policy_file(path: str | Path) -> PolicyMap:
    """The `[policy]` table of the configuration file (an empty map, class defaults everywhere, without
    one). Errors name the file, the entry and the attribute."""
    return read_config_table(path, "policy", lambda raw: PolicyMap.from_config(raw, source="policy"))
