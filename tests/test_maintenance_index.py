"""The maintenance index (<ns>:due): a tick visits what is due, not every destination. Real Redis, real
scripts, a fake clock; each test checks both what the tick did and how many entries it visited."""

from __future__ import annotations

import pytest

from broker_core import maintenance
from broker_core.broker import Broker
from broker_core.messages import Message
from broker_core.model import ConsumerSpec

PERIOD = 30_000  # the default expireMessagesPeriod


@pytest.fixture
def broker(redis_client, namespace, clock) -> Broker:
    return Broker(redis_client, namespace, clock)


def due(broker: Broker, index: str = "due") -> dict[str, int]:
    entries = broker.redis.zrange(f"{broker.namespace}:{index}", 0, -1, withscores=True)
    return {k.decode(): int(v) for k, v in entries}


def settle(broker: Broker, clock, queues: int) -> None:
    """Create `queues` queues and run the first tick, which visits each once and schedules it."""
    for i in range(queues):
        broker.ensure_destination(f"q{i}")
    first = maintenance.run_due(broker)
    assert first.destinations == queues and first.errors == [] and first.still_due == 0


def test_a_tick_with_nothing_due_visits_nothing_whatever_the_number_of_destinations(broker, clock):
    settle(broker, clock, 200)
    assert set(due(broker, "due:periodic").values()) == {clock.now_ms() + PERIOD}  # each one's next sweep
    assert due(broker) == {}  # nothing with a deadline
    clock.advance(1_000)
    report = maintenance.run_due(broker)
    assert (report.destinations, report.indexed, report.still_due) == (0, 200, 0)
    clock.advance(PERIOD)  # the sweeps come due together: every queue is visited once, then rests again
    assert maintenance.run_due(broker).sweeps == 200
    assert maintenance.run_due(broker).destinations == 0


def test_a_lapsed_consumer_is_reaped_by_the_first_tick_after_its_lease_ends_and_only_its_queue_is_visited(
        broker, clock):
    settle(broker, clock, 100)
    c = broker.add_consumer("q7", ConsumerSpec(prefetch=10, lease_ms=5_000, ack_mode="client-individual"))
    broker.send("q7", [Message(body=str(i)) for i in range(3)])
    assert len(broker.receive(c, 10)) == 3
    prefix = broker.ops.prefix(c.destination)
    assert due(broker)[prefix] == clock.now_ms() + 5_001  # the lease's end, written by the script
    clock.advance(5_000)  # the lease ends now: not lapsed yet
    assert maintenance.run_due(broker).destinations == 0
    clock.advance(1)
    report = maintenance.run_due(broker)
    assert report.reaped == [f"queue://q7#{c.consumer_id}"] and report.destinations == 1
    stats = broker.stats("q7")
    assert stats.consumer_count == 0 and stats.pending == 3 and stats.in_flight == 0  # messages back


def test_a_lease_renewed_shorter_brings_the_entry_forward_and_a_longer_one_leaves_it(broker, clock):
    settle(broker, clock, 1)
    c = broker.add_consumer("q0", ConsumerSpec(lease_ms=60_000))
    prefix = broker.ops.prefix(c.destination)
    assert due(broker)[prefix] == clock.now_ms() + 60_001
    broker.renew_leases("q0", [c.consumer_id], 10_000)
    assert due(broker)[prefix] == clock.now_ms() + 10_001
    broker.renew_leases("q0", [c.consumer_id], 20_000)  # later: no write; the visit finds it renewed
    assert due(broker)[prefix] == clock.now_ms() + 10_001
    clock.advance(10_001)
    report = maintenance.run_due(broker)
    assert (report.destinations, report.reaped) == (1, [])
    assert due(broker)[prefix] == clock.now_ms() - 10_001 + 20_001


def test_a_parked_message_is_dispatched_when_it_comes_due(broker, clock):
    settle(broker, clock, 10)
    c = broker.add_consumer("q3", ConsumerSpec(prefetch=5, lease_ms=3_600_000))
    broker.send("q3", Message(body="later", delay_ms=4_000))
    assert broker.receive(c, 5) == []
    clock.advance(3_999)
    assert maintenance.run_due(broker).destinations == 0
    clock.advance(1)
    report = maintenance.run_due(broker)
    assert (report.destinations, report.dispatched) == (1, 1)
    assert [d.body for d in broker.receive(c, 5)] == ["later"]


def test_a_changed_policy_brings_every_entry_forward_at_the_next_tick(broker, clock):
    settle(broker, clock, 20)
    broker.send("q5", Message(body="x", expiration=clock.now_ms() + 10))
    broker.policies.set_entry("queue", ">", {"expireMessagesPeriod": 2_000})
    broker.refresh_policies()
    clock.advance(2_000)  # the entries said 30 s; rebuilt for the new map, they are all due again now
    report = maintenance.run_due(broker)
    # (and ActiveMQ.DLQ, created by the expiry, joins the index due now: the same tick visits it)
    assert (report.destinations, report.sweeps, report.expired) == (21, 21, 1)
    assert set(due(broker, "due:periodic").values()) == {clock.now_ms() + 2_000}


def test_an_index_lost_or_never_built_is_rebuilt_from_the_registry(broker, clock, redis_client, namespace):
    settle(broker, clock, 30)
    c = broker.add_consumer("q9", ConsumerSpec(lease_ms=1_000))
    redis_client.delete(*(f"{namespace}:due{s}" for s in ("", ":periodic", ":state")))  # as before the index
    clock.advance(1_001)
    report = maintenance.run_due(broker)
    assert report.reaped == [f"queue://q9#{c.consumer_id}"] and len(due(broker, "due:periodic")) == 30


def test_a_deleted_destination_leaves_the_index_at_its_next_visit(broker, clock):
    settle(broker, clock, 3)
    broker.delete_destination("q1")
    clock.advance(PERIOD)
    assert maintenance.run_due(broker).destinations == 3
    assert sorted(due(broker, "due:periodic")) == [f"{broker.namespace}:{{q:{u}}}" for u in ("q0", "q2")]


def test_a_topic_subscription_has_its_own_entry_and_its_lapsed_consumer_is_reaped(broker, clock):
    settle(broker, clock, 5)
    c = broker.add_consumer("topic://prices", ConsumerSpec(lease_ms=2_000))
    broker.send("topic://prices", Message(body="1"))
    assert len(broker.receive(c, 5)) == 1
    clock.advance(1_000)
    maintenance.run_due(broker)  # the topic's first visit
    clock.advance(1_001)
    report = maintenance.run_due(broker)
    assert report.reaped == [f"topic://prices#{c.consumer_id}"]
    assert report.destinations == 1  # the subscription only
    assert broker.subscriptions("topic://prices") == []  # a non-durable subscription ends with it


@pytest.mark.e2e
def test_at_2000_queues_a_lapsed_consumer_is_reaped_within_a_second_by_ticks_once_a_second(
        redis_client, namespace):
    import time

    broker = Broker(redis_client, namespace)  # the real clock
    for i in range(2_000):
        broker.ensure_destination(f"q{i}")
    maintenance.run_due(broker)  # the first tick schedules them all
    c = broker.add_consumer("q1234", ConsumerSpec(prefetch=5, lease_ms=2_000))
    broker.send("q1234", [Message(body=str(i)) for i in range(3)])
    assert len(broker.receive(c, 5)) == 3
    lease_end = int(redis_client.zscore(f"{namespace}:{{q:q1234}}:leases", c.consumer_id))
    visited = []
    while True:
        report = maintenance.run_due(broker)
        visited.append(report.destinations)
        if report.reaped:
            break
        assert time.time() * 1000 < lease_end + 3_000, "not reaped"
        time.sleep(max(0.0, 1 - (time.time() % 1)))  # once a second, as Celery beat
    reaped_at = time.time() * 1000
    assert report.reaped == [f"queue://q1234#{c.consumer_id}"]
    assert reaped_at - lease_end < 1_500
    assert broker.stats("q1234").pending == 3
    assert max(visited) <= 5  # nothing else was due: 2,000 queues, a handful of visits
