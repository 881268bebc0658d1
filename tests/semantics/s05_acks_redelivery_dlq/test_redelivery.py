"""Broker-side redelivery and dead-letter queues (spec §5.3, §5.4), and scheduled delivery (AMQ_SCHEDULED_*:
ActiveMQ's scheduler, no section of the spec). Expiry is in s06_expiry, duplicates in s12_duplicates."""

from __future__ import annotations

import pytest

from broker_core.errors import OperationRefused
from broker_core.event_stream import expand
from broker_core.messages import Message, TypedValue

from ...helpers.broker import consumer, drain

DLQ = "ActiveMQ.DLQ"
CAUSE_7 = ("java.lang.Throwable: Delivery[7] exceeds redelivery policy limit:RedeliveryPolicy "
           "{destination = null, collisionAvoidanceFactor = 0.15, maximumRedeliveries = 6, "
           "maximumRedeliveryDelay = -1, initialRedeliveryDelay = 1000, useCollisionAvoidance = false, "
           "useExponentialBackOff = false, backOffMultiplier = 5.0, redeliveryDelay = 1000, "
           "preDispatchCheck = true}, cause:null")


def fail_once(broker, clock, c):
    """Receive the message (waiting out its redelivery delay) and nack it; its delivery record."""
    for _ in range(100):
        got = broker.receive(c, 1)
        if got:
            broker.nack(c, got[0].message_id)
            return got[0]
        clock.advance(100)
    raise AssertionError("the message never came back")


def test_the_seventh_failed_delivery_dead_letters_with_activemqs_cause(broker, clock):
    c = consumer(broker, prefetch=1, ack_mode="client-individual")
    (sent,) = broker.send("orders", Message(body="poison pill", properties={"k": 1}))
    seen = [fail_once(broker, clock, c) for _ in range(7)]
    assert [(d.redelivered, d.delivery_count) for d in seen] == [
        (False, 1), (True, 2), (True, 3), (True, 4), (True, 5), (True, 6), (True, 7)]
    stats = broker.stats("orders")
    assert (stats.queue_size, stats.deadlettered, stats.dequeued) == (0, 1, 1)
    dlq = consumer(broker, DLQ)
    (dead,) = drain(broker, dlq)
    assert dead.message_id == sent and dead.body == "poison pill"
    assert dead.properties["dlqDeliveryFailureCause"] == CAUSE_7
    assert dead.original_destination == "queue://orders"
    assert (dead.redelivered, dead.expiration, dead.properties["k"]) == (False, 0, 1)


def test_a_nacked_message_waits_out_its_delay_without_blocking_others(broker, clock):
    c = consumer(broker, prefetch=10, ack_mode="client-individual")
    broker.send("orders", [Message(body="bad"), Message(body="good")])
    bad, good = drain(broker, c)
    broker.nack(c, bad.message_id)
    broker.ack(c, good.message_id)
    broker.send("orders", Message(body="later"))
    assert [d.body for d in drain(broker, c)] == ["later"]  # "bad" is invisible for 1000 ms
    clock.advance(999)
    assert drain(broker, c) == []
    clock.advance(2)
    again = drain(broker, c)
    assert [(d.body, d.redelivery_count) for d in again] == [("bad", 1)]


def test_dispatch_says_when_a_parked_message_comes_back(broker, clock):
    c = consumer(broker, prefetch=10, ack_mode="client-individual")
    broker.send("orders", Message(body="bad"))
    (bad,) = drain(broker, c)
    broker.nack(c, bad.message_id)
    assert broker.dispatch("orders").hold_until == clock.now_ms() + 1000


def test_exponential_back_off_delays_grow_by_the_multiplier_up_to_the_cap(broker, policy, clock):
    policy("orders", useExponentialBackOff=True, initialRedeliveryDelay=100, backOffMultiplier=3.0,
           maximumRedeliveryDelay=1000, maximumRedeliveries=-1)
    c = consumer(broker, prefetch=1, ack_mode="client-individual")
    broker.send("orders", Message(body="m"))
    (d,) = drain(broker, c)
    waits = []
    for _ in range(5):
        broker.nack(c, d.message_id)
        start = clock.now_ms()
        while not (got := broker.receive(c, 1)):
            clock.advance(10)
        waits.append(clock.now_ms() - start)
        d = got[0]
    assert waits == [100, 300, 900, 1000, 1000]
    assert d.redelivery_count == 5


def test_collision_avoidance_varies_later_delays_by_up_to_15_percent_not_the_first(broker, policy, clock):
    """ActiveMQMessageConsumer.rollback takes getInitialRedeliveryDelay() as it is for the first
    redelivery; only getNextRedeliveryDelay, for the later ones, adds the +/- collisionAvoidanceFactor
    (0.15) x random variance."""
    policy("orders", useCollisionAvoidance=True, maximumRedeliveries=-1)
    c = consumer(broker, prefetch=1, ack_mode="client-individual")
    firsts, laters = set(), set()
    for n in range(8):
        broker.send("orders", Message(body=f"m{n}"))
        (d,) = drain(broker, c)
        for attempt in range(3):
            broker.nack(c, d.message_id)
            start = clock.now_ms()
            while not (got := broker.receive(c, 1)):
                clock.advance(1)
            (firsts if attempt == 0 else laters).add(clock.now_ms() - start)
            d = got[0]
        broker.ack(c, d.message_id)
    assert firsts == {1000}
    assert all(850 <= w <= 1150 for w in laters) and len(laters) > 1, laters


def test_a_poison_nack_dead_letters_at_once_without_a_cause(broker):
    c = consumer(broker, ack_mode="client-individual")
    broker.send("orders", Message(body="m"))
    (d,) = drain(broker, c)
    assert broker.nack(c, d.message_id, poison=True) == (1, 0)
    (dead,) = drain(broker, consumer(broker, DLQ))
    assert "dlqDeliveryFailureCause" not in dead.properties
    assert dead.properties["originalExpiration"] == TypedValue("long", 0)


def test_a_strategy_expiration_gives_the_dead_letter_that_time_to_live_and_no_original_expiration(
        broker, policy, clock):
    """RegionBroker.sendToDeadLetterQueue: with the strategy's expiration > 0 the copy expires that long
    after it is dead-lettered and is not stamped (stampAsExpired, which writes originalExpiration, is the
    branch of an expiration of 0)."""
    policy("orders", deadLetterExpiration=5000)
    c = consumer(broker, ack_mode="client-individual")
    broker.send("orders", Message(body="m", expiration=clock.now_ms() + 100_000))
    clock.advance(10)
    broker.nack(c, drain(broker, c)[0].message_id, poison=True)
    (dead,) = drain(broker, consumer(broker, DLQ))
    assert dead.expiration == clock.now_ms() + 5000
    assert "originalExpiration" not in dead.properties


def test_non_persistent_poison_is_dropped_by_default_and_kept_with_process_non_persistent(broker, policy):
    c = consumer(broker, ack_mode="client-individual")
    broker.send("orders", Message(body="np", persistent=False))
    (d,) = drain(broker, c)
    broker.nack(c, d.message_id, poison=True)
    assert (broker.stats("orders").discarded, broker.destinations()) == (1, ["queue://orders"])
    policy("orders", processNonPersistent=True)
    broker.send("orders", Message(body="np2", persistent=False))
    (d,) = drain(broker, c)
    broker.nack(c, d.message_id, poison=True)
    (dead,) = drain(broker, consumer(broker, DLQ))
    assert (dead.body, dead.persistent, dead.properties["originalDeliveryMode"]) == (
        "np2", True, "NON_PERSISTENT")


def test_the_individual_strategy_uses_a_dead_letter_queue_per_destination(broker, policy):
    policy("orders", deadLetterStrategy="individual")
    c = consumer(broker, ack_mode="client-individual")
    broker.send("orders", Message(body="m"))
    broker.nack(c, drain(broker, c)[0].message_id, poison=True)
    assert "queue://ActiveMQ.DLQ.Queue.orders" in broker.destinations()


def test_the_discarding_strategy_drops_dead_letters(broker, policy):
    policy("orders", deadLetterStrategy="discarding")
    c = consumer(broker, ack_mode="client-individual")
    broker.send("orders", Message(body="m"))
    broker.nack(c, drain(broker, c)[0].message_id, poison=True)
    assert broker.stats("orders").discarded == 1 and broker.destinations() == ["queue://orders"]


def test_a_dead_letter_queue_never_dead_letters_into_itself(broker):
    dlq = consumer(broker, DLQ, ack_mode="client-individual")
    broker.send(DLQ, Message(body="m"))
    broker.nack(dlq, drain(broker, dlq)[0].message_id, poison=True)
    stats = broker.stats(DLQ)
    assert (stats.discarded, stats.queue_size) == (1, 0)


def test_a_scheduled_message_becomes_visible_after_its_delay(broker, clock):
    c = consumer(broker)
    broker.send("orders", [Message(body="later", delay_ms=500), Message(body="now")])
    assert [d.body for d in drain(broker, c)] == ["now"]
    clock.advance(500)
    assert [d.body for d in drain(broker, c)] == ["later"]


def test_a_delayed_message_counts_as_enqueued_when_it_reaches_the_queue_and_as_parked_until_then(
        broker, clock, redis_client, namespace):
    """ActiveMQ's SchedulerBroker keeps a delayed message in its job store and sends it to the queue when it
    is due: the queue's EnqueueCount (and its enqueue event, its NoConsumer advisory) counts it then. Until
    then it is counted and visible as parked (stats, the scheduled list, browse)."""
    broker.send("orders", [Message(body="now"), Message(body="later", delay_ms=500)])
    stats = broker.stats("orders")
    assert (stats.enqueued, stats.pending, stats.parked, stats.queue_size) == (1, 1, 1, 1)

    def enqueue_events():
        events = expand(redis_client.xrange(f"{namespace}:{{q:orders}}:events"))
        return [e[b"msg"].decode() for _, e in events if e[b"type"] == b"enqueue"]

    assert len(enqueue_events()) == 1
    clock.advance(500)
    broker.dispatch("orders")
    stats = broker.stats("orders")
    assert (stats.enqueued, stats.pending, stats.parked, stats.queue_size) == (2, 2, 0, 2)
    assert len(enqueue_events()) == 2


def test_a_delayed_message_removed_before_it_is_due_is_cancelled_never_enqueued_nor_dequeued(broker):
    """Removed from the scheduler before it reached the queue, it leaves the queue's counters alone:
    counted `cancelled`, as a repeating job is; a purge the same. A delayed message cannot be moved
    (it is not on the queue yet, as in ActiveMQ, whose queue view does not see scheduler jobs)."""
    one, _two, _three = broker.send("orders", [Message(body=str(n), delay_ms=60_000) for n in range(3)])
    broker.ensure_destination("archive")
    with pytest.raises(OperationRefused, match="scheduled"):
        broker.move_message("orders", one, "archive")
    assert broker.remove_message("orders", one)
    assert broker.purge("orders") == 2
    stats = broker.stats("orders")
    assert (stats.enqueued, stats.dequeued, stats.purged, stats.cancelled, stats.parked) == (0, 0, 0, 3, 0)


@pytest.mark.parametrize("delay", [-1, 10**13, True])
def test_a_bad_scheduled_delay_is_refused(broker, delay):
    from broker_core.errors import InvalidMessage

    with pytest.raises(InvalidMessage, match="scheduled delay"):
        broker.send("orders", Message(body="x", delay_ms=delay))


def test_consumer_close_returns_messages_without_dead_lettering_by_count(broker, policy):
    policy("orders", maximumRedeliveries=1)
    for _ in range(3):
        c = consumer(broker, prefetch=1)
        broker.send("orders", Message(body="m")) if not broker.stats("orders").queue_size else None
        drain(broker, c)
        broker.close_consumer(c)
    last = consumer(broker, prefetch=1)
    (d,) = drain(broker, last)
    assert d.redelivery_count == 3 and broker.stats("orders").deadlettered == 0


def test_a_repeating_scheduled_message_is_delivered_every_period_the_given_number_of_times(broker, clock):
    c = consumer(broker, ack_mode="client-individual")
    (job,) = broker.send("orders", Message(body="tick", delay_ms=100, period_ms=1000, repeat=2))
    assert job.status == "scheduled"
    got = []
    for _ in range(40):
        clock.advance(100)
        for d in drain(broker, c):
            got.append((d.message_id, clock.now_ms() - 1_700_000_000_000))
            broker.ack(c, d.message_id)
    assert got == [(f"{job}#1", 100), (f"{job}#2", 1100), (f"{job}#3", 2100)]
    assert broker.stats("orders").parked == 0


def test_scheduled_messages_are_listed_and_cancellable(broker, clock):
    c = consumer(broker)
    (one,) = broker.send("orders", Message(body="once", delay_ms=1000))
    (job,) = broker.send("orders", Message(body="often", delay_ms=1000, period_ms=500, repeat=5))
    page = broker.browse("orders")
    assert {(b.message.message_id, b.state) for b in page.messages} == {(one, "parked"), (job, "parked")}
    assert broker.remove_message("orders", job) and broker.remove_message("orders", one)
    clock.advance(5000)
    assert drain(broker, c) == [] and broker.stats("orders").parked == 0


def test_a_repeat_without_a_period_is_refused(broker):
    from broker_core.errors import InvalidMessage

    with pytest.raises(InvalidMessage, match="needs a period"):
        broker.send("orders", Message(body="x", repeat=3))


def test_a_scheduled_message_s_time_to_live_starts_again_when_it_is_due(broker, clock):
    """ActiveMQ's SchedulerBroker sends a due message with its timestamp set to that time and its
    expiration to that time plus its time to live (expiration - timestamp), so a delay longer than the time
    to live does not expire it; a message without an expiration keeps its timestamp. So does each firing of
    a repeating one."""
    sent_at = clock.now_ms()
    broker.send("orders", [Message(body="late", timestamp=sent_at, expiration=sent_at + 300, delay_ms=1_000),
                           Message(body="forever", timestamp=sent_at, delay_ms=1_000),
                           Message(message_id="job", body="each", timestamp=sent_at, expiration=sent_at + 300,
                                   delay_ms=1_000, period_ms=1_000, repeat=1)])
    c = consumer(broker)
    clock.advance(500)  # past the time to live, not yet due: the expiry sweep leaves them be
    broker.sweep_expired("orders")
    assert broker.stats("orders").expired == 0
    clock.advance(500)
    due = clock.now_ms()
    got = {d.body: d for d in drain(broker, c)}
    assert set(got) == {"late", "forever", "each"}
    assert (got["late"].timestamp, got["late"].expiration) == (due, due + 300)
    assert (got["forever"].timestamp, got["forever"].expiration) == (sent_at, 0)
    assert (got["each"].timestamp, got["each"].expiration) == (due, due + 300)
    clock.advance(1_000)
    (again,) = drain(broker, c)
    assert (again.body, again.timestamp, again.expiration) == ("each", due + 1_000, due + 1_300)
    assert broker.stats("orders").expired == 0


def test_a_scheduled_message_arrives_with_its_job_id_and_without_its_schedule(broker, clock):
    """SchedulerBroker sends what fires with a `scheduledJobId` property (the id it was sent with) and
    without its AMQ_SCHEDULED_* properties: moved on once it arrived, it is not delayed again."""
    broker.ensure_destination("elsewhere")
    broker.send("orders", [Message(message_id="once", body="d", delay_ms=500),
                           Message(message_id="job", body="r", delay_ms=500, period_ms=500, repeat=1)])
    c = consumer(broker)
    clock.advance(500)
    got = {d.message_id: d for d in drain(broker, c)}
    assert {i: d.properties.get("scheduledJobId") for i, d in got.items()} == {"once": "once", "job#1": "job"}
    broker.close_consumer(c)
    broker.move_message("orders", "once", "elsewhere")
    broker.forward("orders")
    (moved,) = drain(broker, consumer(broker, "elsewhere"))
    assert (moved.message_id, moved.properties["scheduledJobId"]) == ("once", "once")
    assert broker.stats("elsewhere").parked == 0
