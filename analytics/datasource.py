"""`spark.read.format("signalbox")`: the lifecycle events as a Spark table, from the archive or live Redis.

    from analytics.datasource import register
    register(spark)
    spark.read.format("signalbox").load("/var/signalbox/archive")             # the Parquet archive
    spark.read.format("signalbox").option("source", "live") \\
        .option("redis_url", "redis://127.0.0.1:6390/0").option("namespace", "sb").load()   # the streams

Options: `source` (`archive`, the default with a path, or `live`), `path` (archive folder or URL,
default SIGNALBOX_ARCHIVE_URL), `redis_url` / `namespace` (live; default REDIS_URL / SIGNALBOX_NAMESPACE),
`destination` (comma-separated URIs), `since` / `until` (epoch ms on `ts`, until exclusive).
Rows have the archive's columns (analytics/events.py). Built on Spark 4's Python data source API: one
input partition per archive file or per destination stream; readers yield Arrow record batches.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from .events import SPARK_SCHEMA_DDL, event_date, event_rows, table, unescape_partition_value

LIVE_PAGE = 1_000  # stream entries per XRANGE call (an entry holds up to 100 events)


class DataSourceOptionError(ValueError):
    """A `spark.read.format("signalbox")` option that cannot work."""


@dataclass(frozen=True)
class FilePartition(InputPartition):
    path: str
    date: str
    destination: str


@dataclass(frozen=True)
class StreamPartition(InputPartition):
    destination: str


def _bounds(options: dict[str, str]) -> tuple[int | None, int | None]:
    def bound(name: str) -> int | None:
        value = options.get(name)
        if value in (None, ""):
            return None
        try:
            return int(value)
        except ValueError as exc:
            raise DataSourceOptionError(f"option {name!r} must be epoch milliseconds, got {value!r}") from exc

    return bound("since"), bound("until")


def _arrow_schema(schema: Any) -> pa.Schema:
    """The Arrow schema Spark checks every returned batch against (field names and nullability too)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _with_partition_columns(batch: pa.Table, date: str, destination: str, since: int | None,
                            until: int | None, schema: pa.Schema) -> pa.Table:
    if since is not None:
        batch = batch.filter(pc.greater_equal(batch["ts"], since))
    if until is not None:
        batch = batch.filter(pc.less(batch["ts"], until))
    batch = (batch.append_column("date", pa.array([date] * batch.num_rows, pa.string()))
             .append_column("destination", pa.array([destination] * batch.num_rows, pa.string())))
    return batch.cast(schema)


class ArchiveReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: Any) -> None:
        from .archive import ArchiveLocation

        self.arrow_schema = _arrow_schema(schema)
        from .config import archive_url

        self.url = options.get("path") or archive_url()
        self.location = ArchiveLocation.parse(self.url)
        self.destinations = {d.strip() for d in options.get("destination", "").split(",") if d.strip()}
        self.since, self.until = _bounds(options)

    def partitions(self) -> list[InputPartition]:
        selector = pafs.FileSelector(self.location.root, recursive=True, allow_not_found=True)
        found = []
        for info in self.location.fs.get_file_info(selector):
            if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet") \
                    or info.base_name.startswith((".", "_")):
                continue
            parts = dict(p.split("=", 1) for p in info.path.split("/")
                         if p.startswith(("date=", "destination=")))
            if "date" not in parts or "destination" not in parts:
                continue
            destination = unescape_partition_value(parts["destination"])
            if self.destinations and destination not in self.destinations:
                continue
            found.append(FilePartition(info.path, parts["date"], destination))
        return sorted(found, key=lambda p: p.path) or [FilePartition("", "", "")]

    def read(self, partition: FilePartition) -> Iterator[pa.RecordBatch]:
        if not partition.path:
            return
        data = pq.read_table(partition.path, filesystem=self.location.fs)
        yield from _with_partition_columns(data, partition.date, partition.destination, self.since,
                                           self.until, self.arrow_schema).to_batches()


class LiveReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: Any) -> None:
        self.arrow_schema = _arrow_schema(schema)
        self.redis_url = options.get("redis_url") or os.environ.get("REDIS_URL")
        if not self.redis_url:
            raise DataSourceOptionError(
                "source 'live' needs option redis_url (or REDIS_URL in the environment)")
        self.namespace = options.get("namespace") or os.environ.get("SIGNALBOX_NAMESPACE") or "sb"
        self.destinations = [d.strip() for d in options.get("destination", "").split(",") if d.strip()]
        self.since, self.until = _bounds(options)

    def _broker(self) -> Any:
        """A broker over a client of this reader's own (a Spark worker has no other): the registry and
        the event streams are the broker's, read through it (broker_core/event_archive.py)."""
        import redis

        from broker_core.broker import Broker

        return Broker(redis.Redis.from_url(self.redis_url), self.namespace)

    def partitions(self) -> list[InputPartition]:
        names = self.destinations or self._broker().destinations()  # (in creation order, as ZRANGE)
        return [StreamPartition(name) for name in names] or [StreamPartition("")]

    def read(self, partition: StreamPartition) -> Iterator[pa.RecordBatch]:
        if not partition.destination:
            return
        from broker_core import event_archive
        from broker_core.destinations import parse_destination

        dest = parse_destination(partition.destination)
        broker = self._broker()
        start = "-"
        while True:
            entries = event_archive.read_range(broker, dest, start, "+", LIVE_PAGE)
            if not entries:
                return
            rows = [row for i, f in entries for row in event_rows(i, f)]
            by_date: dict[str, list[dict[str, Any]]] = {}
            for row in rows:
                by_date.setdefault(event_date(row["ts"]), []).append(row)
            for date, dated in by_date.items():
                yield from _with_partition_columns(table(dated), date, dest.uri, self.since,
                                                   self.until, self.arrow_schema).to_batches()
            if len(entries) < LIVE_PAGE:
                return
            last = entries[-1][0].decode()
            start = f"({last}"


class SignalboxDataSource(DataSource):
    """The `signalbox` format: lifecycle events from the Parquet archive or the live Redis streams."""

    @classmethod
    def name(cls) -> str:
        return "signalbox"

    def schema(self) -> str:
        return SPARK_SCHEMA_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        source = self.options.get("source", "archive").lower()
        if source == "archive":
            return ArchiveReader(dict(self.options), schema)
        if source == "live":
            return LiveReader(dict(self.options), schema)
        raise DataSourceOptionError(f"option source must be 'archive' or 'live', got {source!r}")


def register(spark: Any) -> None:
    """Make `spark.read.format("signalbox")` available in this session."""
    spark.dataSource.register(SignalboxDataSource)
