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


# -- a commit is all or nothing ----------------------------------------------------------------------------


def test_a_commit_whose_ack_cannot_apply_applies_nothing_and_leaves_the_transaction_open(broker):
    """The consumer whose message the transaction acknowledged cumulatively was closed (by an operator)
    before the COMMIT: its ack cannot apply (a cumulative ack covers that consumer's window, gone with it;
    an individual one's messages are held for the transaction: test_tx_closed_consumer.py), so neither
    does the send before it; the transaction stays as it was, and its rollback then gives back what it
    acknowledged."""
    c = consumer(broker, prefetch=10, ack_mode="client", consumer_id="C")
    other = consumer(broker, dest="audit", prefetch=10, ack_mode="transacted", consumer_id="D")
    send(broker, "m0")
    send(broker, "a0", dest="audit")
    (d,) = drain(broker, c)
    (a,) = drain(broker, other)
    tx = broker.begin()
    broker.send("orders", Message(body="in-tx"), tx=tx)
    broker.ack(other, a.message_id, tx=tx)  # (a step that would apply: it must not either)
    broker.ack(c, d.message_id, tx=tx)
    broker.close_consumer(c)  # m0 goes back to the queue
    with pytest.raises(TransactionError) as refused:
        broker.commit(tx)
    stats = broker.stats("orders")
    assert (stats.enqueued, stats.dequeued) == (1, 0)  # the send did not land
    assert (broker.stats("audit").dequeued, broker.stats("audit").in_flight) == (0, 1)  # nor the other ack
    text = refused.value.message
    assert "consumer C" in text and "nothing was applied" in text, text
    broker.rollback(tx)  # still open: its ack of a0 is undone, the message redelivered
    assert [(x.body, x.redelivery_count) for x in drain(broker, other)] == [("a0", 1)]


def test_a_commit_whose_send_cannot_apply_acks_nothing_and_can_be_committed_again(broker):
    """The queue a transaction sent to was deleted before its COMMIT: nothing applies, the client is told
    which send failed; once the queue is back the same transaction commits whole."""
    c = consumer(broker, prefetch=10, ack_mode="transacted")
    send(broker, "m0")
    (d,) = drain(broker, c)
    tx = broker.begin()
    broker.ack(c, d.message_id, tx=tx)
    broker.send("audit", [Message(body="x"), Message(body="y")], tx=tx)
    broker.delete_destination("audit")
    with pytest.raises(TransactionError) as refused:
        broker.commit(tx)
    stats = broker.stats("orders")
    assert (stats.dequeued, stats.in_flight) == (0, 1)  # the ack before it was not applied
    text = refused.value.message
    for part in ("nothing was applied", "send to queue://audit", "no longer exists"):
        assert part in text, text
    broker.ensure_destination("audit")
    broker.commit(tx)
    assert (broker.stats("orders").dequeued, broker.stats("audit").enqueued) == (1, 2)


def test_a_message_acknowledged_twice_in_one_transaction_commits(broker):
    """Both acks are checked before either applies; the second finds the message acknowledged by the first
    step of the same commit, which is not a failure."""
    c = consumer(broker, prefetch=10, ack_mode="transacted")
    send(broker, "m0", "m1")
    d0, d1 = drain(broker, c)
    tx = broker.begin()
    broker.ack(c, d0.message_id, tx=tx)
    broker.ack(c, [d0.message_id, d1.message_id], tx=tx)
    broker.send("orders", Message(body="in-tx"), tx=tx)
    broker.commit(tx)
    stats = broker.stats("orders")
    assert (stats.enqueued, stats.dequeued) == (3, 2)


def test_a_message_another_open_transaction_acknowledged_is_refused_naming_it(broker):
    """Transaction t1 acknowledged m0 individually (marked as t1's); an ack of m0 in t2 is refused naming
    t1 and changes nothing (it took the mark, and t2's commit was then refused as if m0 were not in
    flight: the text did not say why). Once t1 is rolled back, t2 may acknowledge it."""
    c = consumer(broker, prefetch=10, ack_mode="transacted")
    send(broker, "m0", "m1")
    d0, _d1 = drain(broker, c)
    t1, t2 = broker.begin(), broker.begin()
    broker.ack(c, d0.message_id, tx=t1)
    before = broker.stats("orders")
    refusal = f"{d0.message_id} is acknowledged in transaction {t1} already"
    with pytest.raises(TransactionError, match=refusal):
        broker.ack(c, d0.message_id, tx=t2)
    after = broker.stats("orders")
    assert (after.in_flight, after.pending, after.consumers[0].prefetch_extension) == (
        before.in_flight, before.pending, before.consumers[0].prefetch_extension)
    broker.commit(t2)  # empty
    broker.rollback(t1)
    t3 = broker.begin()
    assert d0.message_id in [d.message_id for d in drain(broker, c)]  # redelivered (the rollback)
    broker.ack(c, d0.message_id, tx=t3)
    broker.commit(t3)
    assert broker.stats("orders").dequeued == 1


def test_a_transacted_cumulative_ack_over_more_than_one_call_takes_commits_whole(broker):
    """ack.lua takes a cumulative ack of at most 1,000 messages a call; the commit acknowledges a larger
    one's messages individually, 100 a call, in its one MULTI/EXEC."""
    c = consumer(broker, prefetch=1500, ack_mode="client")
    broker.send("orders", [Message(body=f"m{i}") for i in range(1200)])
    got = drain(broker, c, 1200)
    assert len(got) == 1200
    tx = broker.begin()
    broker.send("orders", Message(body="in-tx"), tx=tx)
    broker.ack(c, got[-1].message_id, tx=tx)
    broker.commit(tx)
    stats = broker.stats("orders")
    assert (stats.enqueued, stats.dequeued, stats.in_flight) == (1201, 1200, 1)


def test_a_commit_whose_acked_message_an_operator_removed_applies_nothing(broker):
    c = consumer(broker, prefetch=10, ack_mode="transacted")
    send(broker, "m0", "m1")
    d0, d1 = drain(broker, c)
    tx = broker.begin()
    broker.ack(c, [d0.message_id, d1.message_id], tx=tx)
    broker.send("orders", Message(body="in-tx"), tx=tx)
    assert broker.remove_message("orders", d1.message_id)
    with pytest.raises(TransactionError, match=f"{d1.message_id} is not in flight.*nothing was applied|"
                                               f"nothing was applied.*{d1.message_id} is not in flight"):
        broker.commit(tx)
    stats = broker.stats("orders")
    # in-tx not sent, m0 still held; the one dequeue is the removal's
    assert (stats.enqueued, stats.dequeued, stats.in_flight) == (2, 1, 1)
    broker.rollback(tx)
    assert [(x.body, x.redelivery_count) for x in drain(broker, c)] == [("m0", 1)]
