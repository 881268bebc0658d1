"""The per-message aggregates (jobs.messages: plain aggregates, consumer and group keys) and the fold for
the other messages (jobs.complex_messages) give exactly the plain-Python lives, latencies, redeliveries
and groups per consumer, on a journal made of the edge cases: redeliveries to one, two and three
consumers, messages that never ended, several lives, a life cut by the range, broker clocks out of stream
order, a dispatch after the ack, a dispatch without a consumer, a stream sequence too large to pack."""

from __future__ import annotations

import pytest

from analytics import jobs
from analytics.pipeline import load_events
from tests.analytics import reference
from tests.analytics.conftest import archive_journal
from tests.analytics.journal import START_MS, Journal

pytestmark = pytest.mark.e2e

DEST = "queue://edges"
SINCE, UNTIL = START_MS + 1_000, START_MS + 86_400_000
# The messages jobs.messages cannot take as one life from its aggregates (the fold takes them).
COMPLEX = {"cut-relife", "relife-ack", "three", "after-ack", "anonymous", "big-seq"}


def edge_journal() -> Journal:
    journal = Journal()

    def add(offset_ms: int, kind: str, **fields) -> None:
        journal.add(DEST, START_MS + offset_ms, kind, **fields)

    for c in ("c1", "c2", "c3"):
        add(0, "consumer_add", consumer=c)
    # Enqueued and dispatched before the range, acked in it: no life in the range.
    add(0, "enqueue", msg="cut", group="")
    add(10, "dispatch", msg="cut", consumer="c1", redeliveries=0)
    # Its first life starts before the range; in the range a dispatch of that life, then a second life.
    add(5, "enqueue", msg="cut-relife", group="")
    add(1_100, "dispatch", msg="cut-relife", consumer="c1", redeliveries=0)
    add(1_150, "deadletter", msg="cut-relife", cause="poison", target="queue://ActiveMQ.DLQ")
    add(1_200, "enqueue", msg="cut-relife", group="")
    add(1_300, "dispatch", msg="cut-relife", consumer="c2", redeliveries=0)
    add(1_400, "ack", msg="cut-relife", consumer="c2")
    add(2_000, "ack", msg="cut", consumer="c1")
    # Two lives; the second is acked without a dispatch of its own (the delivery is the first life's).
    add(1_500, "enqueue", msg="relife-ack", group="g2")
    add(1_510, "dispatch", msg="relife-ack", consumer="c1", redeliveries=0)
    add(1_600, "enqueue", msg="relife-ack", group="g3")
    add(1_650, "ack", msg="relife-ack", consumer="c1")
    # Redelivered to three consumers (complex), to one (simple), to two (simple: d_min and d_max).
    add(2_100, "enqueue", msg="three", group="g1")
    add(2_110, "dispatch", msg="three", consumer="c1", redeliveries=0)
    add(2_120, "redeliver", msg="three", consumer="c1", redeliveries=1)
    add(2_130, "dispatch", msg="three", consumer="c2", redeliveries=1)
    add(2_140, "dispatch", msg="three", consumer="c3", redeliveries=2)
    add(2_190, "ack", msg="three", consumer="c3")
    add(2_200, "enqueue", msg="same", group="g1")
    for r in range(3):
        add(2_210 + r * 10, "dispatch", msg="same", consumer="c1", redeliveries=r)
    add(2_270, "ack", msg="same", consumer="c1")
    add(2_300, "enqueue", msg="two", group="g2")
    add(2_310, "dispatch", msg="two", consumer="c3", redeliveries=0)
    add(2_320, "dispatch", msg="two", consumer="c2", redeliveries=1)
    add(2_390, "ack", msg="two", consumer="c2")
    # Never ended: dispatched and not acked; never dispatched.
    add(2_400, "enqueue", msg="open", group="g1")
    add(2_410, "dispatch", msg="open", consumer="c2", redeliveries=0)
    add(2_500, "enqueue", msg="waiting", group="")
    # The broker clocks (ts) out of stream order: the dispatch's ts is before the enqueue's.
    add(3_000, "enqueue", msg="clocks", group="")
    journal.add(DEST, START_MS + 2_990, "dispatch", stream_id=(START_MS + 3_000, 99), msg="clocks",
                consumer="c3", redeliveries=0)
    add(3_005, "ack", msg="clocks", consumer="c3")
    # A second dispatch and ack after the first ack; acked twice.
    add(3_100, "enqueue", msg="after-ack", group="g3")
    add(3_110, "dispatch", msg="after-ack", consumer="c1", redeliveries=0)
    add(3_120, "ack", msg="after-ack", consumer="c1")
    add(3_130, "dispatch", msg="after-ack", consumer="c2", redeliveries=1)
    add(3_140, "ack", msg="after-ack", consumer="c2")
    add(3_200, "enqueue", msg="acked-twice", group="")
    add(3_210, "dispatch", msg="acked-twice", consumer="c1", redeliveries=0)
    add(3_220, "ack", msg="acked-twice", consumer="c1")
    add(3_230, "ack", msg="acked-twice", consumer="c2")
    # A dispatch without a consumer ('' is archived as null).
    add(3_300, "enqueue", msg="anonymous", group="g1")
    add(3_310, "dispatch", msg="anonymous", consumer="", redeliveries=0)
    add(3_320, "ack", msg="anonymous", consumer="c1")
    # A stream sequence of 2^20 within one millisecond: its position does not pack into one long.
    add(3_400, "enqueue", msg="big-seq", group="")
    big_ms = START_MS + 3_410
    journal.add(DEST, big_ms, "dispatch", stream_id=(big_ms, 1 << 20), msg="big-seq", consumer="c1",
                redeliveries=0)
    add(3_420, "ack", msg="big-seq", consumer="c1")
    return journal


@pytest.fixture(scope="module")
def edge_rows():
    return [r for r in edge_journal().rows() if SINCE <= r["ts"] < UNTIL]


@pytest.fixture(scope="module")
def edge_events(spark, tmp_path_factory):
    location = archive_journal(edge_journal(), tmp_path_factory.mktemp("edges"))
    return load_events(spark, location, SINCE, UNTIL).cache()


def test_only_the_edge_cases_take_the_fold(edge_events):
    per_message = {r["msg"]: r["simple"] for r in jobs.messages(edge_events).collect()}
    assert "cut" not in per_message  # no enqueue in the range: no life
    assert {m for m, simple in per_message.items() if not simple} == COMPLEX
    assert {m for m, simple in per_message.items() if simple} == {"same", "two", "open", "waiting", "clocks",
                                                                   "acked-twice"}


def test_lives_equal_the_plain_python_fold(edge_events, edge_rows):
    got = {}
    for r in jobs.lives(edge_events).collect():
        first, ack = r["first_dispatch"], r["ack"]
        got[(r["destination"], r["msg"], r["life"])] = {
            "sent": r["sent_ts"],
            "first_dispatch": None if first is None else (first["ts"], first["consumer"]),
            "ack": None if ack is None else (ack["ts"], ack["consumer"], ack["delivered_ts"]),
            "max_redeliveries": r["max_redeliveries"]}
    expected = reference.lives(edge_rows)
    assert got == expected
    assert expected[(DEST, "relife-ack", 2)]["ack"] == (START_MS + 1_650, "c1", START_MS + 1_510)
    assert expected[(DEST, "after-ack", 1)]["ack"] == (START_MS + 3_120, "c1", START_MS + 3_110)
    assert expected[(DEST, "clocks", 1)]["first_dispatch"] == (START_MS + 2_990, "c3")


def test_latency_redeliveries_and_group_consumers_match(edge_events, edge_rows):
    reference.assert_latency_matches(jobs.latency(jobs.latency_samples(jobs.lives(edge_events))), edge_rows)
    redeliveries = {(r["destination"], r["redeliveries"]): r["messages"]
                    for r in jobs.redelivery_distribution(jobs.lives(edge_events)).collect()}
    assert redeliveries == reference.redeliveries(edge_rows)
    per_consumer = {(r["destination"], r["consumer"]): (r["groups"], r["messages"])
                    for r in jobs.group_consumers(edge_events).collect()}
    # relife-ack's two lives carry two groups; the reference keeps its last enqueue's group only.
    expected_groups = reference.group_consumers(edge_rows)
    expected_groups[(DEST, "c1")] = (expected_groups[(DEST, "c1")][0] + 1, expected_groups[(DEST, "c1")][1])
    assert per_consumer == expected_groups
    assert per_consumer[(DEST, None)] == (1, 1)  # the anonymous dispatch


def test_key_salt_gives_up_on_a_name_twice_in_one_destination(spark):
    seen = spark.createDataFrame([(DEST, "c1"), (DEST, "c1"), ("queue://other", "c2")],
                                 "destination string, consumer string")
    grouped = spark.createDataFrame([(DEST, "g1", 3)], "destination string, `group` string, messages long")
    assert jobs.key_salt(seen.distinct(), grouped) == 0
    with pytest.raises(jobs.KeyCollisionError, match="8 salts"):
        jobs.key_salt(seen, grouped)


def _table(frame) -> list[tuple]:
    return sorted((tuple(r) for r in frame.collect()), key=repr)


@pytest.mark.parametrize("which", ["edges", "generated"])
def test_the_pipeline_builds_the_tables_the_job_functions_build(which, edge_events, spark, archived_journal):
    """The pipeline's path (facts aggregated from the per-message rows, cached intermediates) gives the
    tables of the per-table functions (lives, latency_samples, …) that test_metrics checks."""
    from analytics.pipeline import compute

    events = edge_events if which == "edges" else load_events(spark, archived_journal, START_MS - 1, UNTIL)
    tables = compute(events)
    message_lives = jobs.lives(events)
    assert _table(tables["latency"]) == _table(jobs.latency(jobs.latency_samples(message_lives)).select(
        *tables["latency"].columns))
    assert _table(tables["redeliveries"]) == _table(jobs.redelivery_distribution(message_lives))
    assert _table(tables["group_consumers"]) == _table(jobs.group_consumers(events))
    assert _table(tables["groups"]) == _table(jobs.groups(events))
    assert _table(tables["active_consumers"]) == _table(jobs.active_consumers(events))
    assert _table(tables["dead_letters"]) == _table(jobs.dead_letter_causes(events))
    assert len(_table(tables["latency"])) > 10
