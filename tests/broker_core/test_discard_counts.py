"""One definition of a destination's discards (broker_core/model.py discard_counts): the stats carry each
part (evicted, dropped, dead letters discarded, a topic's including its ended subscriptions') and their sum,
`discards`, which is what the rate history's "discarded" series counts (rate_sample.lua); and the stats
tell scheduled jobs from messages waiting for a redelivery delay. Real Redis, real scripts, a fake clock."""

from __future__ import annotations

import pytest

from broker_core import rates
from broker_core.broker import Broker
from broker_core.messages import Message
from broker_core.model import ConsumerSpec


@pytest.fixture
def broker(redis_client, namespace, clock) -> Broker:
    clock.set(1_800_000_000_000)  # a multiple of 60 s: the sampled step lines up with the clock
    return Broker(redis_client, namespace, clock)


def _sampled_discards(broker: Broker, uri: str) -> float:
    """The "discarded" series' count over the last 5 s step (its rate times the step)."""
    return rates.history(broker, uri, "5m").rates["discarded"][-1] * 5


def test_a_topic_s_discard_parts_sum_to_the_rate_series_ended_subscriptions_included(broker, clock):
    broker.policies.set_entry("topic", "ticks", {"pendingMessageLimitStrategy": "constant",
                                                 "pendingMessageLimit": 2})
    broker.refresh_policies()
    quick = broker.add_consumer("topic://ticks", ConsumerSpec(prefetch=1))  # non-durable: limit 2
    durable = broker.add_consumer("topic://ticks", ConsumerSpec(prefetch=10, client_id="app",
                                                                subscription_name="keep"))
    rates.sample(broker, ["topic://ticks"])  # the base
    clock.advance(5_000)
    # quick: 1 dispatched, 2 kept, 3 evicted (persistent: dead-lettered, not discarded); durable: all 6
    broker.send("topic://ticks", [Message(body=str(i)) for i in range(6)])
    first = broker.receive(quick, 1)
    broker.nack(quick, first[0].message_id, poison=True)  # a non-durable's poison: dropped, no dead letter
    broker.close_consumer(quick)  # its counts go on as the topic's ended ones
    broker.send("topic://ticks", [Message(body=f"np{i}", persistent=False) for i in range(2)])
    for d in broker.receive(durable, 8):
        if d.body.startswith("np"):  # non-persistent dead letters: discarded
            broker.nack(durable, d.message_id, poison=True)
        else:
            broker.ack(durable, [d.message_id], mode="individual")
    st = broker.stats("topic://ticks")
    assert len(st.subscriptions) == 1  # quick's figures are the ended subscription's
    assert (st.evicted, st.dropped, st.discarded) == (3, 1, 2)
    assert st.discards == st.evicted + st.dropped + st.discarded == 6
    rates.sample(broker, ["topic://ticks"])
    assert _sampled_discards(broker, "topic://ticks") == st.discards


def test_a_queue_s_discards_are_its_discarded_dead_letters_as_its_series(broker, clock):
    broker.ensure_destination("q")
    rates.sample(broker, ["queue://q"])
    clock.advance(5_000)
    c = broker.add_consumer("q", ConsumerSpec(prefetch=10))
    broker.send("q", [Message(body=str(i), persistent=False) for i in range(3)])
    for d in broker.receive(c, 3):
        broker.nack(c, d.message_id, poison=True)
    st = broker.stats("q")
    assert (st.evicted, st.dropped, st.discarded, st.discards) == (0, 0, 3, 3)
    rates.sample(broker, ["queue://q"])
    assert _sampled_discards(broker, "queue://q") == st.discards


def test_the_stats_tell_scheduled_jobs_from_redelivery_delayed_messages(broker, clock):
    broker.policies.set_entry("queue", "later", {"initialRedeliveryDelay": 60_000, "maximumRedeliveries": 5})
    broker.refresh_policies()
    delayed, _ = broker.send("later", [
        Message(body="delayed", delay_ms=600_000),
        Message(body="repeating", delay_ms=600_000, period_ms=1_000, repeat=3)])
    broker.send("later", [Message(body="now")])
    c = broker.add_consumer("later", ConsumerSpec(prefetch=1))
    got = broker.receive(c, 1)
    broker.nack(c, got[0].message_id)  # back after its redelivery delay: parked, no job
    st = broker.stats("later")
    assert (st.parked, st.scheduled, st.redelivery_delayed) == (3, 2, 1)
    assert broker.remove_message("later", delayed)  # cancelled: one job fewer
    assert (broker.stats("later").scheduled, broker.stats("later").redelivery_delayed) == (1, 1)
    clock.advance(60_001)
    (back,) = broker.receive(c, 1)  # its delay over, it is dispatched again
    broker.ack(c, [back.message_id], mode="individual")
    assert (broker.stats("later").scheduled, broker.stats("later").redelivery_delayed) == (1, 0)
    clock.advance(600_000)
    for _ in range(4):  # the job fires its first and 3 repeats, then is gone
        for d in broker.receive(c, 1):
            broker.ack(c, [d.message_id], mode="individual")
        clock.advance(1_000)
    for d in broker.receive(c, 1):
        broker.ack(c, [d.message_id], mode="individual")
    st = broker.stats("later")
    # `now` and the job's 4 firings
    assert (st.parked, st.scheduled, st.redelivery_delayed, st.enqueued) == (0, 0, 0, 1 + 4)


def test_a_topic_s_scheduled_jobs_are_its_own_parked_its_subscriptions_parked_are_redelivery_delays(
        broker, clock):
    broker.policies.set_entry("topic", "news", {"initialRedeliveryDelay": 60_000, "maximumRedeliveries": 5})
    broker.refresh_policies()
    c = broker.add_consumer("topic://news", ConsumerSpec(prefetch=1, client_id="app", subscription_name="s"))
    broker.send("topic://news", [Message(body="later", delay_ms=600_000), Message(body="now")])
    got = broker.receive(c, 1)
    broker.nack(c, got[0].message_id)
    st = broker.stats("topic://news")
    assert (st.parked, st.scheduled, st.redelivery_delayed) == (2, 1, 1)


def test_the_scheduled_count_follows_a_purge_and_a_destination_made_again(broker, clock):
    broker.policies.set_entry("queue", "gone", {"initialRedeliveryDelay": 60_000})
    broker.refresh_policies()
    broker.send("gone", [Message(body="a", delay_ms=600_000), Message(body="now")])
    c = broker.add_consumer("gone", ConsumerSpec(prefetch=1))
    broker.nack(c, broker.receive(c, 1)[0].message_id)
    assert (broker.stats("gone").scheduled, broker.stats("gone").redelivery_delayed) == (1, 1)
    broker.close_consumer(c)
    broker.purge("gone")  # the job is cancelled, the delayed redelivery purged
    st = broker.stats("gone")
    assert (st.parked, st.scheduled, st.redelivery_delayed) == (0, 0, 0)
    broker.send("gone", Message(body="b", delay_ms=600_000))
    broker.delete_destination("gone")
    broker.send("gone", Message(body="c", delay_ms=600_000))
    assert (broker.stats("gone").parked, broker.stats("gone").scheduled) == (1, 1)


def test_jobs_parked_before_the_count_was_kept_are_counted_once_by_the_next_maintenance_visit(broker, clock):
    """The meta's 'scheduled' is kept as parked entries come and go (includes/lifecycle.lua parked_info):
    jobs a deployment parked before it was kept are not in it, and a repeating job's entry stays (each
    firing parks it again under the same id), so the count read low for as long as it ran. The maintenance
    visit counts a destination's scheduled entries afresh once (bounded: a parkinfo of at most 2,000)."""
    from broker_core import maintenance
    from broker_core.destinations import parse_destination

    broker.send("old", [Message(body="delayed", delay_ms=600_000),
                        Message(body="cron-like", delay_ms=600_000, period_ms=1_000, repeat=100)])
    c = broker.add_consumer("old", ConsumerSpec(prefetch=1))
    broker.send("old", [Message(body="now")])
    broker.nack(c, broker.receive(c, 1)[0].message_id)  # a redelivery delay: parked, not a job
    meta = f"{broker.ops.prefix(parse_destination('queue://old'))}:meta"
    broker.redis.hdel(meta, "scheduled")  # as a deployment from before the count left them
    broker.send("old", Message(body="since", delay_ms=600_000))  # counted from there
    st = broker.stats("old")
    assert (st.parked, st.scheduled) == (4, 1)
    maintenance.run_due(broker, ["queue://old"])
    st = broker.stats("old")
    assert (st.parked, st.scheduled, st.redelivery_delayed) == (4, 3, 1)
