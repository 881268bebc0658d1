"""broker_core.maintenance on a real Redis with a fake clock: expiry sweeps, the reaper and the other
recovery work, the two slow-consumer abort strategies at the boundaries of their parameters, the
dispatcher reading policies at every tick, and leases keeping a job to one worker at a time."""

from __future__ import annotations

import threading

import pytest
import redis

from broker_core import maintenance
from broker_core.broker import Broker
from broker_core.destinations import parse_destination
from broker_core.effects import Eval
from broker_core.errors import UnknownConsumer
from broker_core.event_stream import expand
from broker_core.messages import Message
from broker_core.model import ConsumerRef, ConsumerSpec

CHECK = 30_000  # ActiveMQ's default checkPeriod, maxSlowDuration and maxTimeSinceLastAck


@pytest.fixture
def broker(redis_client, namespace, clock) -> Broker:
    b = Broker(redis_client, namespace, clock)
    b.ensure_destination("orders")
    return b


def set_policy(broker: Broker, **attributes) -> None:
    """The policy of every queue; the scripts' copy is refreshed too (maxExpirePageSize is theirs)."""
    broker.policies.set_entry("queue", ">", attributes)
    broker.refresh_policies()


def consumer(broker: Broker, cid: str, dest: str = "orders", **spec):
    """A consumer whose lease outlives the test unless it says otherwise (its adapter would renew it)."""
    spec.setdefault("ack_mode", "client-individual")
    spec.setdefault("lease_ms", 3_600_000)
    return broker.add_consumer(dest, ConsumerSpec(**spec), consumer_id=cid)


def receive_all(broker: Broker, c) -> list:
    out = []
    while got := broker.receive(c, 100):
        out += got
    return out


def consumer_ids(broker: Broker, dest: str = "orders") -> list[str]:
    return sorted(c.consumer_id for c in broker.stats(dest).consumers)


def events(redis_client, namespace: str, kind: str, dest: str = "orders") -> list[dict[str, str]]:
    raw = expand(redis_client.xrange(f"{namespace}:{{q:{dest}}}:events"))
    found = [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in raw]
    return [e for e in found if e["type"] == kind]


def expiring(clock, n: int, ttl_ms: int = 1_000, body: str = "x") -> list[Message]:
    return [Message(body=f"{body}{i}", expiration=clock.now_ms() + ttl_ms) for i in range(n)]


# -- expiry sweeps ------------------------------------------------------------------------------------


def test_a_sweep_walks_the_whole_queue_page_by_page_across_runs_while_it_is_in_use(broker, clock):
    set_policy(broker, maxExpirePageSize=100)
    keep, expire = 1_500, 1_500
    for start in range(0, keep, 500):  # interleaved: every page holds both kinds
        batch = [m for pair in zip(expiring(clock, 500, ttl_ms=10**9, body=f"k{start}-"),
                                   expiring(clock, 500, ttl_ms=1_000, body=f"e{start}-"), strict=True)
                 for m in pair]
        broker.send("orders", batch)
    clock.advance(1_001)
    worker = consumer(broker, "W", prefetch=50)
    taken = 0
    runs = []
    while not runs or not runs[-1].cycle_done:
        runs.append(maintenance.run_expiry_sweep(broker, "orders", max_pages=5))
        for delivery in broker.receive(worker, 20):  # the queue is in use between runs
            broker.ack(worker, delivery.message_id)
            taken += 1
        assert len(runs) < 100

    assert len(runs) > 3 and all(run.ran and run.pages <= 5 for run in runs)
    stats = broker.stats("orders")
    assert stats.expired == expire  # by the sweeps, or by dispatch meeting them first (spec §6)
    assert taken + stats.queue_size == keep  # nothing lost, nothing kept that ran out
    assert broker.stats("ActiveMQ.DLQ").queue_size == expire
    status = maintenance.job_status(broker, "orders")["expire"]
    assert status["running"] == 0 and status["last_expired"] == sum(run.expired for run in runs)


@pytest.mark.e2e
def test_expired_messages_leave_a_100000_message_queue_through_successive_sweeps_while_it_is_in_use(
        broker, clock):
    set_policy(broker, processExpired=False)  # dropped, not dead-lettered: the sweep is what is measured
    total = 100_000
    soon = clock.now_ms() + 1_000
    for start in range(0, total, 1_000):  # every other message runs out after a second
        broker.send("orders", [Message(body=f"m{start + i}", expiration=soon if i % 2 else 0)
                               for i in range(1_000)])
    clock.advance(1_001)
    worker = consumer(broker, "W", prefetch=100)
    consumed = sweeps = 0
    while sweeps == 0 or maintenance.job_status(broker, "orders")["expire"]["running"]:
        assert maintenance.run_due(broker, ["queue://orders"]).sweeps == 1
        sweeps += 1
        broker.send("orders", Message(body="more"))  # producers and consumers go on between the runs
        for delivery in broker.receive(worker, 100):
            broker.ack(worker, delivery.message_id)
            consumed += 1
        clock.advance(1_000)
    stats = broker.stats("orders")
    assert sweeps > 1
    assert stats.expired == total // 2
    assert consumed + stats.queue_size == total // 2 + sweeps


def test_sweeps_follow_expireMessagesPeriod_read_at_every_tick_and_zero_turns_them_off(broker, clock):
    set_policy(broker, expireMessagesPeriod=60_000)

    def tick(b: Broker) -> maintenance.TickReport:  # the DLQ gets its own sweeps
        return maintenance.run_due(b, ["queue://orders"])

    broker.ensure_destination("orders")
    assert tick(broker).sweeps == 1  # the first sweep sets the phase
    broker.send("orders", expiring(clock, 3, ttl_ms=10))

    clock.advance(59_999)
    assert tick(broker).sweeps == 0
    assert broker.stats("orders").expired == 0
    clock.advance(1)
    report = tick(broker)
    assert (report.sweeps, report.expired) == (1, 3)

    broker.send("orders", expiring(clock, 2, ttl_ms=10))
    clock.advance(20_000)
    assert tick(broker).sweeps == 0
    set_policy(broker, expireMessagesPeriod=20_000)  # no restart: the next tick reads it
    assert tick(broker).expired == 2

    set_policy(broker, expireMessagesPeriod=0)
    broker.send("orders", expiring(clock, 1, ttl_ms=10))
    clock.advance(10**6)
    assert tick(broker).sweeps == 0
    assert broker.stats("orders").pending == 1


def test_an_unfinished_sweep_goes_on_at_the_next_tick_whatever_the_period(broker, clock, monkeypatch):
    monkeypatch.setattr(maintenance, "SWEEP_PAGES_PER_RUN", 2)
    set_policy(broker, maxExpirePageSize=10, expireMessagesPeriod=3_600_000)
    broker.send("orders", expiring(clock, 95))
    clock.advance(1_001)
    expired = []
    for _ in range(5):
        expired.append(maintenance.run_due(broker, ["queue://orders"]).expired)
        clock.advance(1_000)
    assert expired == [20, 20, 20, 20, 15]
    assert maintenance.run_due(broker, ["queue://orders"]).sweeps == 0  # done; the next waits for the period


def test_a_paused_queue_is_not_swept(broker, clock):
    broker.send("orders", expiring(clock, 2))
    broker.pause("orders")
    clock.advance(1_001)
    maintenance.run_expiry_sweep(broker, "orders", force=True)
    assert broker.stats("orders").pending == 2
    broker.resume("orders")
    maintenance.run_expiry_sweep(broker, "orders", force=True)
    assert broker.stats("orders").expired == 2


# -- leases -------------------------------------------------------------------------------------------


def test_a_job_another_worker_holds_is_skipped_until_its_lease_is_released_or_lapses(broker, clock):
    broker.send("orders", expiring(clock, 4))
    clock.advance(1_001)
    token = maintenance.acquire_lease(broker, "orders", "expire", 30_000)
    assert token is not None
    assert maintenance.acquire_lease(broker, "orders", "expire", 30_000) is None
    assert maintenance.run_expiry_sweep(broker, "orders").ran is False
    status = maintenance.job_status(broker, "orders")
    assert status["expire"]["leased_until"] == clock.now_ms() + 30_000

    clock.advance(30_000)  # the holder died mid-job: its lease lapses
    assert maintenance.run_expiry_sweep(broker, "orders").expired == 4
    assert maintenance.release_lease(broker, "orders", "expire", token) is False  # not the holder now
    assert "leased_until" not in maintenance.job_status(broker, "orders")["expire"]


def test_workers_racing_for_one_sweep_run_it_once(redis_url, namespace, clock):
    clients = [redis.Redis.from_url(redis_url) for _ in range(6)]
    brokers = [Broker(client, namespace, clock) for client in clients]
    set_policy(brokers[0], maxExpirePageSize=50)
    brokers[0].send("orders", expiring(clock, 2_000))
    clock.advance(1_001)
    barrier = threading.Barrier(len(brokers))
    results: list[maintenance.ExpirySweep] = []

    def work(b: Broker) -> None:
        barrier.wait()
        results.append(maintenance.run_expiry_sweep(b, "orders", max_pages=None))

    threads = [threading.Thread(target=work, args=(b,)) for b in brokers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for client in clients:
        client.close()

    assert sorted(r.ran for r in results) == [False] * 5 + [True]
    (winner,) = [r for r in results if r.ran]
    assert winner.expired == 2_000 and winner.cycle_done
    stats = brokers[0].stats("orders")
    assert (stats.expired, stats.queue_size) == (2_000, 0)
    assert maintenance.job_status(brokers[0], "orders")["expire"]["examined"] == 2_000  # walked once


# -- recovery: the reaper, parked messages, left-over forwards ----------------------------------------


def test_the_reaper_closes_a_lapsed_consumer_and_its_messages_go_to_another_redelivered(broker, clock):
    lapsing = consumer(broker, "A", prefetch=5, lease_ms=5_000)
    broker.send("orders", [Message(body="m0"), Message(body="m1")])
    assert len(receive_all(broker, lapsing)) == 2
    other = consumer(broker, "B", prefetch=5, lease_ms=60_000)

    clock.advance(5_000)  # the lease runs to exactly now: not lapsed yet
    assert maintenance.run_due(broker).reaped == []
    clock.advance(1)
    assert maintenance.run_due(broker).reaped == ["queue://orders#A"]

    assert [(d.body, d.redelivered) for d in receive_all(broker, other)] == [("m0", True), ("m1", True)]
    assert consumer_ids(broker) == ["B"]
    assert maintenance.job_status(broker, "orders")["recover"]["reaped"] == 1
    assert maintenance.run_recovery(broker, "orders").ran is False  # nothing left to do


def test_a_parked_message_is_dispatched_when_it_comes_due_without_other_traffic(broker, clock):
    c = consumer(broker, "A", prefetch=1)
    broker.send("orders", Message(body="m"))
    (delivery,) = broker.receive(c)
    broker.nack(c, delivery.message_id)  # back after initialRedeliveryDelay (1000 ms)
    clock.advance(999)
    assert maintenance.run_due(broker).dispatched == 0
    clock.advance(1)
    assert maintenance.run_due(broker).dispatched == 1
    assert [(d.body, d.redelivered) for d in broker.receive(c)] == [("m", True)]


def test_forwards_a_crashed_process_left_behind_are_completed_after_a_grace_time(broker, clock):
    broker.send("orders", expiring(clock, 3))
    clock.advance(1_001)
    # The sweep script set the expired messages aside for the DLQ; the process died before forwarding.
    prefix = broker.ops.prefix(parse_destination("orders"))

    def sweep_script_only():
        return (yield Eval("sweep", (prefix,), (clock.now_ms(),)))

    assert int(broker._run(sweep_script_only())[1]) == 3
    assert broker.stats("orders").forwarding == 3

    assert maintenance.run_recovery(broker, "orders").ran is False  # maybe its process is at it
    clock.advance(maintenance.FORWARD_GRACE_MS - 1)
    assert maintenance.run_recovery(broker, "orders").ran is False
    clock.advance(1)
    assert maintenance.run_recovery(broker, "orders").forwarded == 3
    assert broker.stats("orders").forwarding == 0
    assert broker.stats("ActiveMQ.DLQ").queue_size == 3


# -- abortSlowAckConsumerStrategy (spec §8.3) ---------------------------------------------------------


def test_slow_ack_defaults_abort_at_the_first_check_more_than_30s_after_the_last_ack(broker, clock,
                                                                                       redis_client,
                                                                                       namespace):
    set_policy(broker, slowConsumerStrategy="abortSlowAckConsumerStrategy")
    t0 = clock.now_ms()
    x = consumer(broker, "X", prefetch=1)
    clock.set(t0 + 1)
    y = consumer(broker, "Y", prefetch=1)
    broker.send("orders", [Message(body="m0"), Message(body="m1")])
    assert [d.body for d in receive_all(broker, x)] == ["m0"]
    assert [d.body for d in receive_all(broker, y)] == ["m1"]
    z = consumer(broker, "Z", prefetch=10)  # idle: no messages, never acked; ignoreIdleConsumers

    assert maintenance.run_due(broker).slow_checks == 1  # t0+1: the first check sets the phase
    clock.set(t0 + 1 + CHECK - 1)
    assert maintenance.run_due(broker).slow_checks == 0  # not due
    clock.set(t0 + 1 + CHECK)  # X: 30001 ms since it was created (its last "ack"); Y: exactly 30000
    assert maintenance.run_due(broker).aborted == ["queue://orders#X"]
    assert consumer_ids(broker) == ["Y", "Z"]
    (redelivered,) = receive_all(broker, z)
    assert (redelivered.body, redelivered.redelivered) == ("m0", True)
    broker.ack(z, redelivered.message_id)  # Z acks at t0+30001

    clock.set(t0 + 1 + 2 * CHECK)  # Y: 60000 ms; Z: 30000 ms since its ack
    assert maintenance.run_due(broker).aborted == ["queue://orders#Y"]
    assert consumer_ids(broker) == ["Z"]
    assert [(d.body, d.redelivered) for d in receive_all(broker, z)] == [("m1", True)]

    notice = maintenance.abort_notice(broker, "orders", "X")
    assert notice.strategy == "abortSlowAckConsumer" and notice.abort_connection is False
    assert notice.at == t0 + 1 + CHECK
    assert maintenance.abort_reason(broker, "orders", "X") == (
        "aborted by abortSlowAckConsumerStrategy: no acknowledgement for 30001 ms (maxTimeSinceLastAck "
        "30000 ms), slow for 30000 ms (maxSlowDuration 30000 ms)")
    assert maintenance.abort_reason(broker, "orders", "Z") is None
    assert [e["consumer"] for e in events(redis_client, namespace, "slow_consumer")] == ["X", "Y"]
    aborts = events(redis_client, namespace, "abort")
    assert [(e["consumer"], e["strategy"], e["abort_connection"]) for e in aborts] == [
        ("X", "abortSlowAckConsumer", "0"), ("Y", "abortSlowAckConsumer", "0")]
    removed = events(redis_client, namespace, "consumer_remove")
    assert [(e["consumer"], e["reason"]) for e in removed] == [("X", "aborted"), ("Y", "aborted")]


def holding_consumer(broker: Broker, cid: str = "A", **spec):
    """A consumer holding one message it never acknowledges."""
    c = consumer(broker, cid, prefetch=1, **spec)
    broker.send("orders", Message(body=f"for-{cid}"))
    assert len(receive_all(broker, c)) == 1
    return c


def checks_until_aborted(broker: Broker, clock, period: int, limit: int = 6) -> int | None:
    """Run the strategy every `period` ms; the number of the check that aborted consumer A."""
    for n in range(1, limit + 1):
        clock.advance(period)
        check = maintenance.run_slow_consumer_check(broker, "orders")
        assert check.ran
        if check.aborted:
            assert check.aborted == ["A"]
            return n
    return None


@pytest.mark.parametrize(("max_slow_duration", "aborted_at_check"), [
    (10_000, 1), (20_000, 2), (20_001, 3), (30_000, 3), (0, None), (-1, None),
])
def test_slow_ack_maxSlowDuration_counts_checks_times_checkPeriod(broker, clock, max_slow_duration,
                                                                  aborted_at_check):
    set_policy(broker, slowConsumerStrategy="abortSlowAckConsumer", checkPeriod=10_000,
               maxSlowDuration=max_slow_duration, maxTimeSinceLastAck=0)
    holding_consumer(broker)
    assert checks_until_aborted(broker, clock, 10_000) == aborted_at_check


@pytest.mark.parametrize(("max_slow_count", "aborted_at_check"), [(1, 1), (2, 2), (3, 3), (-1, None)])
def test_slow_ack_maxSlowCount_counts_the_checks_that_found_it_slow(broker, clock, max_slow_count,
                                                                     aborted_at_check):
    set_policy(broker, slowConsumerStrategy="abortSlowAckConsumer", checkPeriod=1_000, maxSlowDuration=-1,
               maxSlowCount=max_slow_count, maxTimeSinceLastAck=0)
    holding_consumer(broker)
    assert checks_until_aborted(broker, clock, 1_000) == aborted_at_check


def test_slow_ack_an_ack_in_time_drops_the_entry_and_the_count_starts_again(broker, clock):
    set_policy(broker, slowConsumerStrategy="abortSlowAckConsumer", checkPeriod=10_000,
               maxSlowDuration=20_000, maxTimeSinceLastAck=15_000)
    c = consumer(broker, "A", prefetch=1)
    broker.send("orders", [Message(body="m0"), Message(body="m1"), Message(body="m2")])
    assert maintenance.run_slow_consumer_check(broker, "orders").tracked == 0  # the phase
    clock.advance(10_000)
    assert maintenance.run_slow_consumer_check(broker, "orders").tracked == 0  # 10 s since it joined
    clock.advance(10_000)
    assert maintenance.run_slow_consumer_check(broker, "orders").tracked == 1  # 20 s: slow, marked once
    clock.advance(5_000)
    (d,) = broker.receive(c)
    broker.ack(c, d.message_id)  # and the freed slot took m1
    clock.advance(5_000)
    assert maintenance.run_slow_consumer_check(broker, "orders").tracked == 0  # 5 s since the ack
    clock.advance(20_000)
    check = maintenance.run_slow_consumer_check(broker, "orders")  # 25 s: slow again, a fresh entry
    assert (check.tracked, check.aborted) == (1, [])
    clock.advance(10_000)
    assert maintenance.run_slow_consumer_check(broker, "orders").aborted == ["A"]


@pytest.mark.parametrize(("ignore_idle", "aborted"), [(True, []), (False, ["A"])])
def test_slow_ack_ignoreIdleConsumers_spares_a_consumer_holding_nothing(broker, clock, ignore_idle, aborted):
    set_policy(broker, slowConsumerStrategy="abortSlowAckConsumer", ignoreIdleConsumers=ignore_idle)
    consumer(broker, "A", prefetch=5)
    clock.advance(CHECK + 1)
    assert maintenance.run_slow_consumer_check(broker, "orders").aborted == aborted


def test_slow_ack_a_negative_maxTimeSinceLastAck_turns_the_strategy_off(broker, clock):
    set_policy(broker, slowConsumerStrategy="abortSlowAckConsumer", maxTimeSinceLastAck=-1)
    holding_consumer(broker)
    assert checks_until_aborted(broker, clock, CHECK, limit=3) is None


def test_abortConnection_is_in_the_tombstone_for_the_adapter(broker, clock, redis_client, namespace):
    set_policy(broker, slowConsumerStrategy="abortSlowAckConsumer", abortConnection=True)
    holding_consumer(broker)
    clock.advance(CHECK + 1)
    assert maintenance.run_slow_consumer_check(broker, "orders").aborted == ["A"]
    notice = maintenance.abort_notice(broker, "orders", "A")
    assert notice.abort_connection is True
    assert [e["abort_connection"] for e in events(redis_client, namespace, "abort")] == ["1"]


# -- abortSlowConsumerStrategy (spec §8.2) ------------------------------------------------------------


def slow_by_dispatch(broker: Broker, clock, *, others: bool = True):
    """Consumer A (prefetch 1) holds a message while the queue tries to dispatch more to it: §8.1 slow.
    With `others`, consumer B takes (and may ack) the rest."""
    a = consumer(broker, "A", prefetch=1)
    b = consumer(broker, "B", prefetch=100) if others else None
    clock.advance(5)
    broker.send("orders", [Message(body=f"m{i}") for i in range(4)])
    (held,) = receive_all(broker, a)
    (stats,) = [c for c in broker.stats("orders").consumers if c.consumer_id == "A"]
    assert stats.slow_since == clock.now_ms()
    return a, b, held.message_id


@pytest.mark.parametrize(("max_slow_duration", "aborted_at_check"), [(30_000, 1), (30_001, 2), (60_000, 2),
                                                                     (60_001, 3)])
def test_slow_consumer_maxSlowDuration_counts_checks_while_it_stays_slow(broker, clock, max_slow_duration,
                                                                          aborted_at_check):
    set_policy(broker, slowConsumerStrategy="abortSlowConsumerStrategy", maxSlowDuration=max_slow_duration)
    assert maintenance.run_slow_consumer_check(broker, "orders").ran  # the phase: checks every 30 s
    slow_by_dispatch(broker, clock)  # 5 ms later
    clock.advance(CHECK - 5)
    checks = 0
    while checks < 4:
        check = maintenance.run_slow_consumer_check(broker, "orders")
        checks += 1
        assert check.ran
        if check.aborted:
            break
        clock.advance(CHECK)
    assert checks == aborted_at_check
    assert consumer_ids(broker) == ["B"]


def test_slow_consumer_defaults_abort_at_the_first_check_after_it_became_slow(broker, clock):
    set_policy(broker, slowConsumerStrategy="abortSlowConsumer")
    assert maintenance.run_due(broker).slow_checks == 1
    _, b, _ = slow_by_dispatch(broker, clock)
    clock.advance(CHECK - 6)
    assert maintenance.run_due(broker).slow_checks == 0  # 29999 ms after the phase: not due
    clock.advance(1)
    assert maintenance.run_due(broker).aborted == ["queue://orders#A"]
    delivered = {d.body: d.redelivered for d in receive_all(broker, b)}
    assert delivered == {"m0": True, "m1": False, "m2": False, "m3": False}
    assert maintenance.abort_reason(broker, "orders", "A") == (
        "aborted by abortSlowConsumerStrategy: slow for 30000 ms (maxSlowDuration 30000 ms)")


def test_slow_consumer_that_gets_room_again_is_no_longer_tracked(broker, clock):
    set_policy(broker, slowConsumerStrategy="abortSlowConsumer", maxSlowDuration=60_000)
    maintenance.run_slow_consumer_check(broker, "orders")
    a, _, held = slow_by_dispatch(broker, clock)
    clock.advance(CHECK - 5)
    assert maintenance.run_slow_consumer_check(broker, "orders").tracked == 1
    broker.ack(a, held)  # room again, and B took everything else
    clock.advance(CHECK)
    check = maintenance.run_slow_consumer_check(broker, "orders")
    assert (check.tracked, check.aborted) == (0, [])


@pytest.mark.parametrize(("max_slow_count", "aborted"), [(2, ["A"]), (3, [])])
def test_slow_consumer_maxSlowCount_counts_each_time_it_became_slow(broker, clock, max_slow_count, aborted):
    set_policy(broker, slowConsumerStrategy="abortSlowConsumer", maxSlowDuration=-1,
               maxSlowCount=max_slow_count)
    maintenance.run_slow_consumer_check(broker, "orders")
    a, _, held = slow_by_dispatch(broker, clock, others=False)
    clock.advance(CHECK)
    assert maintenance.run_slow_consumer_check(broker, "orders").tracked == 1  # slowCount 1
    clock.advance(1)
    # The freed slot takes the next message, and the queue finds A full again: slow a second time.
    assert [d.body for d in broker.ack_and_receive(a, held, 1)] == ["m1"]
    clock.advance(CHECK)
    assert maintenance.run_slow_consumer_check(broker, "orders").aborted == aborted


def test_slow_consumer_with_both_limits_off_does_nothing(broker, clock):
    set_policy(broker, slowConsumerStrategy="abortSlowConsumer", maxSlowDuration=-1, maxSlowCount=-1)
    maintenance.run_slow_consumer_check(broker, "orders")
    slow_by_dispatch(broker, clock)
    for _ in range(3):
        clock.advance(CHECK)
        assert maintenance.run_slow_consumer_check(broker, "orders").tracked == 0
    assert consumer_ids(broker) == ["A", "B"]


# -- the dispatcher and the console's view ------------------------------------------------------------


def test_a_strategy_set_at_run_time_applies_at_the_next_tick(broker, clock):
    holding_consumer(broker)
    clock.advance(10 * CHECK)
    assert maintenance.run_due(broker).slow_checks == 0  # slowConsumerStrategy "none"
    set_policy(broker, slowConsumerStrategy="abortSlowAckConsumer", checkPeriod=1_000, maxSlowDuration=1_000)
    assert maintenance.run_due(broker).aborted == ["queue://orders#A"]


def test_an_operator_can_abort_a_consumer_and_the_adapter_reads_why(broker, clock):
    a = holding_consumer(broker)
    b = consumer(broker, "B", prefetch=5)
    maintenance.abort_consumer(broker, a, "stopped by the operator")
    assert maintenance.abort_reason(broker, "orders", "A") == "stopped by the operator"
    assert [(d.body, d.redelivered) for d in receive_all(broker, b)] == [("for-A", True)]
    with pytest.raises(UnknownConsumer):
        maintenance.abort_consumer(broker, ConsumerRef(parse_destination("orders"), "A"), "again")


def test_tombstones_are_bounded_in_number_and_age(broker, clock, monkeypatch):
    monkeypatch.setattr(maintenance, "TOMBSTONES_MAX", 2)
    monkeypatch.setattr(maintenance, "TOMBSTONE_MS", 10_000)
    orders = parse_destination("orders")
    for i in range(4):
        consumer(broker, f"C{i}")
    for i in range(3):
        clock.advance(1)
        maintenance.abort_consumer(broker, ConsumerRef(orders, f"C{i}"), f"why {i}")
    assert [maintenance.abort_reason(broker, orders, f"C{i}") for i in range(3)] == [None, "why 1", "why 2"]
    clock.advance(10_000)  # C1's is older than 10 s now, C2's exactly 10 s
    maintenance.abort_consumer(broker, ConsumerRef(orders, "C3"), "why 3")
    assert [maintenance.abort_reason(broker, orders, f"C{i}") for i in range(4)] == [None, None, "why 2",
                                                                                    "why 3"]


def test_one_failing_destination_does_not_stop_the_others(broker, clock, monkeypatch):
    broker.ensure_destination("good")
    broker.ensure_destination("bad")
    real = maintenance._visit

    def failing(b, dest, entry, tally):
        if dest.destination.name == "bad":  # (a Home: the destination, or one subscription)
            raise RuntimeError("boom")
        return real(b, dest, entry, tally)

    monkeypatch.setattr(maintenance, "_visit", failing)
    report = maintenance.run_due(broker)
    assert report.errors == ["queue://bad: RuntimeError: boom"]
    assert report.sweeps == 2  # "good" and "orders" were swept
    assert maintenance.last_tick(broker)["errors"] == 1
    # the failed entry is looked at again a second later, not in a loop within the tick
    assert maintenance.run_due(broker).errors == []
    clock.advance(maintenance.RETRY_MS)
    assert maintenance.run_due(broker).errors == ["queue://bad: RuntimeError: boom"]
    # the node page's recent failures: newest first, at most RECENT_ERRORS, with the tick's time
    recent = maintenance.recent_errors(broker.redis.lrange(maintenance.errors_key(broker.namespace), 0, -1))
    boom = "queue://bad: RuntimeError: boom"
    assert recent == [{"ts": clock.now_ms(), "error": boom},
                      {"ts": clock.now_ms() - maintenance.RETRY_MS, "error": boom}]
    for _ in range(maintenance.RECENT_ERRORS + 2):
        clock.advance(maintenance.RETRY_MS)
        maintenance.run_due(broker)
    assert broker.redis.llen(maintenance.errors_key(broker.namespace)) == maintenance.RECENT_ERRORS


def test_the_heartbeat_says_when_the_dispatcher_last_ran(broker, clock):
    assert maintenance.last_tick(broker) == {}
    broker.ensure_destination("orders")
    maintenance.run_due(broker)
    tick = maintenance.last_tick(broker)
    assert tick["last_tick"] == clock.now_ms() and tick["destinations"] == 1
