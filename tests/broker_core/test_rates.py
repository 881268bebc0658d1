"""The rate history (broker_core/rates.py, scripts/lua/rate_sample.lua): real Redis, real scripts, a fake
clock.
Counters become rates per series, the first sample sets a base (no spike), the rings stay within their
size, both resolutions, a stopped sampler, a destination made again, a new process, topics, and the tick's
bounded share."""

from __future__ import annotations

import pytest

from broker_core import maintenance, rates
from broker_core.broker import Broker
from broker_core.messages import Message
from broker_core.model import ConsumerSpec


@pytest.fixture
def broker(redis_client, namespace, clock) -> Broker:
    clock.set(1_800_000_000_000)  # a multiple of 60 s: steps line up with the clock in the assertions
    return Broker(redis_client, namespace, clock)


def send(broker: Broker, queue: str, n: int) -> None:
    broker.send(queue, [Message(body=f"m{i}") for i in range(n)])


def consume(broker: Broker, queue: str, n: int) -> None:
    c = broker.add_consumer(queue, ConsumerSpec(prefetch=n))
    got = broker.receive(c, n)
    broker.ack(c, [d.message_id for d in got], mode="individual")
    broker.close_consumer(c)


def test_counters_become_rates_per_series_and_the_first_sample_is_only_a_base(broker, clock):
    send(broker, "orders", 500)  # before the first sample: history starts at the base, no 500-message spike
    assert rates.sample(broker, ["queue://orders"]) == 1
    clock.advance(5_000)
    send(broker, "orders", 50)
    consume(broker, "orders", 20)
    rates.sample(broker, ["queue://orders"])
    h = rates.history(broker, "queue://orders", "5m")
    assert h.resolution_ms == 5_000 and len(h.times) == 60 and h.times[-1] == clock.now_ms()
    assert h.rates["enqueued"][-1] == 10.0  # 50 in 5 s
    # 20 acked; their acks freed the window, so 20 more were dispatched before the close
    assert h.rates["dispatched"][-1] == 8.0 and h.rates["acked"][-1] == 4.0
    assert h.rates["redelivered"][-1] == h.rates["expired"][-1] == h.rates["deadlettered"][-1] == 0.0
    # the step of the base sample reads 0, not 500/s; before it nothing was sampled
    assert h.rates["enqueued"][-2] == 0.0 and h.rates["enqueued"][-3] is None
    assert max(v for v in h.rates["enqueued"] if v is not None) == 10.0


def test_a_purge_is_not_a_rate_and_redeliveries_and_dead_letters_are(broker, clock):
    broker.ensure_destination("q")
    rates.sample(broker, ["queue://q"])
    clock.advance(5_000)
    send(broker, "q", 100)
    c = broker.add_consumer("q", ConsumerSpec(prefetch=10))
    got = broker.receive(c, 10)
    broker.nack(c, [d.message_id for d in got[:3]])  # back for redelivery
    broker.nack(c, got[3].message_id, poison=True)  # dead-lettered
    broker.close_consumer(c)  # the 6 it held come back with their counter raised
    broker.purge("q")  # an operator's operation: no series moves for it
    rates.sample(broker, ["queue://q"])
    last = {name: values[-1] for name, values in rates.history(broker, "queue://q", "5m").rates.items()}
    # 10 dispatched, and 4 more into the room the four NACKs made: 14
    assert last == {"enqueued": 20.0, "dispatched": 2.8, "acked": 0.0, "redelivered": 1.8, "expired": 0.0,
                    "deadlettered": 0.2, "discarded": 0.0}


def test_the_rings_hold_an_hour_at_5_s_and_a_day_at_1_min_and_never_grow(broker, clock):
    broker.ensure_destination("busy")
    rates.sample(broker, ["queue://busy"])
    for _ in range(800):  # 66 minutes, one message per step: more steps than the 5 s ring holds
        clock.advance(5_000)
        send(broker, "busy", 1)
        rates.sample(broker, ["queue://busy"])
    prefix = broker.ops.prefix(rates.parse_destination("queue://busy"))
    assert broker.redis.strlen(f"{prefix}:rates:5s") == 720 * rates.SLOT
    assert len(list(rates.ring_slots(broker, "queue://busy", "5s"))) == 720
    assert broker.redis.strlen(f"{prefix}:rates:1m") <= 1440 * rates.SLOT
    hour = rates.history(broker, "queue://busy", "1h")
    assert len(hour.times) == 720 and set(hour.rates["enqueued"]) == {0.2}
    day = rates.history(broker, "queue://busy", "24h")
    assert day.resolution_ms == 60_000 and len(day.times) == 1440
    sampled = [v for v in day.rates["enqueued"] if v is not None]
    assert 66 <= len(sampled) <= 68 and all(abs(v - 0.2) < 1e-9 for v in sampled[1:-1])
    assert day.rates["enqueued"][0] is None  # before the first sample
    assert broker.redis.pttl(f"{prefix}:rates:5s") > 24 * 3_600_000  # an idle destination's go away


def test_an_idle_destination_writes_no_ring_and_reads_zero(broker, clock):
    broker.ensure_destination("idle")
    for _ in range(10):
        rates.sample(broker, ["queue://idle"])
        clock.advance(5_000)
    prefix = broker.ops.prefix(rates.parse_destination("queue://idle"))
    assert not broker.redis.exists(f"{prefix}:rates:5s", f"{prefix}:rates:1m")
    h = rates.history(broker, "queue://idle", "5m")
    assert h.rates["enqueued"][-11:-1] == [0.0] * 10 and h.rates["enqueued"][-1] is None  # not sampled yet


def test_after_a_stop_of_the_sampler_the_gap_reads_as_its_average_not_a_spike(broker, clock):
    broker.ensure_destination("q")
    rates.sample(broker, ["queue://q"])
    clock.advance(60_000)  # the worker was down for a minute
    send(broker, "q", 120)
    rates.sample(broker, ["queue://q"])
    values = rates.history(broker, "queue://q", "5m").rates["enqueued"]
    assert values[-12:] == [2.0] * 12 and values[-13] == 0.0  # 120 over 60 s, spread over its 12 steps


def test_a_destination_made_again_starts_a_new_base_and_a_new_process_carries_on(broker, clock, redis_client):
    send(broker, "q", 100)
    rates.sample(broker, ["queue://q"])
    broker.delete_destination("q")
    prefix = broker.ops.prefix(rates.parse_destination("queue://q"))
    assert not broker.redis.exists(f"{prefix}:rates")  # deleted with the queue
    send(broker, "q", 3)
    clock.advance(5_000)
    rates.sample(broker, ["queue://q"])
    clock.advance(5_000)
    send(broker, "q", 10)
    # a restarted worker: a new client and Broker, the state is all in Redis
    again = Broker(redis_client.__class__(connection_pool=redis_client.connection_pool), broker.namespace,
                   clock)
    rates.sample(again, ["queue://q"])
    values = rates.history(again, "queue://q", "5m").rates["enqueued"]
    assert values[-1] == 2.0 and values[-2] == 0.0 and values[-3] is None
    # a counter that goes down (made again without a delete seen) sets a new base, never a negative rate
    broker.redis.hset(f"{prefix}:meta", "enqueued", 1)
    clock.advance(5_000)
    rates.sample(broker, ["queue://q"])
    assert rates.history(broker, "queue://q", "5m").rates["enqueued"][-1] == 0.0


def test_a_topic_counts_its_subscriptions(broker, clock):
    c = broker.add_consumer("topic://news", ConsumerSpec(prefetch=100))
    rates.sample(broker, ["topic://news"])
    clock.advance(5_000)
    broker.send("topic://news", [Message(body=str(i)) for i in range(10)])
    got = broker.receive(c, 10)
    broker.ack(c, [d.message_id for d in got], mode="individual")
    rates.sample(broker, ["topic://news"])
    last = {n: v[-1] for n, v in rates.history(broker, "topic://news", "5m").rates.items()}
    assert (last["enqueued"], last["dispatched"], last["acked"]) == (2.0, 2.0, 2.0)


def test_the_tick_samples_every_destination_once_per_5_s_in_bounded_calls(broker, clock, monkeypatch):
    for i in range(120):
        broker.ensure_destination(f"q{i}")
    first = maintenance.run_due(broker)
    assert first.sampled == 120 and first.errors == []
    assert maintenance.run_due(broker).sampled == 0  # the same 5 s step: no second pass
    clock.advance(5_000)
    for i in range(0, 120, 2):
        send(broker, f"q{i}", 5)
    # a pass that does not fit in the tick's time goes on at the next tick from its cursor
    monkeypatch.setattr(rates, "SCAN_COUNT", 20)
    broker.redis.zadd(broker.ops.registry_key, {"queue://": 1})  # not a name: skipped, the pass goes on
    assert 0 < rates.sample_due(broker, seconds=0) < 120
    while rates.sample_due(broker, seconds=0):
        pass
    assert rates.history(broker, "queue://q0", "5m").rates["enqueued"][-1] == 1.0
    assert rates.history(broker, "queue://q1", "5m").rates["enqueued"][-1] == 0.0
    everything = rates.history(broker, None, "5m")  # the namespace's: every destination summed
    assert everything.rates["enqueued"][-1] == 60.0 and everything.rates["enqueued"][-3] is None


def test_discarded_messages_are_a_series_a_topic_s_evictions_and_a_queue_s_dropped_dead_letters(broker,
                                                                                                 clock):
    """Messages the broker dropped without delivering or dead-lettering them (the console's *discards*): a
    topic subscription's evictions by a pending-message limit, a queue's dead letters discarded (a
    non-persistent poison message). Each is a rate of its own, and the namespace's rings sum them."""
    broker.policies.set_entry("topic", "ticks", {"pendingMessageLimitStrategy": "constant",
                                                 "pendingMessageLimit": 2})
    broker.refresh_policies()
    broker.add_consumer("topic://ticks", ConsumerSpec(prefetch=1))
    broker.ensure_destination("q")
    both = ["topic://ticks", "queue://q"]
    rates.sample(broker, both, pass_span=5_000)
    clock.advance(5_000)
    broker.send("topic://ticks", [Message(body=str(i)) for i in range(6)])  # 1 dispatched, 2 kept, 3 evicted
    c = broker.add_consumer("q", ConsumerSpec(prefetch=10))
    broker.send("q", [Message(body=str(i), persistent=False) for i in range(4)])
    for d in broker.receive(c, 4):
        broker.nack(c, d.message_id, poison=True)  # non-persistent: discarded, not dead-lettered
    assert (broker.stats("topic://ticks").evicted, broker.stats("q").discarded) == (3, 4)
    rates.sample(broker, both, pass_span=5_000)
    assert rates.history(broker, "topic://ticks", "5m").rates["discarded"][-1] == 0.6
    queue = rates.history(broker, "queue://q", "5m").rates
    assert queue["discarded"][-1] == 0.8 and queue["deadlettered"][-1] == 0.0
    assert rates.history(broker, None, "5m").rates["discarded"][-1] == 1.4


def test_history_stored_before_the_discarded_series_keeps_its_rates_and_reads_it_as_absent(broker, clock):
    """The rings stored by the sampler before the series was added (32-byte slots of six deltas, a base of
    six counters) are read as they were; *discarded* is null (not sampled) before the sampler first read it
    for that destination, and the first new sample carries the old base on (no lost step)."""
    import struct

    broker.ensure_destination("old")
    prefix = broker.ops.prefix(rates.parse_destination("queue://old"))
    send(broker, "old", 50)
    # what the previous sampler left: a base at t0, then one 5 s slot with the 50 enqueued, base at t1
    t0, t1 = clock.now_ms() - 5_000, clock.now_ms()
    broker.redis.hset(f"{prefix}:rates", mapping={"since": t0, "at": t1, "c": "50,0,0,0,0,0",
                                                  "w5s": t1 // 5_000, "w1m": t1 // 60_000})
    for ring, res, size in (("5s", 5_000, 720), ("1m", 60_000, 1_440)):
        epoch = t1 // res
        broker.redis.setrange(f"{prefix}:rates:{ring}", (epoch % size) * 32,
                              struct.pack(">8I", epoch, 5_000, 50, 0, 0, 0, 0, 0))
    clock.advance(5_000)
    send(broker, "old", 10)
    rates.sample(broker, ["queue://old"])
    h = rates.history(broker, "queue://old", "5m").rates
    assert h["enqueued"][-3:] == [0.0, 10.0, 2.0]  # the old base, its slot, the new sample from the old base
    assert h["discarded"][-3:] == [None, None, 0.0]  # not sampled before, then its base
    c = broker.add_consumer("old", ConsumerSpec(prefetch=100))
    for d in broker.receive(c, 5):
        broker.nack(c, d.message_id, poison=True)  # persistent: dead-lettered, not discarded
    broker.send("old", [Message(body="n", persistent=False)])
    [d] = [d for d in broker.receive(c, 100) if d.body == "n"]
    broker.nack(c, d.message_id, poison=True)
    clock.advance(5_000)
    rates.sample(broker, ["queue://old"])
    h = rates.history(broker, "queue://old", "5m").rates
    assert (h["deadlettered"][-1], h["discarded"][-1]) == (1.0, 0.2)


def _subscribers(broker: Broker, topic: str, n: int) -> list:
    return [broker.add_consumer(topic, ConsumerSpec(prefetch=1)) for _ in range(n)]


def _recorded_calls(monkeypatch, before_call=None) -> list[tuple]:
    """The rate_sample calls' (first destination's name, start in its subscriptions, destinations) as they
    are made; `before_call(i)` runs just before the i-th
    (between two calls of one pass)."""
    from broker_core.scripts import calls

    made: list[tuple] = []
    real = calls.RateSample.call

    def recorded(cls, rates_key, prefixes, now, kinds, *rest):
        if before_call is not None:
            before_call(len(made))
        call = real(rates_key, prefixes, now, kinds, *rest)
        made.append((prefixes[0].partition("}")[0].rpartition(":")[2], call.args[5], len(prefixes)))
        return call

    monkeypatch.setattr(calls.RateSample, "call", classmethod(recorded))
    return made


def _dispatched_rate_matches_the_stats(broker, clock, topic: str, before: int) -> None:
    stats = broker.stats(topic)
    h = rates.history(broker, topic, "5m").rates
    assert h["dispatched"][-1] * 5 == stats.dispatched - before


def test_a_topic_s_rates_count_every_subscription_as_its_stats_do(broker, clock):
    """150 subscriptions, past what one call reads: every one counts, as in the stats (the console's cards),
    which the chart's series then match (it read the first 100)."""
    topic = "topic://wide"
    _subscribers(broker, topic, 150)
    rates.sample(broker, [topic])
    clock.advance(5_000)
    broker.send(topic, Message(body="x"))  # one dispatched to each subscription
    rates.sample(broker, [topic])
    assert broker.stats(topic).dispatched == 150
    _dispatched_rate_matches_the_stats(broker, clock, topic, 0)


def test_a_call_reads_a_bounded_number_of_subscriptions_and_a_topic_goes_on_in_the_next(broker, clock,
                                                                                       monkeypatch):
    """A call reads at most SUBS_PER_CALL subscriptions' counters whatever the topics (25 topics of 100
    read in one call took 10-25 ms under load): a topic with more is read over several calls of the pass,
    from where the previous one stopped, and sampled once its last part is read; queues go SAMPLE_CHUNK a
    call; every destination is sampled once."""
    monkeypatch.setattr(rates, "SUBS_PER_CALL", 40)
    made = _recorded_calls(monkeypatch)
    names = ["topic://big", *(f"topic://t{i}" for i in range(30)), *(f"queue://q{i}" for i in range(30))]
    for name in names:
        broker.ensure_destination(name)
    _subscribers(broker, "topic://big", 100)
    for i in range(30):
        _subscribers(broker, f"topic://t{i}", 3)
    assert rates.sample(broker, names, pass_span=5_000) == len(names)
    clock.advance(5_000)
    broker.send("topic://big", Message(body="x"))
    made.clear()
    rates.sample(broker, names, pass_span=5_000)
    # 40 subscriptions a call: topic://big in three parts (40, 40, then 20 and the 3 of t0-t5, 2 of t6),
    # each from where the previous call stopped; then t6's last, t7-t19 (39); t20-t29 (30) and the first
    # 15 queues (25 a call); the other 15
    assert made == [("big", 0, 25), ("big", 40, 25), ("big", 80, 25), ("t6", 2, 25), ("t20", 0, 25),
                    ("q15", 0, 15)]
    _dispatched_rate_matches_the_stats(broker, clock, "topic://big", 0)


def test_a_subscription_removed_between_two_parts_leaves_the_topic_out_of_that_pass(broker, clock,
                                                                                    monkeypatch):
    """Parts read in different calls are one count only if no subscription before the cursor went in
    between (its counters would be counted twice: read, then in ended_*; and the one after it skipped):
    then the topic is left out of that pass, and its next sample covers both spans, no spike."""
    monkeypatch.setattr(rates, "SUBS_PER_CALL", 40)
    topic = "topic://churn"
    subs = _subscribers(broker, topic, 100)
    rates.sample(broker, [topic])
    clock.advance(5_000)
    broker.send(topic, Message(body="x"))
    _recorded_calls(monkeypatch, lambda i: broker.close_consumer(subs[5]) if i == 1 else None)
    rates.sample(broker, [topic])
    assert rates.history(broker, topic, "5m").rates["dispatched"][-1] is None  # left out: not sampled
    monkeypatch.undo()
    clock.advance(5_000)
    rates.sample(broker, [topic])
    h = rates.history(broker, topic, "5m").rates["dispatched"]
    assert h[-2:] == [10.0, 10.0]  # 100 over the 10 s the sample covers, read as their average


def test_the_tick_s_sampling_stops_at_the_call_that_spends_its_time_and_the_next_tick_goes_on_from_there(
        broker, clock, monkeypatch):
    """The tick's share of sampling is checked after each script call, not after each registry page: a
    page (SCAN_COUNT, 200 names) of topics read over several calls each could hold the tick for seconds
    past its share. A tick whose time is spent makes one call; the next goes on with the rest of the page
    (and a topic mid-way from where its subscriptions stopped), and the pass samples each destination once."""
    monkeypatch.setattr(rates, "SUBS_PER_CALL", 40)
    names = [f"queue://q{i}" for i in range(150)] + ["topic://wide"]
    for name in names:
        broker.ensure_destination(name)
    _subscribers(broker, "topic://wide", 100)  # three calls' worth of subscriptions
    assert broker.redis.zcard(broker.ops.registry_key) == len(names)  # (one ZSCAN page: SCAN_COUNT 200)
    made = _recorded_calls(monkeypatch)
    ticks: list[int] = []  # what each tick sampled
    while len(ticks) < 20:
        calls_before = len(made)
        ticks.append(rates.sample_due(broker, seconds=0))
        if len(made) == calls_before:  # the pass is over: this tick had nothing to do
            break
        assert len(made) == calls_before + 1  # one call: its time was spent at the first
    assert 8 < len(ticks) < 20  # 151 destinations 25 a call, the topic's parts in calls of their own
    assert sum(ticks) == len(names)  # each sampled once
    # the topic's second and third parts, each a later tick's, from where the previous one stopped
    assert [start for name, start, _ in made if name == "wide" and start] == [40, 80]
    clock.advance(5_000)  # the next pass, all of it in one tick
    assert rates.sample_due(broker) == len(names)
