"""The archived lifecycle event: one flat row per stream entry, shared by the archiver, the jobs and the
Spark data source (the stream fields are documented in docs/broker_core.md, "Lifecycle events").

The fields the analytics read get typed columns; every other field of an entry goes to `attrs`, so a new
event type or field is archived without a schema change. `event_ms`/`event_seq` are the stream id and the
event's place in its entry (Redis's clock and the true order of the destination's events: SEQ_PER_ENTRY);
`ts` is the broker clock of the caller.
Partitions: `date` (UTC day of `ts`) and `destination` (the URI), Hive style, escaped as Spark escapes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from broker_core import event_stream
from broker_core.resp import reply_text as _text

STRING_FIELDS = ("msg", "consumer", "group", "reason", "cause", "target", "detail", "strategy")
LONG_FIELDS = ("priority", "size", "redeliveries", "delay", "expiration", "count")
TYPED = frozenset(("type", "ts", *STRING_FIELDS, *LONG_FIELDS))

# Columns stored in each Parquet file; `date` and `destination` come from the folder names.
FILE_SCHEMA = pa.schema(
    [
        pa.field("event_ms", pa.int64(), nullable=False),
        pa.field("event_seq", pa.int64(), nullable=False),
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("type", pa.string(), nullable=False),
        *(pa.field(name, pa.string()) for name in STRING_FIELDS),
        *(pa.field(name, pa.int64()) for name in LONG_FIELDS),
        pa.field("attrs", pa.map_(pa.string(), pa.string())),
    ]
)
COLUMNS = tuple(FILE_SCHEMA.names)

# The same row as Spark sees it through the archive or the data source (partition columns last).
SPARK_SCHEMA_DDL = ", ".join(
    ["event_ms BIGINT", "event_seq BIGINT", "ts BIGINT", "type STRING"]
    + [f"`{name}` STRING" for name in STRING_FIELDS]
    + [f"{name} BIGINT" for name in LONG_FIELDS]
    + ["attrs MAP<STRING, STRING>", "date STRING", "destination STRING"]
)

# Spark's ExternalCatalogUtils escapes these (and control characters) in partition values.
_SPARK_ESCAPED = set('"#%\'*/:=?\\\x7f{[]^')


def parse_stream_id(stream_id: bytes | str) -> tuple[int, int]:
    ms, _, seq = _text(stream_id).partition("-")
    return int(ms), int(seq or 0)


def format_stream_id(ms: int, seq: int) -> str:
    return f"{ms}-{seq}"


def next_stream_id(stream_id: str) -> str:
    """The smallest id after `stream_id` (XTRIM MINID keeps ids >= it)."""
    ms, seq = parse_stream_id(stream_id)
    return format_stream_id(ms, seq + 1)


# An entry's place in the stream and an event's place in its entry as one event_seq: the entry's sequence
# times SEQ_PER_ENTRY plus the event's place (an entry holds at most 100 events: base.lua EVENTS_PER_ENTRY).
SEQ_PER_ENTRY = 1024


def event_rows(stream_id: bytes | str, fields: Mapping[bytes, bytes]) -> list[dict[str, Any]]:
    """The events of one stream entry (broker_core/event_stream.py) as rows of FILE_SCHEMA, in order."""
    ms, seq = parse_stream_id(stream_id)
    return [_row(ms, seq * SEQ_PER_ENTRY + place, event)
            for place, event in enumerate(event_stream.events_of(fields))]


def lost_row(before_id: bytes | str, ts: int, count: int) -> dict[str, Any]:
    """The `lost` row of `count` events the stream's cap dropped before the archive read them, placed just
    before the entry `before_id` (the first one read after them: event_seq one below its first event's)."""
    ms, seq = parse_stream_id(before_id)
    return _row(ms, seq * SEQ_PER_ENTRY - 1, {"type": "lost", "ts": str(ts), "count": str(count)})


def _row(ms: int, seq: int, fields: Mapping[Any, Any]) -> dict[str, Any]:
    plain = {_text(k): _text(v) for k, v in fields.items()}
    row: dict[str, Any] = {"event_ms": ms, "event_seq": seq, "ts": _long(plain.get("ts")) or ms,
                           "type": plain.get("type", "")}
    for name in STRING_FIELDS:
        row[name] = plain.get(name) or None  # the scripts write '' for "none" (no group, no consumer)
    for name in LONG_FIELDS:
        row[name] = _long(plain.get(name))
    row["attrs"] = [(k, v) for k, v in plain.items() if k not in TYPED] or None
    return row


def _long(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        try:
            return int(float(value))
        except ValueError:
            return None


def event_date(ts_ms: int) -> str:
    return dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d")


def table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    rows = list(rows)
    return pa.Table.from_pydict({name: [r[name] for r in rows] for name in COLUMNS}, schema=FILE_SCHEMA)


def escape_partition_value(value: str) -> str:
    """A partition folder value Spark decodes back to `value` (queue://orders -> queue%3A%2F%2Forders)."""
    return "".join(f"%{ord(c):02X}" if c in _SPARK_ESCAPED or ord(c) < 0x20 else c for c in value)


def unescape_partition_value(value: str) -> str:
    return unquote(value)
