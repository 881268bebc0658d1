"""AMQ_SCHEDULED_CRON (ActiveMQ's scheduler, no section of the spec): a job kept under the message's id that
delivers at each minute its expression names ('<id>#1', '<id>#2', ...), in UTC, until it is cancelled; with a
delay (or a period) its first time is that much later; with a repeat each of its times starts a run of
repeat + 1 deliveries a period apart. The fake clock starts at 2023-11-14T22:13:20Z."""

from __future__ import annotations

import datetime

import pytest

from broker_core.errors import InvalidMessage
from broker_core.messages import Message

from ...helpers.broker import consumer, drain

START = 1_700_000_000_000  # 2023-11-14T22:13:20Z (FakeClock)


def at(text: str) -> int:
    """ms since the start, of a UTC time on the fake clock's first day ('22:15:00')."""
    t = datetime.datetime.fromisoformat(f"2023-11-14T{text}").replace(tzinfo=datetime.UTC)
    return int(t.timestamp() * 1000) - START


def run(broker, clock, c, until_ms: int, step_ms: int = 1000) -> list[tuple[str, int]]:
    """Move the clock by steps up to `until_ms` after the start; (id, when) of each delivery, acked."""
    got = []
    while clock.now_ms() - START < until_ms:
        clock.advance(step_ms)
        for d in drain(broker, c):
            got.append((d.message_id, clock.now_ms() - START))
            broker.ack(c, d.message_id)
    return got


def test_a_cron_job_delivers_at_each_time_its_expression_names_and_stays(broker, clock):
    c = consumer(broker, ack_mode="client-individual")
    (job,) = broker.send("orders", Message(body="tick", cron="*/5 * * * *"))
    assert job.status == "scheduled"
    got = run(broker, clock, c, at("22:31:00"))
    assert got == [(f"{job}#1", at("22:15:00")), (f"{job}#2", at("22:20:00")), (f"{job}#3", at("22:25:00")),
                   (f"{job}#4", at("22:30:00"))]
    st = broker.stats("orders")
    # each firing is an enqueue, as a repeat's; the job itself never ends
    assert (st.enqueued, st.parked) == (4, 1)
    (parked,) = broker.browse("orders").messages
    assert (parked.message.message_id, parked.state) == (job, "parked")
    assert broker.parked_times("orders", [job])[job] == {"due": START + at("22:35:00"), "period": None,
                                                         "repeats_left": None, "cron": "*/5 * * * *"}


def test_a_delay_or_a_period_moves_only_the_first_time(broker, clock):
    """ActiveMQ's JobScheduler adds the delay (or, without one, the period) to the first time only."""
    c = consumer(broker, ack_mode="client-individual")
    (delayed,) = broker.send("orders", Message(body="d", cron="*/10 * * * *", delay_ms=90_000))
    (periodic,) = broker.send("orders", Message(body="p", cron="*/10 * * * *", period_ms=30_000))
    got = run(broker, clock, c, at("22:41:00"))
    assert sorted(got, key=lambda g: (g[1], g[0])) == sorted([
        (f"{periodic}#1", at("22:20:30")), (f"{delayed}#1", at("22:21:30")),
        (f"{delayed}#2", at("22:30:00")), (f"{periodic}#2", at("22:30:00")),
        (f"{delayed}#3", at("22:40:00")), (f"{periodic}#3", at("22:40:00"))], key=lambda g: (g[1], g[0]))


def test_with_a_repeat_each_time_starts_a_run_of_deliveries_a_period_apart(broker, clock):
    """ActiveMQ's scheduler delivers nothing at the cron time itself then: it schedules a job with the
    period and repeat, whose first delivery is a period (or the delay) later. The first time is itself a
    period after the expression's (as without a repeat), so the first run starts at 22:15:10."""
    c = consumer(broker, ack_mode="client-individual")
    (job,) = broker.send("orders", Message(body="burst", cron="*/5 * * * *", period_ms=10_000, repeat=2))
    got = run(broker, clock, c, at("22:21:00"))
    assert got == [(f"{job}#{n}", at(t)) for n, t in enumerate(
        ["22:15:20", "22:15:30", "22:15:40", "22:20:10", "22:20:20", "22:20:30"], start=1)]
    assert broker.stats("orders").enqueued == 6


def test_runs_that_overlap_all_deliver(broker, clock):
    """Every minute a run of 3 deliveries 45 s apart: runs overlap, each delivers its own. (Times: 22:14:45
    (22:14 plus the period), 22:15, 22:16, 22:17; their runs from 22:15:30, 22:15:45, 22:16:45, 22:17:45.)"""
    c = consumer(broker, ack_mode="client-individual")
    (job,) = broker.send("orders", Message(body="o", cron="* * * * *", period_ms=45_000, repeat=2))
    got = run(broker, clock, c, at("22:17:00"))
    times = [t for _i, t in got]
    assert times == [at("22:15:30"), at("22:15:45"), at("22:16:15"), at("22:16:30"), at("22:16:45"),
                     at("22:17:00")]
    assert [i for i, _t in got] == [f"{job}#{n}" for n in range(1, 7)]


def test_a_cron_job_is_cancelled_by_remove_message_and_by_purge(broker, clock):
    c = consumer(broker)
    (one,) = broker.send("orders", Message(body="a", cron="* * * * *"))
    (two,) = broker.send("orders", Message(body="b", cron="* * * * *", period_ms=1_000, repeat=3))
    assert broker.stats("orders").parked == 2
    assert broker.remove_message("orders", one)
    broker.purge("orders")
    clock.advance(300_000)
    assert drain(broker, c) == []
    st = broker.stats("orders")
    assert (st.parked, st.enqueued) == (0, 0)


def test_a_cron_job_on_a_topic_fires_to_the_subscriptions_of_its_time(broker, clock):
    from ..s07_topics.test_topics import sub

    subscribers: dict[str, object] = {"early": sub(broker, "topic://ticks")}
    got: dict[str, list[str]] = {"early": [], "late": []}
    (job,) = broker.send("topic://ticks", Message(body="t", cron="*/2 * * * *"))
    while clock.now_ms() - START < at("22:16:05"):
        clock.advance(5_000)
        if "late" not in subscribers and clock.now_ms() - START >= at("22:15:00"):
            subscribers["late"] = sub(broker, "topic://ticks")
        for name, s in subscribers.items():
            got[name] += [d.message_id for d in drain(broker, s)]
    assert got == {"early": [f"{job}#1", f"{job}#2"], "late": [f"{job}#2"]}
    st = broker.stats("topic://ticks")
    assert (st.parked, st.enqueued) == (1, 2)


@pytest.mark.parametrize(("cron", "says"), [
    ("61 * * * *", "the minute field '61' is outside 0-60"),
    ("* * * *", "4 fields, not 5"),
    ("0 0 30 2 *", "never fire"),
])
def test_an_invalid_expression_is_refused_naming_the_header_and_nothing_changes(broker, cron, says):
    with pytest.raises(InvalidMessage, match="AMQ_SCHEDULED_CRON") as raised:
        broker.send("orders", Message(body="x", cron=cron))
    assert says in str(raised.value)
    assert broker.destinations() == []


def test_a_job_keeps_at_most_max_cron_runs_going(broker, clock):
    """Every minute a run 90 minutes long (its first delivery 1 ms after the time: the delay): after 16
    times, 16 runs go on and the 17th time starts none (lifecycle.MAX_CRON_RUNS), so each script call's
    work stays bounded."""
    import msgpack

    (job,) = broker.send("orders", Message(body="r", cron="* * * * *", delay_ms=1, period_ms=600_000,
                                           repeat=9))
    runs = []
    for _ in range(18):
        clock.advance(60_000)
        broker.dispatch("orders")
        record = msgpack.unpackb(broker.redis.hget(f"{broker.namespace}:{{q:orders}}:sched", job), raw=True)
        runs.append(len(record[9]))
    assert runs == [*range(1, 17), 16, 16]


def test_a_cron_job_sent_in_a_transaction_is_kept_at_the_commit(broker, clock):
    c = consumer(broker, ack_mode="client-individual")
    tx = broker.begin()
    broker.send("orders", Message(body="t", message_id="job", cron="*/5 * * * *"), tx=tx)
    assert broker.stats("orders").parked == 0
    broker.commit(tx)
    assert broker.stats("orders").parked == 1
    assert run(broker, clock, c, at("22:16:00")) == [("job#1", at("22:15:00"))]


def test_a_cron_job_waits_while_its_queue_is_over_its_memory_limit(broker, clock):
    """A cron job with nobody consuming must not fill Redis past the queue's memoryLimit: a firing waits
    while the queue is over its limit (ActiveMQ's scheduler blocks in the send), and a time passed
    meanwhile is not made up. (It fired every minute whatever the limit: 13 KB held of 2.2 KB after ten.)"""
    broker.policies.set_entry("queue", "orders", {"memoryLimit": 2 * 1100})
    (job,) = broker.send("orders", Message(body="x" * 1000, cron="* * * * *"))
    for _ in range(10):
        clock.advance(60_000)
        broker.dispatch("orders")
    st = broker.stats("orders")
    # the job (about 1.2 KB with its cron form) and the first firing, which took the queue past its limit
    # (a firing may overshoot by one delivery); the nine times since waited
    assert (st.queue_size, st.parked, st.enqueued) == (1, 1, 1)
    assert st.memory_usage <= st.memory_limit + 1300
    c = consumer(broker, ack_mode="client-individual")
    for d in drain(broker, c):
        broker.ack(c, d.message_id)
    room = clock.now_ms() - START
    got = run(broker, clock, c, room + 61_000)
    # room again: the firing that waited goes within FIRING_RETRY_MS, then the next time; none made up
    assert got == [(f"{job}#2", room + 1000), (f"{job}#3", at("22:24:00"))]
