"""Policies kept in Redis, so every gateway process, worker and the console sees runtime changes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from broker_core.destinations import (
    Destination,
)
from broker_core.errors import InvalidDestination, InvalidPolicy
from broker_core.resp import reply_text as _text

from .entry import DEFAULT_ENTRY_ID, PolicyEntry, normalize_attributes
from .policy_map import PolicyMap, PolicyMapEntry, in_context, pattern_destination


class PolicyStore:
    """Policies kept in Redis so every gateway process, worker and the console sees runtime changes.

    Keys: `<namespace>:policies` is a hash from entry id (`queue://orders.>`, or `default` for the default
    entry) to JSON `{"kind", "pattern", "attributes"}`; `<namespace>:policies:version` is incremented in the
    same MULTI/EXEC as every change. `policy_map()` caches the map and re-reads it when the version moves,
    checking at most every `check_interval` seconds (0 = on every call). On a Redis Cluster both keys must
    hash to one slot, so give the namespace a hash tag (`{signalbox}`).
    """

    def __init__(self, redis_client: Any, namespace: str, *, check_interval: float = 0.0) -> None:
        self._redis = redis_client
        self.namespace = namespace
        self.key = f"{namespace}:policies"
        self.version_key = f"{namespace}:policies:version"
        self.check_interval = check_interval
        self._cached: PolicyMap | None = None
        self._cached_version: int | None = None
        self._checked_at = 0.0

    # -- writing

    @staticmethod
    def _encode(entry: PolicyMapEntry) -> str:
        return json.dumps(
            {"kind": entry.kind, "pattern": entry.pattern, "attributes": dict(entry.attributes)},
            sort_keys=True,
        )

    def _write(self, *, replace_all: bool = False, set_fields: Mapping[str, str] | None = None,
               delete_fields: Iterable[str] = ()) -> int:
        pipe = self._redis.pipeline(transaction=True)
        if replace_all:
            pipe.delete(self.key)
        if set_fields:
            pipe.hset(self.key, mapping=dict(set_fields))
        delete = list(delete_fields)
        if delete:
            pipe.hdel(self.key, *delete)
        pipe.incr(self.version_key)
        return int(pipe.execute()[-1])

    def load_from(self, policy_map: PolicyMap) -> int:
        """Replace every stored entry (and the default entry) with `policy_map`'s; returns the new version."""
        fields_ = {entry.id: self._encode(entry) for entry in policy_map.entries}
        if policy_map.default_attributes is not None:
            fields_[DEFAULT_ENTRY_ID] = json.dumps({"attributes": dict(policy_map.default_attributes)})
        return self._write(replace_all=True, set_fields=fields_)

    def set_entry(self, kind: str, pattern: str, attributes: Mapping[str, Any]) -> PolicyMapEntry:
        """Add or replace the entry for (kind, pattern) with exactly `attributes` (camelCase).

        Validated before anything is written: on InvalidPolicy/InvalidDestination nothing changes.
        """
        entry = PolicyMapEntry.create(kind, pattern, attributes)
        self._write(set_fields={entry.id: self._encode(entry)})
        return entry

    def remove_entry(self, kind: str, pattern: str) -> bool:
        """Remove the entry for (kind, pattern); False if there was none."""
        entry_id = pattern_destination(kind, pattern).uri
        pipe = self._redis.pipeline(transaction=True)
        pipe.hdel(self.key, entry_id)
        pipe.incr(self.version_key)
        removed, _ = pipe.execute()
        return bool(removed)

    def set_default(self, attributes: Mapping[str, Any] | None) -> None:
        """Set the default entry's attributes (None removes it); validated before writing."""
        if attributes is None:
            self._write(delete_fields=[DEFAULT_ENTRY_ID])
            return
        try:
            explicit = normalize_attributes(attributes)
        except InvalidPolicy as error:
            raise in_context(error, "default policy entry") from None
        self._write(set_fields={DEFAULT_ENTRY_ID: json.dumps({"attributes": explicit})})

    # -- reading

    def version(self) -> int:
        raw = self._redis.get(self.version_key)
        return int(raw) if raw is not None else 0

    def _read(self) -> tuple[int, PolicyMap]:
        pipe = self._redis.pipeline(transaction=True)
        pipe.get(self.version_key)
        pipe.hgetall(self.key)
        raw_version, raw_fields = pipe.execute()
        entries: list[PolicyMapEntry] = []
        default: Mapping[str, Any] | None = None
        for raw_id, raw_json in sorted((_text(k), _text(v)) for k, v in raw_fields.items()):
            try:
                data = json.loads(raw_json)
                if raw_id == DEFAULT_ENTRY_ID:
                    default = data["attributes"]
                else:
                    entries.append(PolicyMapEntry.create(data["kind"], data["pattern"], data["attributes"]))
            except (ValueError, KeyError, TypeError, InvalidPolicy, InvalidDestination) as error:
                known = isinstance(error, InvalidPolicy | InvalidDestination)
                reason = error.message if known else repr(error)
                raise InvalidPolicy(
                    f"stored policy {raw_id!r} in {self.key} is unreadable: {reason}",
                    key=self.key,
                    entry=raw_id,
                ) from None
        version = int(raw_version) if raw_version is not None else 0
        return version, PolicyMap(entries, default)

    def entries(self) -> list[PolicyMapEntry]:
        """The stored entries (without the default entry), read from Redis now."""
        return list(self._read()[1].entries)

    def policy_map(self) -> PolicyMap:
        """The current map; cached, re-read from Redis when the version counter has changed."""
        now = time.monotonic()
        if self._cached is not None and now - self._checked_at < self.check_interval:
            return self._cached
        if self._cached is None or self.version() != self._cached_version:
            self._cached_version, self._cached = self._read()
        self._checked_at = now
        return self._cached

    def resolve(self, destination: Destination) -> PolicyEntry:
        return self.policy_map().resolve(destination)
