"""A scheduler job with no delay (ActiveMQ's SchedulerBroker makes a job of every message sent with an
AMQ_SCHEDULED_DELAY or AMQ_SCHEDULED_PERIOD property, whatever its value): a delay given as 0, or a period
without a repeat, is a job due now. It is delivered at once, once, with `scheduledJobId`, and a BROWSE of
the scheduler shows the schedule as it was given (0 included). The rule is broker_core's (messages.py
`Message.delay_ms` / `period_ms` given, GIVEN_ZERO), so every adapter that builds a Message with a delay
or a period of 0 gets it; against the real Redis, with the test's clock standing still (nothing waits for
a later time)."""

from __future__ import annotations

import pytest

from broker_core.destinations import Destination, parse_destination
from broker_core.errors import InvalidMessage
from broker_core.messages import Message, TypedValue
from broker_core.scheduler import SchedulerRequest

from ..helpers.broker import consumer, drain


def job_ids(deliveries) -> dict[str, str | None]:
    return {d.message_id: d.properties.get("scheduledJobId") for d in deliveries}


def test_a_delay_of_0_or_a_period_alone_is_a_job_delivered_at_once_with_its_job_id(broker, clock):
    c = consumer(broker)
    broker.send("orders", [Message(message_id="zero", body="a", delay_ms=0),
                           Message(message_id="period", body="b", period_ms=200),
                           Message(message_id="zero-period", body="c", delay_ms=0, period_ms=0),
                           Message(message_id="plain", body="d")])
    # at once (the clock has not moved), in the order sent, each once; the plain message is no job
    got = drain(broker, c)
    assert [d.message_id for d in got] == ["zero", "period", "zero-period", "plain"]
    assert job_ids(got) == {"zero": "zero", "period": "period", "zero-period": "zero-period", "plain": None}
    stats = broker.stats("orders")
    assert (stats.enqueued, stats.parked) == (4, 0)
    clock.advance(1_000)  # a period without a repeat fires once
    assert drain(broker, c) == []


def test_a_job_due_now_on_a_topic_reaches_its_subscribers_at_once(broker, clock):
    sub = consumer(broker, "topic://now")
    broker.send("topic://now", Message(message_id="t0", body="now", delay_ms=0))
    assert job_ids(drain(broker, sub)) == {"t0": "t0"}
    assert broker.stats("topic://now").parked == 0


def test_a_job_due_now_sent_in_a_transaction_is_delivered_at_the_commit(broker):
    c = consumer(broker)
    tx = broker.begin()
    broker.send("orders", Message(message_id="tx0", body="x", delay_ms=0), tx=tx)
    assert drain(broker, c) == []
    broker.commit(tx)
    assert job_ids(drain(broker, c)) == {"tx0": "tx0"}


async def test_a_browse_shows_a_delay_or_period_of_0_as_given(broker, aio):
    """SchedulerBroker's BROWSE sends each job with the properties it was sent with: a repeating job sent
    with AMQ_SCHEDULED_DELAY 0 shows it (it was left out), a cron job sent with a period of 0 that."""
    broker.send("queue://browsed", [
        Message(message_id="rep", body="r", delay_ms=0, period_ms=3_600_000, repeat=2),
        Message(message_id="cron", body="c", cron="0 0 1 1 *", period_ms=0),
        Message(message_id="late", body="l", delay_ms=3_600_000)])
    consumer(broker, "queue://browse.replies")

    async def may(dest: Destination, action: str) -> bool:
        return True

    replies = parse_destination("queue://browse.replies")
    assert await aio.manage_scheduler(SchedulerRequest("BROWSE", reply_to=replies), may) == 3
    # (the replies' AMQ_SCHEDULED_* properties show the schedule; they schedule nothing: scheduler.BrowsedJob)
    assert (broker.stats(replies).queue_size, broker.stats(replies).parked) == (3, 0)
    shown = {m.message.properties["scheduledJobId"]: {k: v for k, v in m.message.properties.items()
                                                      if k.startswith("AMQ_SCHEDULED")}
             for m in broker.browse(replies).messages}
    assert shown == {
        "rep": {"AMQ_SCHEDULED_DELAY": TypedValue("long", 0),
                "AMQ_SCHEDULED_PERIOD": TypedValue("long", 3_600_000), "AMQ_SCHEDULED_REPEAT": 2},
        "cron": {"AMQ_SCHEDULED_PERIOD": TypedValue("long", 0), "AMQ_SCHEDULED_CRON": "0 0 1 1 *"},
        "late": {"AMQ_SCHEDULED_DELAY": TypedValue("long", 3_600_000)},
    }


def test_the_amq_scheduled_properties_schedule_a_message_as_the_fields_do(broker, clock):
    """SchedulerBroker reads a message's schedule from its AMQ_SCHEDULED_* properties alone (converting text,
    TypeConversionSupport), which is all ActiveMQ's REST servlet can set: Message.pack moves them into the
    fields, so the message is scheduled and delivered without them."""
    c = consumer(broker)
    broker.send("orders", [Message(message_id="p0", body="a",
                                   properties={"AMQ_SCHEDULED_DELAY": "0", "n": 1}),
                           Message(message_id="p1", body="b", properties={
                               "AMQ_SCHEDULED_DELAY": TypedValue("long", 500)})])
    (now,) = drain(broker, c)
    assert (now.message_id, now.properties) == ("p0", {"n": 1, "scheduledJobId": "p0"})
    clock.advance(500)
    assert job_ids(drain(broker, c)) == {"p1": "p1"}
    for bad, named in (({"AMQ_SCHEDULED_PERIOD": "soon"}, "must be an integer"),
                       ({"AMQ_SCHEDULED_DELAY": 1.5}, "must be an integer"),
                       ({"AMQ_SCHEDULED_CRON": 5}, "must be a cron expression")):
        with pytest.raises(InvalidMessage, match=named):
            broker.send("orders", Message(body="x", properties=bad))
    with pytest.raises(InvalidMessage, match="gives the schedule's delay_ms again"):
        broker.send("orders", Message(body="x", delay_ms=5, properties={"AMQ_SCHEDULED_DELAY": 5}))
    assert broker.stats("orders").enqueued == 2


async def test_jobs_due_now_are_on_the_queue_when_their_send_returns_with_no_timer(broker, aio):
    """The send's own script call brings a job due now back (its dispatch chunk runs after the send's loop:
    lifecycle.lua unpark_due), so nothing waits for a timer or the maintenance tick, and no timer is armed
    for it (due.py: one armed at the send's own time would only dispatch again). Past the 100 parked
    messages one chunk brings back too: a batch of 250."""
    queue = parse_destination("queue://due.now")
    c = consumer(broker, queue.uri, prefetch=1000)
    await aio.send(queue, Message(message_id="n0", body="x", delay_ms=0))
    await aio.send(queue, [Message(message_id=f"b{i}", body="x", period_ms=0) for i in range(250)])
    stats = await aio.stats(queue)
    assert (stats.parked, stats.enqueued, len(aio.due)) == (0, 251, 0)
    got = drain(broker, c)
    assert len(got) == 251 and all(d.properties["scheduledJobId"] == d.message_id for d in got)


def test_a_delay_field_given_as_0_beside_the_property_is_refused(broker):
    """A delay (or period) given as 0 is given (a job due now): the same property beside it gives it again,
    and is refused as any other pair, not taken silently over the field."""
    consumer(broker)
    for fields, name in (({"delay_ms": 0}, "AMQ_SCHEDULED_DELAY"),
                         ({"period_ms": 0}, "AMQ_SCHEDULED_PERIOD")):
        with pytest.raises(InvalidMessage, match="again: give one of them"):
            broker.send("orders", Message(body="x", properties={name: "60000"}, **fields))
    assert broker.stats("orders").enqueued == 0


def test_a_message_carrying_a_scheduled_job_id_is_not_scheduled_again(broker):
    """SchedulerBroker.send schedules a message only when it has no AMQ_SCHEDULED_ID (scheduledJobId): one
    that has been through a scheduler already (a BROWSE's reply, re-sent as it came) is delivered at once,
    its AMQ_SCHEDULED_* properties kept as properties."""
    c = consumer(broker)
    props = {"scheduledJobId": "ID:old-job", "AMQ_SCHEDULED_DELAY": TypedValue("long", 3_600_000),
             "AMQ_SCHEDULED_PERIOD": "5000", "AMQ_SCHEDULED_REPEAT": 2}
    broker.send("orders", Message(message_id="resent", body="x", properties=dict(props)))
    (got,) = drain(broker, c)
    assert got.properties == props
    assert broker.stats("orders").parked == 0
