"""Repeating scheduled messages sent to a destination with virtual routing (spec §10, issue 5): the job stays
where the producer sent it and each firing is routed like a send (ActiveMQ's SchedulerBroker re-sends each
repeat to the destination), so a topic target gets every firing.
Against a real Redis."""

from __future__ import annotations

import msgpack

from broker_core.broker import Broker
from broker_core.config.virtual import VirtualConfig
from broker_core.destinations import parse_destination
from broker_core.messages import Message
from broker_core.ops import virtual

from ...helpers.broker import consumer, drain


def configure(broker: Broker, **table) -> None:
    virtual.configure(broker, VirtualConfig.from_config(table))


def fire(broker: Broker, clock, source: str, period_ms: int) -> None:
    """Let one period pass and run the source's dispatch, which fires the job and delivers its copies."""
    clock.advance(period_ms)
    broker.dispatch(source)


def ids(deliveries) -> list[str]:
    return [d.message_id for d in deliveries]


def stored_record(broker: Broker, dest: str, message_id: str) -> list:
    prefix = broker.ops.prefix(parse_destination(dest))
    return msgpack.unpackb(broker.redis.hget(f"{prefix}:msgs", message_id), raw=False)


def test_each_firing_of_a_repeating_message_sent_to_a_composite_reaches_its_topic_target(broker, clock):
    configure(broker, compositeQueue=[{"name": "x", "forwardTo": ["topic://t", "x.a"]}])
    sub = consumer(broker, "topic://t", ack_mode="client-individual")
    queue = consumer(broker, "x.a", ack_mode="client-individual")
    (job,) = broker.send("x", Message(body="tick", message_id="job", delay_ms=500, period_ms=1000, repeat=2))
    assert job.status == "scheduled"
    assert drain(broker, sub) == [] and drain(broker, queue) == []  # nothing before the first firing
    fire(broker, clock, "x", 500)
    got_t, got_q = ids(drain(broker, sub)), ids(drain(broker, queue))
    for _ in range(3):
        fire(broker, clock, "x", 1000)
        got_t += ids(drain(broker, sub))
        got_q += ids(drain(broker, queue))
    assert got_t == ["job#1", "job#2", "job#3"]
    assert got_q == ["job#1", "job#2", "job#3"]
    stats = broker.stats("x")
    # forward only: x keeps nothing of the firings, and no copy was refused or is still owed
    assert (stats.enqueued, stats.queue_size, stats.forward_refused, stats.forwarding) == (0, 0, 0, 0)
    assert broker.stats("x.a").enqueued == 3


def test_a_firings_copies_carry_no_schedule_so_their_targets_schedule_nothing(broker, clock):
    configure(broker, compositeQueue=[{"name": "x", "forwardTo": ["x.a"]}])
    broker.ensure_destination("x.a")
    broker.send("x", Message(body="tick", message_id="job", delay_ms=500, period_ms=1000, repeat=1))
    fire(broker, clock, "x", 500)
    record = stored_record(broker, "x.a", "job#1")
    assert record[16] == "queue://x"  # the composite is the original destination
    assert record[17:20] == [0, 0, 0]  # delay, period, repeat: SchedulerBroker removes them
    prefix = broker.ops.prefix(parse_destination("x.a"))
    assert broker.redis.hlen(f"{prefix}:sched") == 0 and broker.stats("x.a").parked == 0


def test_a_mirrored_queue_keeps_each_firing_and_copies_it_to_its_mirror_topic(broker, clock):
    configure(broker, useMirroredQueues=True)
    mirror = consumer(broker, "topic://VirtualTopic.Mirror.orders")
    local = consumer(broker, "orders")
    broker.send("orders", Message(body="tick", message_id="job", period_ms=1000, repeat=1))
    got_mirror, got_local = [], []
    for _ in range(3):
        fire(broker, clock, "orders", 1000)
        got_mirror += ids(drain(broker, mirror))
        got_local += ids(drain(broker, local))
    assert got_local == ["job#1", "job#2"]
    assert got_mirror == ["job#1", "job#2"]
    assert broker.stats("orders").forward_refused == 0


def test_a_client_side_composite_with_a_topic_part_gets_every_firing(broker, clock):
    sub = consumer(broker, "topic://t")
    local = consumer(broker, "orders")
    (job,) = broker.send("orders,topic://t", Message(body="tick", message_id="job", period_ms=100, repeat=1))
    assert job.status == "scheduled"
    seen_t, seen_local = [], []
    for _ in range(3):
        fire(broker, clock, "orders", 100)
        seen_t += drain(broker, sub)
        seen_local += ids(drain(broker, local))
    assert ids(seen_t) == ["job#1", "job#2"] and seen_local == ["job#1", "job#2"]
    assert seen_t[0].original_destination == "queue://orders,topic://t"


def test_a_filtered_target_is_matched_at_each_firing(broker, clock):
    configure(broker, compositeQueue=[{"name": "x", "forwardOnly": False, "forwardTo": [
        {"topic": "t", "selector": "region = 'eu'"}, {"queue": "x.us", "selector": "region = 'us'"}]}])
    sub = consumer(broker, "topic://t")
    broker.ensure_destination("x.us")
    broker.send("x", Message(body="tick", message_id="job", period_ms=100, repeat=1,
                             properties={"region": "eu"}))
    for _ in range(3):
        fire(broker, clock, "x", 100)
    assert ids(drain(broker, sub)) == ["job#1", "job#2"]
    assert broker.stats("x.us").enqueued == 0
    assert broker.stats("x").enqueued == 2  # forwardOnly false: each firing kept on x too


def test_an_operators_copy_of_a_firing_carries_no_schedule(broker, clock):
    """A repeating job's delivery keeps the schedule in its stored form; an operator's copy or move of it is
    one firing, which its target delivers now and never schedules again (ActiveMQ's fired message has lost
    its AMQ_SCHEDULED_* properties). A topic once refused it (TOPIC_REPEAT), and a queue made a new job of
    it; now both take it as it is, once."""
    sub = consumer(broker, "topic://t")
    broker.send("orders", Message(body="tick", message_id="job", period_ms=100, repeat=1))
    fire(broker, clock, "orders", 100)
    broker.copy_message("orders", "job#1", "topic://t")
    broker.ensure_destination("other")
    broker.copy_message("orders", "job#1", "other")
    clock.advance(1_000)
    broker.dispatch("topic://t")
    broker.dispatch("other")
    assert ids(drain(broker, sub)) == ["job#1"]
    assert stored_record(broker, "other", "job#1")[17:20] == [0, 0, 0]
    assert (broker.stats("other").enqueued, broker.stats("other").parked) == (1, 0)
    assert (broker.stats("topic://t").parked, broker.stats("orders").forward_refused) == (0, 0)


def test_each_firing_of_a_cron_job_sent_to_a_composite_is_routed_without_its_schedule(broker, clock):
    """A cron job (AMQ_SCHEDULED_CRON) stays on the composite, as a repeat's job: each firing is routed,
    its copies without the schedule (no cron form either: record[20]), so the target schedules nothing."""
    configure(broker, compositeQueue=[{"name": "x", "forwardTo": ["topic://t", "x.a"]}])
    sub = consumer(broker, "topic://t", ack_mode="client-individual")
    queue = consumer(broker, "x.a", ack_mode="client-individual")
    (job,) = broker.send("x", Message(body="tick", message_id="job", cron="* * * * *"))
    assert job.status == "scheduled"
    got_t, got_q = [], []
    for _ in range(3):
        fire(broker, clock, "x", 60_000)
        got_t += ids(drain(broker, sub))
        got_q += ids(drain(broker, queue))
    assert got_t == ["job#1", "job#2", "job#3"] and got_q == ["job#1", "job#2", "job#3"]
    record = stored_record(broker, "x.a", "job#3")
    assert record[17:20] == [0, 0, 0] and (len(record) == 20 or record[20] is None)
    prefix = broker.ops.prefix(parse_destination("x.a"))
    assert broker.redis.hlen(f"{prefix}:sched") == 0 and broker.stats("x.a").parked == 0
    assert broker.stats("x").parked == 1  # the job goes on
