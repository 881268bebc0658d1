"""Every Spark metric equals the plain-Python computation (tests/analytics/reference.py) on the same
generated journal, read back from the archive's Parquet layout."""

from __future__ import annotations

import pytest

from analytics import jobs
from analytics.pipeline import load_events
from tests.analytics import reference
from tests.analytics.journal import START_MS

pytestmark = pytest.mark.e2e

RANGE = (START_MS - 1, START_MS + 86_400_000)


@pytest.fixture(scope="module")
def events(spark, archived_journal):
    return load_events(spark, archived_journal, *RANGE).cache()


@pytest.fixture(scope="module")
def rows(journal):
    return journal.rows()


def test_the_archive_holds_every_generated_event_once(events, rows):
    assert events.count() == len(rows)
    keys = {(r["destination"], r["event_ms"], r["event_seq"]) for r in events.collect()}
    assert keys == {(r["destination"], r["event_ms"], r["event_seq"]) for r in rows}


def test_per_minute_counters_match_counting_event_by_event(events, rows):
    got = {(r["destination"], r["minute_ms"]): {n: r[n] for n in jobs.COUNTER_NAMES}
           for r in jobs.per_minute(events).collect()}
    expected = reference.per_minute(rows)
    assert got == expected
    totals = {n: sum(v[n] for v in got.values()) for n in jobs.COUNTER_NAMES}
    assert totals["redelivered"] > 0 and totals["dead_lettered"] > 0 and totals["expired"] > 0


def test_latency_percentiles_match_per_destination_and_per_consumer(events, rows):
    got = reference.assert_latency_matches(jobs.latency(jobs.latency_samples(jobs.lives(events))), rows)
    assert {k[2] for k in got} == set(jobs.LATENCY_METRICS)
    assert {k[1] for k in got} >= {None, "c1", "c2", "c3"}


def test_redelivery_distribution_and_dead_letter_causes_match(events, rows):
    lives = jobs.lives(events)
    got = {(r["destination"], r["redeliveries"]): r["messages"]
           for r in jobs.redelivery_distribution(lives).collect()}
    assert got == reference.redeliveries(rows)
    assert max(k[1] for k in got) == 6  # the seventh failure dead-letters
    causes = {(r["destination"], r["outcome"], r["cause"], r["target"]): r["count"]
              for r in jobs.dead_letter_causes(events).collect()}
    assert causes == reference.dead_letters(rows)
    assert {k[2] for k in causes} == {"expired", "redelivery", "poison"}


def test_group_messages_owner_changes_and_owners_match(events, rows):
    got = {(r["destination"], r["group"]): (r["messages"], r["assignments"], r["owner_changes"], r["owner"])
           for r in jobs.groups(events).collect()}
    expected = reference.groups(rows)
    assert got == expected
    assert sum(v[2] for v in got.values()) > 0


def test_groups_and_messages_per_consumer_and_active_consumers_match(events, rows):
    got = {(r["destination"], r["consumer"]): (r["groups"], r["messages"])
           for r in jobs.group_consumers(events).collect()}
    assert got == reference.group_consumers(rows)
    active = {(r["destination"], r["consumer"]) for r in jobs.active_consumers(events).collect()}
    assert active == reference.active_consumers(rows)
    assert ("queue://orders", "c1") not in active  # removed two thirds in


def test_slow_consumer_episodes_and_aborts_match(events, rows):
    got = sorted((r["destination"], r["consumer"], r["start_ts"], r["end_ts"], r["signals"])
                 for r in jobs.slow_consumer_episodes(events).collect())
    assert got == reference.slow_episodes(rows)
    aborted = [(r["destination"], r["consumer"], r["reason"], r["strategy"], r["abort_connection"])
               for r in jobs.aborts(events).collect()]
    expected = [(r["destination"], r["consumer"], r["reason"], r["strategy"], False)
                for r in rows if r["type"] == "abort"]
    assert sorted(aborted) == sorted(expected) and len(aborted) == 2


def test_a_time_range_keeps_only_its_events(spark, archived_journal, rows):
    since, until = START_MS + 5 * 60_000, START_MS + 10 * 60_000
    window = load_events(spark, archived_journal, since, until)
    assert window.count() == sum(1 for r in rows if since <= r["ts"] < until)
    got = {(r["destination"], r["minute_ms"]): {n: r[n] for n in jobs.COUNTER_NAMES}
           for r in jobs.per_minute(window).collect()}
    assert got == reference.per_minute([r for r in rows if since <= r["ts"] < until])
