"""Edges of the message lifecycle found in review; each was once a defect."""

from __future__ import annotations

import msgpack
import pytest

from broker_core.errors import InvalidMessage, OperationRefused, UnknownDestination
from broker_core.messages import Message

from ..helpers.broker import consumer, drain

DLQ = "ActiveMQ.DLQ"


def test_a_dead_letter_at_the_producer_limits_still_reaches_the_dlq(broker, policy):
    policy(">", maxPropertyCount=3)
    c = consumer(broker, ack_mode="client-individual")
    broker.send("orders", Message(body="m", properties={"a": 1, "b": 2, "c": 3}))
    broker.nack(c, drain(broker, c)[0].message_id, poison=True)
    assert broker.stats("orders").forwarding == 0
    (dead,) = drain(broker, consumer(broker, DLQ))
    assert len(dead.properties) == 4  # originalExpiration added past the producer limit


def test_nacking_a_delivery_of_a_repeating_job_leaves_the_job_running(broker, clock):
    c = consumer(broker, ack_mode="client-individual")
    (job,) = broker.send("orders", Message(body="tick", period_ms=1000, repeat=2))
    clock.advance(1)
    (first,) = drain(broker, c)
    broker.nack(c, first.message_id)
    seen = []
    for _ in range(40):
        clock.advance(100)
        for d in drain(broker, c):
            seen.append(d.message_id)
            broker.ack(c, d.message_id)
    assert sorted(seen) == sorted([f"{job}#1", f"{job}#2", f"{job}#3"])


def test_a_producer_id_with_a_hash_is_refused(broker):
    with pytest.raises(InvalidMessage, match="'#'"):
        broker.send("orders", Message(body="x", message_id="J#2"))


def test_browse_sees_every_parked_message_even_when_their_times_tie(broker):
    broker.send("orders", [Message(body=str(i), delay_ms=5000) for i in range(250)])
    seen, cursor = set(), None
    while True:
        page = broker.browse("orders", cursor=cursor, limit=40)
        seen |= {b.message.message_id for b in page.messages}
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert len(seen) == 250


def test_a_received_message_counts_as_delivered_even_if_the_next_one_expired_at_hand_over(broker, clock):
    c = consumer(broker, prefetch=5)
    broker.send("orders", [Message(body="A"), Message(body="B", expiration=clock.now_ms() + 10)])
    clock.advance(20)
    assert [d.body for d in broker.receive(c, 5)] == ["A"]
    other = consumer(broker, prefetch=5)
    broker.close_consumer(c)
    assert [(d.body, d.redelivery_count) for d in drain(broker, other)] == [("A", 1)]


def test_cancelling_a_repeating_job_is_counted_as_a_cancel_and_stops_it(broker, clock):
    c = consumer(broker, ack_mode="client-individual")
    (job,) = broker.send("orders", Message(body="tick", period_ms=1000, repeat=5))
    clock.advance(1)
    assert [d.message_id for d in drain(broker, c)] == [f"{job}#1"]
    assert broker.remove_message("orders", job)
    clock.advance(10_000)
    assert drain(broker, c) == []
    stats = broker.stats("orders")
    assert (stats.cancelled, stats.purged, stats.parked) == (1, 0, 0)


def test_returned_messages_keep_their_place_with_message_priorities(broker, policy):
    policy("orders", prioritizedMessages=True)
    c = consumer(broker, prefetch=1, ack_mode="client-individual")
    broker.send("orders", [Message(body=f"M{i}", priority=1) for i in range(5)])
    (m0,) = drain(broker, c)
    broker.release(c, [m0.message_id])
    assert [d.body for d in drain(broker, c)] == ["M0"]


def test_a_commit_delivers_the_dead_letters_it_makes(broker, clock):
    tx = broker.begin()
    broker.send("orders", Message(body="late", expiration=clock.now_ms() + 5), tx=tx)
    clock.advance(10)
    broker.commit(tx)
    assert broker.stats("orders").forwarding == 0
    assert [d.body for d in drain(broker, consumer(broker, DLQ))] == ["late"]


def test_a_repeating_job_is_not_moved(broker):
    broker.ensure_destination("archive")
    (job,) = broker.send("orders", Message(body="tick", period_ms=1000, repeat=2, delay_ms=5000))
    with pytest.raises(OperationRefused, match="repeating scheduled message"):
        broker.move_message("orders", job, "archive")


@pytest.mark.parametrize(
    ("settings", "delays"),
    [
        ({"initialRedeliveryDelay": 3000, "redeliveryDelay": 3000, "maximumRedeliveryDelay": 2000},
         [3000, 3000, 3000]),  # the cap applies only to back-off, and never below redeliveryDelay
        ({"initialRedeliveryDelay": 0, "useExponentialBackOff": True}, [0, 1000, 5000]),
        ({"useExponentialBackOff": True, "backOffMultiplier": 2.0, "maximumRedeliveryDelay": 3000,
          "redeliveryDelay": 500}, [1000, 2000, 3000]),
    ],
)
def test_redelivery_delays_follow_activemqs_policy(broker, policy, clock, settings, delays):
    policy("orders", maximumRedeliveries=-1, **settings)
    c = consumer(broker, prefetch=1, ack_mode="client-individual")
    broker.send("orders", Message(body="m"))
    (d,) = drain(broker, c)
    waits = []
    for _ in delays:
        broker.nack(c, d.message_id)
        start = clock.now_ms()
        while not (got := broker.receive(c, 1)):
            clock.advance(100)
        waits.append(clock.now_ms() - start)
        d = got[0]
    assert waits == delays


def test_operator_calls_on_a_missing_destination_are_refused_and_write_nothing(broker, redis_client,
                                                                                namespace):
    for call in (lambda: broker.remove_message("ghost", "ID:x"), lambda: broker.browse("ghost"),
                 lambda: broker.get_message("ghost", "ID:x"), lambda: broker.purge("ghost")):
        with pytest.raises(UnknownDestination, match="queue://ghost"):
            call()
    assert broker.sweep_expired("ghost").done
    assert list(redis_client.scan_iter(match=f"{namespace}:*ghost*")) == []


def test_a_retried_dead_letter_that_dies_again_has_one_cause(broker, policy, redis_client, namespace):
    policy(">", maximumRedeliveries=0)
    c = consumer(broker, ack_mode="client-individual", prefetch=1)
    (m,) = broker.send("orders", Message(body="m", properties={"k": 1}))
    broker.nack(c, drain(broker, c)[0].message_id)  # Delivery[1] exceeds ... limit
    broker.retry_message(DLQ, m)
    broker.nack(c, drain(broker, c)[0].message_id)
    stored = msgpack.unpackb(redis_client.hget(f"{namespace}:{{q:{DLQ}}}:msgs", m), raw=True)
    names = stored[11][0::3]  # the packed property list: name, type, value, ...
    assert names.count(b"dlqDeliveryFailureCause") == 1 and names.count(b"originalExpiration") == 1


def test_an_expiration_beyond_a_long_is_refused(broker):
    with pytest.raises(InvalidMessage, match="expiration"):
        broker.send("orders", Message(body="x", expiration=2**64))
