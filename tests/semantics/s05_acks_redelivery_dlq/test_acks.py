"""Acknowledgement modes (spec §5.1-5.2, Appendix A) and transactions."""

from __future__ import annotations

import pytest

from broker_core.errors import InvalidConsumer, NotInFlight, TransactionError
from broker_core.messages import Message

from ...helpers.broker import consumer, drain


def send(broker, *bodies, dest="orders"):
    return broker.send(dest, [Message(body=b) for b in bodies])


def test_auto_mode_acknowledges_as_the_adapter_takes_the_messages(broker):
    c = consumer(broker, prefetch=2, ack_mode="auto")
    send(broker, *[f"m{i}" for i in range(5)])
    got = drain(broker, c)
    assert [d.body for d in got] == [f"m{i}" for i in range(5)]  # the window never stays full
    stats = broker.stats("orders")
    assert (stats.queue_size, stats.dequeued, stats.consumers[0].acked) == (0, 5, 5)
    with pytest.raises(InvalidConsumer, match="automatically"):
        broker.ack(c, got[0].message_id)


def test_client_mode_ack_is_cumulative_over_this_consumers_messages(broker):
    a = consumer(broker, prefetch=10, consumer_id="A")
    b = consumer(broker, prefetch=10, consumer_id="B")
    send(broker, *[f"m{i}" for i in range(6)])
    got_a, got_b = drain(broker, a), drain(broker, b)
    assert broker.ack(a, got_a[1].message_id) == 2  # m0 and m2, not B's m1
    stats = {c.consumer_id: c for c in broker.stats("orders").consumers}
    assert (stats["A"].in_flight, stats["B"].in_flight) == (1, 3)
    assert len(got_b) == 3


def test_client_individual_mode_acks_exactly_one_message(broker):
    c = consumer(broker, prefetch=10, ack_mode="client-individual")
    send(broker, "m0", "m1", "m2")
    got = drain(broker, c)
    assert broker.ack(c, got[1].message_id) == 1
    assert broker.stats("orders").in_flight == 2


def test_an_ack_for_a_message_not_in_flight_is_refused_and_changes_nothing(broker):
    c = consumer(broker, prefetch=10, ack_mode="client-individual")
    send(broker, "m0", "m1")
    got = drain(broker, c)
    with pytest.raises(NotInFlight, match="ID:nope"):
        broker.ack(c, [got[0].message_id, "ID:nope"])
    assert broker.stats("orders").in_flight == 2
    broker.ack(c, got[0].message_id)
    with pytest.raises(NotInFlight):
        broker.ack(c, got[0].message_id)  # acked twice


def test_a_consumer_cannot_ack_another_consumers_message(broker):
    a = consumer(broker, prefetch=1, consumer_id="A", ack_mode="client-individual")
    b = consumer(broker, prefetch=1, consumer_id="B", ack_mode="client-individual")
    send(broker, "m0", "m1")
    (da,) = drain(broker, a)
    with pytest.raises(NotInFlight, match="consumer B"):
        broker.ack(b, da.message_id)


def test_a_transaction_applies_its_sends_and_acks_on_commit_only(broker):
    c = consumer(broker, prefetch=10, ack_mode="transacted")
    send(broker, "m0")
    (d,) = drain(broker, c)
    tx = broker.begin()
    broker.send("orders", Message(body="in-tx"), tx=tx)
    broker.ack(c, d.message_id, tx=tx)
    stats = broker.stats("orders")
    assert (stats.enqueued, stats.dequeued, stats.consumers[0].prefetch_extension) == (1, 0, 1)
    broker.commit(tx)
    stats = broker.stats("orders")
    assert (stats.enqueued, stats.dequeued) == (2, 1)
    assert [x.body for x in drain(broker, c)] == ["in-tx"]
    with pytest.raises(TransactionError):
        broker.commit(tx)


def test_a_rollback_drops_the_sends_and_redelivers_the_acked_messages(broker):
    c = consumer(broker, prefetch=10, ack_mode="transacted")
    send(broker, "m0")
    (d,) = drain(broker, c)
    tx = broker.begin()
    broker.send("orders", Message(body="never"), tx=tx)
    broker.ack(c, d.message_id, tx=tx)
    broker.rollback(tx)
    again = drain(broker, c)
    assert [(x.body, x.redelivery_count) for x in again] == [("m0", 1)]
    assert broker.stats("orders").enqueued == 1


def test_a_transacted_consumer_acks_only_inside_a_transaction(broker):
    c = consumer(broker, ack_mode="transacted")
    send(broker, "m0")
    (d,) = drain(broker, c)
    with pytest.raises(TransactionError):
        broker.ack(c, d.message_id)


def test_ack_and_receive_hands_over_what_the_freed_window_brought_in_the_same_call(broker):
    c = consumer(broker, prefetch=1, ack_mode="client-individual")
    send(broker, "m0", "m1", "m2")
    (first,) = drain(broker, c)
    (second,) = broker.ack_and_receive(c, first.message_id, 5)
    assert second.body == "m1"
    assert [d.body for d in broker.ack_and_receive(c, second.message_id, 5)] == ["m2"]
    stats = broker.stats("orders")
    assert (stats.dequeued, stats.in_flight, stats.consumers[0].undelivered) == (2, 1, 0)
