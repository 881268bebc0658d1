"""Scheduled messages sent to a topic (AMQ_SCHEDULED_DELAY / PERIOD / REPEAT): ActiveMQ's SchedulerBroker
keeps each as a job and, when due, sends it to the topic like a new send, so it reaches the subscriptions
of that time, counted as enqueued then. Here the topic keeps the job on its own keys until it fires
(counted as parked), and each firing is published to the topic's subscriptions of its time (lifecycle.lua
fire_scheduled)."""

from __future__ import annotations

import pytest

from broker_core import maintenance
from broker_core.errors import OperationRefused
from broker_core.messages import Message

from ...helpers.broker import drain
from .test_topics import bodies, stored, sub

T = "topic://ticks"


def ids(deliveries) -> list[str]:
    return [d.message_id for d in deliveries]


def test_a_subscriber_that_joins_during_the_delay_gets_the_message(broker, clock):
    early = sub(broker, T)
    (sent,) = broker.send(T, Message(body="later", message_id="m1", delay_ms=5_000))
    assert sent.status == "ok"
    st = broker.stats(T)
    # kept on the topic until it fires: parked there, not yet enqueued nor stored for a subscription
    assert (st.parked, st.enqueued, st.pending, stored(broker, T)) == (1, 0, 0, 0)
    late = sub(broker, T)
    clock.advance(5_000)
    maintenance.run_due(broker)  # the maintenance index has the topic due: its tick fires the job
    assert ids(drain(broker, early)) == ["m1"] and ids(drain(broker, late)) == ["m1"]
    st = broker.stats(T)
    assert (st.parked, st.enqueued, st.forwarding, st.duplicates) == (0, 1, 0, 0)


def test_a_subscriber_that_left_during_the_delay_does_not_get_it(broker, clock):
    leaving, staying = sub(broker, T), sub(broker, T)
    broker.send(T, Message(body="later", message_id="m1", delay_ms=1_000))
    broker.close_consumer(leaving)
    # it was never the leaving subscription's: not dropped with it (the send gave it no message)
    assert broker.stats(T).removed_with_subscription == 0
    clock.advance(1_000)
    # a subscriber's own call fires its topic's due job (no tick needed): the next one gets it
    assert broker.receive(staying) == []
    assert ids(drain(broker, staying)) == ["m1"]
    (only,) = broker.subscriptions(T)
    assert only.enqueued == 1 and broker.stats(T).removed_with_subscription == 0
    broker.close_consumer(staying)
    broker.send(T, Message(body="nobody", message_id="m2", delay_ms=1_000))
    clock.advance(1_000)
    broker.dispatch(T)
    st = broker.stats(T)  # nobody subscribed when it fired: ActiveMQ's onMessageWithNoConsumers
    assert (st.enqueued, st.no_subscription, st.parked) == (2, 1, 0)


def test_a_repeating_message_fires_to_the_subscriptions_of_each_firing(broker, clock):
    a = sub(broker, T)
    (job,) = broker.send(T, Message(body="tick", message_id="job", delay_ms=100, period_ms=1_000, repeat=2))
    assert job.status == "scheduled"
    assert broker.stats(T).parked == 1
    clock.advance(100)
    broker.dispatch(T)  # the first firing: a alone
    b = sub(broker, T)
    clock.advance(1_000)
    broker.dispatch(T)  # the second: a and b
    got_a = ids(drain(broker, a))
    broker.close_consumer(a)
    clock.advance(1_000)
    broker.dispatch(T)  # the third and last: b alone
    clock.advance(5_000)
    broker.dispatch(T)
    assert got_a == ["job#1", "job#2"]
    assert ids(drain(broker, b)) == ["job#2", "job#3"]
    st = broker.stats(T)
    assert (st.enqueued, st.parked, st.forwarding) == (3, 0, 0)
    assert broker.redis.hlen(f"{broker.namespace}:{{t:ticks}}:sched") == 0


def test_a_durable_subscriber_offline_at_the_firing_gets_it_when_it_returns(broker, clock):
    """The durable subscription is made during the delay (after the send) and is offline when it fires."""
    broker.ensure_destination(T)
    broker.send(T, Message(body="later", message_id="m1", delay_ms=1_000))
    d = sub(broker, T, client_id="app", subscription_name="audit")
    broker.close_consumer(d)
    clock.advance(1_000)
    broker.dispatch(T)
    (info,) = broker.subscriptions(T)
    assert not info.active and info.pending == 1
    again = sub(broker, T, client_id="app", subscription_name="audit")
    assert bodies(drain(broker, again)) == ["later"]


def test_a_topic_job_is_listed_cancelled_by_id_and_releases_its_memory(broker, clock):
    s = sub(broker, T)
    broker.send(T, [Message(body="once", message_id="m1", delay_ms=1_000),
                    Message(body="tick", message_id="job", period_ms=1_000, repeat=3)])
    assert ids(drain(broker, s)) == ["job#1"]  # (no delay: its first firing is published with the send)
    broker.ack(s, "job#1")
    assert broker.stats(T).memory_usage > 0
    listed = broker.browse(T).messages  # what GET …/scheduled lists
    assert sorted((b.message.message_id, b.state) for b in listed) == [("job", "parked"), ("m1", "parked")]
    times = broker.parked_times(T, ["m1", "job"])
    assert times["job"]["repeats_left"] == 2 and times["m1"]["due"] == clock.now_ms() + 1_000
    # the same id again while its job waits is a duplicate
    (again,) = broker.send(T, Message(body="once", message_id="m1", delay_ms=1_000))
    assert again.status == "duplicate"
    assert broker.remove_message(T, "m1") and broker.remove_message(T, "job")
    st = broker.stats(T)
    assert (st.parked, st.cancelled, st.enqueued, st.memory_usage) == (0, 2, 1, 0)
    clock.advance(10_000)
    broker.dispatch(T)
    assert broker.stats(T).enqueued == 1 and drain(broker, s) == []
    with pytest.raises(OperationRefused):  # a topic's own messages are still its subscriptions'
        broker.remove_message(T, "not-a-job")


def test_a_delayed_retained_message_is_retained_when_it_is_published(broker, clock):
    broker.ensure_destination(T)
    broker.send(T, Message(body="last", message_id="r1", delay_ms=1_000,
                           properties={"ActiveMQ.Retain": True}))
    early = sub(broker, T, retroactive=True)
    assert drain(broker, early) == []
    clock.advance(1_000)
    broker.dispatch(T)
    later = sub(broker, T, retroactive=True)
    (replayed,) = drain(broker, later)
    assert replayed.body == "last" and replayed.properties.get("ActiveMQ.Retained") is True


def test_a_firing_s_time_to_live_starts_when_it_fires(broker, clock):
    """As on a queue (test_redelivery.py): SchedulerBroker re-stamps the message it sends to the topic, so
    a delay longer than the time to live does not expire it on the way."""
    early = sub(broker, T)
    sent_at = clock.now_ms()
    broker.send(T, Message(body="later", message_id="m1", timestamp=sent_at, expiration=sent_at + 100,
                           delay_ms=5_000))
    clock.advance(5_000)
    maintenance.run_due(broker)
    (got,) = drain(broker, early)
    assert (got.message_id, got.timestamp, got.expiration) == ("m1", sent_at + 5_000, sent_at + 5_100)
    assert broker.stats(T).expired == 0


def test_a_firing_s_enqueue_event_names_its_job_as_a_queue_firing_s_does(broker, clock):
    """A queue's firing writes `enqueue` with `scheduled: <job id>` (lifecycle.lua); a topic's, published by
    topic_send.lua, the same, also when its fan-out goes on over several calls (fanout.lua)."""
    from .test_topics import events

    sub(broker, T)
    broker.send(T, [Message(body="plain", message_id="p1"),
                    Message(body="later", message_id="d1", delay_ms=100),
                    Message(body="tick", message_id="job", delay_ms=100, period_ms=1_000, repeat=1)])
    clock.advance(1_100)
    broker.dispatch(T)
    enqueues = {e["msg"]: e.get("scheduled") for e in events(broker, T) if e["type"] == "enqueue"}
    assert enqueues == {"p1": None, "d1": "d1", "job#1": "job", "job#2": "job"}


def test_a_firing_whose_fan_out_takes_several_calls_names_its_job_too(broker, clock):
    """Past 32 subscriptions taking it (fanout.lua MAX_TAKERS) a publication goes on in later calls, and
    its enqueue event is written when it is done (fanout.finish)."""
    from .test_topics import events

    subs = [sub(broker, T) for _ in range(40)]
    broker.send(T, Message(body="later", message_id="d1", delay_ms=100))
    clock.advance(100)
    broker.dispatch(T)
    assert all(ids(drain(broker, s)) == ["d1"] for s in subs)
    enqueues = [e for e in events(broker, T) if e["type"] == "enqueue"]
    assert [(e["msg"], e.get("scheduled"), e["subscriptions"]) for e in enqueues] == [("d1", "d1", "40")]


def test_a_cron_job_waits_while_offline_durable_subscribers_hold_the_topic_over_its_limit(broker, clock):
    """As a queue's (s05 test_cron_schedule): a firing waits while the topic is over its memoryLimit, so a
    durable subscriber offline does not make a cron job fill Redis (it held 10 firings, 11.9 KB of a 2.2 KB
    limit, after ten minutes); it gets the one that fired, then the next once there is room."""
    broker.policies.set_entry("topic", "ticks", {"memoryLimit": 2 * 1100})
    broker.ensure_destination(T)
    broker.close_consumer(sub(broker, T, client_id="app", subscription_name="audit"))
    (job,) = broker.send(T, Message(body="x" * 1000, cron="* * * * *"))
    for _ in range(10):
        clock.advance(60_000)
        broker.dispatch(T)
    (info,) = broker.subscriptions(T)
    assert (info.pending, broker.stats(T).enqueued) == (1, 1)
    again = sub(broker, T, client_id="app", subscription_name="audit")
    for d in drain(broker, again):
        broker.ack(again, d.message_id)
    clock.advance(1_000)  # (lifecycle.FIRING_RETRY_MS)
    broker.dispatch(T)
    assert ids(drain(broker, again)) == [f"{job}#2"]
