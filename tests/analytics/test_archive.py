"""The archiver against a real Redis: exactly once, even when it is killed (SIGKILL) at each step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from analytics import archive
from analytics.archive import ArchiveLocation, archive_destination
from analytics.events import event_rows
from broker_core import event_stream
from broker_core.broker import Broker
from broker_core.messages import Message
from broker_core.model import ConsumerSpec

ROOT = Path(__file__).resolve().parents[2]
LEASE_MS = 300
BATCH = 7  # events per file, so a run writes several batches


def traffic(broker: Broker, destination: str, messages: int) -> None:
    """Sends, dispatches and acks on a real destination: its scripts write the events."""
    broker.send(destination, [Message(body=f"m{i}", group_id=f"g{i % 3}") for i in range(messages)])
    consumer = broker.add_consumer(destination, ConsumerSpec(prefetch=100, ack_mode="client-individual"))
    for delivery in broker.receive(consumer, max_messages=messages):
        broker.ack(consumer, delivery.message_id)
    broker.close_consumer(consumer)


def stream_entries(broker: Broker, destination: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
    dest = archive.parse_destination(destination)
    return broker.redis.xrange(archive.events_key(broker, dest))


def stream_ids(broker: Broker, destination: str) -> list[tuple[int, int]]:
    """Every event in the stream as the archive numbers it (event_ms, event_seq): an entry may hold
    several (broker_core/event_stream.py)."""
    return [(row["event_ms"], row["event_seq"]) for i, f in stream_entries(broker, destination)
            for row in event_rows(i, f)]


def batches(counts: list[int], limit: int) -> list[int]:
    """The events of each batch the archiver makes of entries holding `counts` events: whole entries until
    a batch holds `limit` events (archive.read_entries)."""
    out, held = [], 0
    for n in counts:
        held += n
        if held >= limit:
            out, held = [*out, held], 0
    return out + ([held] if held else [])


def archived_ids(root: Path, destination: str) -> list[tuple[int, int]]:
    """Every archived event id of a destination, duplicates kept (pyarrow skips the hidden .tmp files)."""
    if not root.exists():
        return []
    table = ds.dataset(str(root), format="parquet", partitioning="hive").to_table()
    # pyarrow decodes the folder names as Spark does (queue%3A%2F%2Forders -> queue://orders).
    rows = table.filter(ds.field("destination") == destination).to_pylist()
    return sorted((r["event_ms"], r["event_seq"]) for r in rows)


def run_archiver(redis_url: str, namespace: str, root: Path, kill_at: str | None = None) -> int:
    env = {**os.environ, "SIGNALBOX_ARCHIVE_KILL_AT": kill_at or ""}
    command = [sys.executable, "-m", "analytics.archive", "--redis-url", redis_url, "--namespace", namespace,
               "--archive", str(root), "--batch-events", str(BATCH), "--lease-ms", str(LEASE_MS),
               "--keep-ms", "0", "--retention-days", "0"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=120).returncode


@pytest.fixture
def broker(redis_client, namespace) -> Broker:
    return Broker(redis_client, namespace)


def test_an_archive_run_moves_every_event_to_parquet_and_trims_the_stream(broker, tmp_path):
    traffic(broker, "orders", 10)
    before = stream_ids(broker, "queue://orders")
    last_entry = stream_entries(broker, "queue://orders")[-1][0].decode()
    run = archive_destination(broker, "orders", ArchiveLocation.parse(tmp_path), batch_events=7)
    assert run.archived == len(before) > 30
    assert archived_ids(tmp_path, "queue://orders") == before
    assert stream_ids(broker, "queue://orders") == []
    assert archive.checkpoint(broker, "orders")["last"] == last_entry
    # Nothing new: a second run writes nothing.
    again = archive_destination(broker, "orders", ArchiveLocation.parse(tmp_path), batch_events=7)
    assert again.archived == 0 and archived_ids(tmp_path, "queue://orders") == before


def test_a_batch_is_read_from_the_stream_in_bounded_pages_and_replayed_the_same_way(
        broker, tmp_path, monkeypatch):
    traffic(broker, "orders", 10)
    before = stream_ids(broker, "queue://orders")
    entries = stream_entries(broker, "queue://orders")
    stream = archive.events_key(broker, archive.parse_destination("orders"))
    reads: list[int] = []
    xrange = broker.redis.xrange

    def counted(*args, **kwargs):
        reads.append(kwargs.get("count") or 0)
        return xrange(*args, **kwargs)

    monkeypatch.setattr(archive, "READ_PAGE", 4)
    monkeypatch.setattr(broker.redis, "xrange", counted)
    # a batch left pending by a crashed run (its range recorded, nothing written) is read again in pages
    pending = f"{entries[0][0].decode()} {entries[12][0].decode()}"
    broker.redis.hset(archive.checkpoint_key(broker, archive.parse_destination("orders")), "pending", pending)
    run = archive_destination(broker, "orders", ArchiveLocation.parse(tmp_path), batch_events=13)
    assert run.archived == len(before) and archived_ids(tmp_path, "queue://orders") == before
    assert reads and all(0 < n <= 4 for n in reads)  # never more than a page per read
    assert broker.redis.xlen(stream) == 0
    # the files are the batches, not the pages: the pending one (13 entries), then whole entries until a
    # batch holds 13 events
    rows = [pq.read_metadata(f).num_rows for f in run.files]
    counts = [event_stream.count(f) for _, f in entries]
    assert rows == [sum(counts[:13]), *batches(counts[13:], 13)] and sum(rows) == len(before)


def test_events_younger_than_keep_ms_stay_in_the_stream_for_live_views(broker, tmp_path):
    traffic(broker, "orders", 3)
    before = stream_ids(broker, "queue://orders")
    archive_destination(broker, "orders", ArchiveLocation.parse(tmp_path), keep_ms=600_000)
    assert archived_ids(tmp_path, "queue://orders") == before
    assert stream_ids(broker, "queue://orders") == before  # archived, kept for now, never archived twice
    assert archive_destination(broker, "orders", ArchiveLocation.parse(tmp_path)).archived == 0


@pytest.mark.e2e
@pytest.mark.parametrize("point", archive.KILL_POINTS)
@pytest.mark.parametrize("nth", ["first", "third", "last"])
def test_an_archiver_killed_at_any_step_leaves_every_event_archived_exactly_once(
        broker, redis_url, namespace, tmp_path, point, nth):
    traffic(broker, "orders", 12)
    first = stream_ids(broker, "queue://orders")
    # "last": the final, short batch, which grows by the time the archiver runs again.
    counts = [event_stream.count(f) for _, f in stream_entries(broker, "queue://orders")]
    hit = {"first": 1, "third": 3, "last": len(batches(counts, BATCH))}[nth]
    died = run_archiver(redis_url, namespace, tmp_path, f"{point}:{hit}")
    assert died == -signal.SIGKILL, "the kill point was not reached"
    traffic(broker, "orders", 4)  # the broker goes on while the archiver is down
    # The killed run may have trimmed part of `first` (after archiving it); nothing else left the stream.
    everything = set(first) | set(stream_ids(broker, "queue://orders"))
    time.sleep(LEASE_MS / 1000 + 0.2)  # the dead archiver's lease lapses
    assert run_archiver(redis_url, namespace, tmp_path) == 0
    archived = archived_ids(tmp_path, "queue://orders")
    assert archived == sorted(set(everything)) and len(archived) == len(set(archived))
    assert stream_ids(broker, "queue://orders") == []
    assert not [p for p in tmp_path.rglob(".tmp-*")], "temporary files of the killed run were cleared"


def test_retention_deletes_day_folders_older_than_the_setting(tmp_path):
    import datetime as dt

    for day in ("2026-11-01", "2026-11-20", "2026-11-22"):
        (tmp_path / f"date={day}" / "destination=queue%3A%2F%2Forders").mkdir(parents=True)
    removed = archive.apply_retention(ArchiveLocation.parse(tmp_path), 3, today=dt.date(2026, 11, 22))
    assert removed == ["2026-11-01"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["date=2026-11-20", "date=2026-11-22"]


def test_an_unusable_archive_location_is_refused_with_its_name():
    with pytest.raises(archive.ArchiveError, match="nosuchscheme://x"):
        ArchiveLocation.parse("nosuchscheme://x/archive")
    with pytest.raises(archive.ArchiveError, match="empty"):
        ArchiveLocation.parse("  ")


@pytest.mark.e2e
def test_a_pending_batch_whose_oldest_entries_the_cap_dropped_is_not_archived_twice(
        broker, redis_url, namespace, tmp_path):
    broker.policies.set_entry("queue", ">", {"eventsMaxLen": 50})
    broker.refresh_policies()
    broker.ensure_destination("orders")
    for i in range(20):  # an entry (one enqueue) each
        broker.send("orders", Message(body=str(i)))
    first = stream_ids(broker, "queue://orders")
    assert len(first) == 20
    # The first batch (BATCH entries) is written, then the archiver dies before its checkpoint.
    assert run_archiver(redis_url, namespace, tmp_path, "before_checkpoint:1") == -signal.SIGKILL
    assert archived_ids(tmp_path, "queue://orders") == first[:BATCH]
    for i in range(33):  # the stream goes over its cap by 3: the pending batch's oldest 3 entries go
        broker.send("orders", Message(body=f"more{i}"))
    assert stream_ids(broker, "queue://orders")[0] == first[3]
    time.sleep(LEASE_MS / 1000 + 0.2)
    assert run_archiver(redis_url, namespace, tmp_path) == 0
    archived = archived_ids(tmp_path, "queue://orders")
    assert len(archived) == len(set(archived)), "events archived twice"
    assert archived == sorted(set(first) | set(archived[BATCH:]))


def lost_rows(root: Path, destination: str) -> list[dict]:
    table = ds.dataset(str(root), format="parquet", partitioning="hive").to_table()
    rows = table.filter(ds.field("destination") == destination).to_pylist()
    return [r for r in rows if r["type"] == "lost"]


def test_events_the_cap_dropped_before_they_were_archived_are_archived_as_a_loss(broker, tmp_path):
    broker.policies.set_entry("queue", ">", {"eventsMaxLen": 50})
    broker.refresh_policies()
    broker.ensure_destination("orders")
    location = ArchiveLocation.parse(tmp_path)
    for i in range(80):  # an entry (one enqueue) each: the cap drops the oldest 30, never archived
        broker.send("orders", Message(body=str(i)))
    kept = stream_ids(broker, "queue://orders")
    run = archive_destination(broker, "orders", location, keep_ms=600_000)
    assert (run.archived, run.lost) == (50, 30)
    [lost] = lost_rows(tmp_path, "queue://orders")
    assert lost["count"] == 30 and (lost["event_ms"], lost["event_seq"]) < kept[0]
    assert archive.checkpoint(broker, "orders")["lost"] == "30"
    # The archived events kept in the stream (keep_ms) for live views are what the cap drops next: no loss.
    for i in range(20):
        broker.send("orders", Message(body=f"more{i}"))
    again = archive_destination(broker, "orders", location, keep_ms=600_000)
    assert (again.archived, again.lost) == (20, 0)
    assert len(lost_rows(tmp_path, "queue://orders")) == 1
    assert broker.stats("orders").events_trimmed == 50  # the stream's own count: every event it trimmed


def test_entries_the_cap_drops_once_the_archive_has_read_them_are_archived_not_lost(
        broker, tmp_path, monkeypatch):
    broker.policies.set_entry("queue", ">", {"eventsMaxLen": 50})
    broker.refresh_policies()
    broker.ensure_destination("orders")
    for i in range(50):
        broker.send("orders", Message(body=str(i)))
    first = stream_ids(broker, "queue://orders")
    read = archive.read_entries

    def then_more(*args, **kwargs):  # the broker goes on between the archive's read and its `pending`
        entries = read(*args, **kwargs)
        monkeypatch.setattr(archive, "read_entries", read)
        for i in range(10):  # over the cap: the 10 oldest entries go, which were just read
            broker.send("orders", Message(body=f"more{i}"))
        return entries

    monkeypatch.setattr(archive, "read_entries", then_more)
    location = ArchiveLocation.parse(tmp_path)
    run = archive_destination(broker, "orders", location, max_batches=1)
    assert (run.archived, run.lost) == (50, 0)
    assert broker.stats("orders").events_trimmed == 10
    again = archive_destination(broker, "orders", location)
    assert (again.archived, again.lost) == (10, 0)
    archived = archived_ids(tmp_path, "queue://orders")
    assert archived[:50] == first and len(archived) == len(set(archived)) == 60
    assert lost_rows(tmp_path, "queue://orders") == []
