"""The entries of a destination's lifecycle event stream (`<prefix>:events`) as events.

A script call writes its first two events for a stream an entry each, holding the event's fields (`type`,
`ts`, then its own); the rest when it ends (scripts/lua/includes/base.lua, `end_call`), as entries of
`ts`, `n` and `e`, the events packed with msgpack as an array of arrays {type, field, value, ...} in the
order they happened. Every reader of the stream (the console's live view, the event archive,
the analytics' live source, the tests) reads events through `events_of`, each as the fields of a
one-event entry: bytes to bytes, numbers as the digits Redis would have written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgpack


def _digits(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, float):  # (Redis formats a Lua number argument with "%.17g")
        return (b"%d" % value) if value.is_integer() else (b"%.17g" % value)
    return str(value).encode()


def _single(fields: Mapping[Any, Any]) -> bool:
    """An entry holding one event: it has a type (a client decoding replies has str keys)."""
    return b"type" in fields or "type" in fields


def count(fields: Mapping[bytes, bytes]) -> int:
    """How many events one stream entry holds, without unpacking them."""
    return 1 if _single(fields) else int(fields[b"n"])


def events_of(fields: Mapping[bytes, bytes]) -> list[dict[bytes, bytes]]:
    """The events of one stream entry (its fields as redis-py returns them), in order."""
    if _single(fields):
        return [dict(fields)]
    ts = fields[b"ts"]
    out = []
    for event in msgpack.unpackb(fields[b"e"], raw=True):
        one = {b"type": _digits(event[0]), b"ts": ts}
        for i in range(1, len(event) - 1, 2):
            one[_digits(event[i])] = _digits(event[i + 1])
        out.append(one)
    return out


def expand(entries: Iterable[tuple[Any, Mapping[bytes, bytes]]]) -> list[tuple[Any, dict[bytes, bytes]]]:
    """(entry id, event fields) for every event of these entries (XRANGE's or XREAD's), in order; the events
    of one entry share its id."""
    return [(entry_id, event) for entry_id, fields in entries for event in events_of(fields)]
