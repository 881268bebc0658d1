"""The event archive: drains each destination's lifecycle event stream (`<prefix>:events`) into Parquet.

Layout: `<root>/date=YYYY-MM-DD/destination=<escaped URI>/events-<first id>-<last id>.parquet`, one
file per batch of stream entries and UTC day. The root is a local folder or any URL pyarrow.fs
understands (file://, hdfs://, s3://, gs://, abfs:// ...), the same URL Spark then reads.

Exactly once, per destination, with its checkpoint hash `<prefix>:archive` in Redis:
1. `pending` = "<first id> <last id>" is recorded before anything is written, so a run after a crash
   rewrites exactly the same batch under the same file names (never a second, overlapping file);
2. each file is written to a hidden temporary name (`.tmp-…`, which Spark and pyarrow skip), flushed,
   fsynced, renamed to its final name and the folder fsynced; a final file that exists is complete and
   is kept;
3. `last` = the batch's last id and `pending` removed, in one MULTI;
4. only then the stream is trimmed below `last` (event_archive.trim). A crash before the trim is
   repaired by the next run, which trims first.
A per-destination maintenance lease (`<prefix>:lease:archive`) keeps two workers off the same stream.
Events the stream's own cap (`eventsMaxLen`) dropped before a run are gone; archive often enough.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import redis

from broker_core import event_archive, event_stream
from broker_core.broker import Broker
from broker_core.destinations import Destination, parse_destination
from broker_core.maintenance import job_lease
from broker_core.resp import reply_text as _text

from . import events

log = logging.getLogger(__name__)

BATCH_EVENTS = 50_000  # events per file (and day): whole entries until the batch holds this many
# stream entries per XRANGE: one read of 50,000 one-event entries held Redis for 30-110 ms; an entry holds
# up to 100 events (broker_core/event_stream.py), so a read is at most 20,000 events
READ_PAGE = 200
MAX_BATCHES_PER_RUN = 20  # a longer backlog goes on at the next run
LEASE_MS = 120_000
# Test hook (crash tests): SIGNALBOX_ARCHIVE_KILL_AT=<point>[:<n>] kills this process with SIGKILL the
# n-th time (default 1st) it reaches <point>. The points are the steps of the cycle above.
KILL_POINTS = ("before_write", "after_write", "before_checkpoint", "before_trim")
_kill_hits: dict[str, int] = defaultdict(int)


def _kill_point(name: str) -> None:
    spec = os.environ.get("SIGNALBOX_ARCHIVE_KILL_AT", "")
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point != name:
        return
    _kill_hits[name] += 1
    if _kill_hits[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


class ArchiveError(ValueError):
    """A bad archive location or setting."""


@dataclass(frozen=True)
class ArchiveLocation:
    """Where the archive lives: a pyarrow filesystem and the root path inside it."""

    url: str
    fs: pafs.FileSystem
    root: str

    @classmethod
    def parse(cls, url: str | os.PathLike[str]) -> ArchiveLocation:
        text = os.fspath(url).strip()
        if not text:
            raise ArchiveError("the archive location is empty; give a folder or a URL such as hdfs://nn/path")
        if "://" not in text:
            text = os.path.abspath(text)
            return cls(text, pafs.LocalFileSystem(), text)
        try:
            fs, root = pafs.FileSystem.from_uri(text)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, ValueError) as exc:
            raise ArchiveError(f"archive location {text!r} is not a filesystem URL pyarrow can open: {exc}"
                               ) from exc
        return cls(text, fs, root.rstrip("/"))

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def spark_path(self) -> str:
        """The root as Spark reads it."""
        return f"file://{self.root}" if self.is_local else self.url

    def folder(self, date: str, destination: str) -> str:
        return f"{self.root}/date={date}/destination={events.escape_partition_value(destination)}"


@dataclass
class DestinationRun:
    destination: str
    archived: int = 0
    files: list[str] = field(default_factory=list)
    trimmed: int = 0
    skipped: bool = False  # another worker holds the lease
    lost: int = 0  # events the stream's cap dropped before they were read (archived as `lost` rows)


def checkpoint_key(broker: Broker, dest: Destination) -> str:
    return event_archive.checkpoint_key(broker, dest)


def events_key(broker: Broker, dest: Destination) -> str:
    return event_archive.events_key(broker, dest)


def _write_file(location: ArchiveLocation, folder: str, name: str, rows: list[dict[str, Any]]) -> str:
    """Write one batch file durably; returns its final path. An existing final file is complete (it was
    only renamed there after its fsync) and is kept as it is."""
    final = f"{folder}/{name}"
    if location.fs.get_file_info(final).type == pafs.FileType.File:
        return final
    location.fs.create_dir(folder, recursive=True)
    tmp = f"{folder}/.tmp-{name}-{uuid.uuid4().hex[:8]}"
    table = events.table(rows)
    if location.is_local:
        with open(tmp, "wb") as handle:
            pq.write_table(table, handle, compression="zstd")
            handle.flush()
            os.fsync(handle.fileno())
        _kill_point("after_write")
        os.replace(tmp, final)
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    else:
        # Remote filesystems: the stream's close() returns once the store has the data (HDFS hflush on
        # close, S3 completes the upload); move() is a rename on HDFS and copy+delete on object stores.
        with location.fs.open_output_stream(tmp) as stream:
            pq.write_table(table, stream, compression="zstd")
        _kill_point("after_write")
        location.fs.move(tmp, final)
    return final


def _clear_temporaries(location: ArchiveLocation, folder: str, name: str) -> None:
    """Temporary files a crashed run left for this batch file."""
    try:
        infos = location.fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    except OSError:
        return
    for info in infos:
        if info.base_name.startswith(f".tmp-{name}-"):
            location.fs.delete_file(info.path)


def write_entries(location: ArchiveLocation, destination: str, entries: list[tuple[Any, Any]],
                  bounds: tuple[str, str] | None = None, lost: int = 0, lost_ts: int = 0) -> list[str]:
    """Write a batch's files, named by its `bounds` (first and last id; default the entries'). A batch
    redone after a crash is named by its recorded bounds, not by the entries still there: the stream's cap
    may have dropped its oldest entries since, and a name from the entries left would put them in a second
    file beside the complete one. `lost` > 0: the events the cap dropped unread before the batch, as one
    `lost` row (events.lost_row) before its first entry, at the first event's ts (else `lost_ts`)."""
    first, last = bounds or (_text(entries[0][0]), _text(entries[-1][0]))
    name = f"events-{first.replace('-', '_')}-{last.replace('-', '_')}.parquet"
    by_date: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if lost > 0:
        ts = events.event_rows(*entries[0])[0]["ts"] if entries else lost_ts
        by_date[events.event_date(ts)].append(events.lost_row(first, ts, lost))
    for stream_id, fields in entries:
        for row in events.event_rows(stream_id, fields):
            by_date[events.event_date(row["ts"])].append(row)
    written = []
    for date, rows in sorted(by_date.items()):
        folder = location.folder(date, destination)
        written.append(_write_file(location, folder, name, rows))
        _clear_temporaries(location, folder, name)
    return written


def _trim(broker: Broker, dest: Destination, last: str, keep_ms: int) -> int:
    """Drop archived entries (ids <= last), except those younger than keep_ms (Redis's clock, as the
    stream ids), which stay for live views of recent events."""
    threshold = events.next_stream_id(last)
    if keep_ms > 0:
        recent = f"{event_archive.server_time_ms(broker) - keep_ms}-0"
        threshold = min(threshold, recent, key=events.parse_stream_id)
    return event_archive.trim(broker, dest, threshold)


def read_entries(broker: Broker, dest: Destination, first: str, last: str,
                 limit: int) -> list[tuple[Any, Any]]:
    """The stream entries from `first` to `last` (XRANGE bounds) until they hold `limit` events, read
    READ_PAGE at a time."""
    entries: list[tuple[Any, Any]] = []
    held = 0
    while held < limit:
        page = event_archive.read_range(broker, dest, first, last, READ_PAGE)
        for entry in page:
            entries.append(entry)
            held += event_stream.count(entry[1])
            if held >= limit:
                break
        if len(page) < READ_PAGE:
            break
        first = f"({_text(entries[-1][0])}"
    return entries


def archive_destination(broker: Broker, destination: str | Destination, location: ArchiveLocation, *,
                        batch_events: int = BATCH_EVENTS, max_batches: int = MAX_BATCHES_PER_RUN,
                        lease_ms: int = LEASE_MS, keep_ms: int = 0) -> DestinationRun:
    """Drain one destination's event stream into the archive (see the module docstring for the steps)."""
    dest = destination if isinstance(destination, Destination) else parse_destination(destination)
    run = DestinationRun(dest.uri)
    with job_lease(broker, dest, "archive", lease_ms) as lease:
        if lease is None:
            run.skipped = True
            return run
        for _ in range(max_batches):
            last, pending, seen, pending_lost, pending_seen = (
                None if v is None else _text(v) for v in event_archive.checkpoint_fields(
                    broker, dest, "last", "pending", "lost_seen", "pending_lost", "pending_seen"))
            if last:
                run.trimmed += _trim(broker, dest, last, keep_ms)  # a crash after the checkpoint left these
            if pending:
                first_id, last_id = pending.split()
                entries = read_entries(broker, dest, first_id, last_id, 2**62)
                # (no pending_seen: the crash came before the loss was worked out; the next batch counts it)
                lost, lost_seen = int(pending_lost or 0), None if pending_seen is None else int(pending_seen)
            else:
                start = f"({last}" if last else "-"
                entries = read_entries(broker, dest, start, "+", batch_events)
                if not entries:
                    break
                first_id, last_id = _text(entries[0][0]), _text(entries[-1][0])
                oldest, lost_seen = event_archive.begin_batch(broker, dest, first_id, last_id)
                # The cap counted as lost what it dropped after `last` until `pending` was recorded: the
                # events dropped before this read, and those of this batch's oldest entries it dropped
                # once read (they are here, and archived).
                kept = None if oldest is None else events.parse_stream_id(oldest)
                gone = sum(event_stream.count(fields) for entry_id, fields in entries
                           if kept is None or events.parse_stream_id(entry_id) < kept)
                lost = lost_seen - int(seen or 0) - gone
                event_archive.record_loss(broker, dest, lost, lost_seen)
            if entries or lost:
                _kill_point("before_write")
                run.files += write_entries(location, dest.uri, entries, (first_id, last_id), lost,
                                           broker.clock.now_ms())
                _kill_point("before_checkpoint")
            if lost:
                log.warning("%s: %d events were dropped by the event stream's cap (eventsMaxLen) before the "
                            "archive read them; archived as a loss", dest.uri, lost)
            archived = sum(event_stream.count(fields) for _, fields in entries)
            event_archive.end_batch(broker, dest, last_id, broker.clock.now_ms(), archived, lost, lost_seen)
            run.archived += archived
            run.lost += lost
            _kill_point("before_trim")
            run.trimmed += _trim(broker, dest, last_id, keep_ms)
            if not lease.renew():
                break
    return run


@dataclass
class ArchiveRun:
    destinations: list[DestinationRun]
    removed_days: list[str]

    @property
    def archived(self) -> int:
        return sum(d.archived for d in self.destinations)

    @property
    def lost(self) -> int:
        return sum(d.lost for d in self.destinations)

    def as_dict(self) -> dict[str, Any]:
        return {"archived": self.archived, "lost": self.lost, "removed_days": self.removed_days,
                "destinations": [vars(d) for d in self.destinations]}


def archive_all(broker: Broker, location: ArchiveLocation, *, retention_days: int = 0,
                destinations: Iterable[str] | None = None, **options: Any) -> ArchiveRun:
    """Archive every destination (or the given ones), then apply the retention."""
    names = list(destinations or broker.destinations())
    runs = [archive_destination(broker, name, location, **options) for name in names]
    removed = apply_retention(location, retention_days) if retention_days > 0 else []
    return ArchiveRun(runs, removed)


def apply_retention(location: ArchiveLocation, retention_days: int, today: dt.date | None = None
                    ) -> list[str]:
    """Delete the day folders older than `retention_days` days (0 keeps everything)."""
    if retention_days <= 0:
        return []
    today = today or dt.datetime.now(dt.UTC).date()
    oldest_kept = today - dt.timedelta(days=retention_days - 1)
    removed = []
    for info in location.fs.get_file_info(pafs.FileSelector(location.root, allow_not_found=True)):
        if info.type != pafs.FileType.Directory or not info.base_name.startswith("date="):
            continue
        try:
            day = dt.date.fromisoformat(info.base_name[5:])
        except ValueError:
            continue
        if day < oldest_kept:
            location.fs.delete_dir(info.path)
            removed.append(info.base_name[5:])
    return sorted(removed)


def checkpoint(broker: Broker, destination: str | Destination) -> dict[str, str]:
    dest = destination if isinstance(destination, Destination) else parse_destination(destination)
    return {_text(k): _text(v) for k, v in event_archive.checkpoint(broker, dest).items()}


def main(argv: list[str] | None = None) -> int:
    """`python -m analytics.archive`: one archive run from the command line (and the crash tests)."""
    import argparse
    import json

    from analytics import config

    parser = argparse.ArgumentParser(prog="python -m analytics.archive", description=main.__doc__)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6390/0"))
    parser.add_argument("--namespace", default=os.environ.get("SIGNALBOX_NAMESPACE", "sb"))
    parser.add_argument("--archive", default=None, help="folder or URL (default SIGNALBOX_ARCHIVE_URL)")
    parser.add_argument("--destination", action="append", help="only this destination (repeatable)")
    parser.add_argument("--batch-events", type=int, default=BATCH_EVENTS)
    parser.add_argument("--lease-ms", type=int, default=LEASE_MS)
    parser.add_argument("--keep-ms", type=int, default=None, help="default SIGNALBOX_ARCHIVE_KEEP_MS")
    parser.add_argument("--retention-days", type=int, default=None)
    args = parser.parse_args(argv)
    if args.batch_events < 1:
        parser.error(f"--batch-events must be at least 1, got {args.batch_events}")
    try:
        location = ArchiveLocation.parse(args.archive or config.archive_url())
    except ArchiveError as exc:
        parser.error(str(exc))
    broker = Broker(redis.Redis.from_url(args.redis_url), args.namespace)
    run = archive_all(broker, location, destinations=args.destination,
                      retention_days=(config.archive_retention_days() if args.retention_days is None
                                      else args.retention_days),
                      batch_events=args.batch_events, lease_ms=args.lease_ms,
                      keep_ms=config.archive_keep_ms() if args.keep_ms is None else args.keep_ms)
    print(json.dumps(run.as_dict()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
