"""A destination's enqueue times (ActiveMQ's DestinationStatistics processTime: AverageEnqueueTime,
MinEnqueueTime, MaxEnqueueTime): each dispatch adds the time since the message last reached the broker
(RegionBroker.preProcessDispatch: now - brokerInTime), which every send sets, a scheduled message's firing
and a dead letter's copy included; a redelivery and each topic subscriber's dispatch count again."""

from __future__ import annotations

import msgpack

from broker_core.messages import Message
from broker_core.model import EnqueueTimes

from ..helpers.broker import broker, consumer, drain, policy  # noqa: F401  (fixtures)


def times(*waited: int) -> EnqueueTimes:
    """The figure after dispatches that waited these ms, in order (TimeStatisticImpl.addTime's rule for
    the smallest: a 0 holds until the next time)."""
    least = 0
    for t in waited:
        if t < least or least == 0:
            least = t
    return EnqueueTimes(len(waited), sum(waited), least, max(waited))


def test_each_dispatch_counts_the_wait_since_the_send(broker, clock):  # noqa: F811
    broker.send("q", Message(body="a"))
    clock.advance(300)
    broker.send("q", Message(body="b"))
    clock.advance(200)
    c = consumer(broker, "q", prefetch=10)
    assert [d.body for d in drain(broker, c)] == ["a", "b"]
    assert broker.stats("q").enqueue_times == times(500, 200)
    assert broker.stats("q").enqueue_times.average == 350.0
    # a message sent while a consumer has room is dispatched at once: 0, which the next time replaces
    broker.send("q", Message(body="c"))
    assert broker.stats("q").enqueue_times == times(500, 200, 0)


def test_a_redelivery_counts_again_from_the_send(broker, clock):  # noqa: F811
    broker.send("q", Message(message_id="m1", body="a"))
    clock.advance(100)
    c = consumer(broker, "q", prefetch=1)
    drain(broker, c)
    clock.advance(400)
    broker.release(c, ["m1"])  # back at once, redelivered to the same consumer: 500 ms after its send
    assert [d.redelivery_count for d in drain(broker, c)] == [1]
    assert broker.stats("q").enqueue_times == times(100, 500)


def test_a_dead_letter_starts_again_on_the_dead_letter_queue(broker, clock):  # noqa: F811
    broker.send("q", Message(message_id="m1", body="a"))
    clock.advance(100)
    c = consumer(broker, "q")
    drain(broker, c)
    clock.advance(1_000)
    broker.nack(c, "m1", poison=True)  # to ActiveMQ.DLQ, sent there now
    broker.forward("q")
    clock.advance(250)
    dlq = consumer(broker, "ActiveMQ.DLQ")
    assert [d.message_id for d in drain(broker, dlq)] == ["m1"]
    assert broker.stats("ActiveMQ.DLQ").enqueue_times == times(250)
    assert broker.stats("q").enqueue_times == times(100)


def test_a_scheduled_message_is_timed_from_its_firing(broker, clock):  # noqa: F811
    c = consumer(broker, "q")
    broker.send("q", Message(message_id="m1", body="late", delay_ms=5_000))
    clock.advance(5_000)
    assert [d.body for d in drain(broker, c)] == ["late"]  # dispatched as it fires
    assert broker.stats("q").enqueue_times == times(0)
    broker.ack(c, "m1")
    broker.close_consumer(c)
    broker.send("q", Message(body="later", delay_ms=1_000))
    clock.advance(1_000)
    broker.send("q", Message(body="now"))  # (its call fires "later", due: both reach the queue now)
    clock.advance(700)
    assert sorted(d.body for d in drain(broker, consumer(broker, "q"))) == ["later", "now"]
    assert broker.stats("q").enqueue_times == times(0, 700, 700)  # not 1,700: from the firing


def test_topic_subscribers_each_count_on_the_topic(broker, clock):  # noqa: F811
    one, two = consumer(broker, "topic://t", prefetch=1), consumer(broker, "topic://t", prefetch=1)
    broker.send("topic://t", [Message(message_id="m1", body="a"), Message(message_id="m2", body="b")])
    clock.advance(50)
    assert [d.body for d in drain(broker, one)] == ["a"]
    assert [d.body for d in drain(broker, two)] == ["a"]
    broker.ack(one, "m1")  # each subscription's second message waited 50 ms for room
    broker.ack(two, "m1")
    assert broker.stats("topic://t").enqueue_times == times(0, 0, 50, 50)


def test_a_record_stored_before_the_field_is_not_timed(broker, clock, redis_client, namespace):  # noqa: F811
    broker.send("q", Message(message_id="old", body="a"))
    key = next(k for k in redis_client.scan_iter(f"{namespace}*msgs") if b"{q" in k or b"q" in k)
    record = msgpack.unpackb(redis_client.hget(key, "old"), raw=True)
    redis_client.hset(key, "old", msgpack.packb(record[:20], use_bin_type=False))
    clock.advance(100)
    drain(broker, consumer(broker, "q"))
    assert broker.stats("q").enqueue_times == EnqueueTimes()


def test_a_moved_message_starts_again_on_its_target(broker, clock):  # noqa: F811
    """QueueView.moveMessageTo re-sends the message (BrokerSupport.resend): its time starts at the move."""
    broker.send("q", Message(message_id="m1", body="a"))
    clock.advance(1_000)
    broker.ensure_destination("q2")
    assert broker.move_message("q", "m1", "q2") == 1
    broker.forward("q")
    clock.advance(40)
    assert [d.message_id for d in drain(broker, consumer(broker, "q2"))] == ["m1"]
    assert broker.stats("q2").enqueue_times == times(40)
