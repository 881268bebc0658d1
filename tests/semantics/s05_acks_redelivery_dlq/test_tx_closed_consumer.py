"""A message a transaction acknowledged (individually) whose consumer closes before the transaction ends
stays with the transaction, as ActiveMQ's Queue keeps a transacted ack's message (acked, not dispatched
again) after its subscription's removal: the COMMIT consumes it, a ROLLBACK (or the transaction's lapse,
found by the maintenance tick) returns it for redelivery, its counter raised once, by the close."""

from __future__ import annotations

import time

import pytest

from broker_core import maintenance
from broker_core.destinations import parse_destination
from broker_core.errors import TransactionError
from broker_core.keys import Home
from broker_core.messages import Message
from broker_core.model import summary_of

from ...helpers.broker import consumer, drain


def _acked_then_closed(broker, ttl_ms=None):
    """m0 and m1 received by C; m0 acknowledged in a transaction (with a send), then C closed. Returns
    the transaction, a second consumer D on the queue and m0's id."""
    c = consumer(broker, prefetch=10, ack_mode="client-individual", consumer_id="C")
    broker.send("orders", [Message(body="m0"), Message(body="m1")])
    d0, _d1 = drain(broker, c)
    tx = broker.begin(ttl_ms) if ttl_ms else broker.begin()
    broker.send("audit", Message(body="in-tx"), tx=tx)
    broker.ack(c, d0.message_id, tx=tx)
    broker.close_consumer(c)
    other = consumer(broker, prefetch=10, ack_mode="client-individual", consumer_id="D")
    return tx, other, d0.message_id


def test_the_commit_consumes_a_message_whose_consumer_closed_after_its_transacted_ack(broker):
    tx, other, _m0 = _acked_then_closed(broker)
    # held for the transaction: not dispatched again meanwhile, still counted in the queue
    assert [(x.body, x.redelivery_count) for x in drain(broker, other)] == [("m1", 1)]
    stats = broker.stats("orders")
    assert (stats.queue_size, stats.in_flight, stats.dequeued) == (2, 2, 0)
    broker.commit(tx)
    stats = broker.stats("orders")
    assert (stats.queue_size, stats.in_flight, stats.dequeued) == (1, 1, 1)
    assert broker.stats("audit").enqueued == 1
    assert drain(broker, other) == []  # m0 never comes back


def test_a_rollback_returns_it_redelivered_once(broker):
    tx, other, _m0 = _acked_then_closed(broker)
    assert [x.body for x in drain(broker, other)] == ["m1"]
    broker.rollback(tx)
    assert [(x.body, x.redelivery_count) for x in drain(broker, other)] == [("m0", 1)]
    stats = broker.stats("orders")
    assert (stats.queue_size, stats.in_flight, stats.dequeued) == (2, 2, 0)
    assert broker.stats("audit").enqueued == 0


def test_a_transaction_that_lapses_gives_it_back_at_the_next_tick(broker, clock):
    """Its owner died (the key expired, never renewed): the maintenance index brings the queue up when
    the transaction would have ended, and the tick returns the message, once."""
    tx, other, _m0 = _acked_then_closed(broker, ttl_ms=300)
    assert [x.body for x in drain(broker, other)] == ["m1"]
    maintenance.run_due(broker)
    assert drain(broker, other) == []  # the transaction is still open
    _lapse_gives_m0_back_once(broker, clock, other)
    assert broker.stats("orders").in_flight == 2


def _lapse_gives_m0_back_once(broker, clock, to) -> None:
    """The transaction's key ends (by Redis's clock, ttl 300 ms): the next tick gives the held m0 back,
    redelivered, to `to`, and the tick after that nothing more."""
    time.sleep(0.4)
    clock.advance(1_000)
    maintenance.run_due(broker)
    assert [(x.body, x.redelivery_count) for x in drain(broker, to)] == [("m0", 1)]
    clock.advance(1_000)
    maintenance.run_due(broker)
    assert drain(broker, to) == []  # once


def test_a_reaped_consumer_s_transacted_ack_commits_too(broker, clock):
    """The lease lapsed (the reaper closed the consumer) while the transaction stayed open: one rule."""
    c = consumer(broker, prefetch=10, ack_mode="client-individual", consumer_id="C", lease_ms=1_000)
    broker.send("orders", Message(body="m0"))
    (d0,) = drain(broker, c)
    tx = broker.begin()
    broker.ack(c, d0.message_id, tx=tx)
    clock.advance(5_000)
    maintenance.run_due(broker)
    assert broker.stats("orders").consumer_count == 0
    broker.commit(tx)
    stats = broker.stats("orders")
    assert (stats.queue_size, stats.dequeued) == (0, 1)


def test_a_held_message_an_operator_removed_is_not_committed_nor_given_back(broker, clock):
    """Removed while held: the commit refuses the ack (nothing applied), and neither the rollback nor the
    tick brings back a message that is gone."""
    tx, other, m0 = _acked_then_closed(broker)
    assert [x.body for x in drain(broker, other)] == ["m1"]
    assert broker.remove_message("orders", m0)
    with pytest.raises(TransactionError, match="nothing was applied"):
        broker.commit(tx)
    broker.rollback(tx)
    clock.advance(3_600_000)  # (past the transaction's hour: D's lease lapses too, m1 goes back)
    maintenance.run_due(broker)
    last = consumer(broker, prefetch=10, ack_mode="client-individual", consumer_id="E")
    assert [x.body for x in drain(broker, last)] == ["m1"]
    stats = broker.stats("orders")
    assert (stats.queue_size, stats.in_flight, stats.dequeued) == (1, 1, 1)


def test_reaping_lapsed_consumers_gives_back_what_lapsed_transactions_held(broker, clock):
    """The live processes that reap a dead one's consumers (every lease renewal) give back what its
    lapsed transactions held, without waiting for the maintenance tick."""
    tx, other, _m0 = _acked_then_closed(broker, ttl_ms=300)
    assert [x.body for x in drain(broker, other)] == ["m1"]
    time.sleep(0.4)
    clock.advance(1_000)
    broker.renew_leases("orders", ["D"], 60_000)
    assert broker.reap_lapsed("orders") == []
    assert [(x.body, x.redelivery_count) for x in drain(broker, other)] == [("m0", 1)]


def test_a_purge_takes_a_held_message_too(broker, clock):
    """A purge removes every message the queue held when it began, wherever it is (in flight too): one
    held for an open transaction as well, which would otherwise come back at the rollback (or the lapse)
    from a queue the operator emptied. The commit then refuses its ack, as for any in-flight message a
    purge took."""
    tx, other, _m0 = _acked_then_closed(broker)
    assert [x.body for x in drain(broker, other)] == ["m1"]
    assert broker.purge("orders") == 2
    stats = broker.stats("orders")
    assert (stats.queue_size, stats.in_flight, stats.dequeued) == (0, 0, 2)
    broker.rollback(tx)
    clock.advance(3_600_000)  # (past the transaction's hour)
    maintenance.run_due(broker)
    last = consumer(broker, prefetch=10, ack_mode="client-individual", consumer_id="E")
    assert drain(broker, last) == []  # (D was reaped: its lease lapsed meanwhile)
    assert broker.stats("orders").queue_size == 0


def test_a_rollback_returns_the_held_messages_of_an_ack_one_of_whose_messages_left(broker):
    """One ack of two messages in the transaction, both held, one removed by an operator since: the
    rollback gives back the other at once (it was refused whole, its consumer gone, and left held until
    the transaction's key would have expired: an hour)."""
    c = consumer(broker, prefetch=10, ack_mode="client-individual", consumer_id="C")
    broker.send("orders", [Message(body="m0"), Message(body="m1")])
    d0, d1 = drain(broker, c)
    tx = broker.begin()
    broker.ack(c, [d0.message_id, d1.message_id], tx=tx)
    broker.close_consumer(c)
    assert broker.remove_message("orders", d0.message_id)
    broker.rollback(tx)
    other = consumer(broker, prefetch=10, ack_mode="client-individual", consumer_id="D")
    assert [(x.body, x.redelivery_count) for x in drain(broker, other)] == [("m1", 1)]


def test_a_nack_after_a_transacted_ack_ends_the_transaction_s_mark(broker, policy):
    """C acknowledges m0 in a transaction, then NACKs it: m0 goes back to the queue (and to C again, at
    once), and the transaction's mark goes with the window it was made in. C's close, then D's, give it
    back; it was held for the transaction instead (found nowhere), whose commit would have consumed a
    message redelivered since and never acknowledged again."""
    policy("orders", initialRedeliveryDelay=0, redeliveryDelay=0)  # (redelivered at once)
    c = consumer(broker, prefetch=10, ack_mode="client-individual", consumer_id="C")
    broker.send("orders", Message(body="m0"))
    (d0,) = drain(broker, c)
    tx = broker.begin()
    broker.ack(c, d0.message_id, tx=tx)
    broker.nack(c, [d0.message_id])
    broker.close_consumer(c)
    d = consumer(broker, prefetch=10, ack_mode="client-individual", consumer_id="D")
    assert [x.body for x in drain(broker, d)] == ["m0"]
    broker.close_consumer(d)
    e = consumer(broker, prefetch=10, ack_mode="client-individual", consumer_id="E")
    assert [x.body for x in drain(broker, e)] == ["m0"]


def test_an_operator_sees_a_held_message_where_the_counts_put_it(broker):
    """Counted in the queue's size and in flight, a held message is browsed and found by id too, in flight
    with no consumer (its consumer closed): an operator who could not see it could not remove it."""
    _tx, other, m0 = _acked_then_closed(broker)
    assert [x.body for x in drain(broker, other)] == ["m1"]
    page = broker.browse("orders")
    assert sorted((b.message.body, b.state, b.message.consumer_id) for b in page.messages) == [
        ("m0", "inflight", ""), ("m1", "inflight", "D")]
    assert page.next_cursor is None
    got = broker.get_message("orders", m0)
    assert (got.message.body, got.state, got.message.redelivery_count) == ("m0", "inflight", 1)
    # one at a time, the cursor goes from the windows to the held ones
    first = broker.browse("orders", limit=1)
    second = broker.browse("orders", limit=1, cursor=first.next_cursor)
    assert {first.messages[0].message.body, second.messages[0].message.body} == {"m0", "m1"}


def test_a_held_message_is_not_moved_and_the_refusal_says_why(broker):
    """In flight (held for its transaction), it is refused as any in-flight message, not as one missing."""
    _tx, other, m0 = _acked_then_closed(broker)
    drain(broker, other)
    broker.send("elsewhere", Message(body="x"))
    try:
        broker.move_message("orders", m0, "elsewhere")
    except Exception as exc:  # noqa: BLE001 - the refusal is what is asserted
        assert "in flight" in str(exc) and "transaction" in str(exc), exc
    else:
        raise AssertionError("moved")
    assert broker.stats("orders").queue_size == 2


# -- a durable topic subscription's consumer ---------------------------------------------------------------
# ActiveMQ 5.17 acknowledges a durable subscription's message in its store inside the transaction
# (DurableTopicSubscription.acknowledge -> Topic.acknowledge -> TopicMessageStore.acknowledge through the
# transaction store: MemoryTransactionStore / KahaDBTransactionStore.acknowledge queue the ack in the
# transaction, KahaDB's MessageDatabase.process(KahaCommitCommand) applies it), whatever became of the
# subscriber since (DurableTopicSubscription.deactivate leaves the store alone): the commit consumes the
# message, which never comes back to the subscription; a rollback drops the queued ack, and the message is
# still the subscription's, dispatched again when it is active.

TOPIC = "topic://prices"


def _durable(broker, consumer_id):
    return consumer(broker, TOPIC, client_id="app", subscription_name="s", prefetch=10,
                    ack_mode="client-individual", consumer_id=consumer_id)


def _durable_acked_then_offline(broker, ttl_ms=None):
    """m0 and m1 received by the durable subscriber C; m0 acknowledged in a transaction, then C closed
    (the subscription offline). Returns the transaction."""
    c = _durable(broker, "C")
    broker.send(TOPIC, [Message(body="m0"), Message(body="m1")])
    d0, _d1 = drain(broker, c)
    tx = broker.begin(ttl_ms) if ttl_ms else broker.begin()
    broker.ack(c, d0.message_id, tx=tx)
    broker.close_consumer(c)
    return tx


def _subscription(broker):
    (sub,) = broker.subscriptions(TOPIC)
    return sub


def test_the_commit_consumes_a_durable_subscription_s_message_acked_before_it_went_offline(broker):
    tx = _durable_acked_then_offline(broker)
    broker.commit(tx)
    again = _durable(broker, "D")
    assert [(x.body, x.redelivery_count) for x in drain(broker, again)] == [("m1", 1)]
    sub = _subscription(broker)
    assert (sub.in_flight, sub.dequeued) == (1, 1)


def test_held_while_the_durable_subscriber_is_back_before_the_commit(broker):
    """Back before the transaction ends, the subscriber is not given m0 again (the commit will consume it):
    held for the transaction, counted in flight."""
    tx = _durable_acked_then_offline(broker)
    again = _durable(broker, "D")
    assert [(x.body, x.redelivery_count) for x in drain(broker, again)] == [("m1", 1)]
    assert _subscription(broker).in_flight == 2
    broker.commit(tx)
    assert drain(broker, again) == []
    sub = _subscription(broker)
    assert (sub.in_flight, sub.dequeued) == (1, 1)


def test_a_rollback_gives_it_back_to_the_durable_subscription(broker):
    tx = _durable_acked_then_offline(broker)
    broker.rollback(tx)
    again = _durable(broker, "D")
    assert sorted((x.body, x.redelivery_count) for x in drain(broker, again)) == [("m0", 1), ("m1", 1)]
    assert _subscription(broker).dequeued == 0


def test_a_rollback_while_the_durable_subscriber_is_back_gives_it_back_to_it(broker):
    tx = _durable_acked_then_offline(broker)
    again = _durable(broker, "D")
    assert [x.body for x in drain(broker, again)] == ["m1"]
    broker.rollback(tx)
    assert [(x.body, x.redelivery_count) for x in drain(broker, again)] == [("m0", 1)]


def test_a_durable_subscription_s_held_message_goes_back_when_its_transaction_lapses(broker, clock):
    _durable_acked_then_offline(broker, ttl_ms=300)
    again = _durable(broker, "D")
    assert [x.body for x in drain(broker, again)] == ["m1"]
    _lapse_gives_m0_back_once(broker, clock, again)


def test_a_held_message_leaves_with_its_durable_subscription(broker):
    """The subscription destroyed while it holds a message for a transaction: the topic's one stored copy
    goes with it (left, nothing would ever release it), and the commit skips the ack, as a non-durable
    subscription's whose messages went with it, and applies the rest."""
    tx = _durable_acked_then_offline(broker)
    broker.send("audit", Message(body="in-tx"), tx=tx)
    assert broker.unsubscribe(TOPIC, client_id="app", subscription_name="s") == 2
    maintenance.run_due(broker)  # (an ended subscription's messages are released a chunk per call)
    assert broker.redis.hlen(f"{broker.namespace}:{{t:prices}}:msgs") == 0
    broker.commit(tx)
    assert broker.stats("audit").enqueued == 1


def test_a_non_durable_subscription_s_transacted_ack_is_skipped_once_its_subscriber_closed(broker):
    """A non-durable subscription ends with its consumer and its messages with it (TopicSubscription holds
    nothing in a store): the commit has nothing to consume and applies the rest."""
    c = consumer(broker, TOPIC, prefetch=10, ack_mode="client-individual", consumer_id="C")
    broker.send(TOPIC, Message(body="m0"))
    (d0,) = drain(broker, c)
    tx = broker.begin()
    broker.send("audit", Message(body="in-tx"), tx=tx)
    broker.ack(c, d0.message_id, tx=tx)
    broker.close_consumer(c)
    broker.commit(tx)
    assert broker.stats("audit").enqueued == 1
    assert broker.redis.hlen(f"{broker.namespace}:{{t:prices}}:msgs") == 0


def test_a_durable_subscription_s_committed_ack_leaves_no_mark_behind(broker):
    """The subscriber still there at the commit: the message is acknowledged as any, and the
    transaction's mark on it goes with it (left, the subscription's marks would only grow)."""
    c = _durable(broker, "C")
    broker.send(TOPIC, Message(body="m0"))
    (d0,) = drain(broker, c)
    tx = broker.begin()
    broker.ack(c, d0.message_id, tx=tx)
    broker.commit(tx)
    assert _subscription(broker).dequeued == 1
    home = Home(parse_destination(TOPIC), c.subscription)
    assert broker.redis.hlen(f"{broker.ops.home_prefix(home)}:txacks") == 0


def test_a_durable_subscription_s_held_message_counts_in_flight_in_the_topic_s_summary(broker):
    """The topic's summary (the console's list, /metrics) adds its subscriptions up as its stats do."""
    _durable_acked_then_offline(broker)
    topic = parse_destination(TOPIC)
    (summary,) = broker._run(broker.ops.summaries([topic], broker.clock.now_ms()))
    assert summary == summary_of(broker.stats(TOPIC))
    assert (summary.pending, summary.in_flight) == (1, 1)


def test_reaping_a_durable_subscriber_gives_back_what_its_lapsed_transaction_held(broker, clock):
    """The live processes that reap a dead one's consumers give back what its lapsed transactions held in
    a durable subscription too, its next subscriber's lease renewal reaping them."""
    _durable_acked_then_offline(broker, ttl_ms=300)
    again = _durable(broker, "D")
    assert [x.body for x in drain(broker, again)] == ["m1"]
    time.sleep(0.4)
    clock.advance(1_000)
    broker.renew_leases(TOPIC, ["D"], 60_000)
    assert broker.reap_lapsed(TOPIC) == []
    assert [(x.body, x.redelivery_count) for x in drain(broker, again)] == [("m0", 1)]


def _acked_in_tx_then_nacked_then_closed(broker, tx: str) -> None:
    """m0 to durable subscriber C, acknowledged in `tx`, NACKed (redelivered at once), then C closed."""
    broker.policies.set_entry("topic", "prices", {"initialRedeliveryDelay": 0, "redeliveryDelay": 0})
    broker.refresh_policies()
    c = _durable(broker, "C")
    broker.send(TOPIC, Message(body="m0"))
    (d0,) = drain(broker, c)
    broker.ack(c, d0.message_id, tx=tx)
    broker.nack(c, [d0.message_id])
    broker.close_consumer(c)


def test_a_nack_after_a_durable_subscriber_s_transacted_ack_ends_the_transaction_s_mark(broker):
    """As on a queue: the NACKed message is back in the subscription and no longer the transaction's, so
    its subscriber's close gives it back instead of holding it for that transaction."""
    _acked_in_tx_then_nacked_then_closed(broker, broker.begin())
    again = _durable(broker, "D")
    assert [x.body for x in drain(broker, again)] == ["m0"]


# -- what becomes of a durable subscription's held message -------------------------------------------------


def _topic_messages(broker):
    return broker.redis.hlen(f"{broker.namespace}:{{t:prices}}:msgs")


def test_a_durable_subscription_re_created_under_its_name_before_the_commit_has_its_old_ack_skipped(broker):
    """Unsubscribed (its held m0 went with it), then subscribed again under the same name: a new
    subscription with the same key. The commit skips the old one's ack, as for one removed, and applies
    the rest; the new subscription is left alone (it was refused for ever: its consumer is unknown there
    and m0 held by nobody)."""
    tx = _durable_acked_then_offline(broker)
    broker.send("audit", Message(body="in-tx"), tx=tx)
    assert broker.unsubscribe(TOPIC, client_id="app", subscription_name="s") == 2
    again = _durable(broker, "D")
    broker.send(TOPIC, Message(body="m2"))
    broker.commit(tx)
    assert broker.stats("audit").enqueued == 1
    assert [(x.body, x.redelivery_count) for x in drain(broker, again)] == [("m2", 0)]
    sub = _subscription(broker)
    assert (sub.pending, sub.in_flight, sub.dequeued) == (0, 1, 0)


def test_a_durable_subscription_replaced_by_another_selector_before_the_commit_skips_its_old_ack(broker):
    """The subscriber back with another selector: the subscription is replaced (TopicRegion's
    hasDurableSubChanged), under the same key. The commit skips the old one's ack."""
    tx = _durable_acked_then_offline(broker)
    broker.send("audit", Message(body="in-tx"), tx=tx)
    again = consumer(broker, TOPIC, client_id="app", subscription_name="s", prefetch=10,
                     ack_mode="client-individual", consumer_id="D", selector="color = 'red'")
    broker.commit(tx)
    assert broker.stats("audit").enqueued == 1
    assert drain(broker, again) == []
    assert _subscription(broker).dequeued == 0


def test_a_durable_subscription_s_ack_goes_where_it_is_held_when_its_consumer_id_is_reused(broker):
    """C closed (m0 held in the durable subscription for the transaction), and a new consumer under the
    same id subscribes to the topic without a durable name: the commit consumes m0 where it is held,
    not in the consumer id's new subscription (where it was refused: not in flight there)."""
    tx = _durable_acked_then_offline(broker)
    other = consumer(broker, TOPIC, prefetch=10, ack_mode="client-individual", consumer_id="C")
    broker.commit(tx)
    durable = next(s for s in broker.subscriptions(TOPIC) if s.durable)
    assert (durable.pending, durable.in_flight, durable.dequeued) == (1, 0, 1)
    assert drain(broker, other) == []


def test_a_rollback_after_the_durable_subscription_was_removed_gives_back_the_rest(broker):
    """The subscription removed with its held m0: the rollback has nothing to give back there, and gives
    back what the transaction held on a queue, at once."""
    tx = _durable_acked_then_offline(broker)
    q = consumer(broker, prefetch=10, ack_mode="client-individual", consumer_id="Q")
    broker.send("orders", Message(body="q0"))
    (q0,) = drain(broker, q)
    broker.ack(q, q0.message_id, tx=tx)
    broker.close_consumer(q)
    assert broker.unsubscribe(TOPIC, client_id="app", subscription_name="s") == 2
    broker.rollback(tx)
    last = consumer(broker, prefetch=10, ack_mode="client-individual", consumer_id="E")
    assert [(x.body, x.redelivery_count) for x in drain(broker, last)] == [("q0", 1)]
    maintenance.run_due(broker)
    assert _topic_messages(broker) == 0


def test_the_topic_deleted_while_a_durable_subscription_holds_a_message_the_commit_applies_the_rest(broker):
    tx = _durable_acked_then_offline(broker)
    broker.send("audit", Message(body="in-tx"), tx=tx)
    broker.delete_destination(TOPIC)
    maintenance.run_due(broker)
    broker.commit(tx)
    assert broker.stats("audit").enqueued == 1
    assert _topic_messages(broker) == 0


def _expired_while_held(broker, clock) -> str:
    """m0 (expiring in 1 s) acknowledged in a transaction, its durable subscriber gone, then 5 s later: the
    transaction's id."""
    c = _durable(broker, "C")
    broker.send(TOPIC, [Message(body="m0", expiration=clock.now_ms() + 1_000), Message(body="m1")])
    d0, _d1 = drain(broker, c)
    tx = broker.begin()
    broker.ack(c, d0.message_id, tx=tx)
    broker.close_consumer(c)
    clock.advance(5_000)
    return tx


def test_a_durable_subscription_s_message_expiring_while_held_is_consumed_once_by_the_commit(broker, clock):
    tx = _expired_while_held(broker, clock)
    maintenance.run_due(broker)
    broker.commit(tx)
    again = _durable(broker, "D")
    assert [x.body for x in drain(broker, again)] == ["m1"]
    sub = _subscription(broker)
    assert (sub.pending, sub.in_flight, sub.dequeued, sub.expired) == (0, 1, 1, 0)


def test_a_durable_subscription_s_message_expiring_while_held_expires_after_a_rollback(broker, clock):
    broker.rollback(_expired_while_held(broker, clock))
    again = _durable(broker, "D")
    assert [x.body for x in drain(broker, again)] == ["m1"]
    sub = _subscription(broker)
    assert (sub.pending, sub.in_flight, sub.dequeued, sub.expired) == (0, 1, 1, 1)
    assert _topic_messages(broker) == 1


def test_the_durable_subscriber_back_acks_and_nacks_others_before_the_commit(broker):
    broker.policies.set_entry("topic", "prices", {"maximumRedeliveries": 0})
    broker.refresh_policies()
    tx = _durable_acked_then_offline(broker)
    broker.send(TOPIC, [Message(body="m2"), Message(body="m3")])
    again = _durable(broker, "D")
    got = {x.body: x for x in drain(broker, again)}
    assert sorted(got) == ["m1", "m2", "m3"]
    broker.ack(again, got["m1"].message_id)
    broker.nack(again, [got["m2"].message_id], poison=True)
    broker.commit(tx)
    sub = _subscription(broker)
    assert (sub.pending, sub.in_flight, sub.dequeued, sub.deadlettered) == (0, 1, 3, 1)
    broker.ack(again, got["m3"].message_id)
    assert _topic_messages(broker) == 0


def test_a_commit_refused_for_another_step_then_retried_consumes_the_held_message_once(broker):
    tx = _durable_acked_then_offline(broker)
    broker.send("audit", Message(body="before"))
    broker.send("audit", Message(body="in-tx"), tx=tx)
    broker.delete_destination("audit")
    with pytest.raises(TransactionError, match="nothing was applied"):
        broker.commit(tx)
    sub = _subscription(broker)
    assert (sub.pending, sub.in_flight, sub.dequeued) == (1, 1, 0)
    broker.send("audit", Message(body="again"))
    broker.commit(tx)
    sub = _subscription(broker)
    assert (sub.pending, sub.in_flight, sub.dequeued) == (1, 0, 1)
    again = _durable(broker, "D")
    assert [x.body for x in drain(broker, again)] == ["m1"]
    assert _topic_messages(broker) == 1


def test_a_lapsed_transaction_gives_back_to_an_offline_durable_subscription(broker, clock):
    """Nobody back: the tick visits the subscription's own index entry and returns m0 to it, once."""
    _durable_acked_then_offline(broker, ttl_ms=300)
    home = Home(parse_destination(TOPIC), _subscription(broker).key)
    assert broker.redis.zscore(f"{broker.namespace}:due", broker.ops.home_prefix(home))
    time.sleep(0.4)
    clock.advance(1_000)
    maintenance.run_due(broker)
    sub = _subscription(broker)
    assert (sub.pending, sub.in_flight) == (2, 0)
    maintenance.run_due(broker)
    again = _durable(broker, "D")
    assert sorted((x.body, x.redelivery_count) for x in drain(broker, again)) == [("m0", 1), ("m1", 1)]


def test_a_commit_after_a_nack_and_the_durable_subscriber_s_close_leaves_the_nacked_message(broker):
    """The NACK gave m0 back to the subscription (no longer the transaction's), then C closed: the commit
    does not consume it (it was refused: m0 held for nobody, C gone) and m0 comes again, once."""
    tx = broker.begin()
    broker.send("audit", Message(body="in-tx"), tx=tx)
    _acked_in_tx_then_nacked_then_closed(broker, tx)
    broker.commit(tx)
    assert broker.stats("audit").enqueued == 1
    again = _durable(broker, "D")
    assert [x.body for x in drain(broker, again)] == ["m0"]
    assert _subscription(broker).dequeued == 0


def test_a_rollback_after_the_durable_subscription_was_re_created_leaves_the_new_one_alone(broker):
    tx = _durable_acked_then_offline(broker)
    assert broker.unsubscribe(TOPIC, client_id="app", subscription_name="s") == 2
    again = _durable(broker, "D")
    broker.send(TOPIC, Message(body="m2"))
    assert [x.body for x in drain(broker, again)] == ["m2"]
    broker.rollback(tx, redeliver=False)  # (STOMP's ABORT)
    assert drain(broker, again) == []
    sub = _subscription(broker)
    assert (sub.pending, sub.in_flight, sub.dequeued) == (0, 1, 0)


def test_the_topic_deleted_and_made_again_with_the_durable_subscription_before_the_commit(broker):
    tx = _durable_acked_then_offline(broker)
    broker.send("audit", Message(body="in-tx"), tx=tx)
    broker.delete_destination(TOPIC)
    maintenance.run_due(broker)
    again = _durable(broker, "D")
    broker.send(TOPIC, Message(body="m2"))
    broker.commit(tx)
    assert broker.stats("audit").enqueued == 1
    assert [(x.body, x.redelivery_count) for x in drain(broker, again)] == [("m2", 0)]
    assert _topic_messages(broker) == 1


def test_a_new_retroactive_durable_subscription_gets_a_message_another_one_holds_for_a_transaction(broker):
    """A new retroactive durable subscription first catches up on what the topic stores for its other
    durable subscriptions (Topic.activate loads the store's backlog, where an ack waiting for its
    transaction has not removed the message yet): m0, held for the transaction in the first one, is in
    that backlog as it was in flight or pending there (it was missed: held is neither)."""
    _durable_acked_then_offline(broker)
    late = consumer(broker, TOPIC, client_id="app", subscription_name="late", prefetch=10,
                    ack_mode="client-individual", consumer_id="L", retroactive=True)
    assert sorted(x.body for x in drain(broker, late)) == ["m0", "m1"]


def test_a_retroactive_durable_subscriber_back_is_not_replayed_the_retained_message_held_for_it(broker):
    """The retained message, acknowledged in a transaction and held for it (its subscriber gone): the
    subscriber back, retroactive, is not given it again (the subscription holds it, as one in flight), so
    that the rollback's return does not put in its pending list a message already in its window (it was
    then delivered twice)."""
    def durable(cid):
        return consumer(broker, TOPIC, client_id="app", subscription_name="s", prefetch=10,
                        ack_mode="client-individual", consumer_id=cid, retroactive=True)

    c = durable("C")
    broker.send(TOPIC, Message(body="r", message_id="r1", properties={"ActiveMQ.Retain": True}))
    (r1,) = drain(broker, c)
    tx = broker.begin()
    broker.ack(c, r1.message_id, tx=tx)
    broker.close_consumer(c)
    again = durable("D")
    assert drain(broker, again) == []
    broker.rollback(tx)
    assert [(x.message_id, x.redelivery_count) for x in drain(broker, again)] == [("r1", 1)]
    assert drain(broker, again) == []
    sub = _subscription(broker)
    assert (sub.pending, sub.in_flight) == (0, 1)
