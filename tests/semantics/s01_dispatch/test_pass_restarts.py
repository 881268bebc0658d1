"""The dispatch pass never leaves a dispatchable message behind (review findings, each once a bug)."""

from __future__ import annotations

import pytest

from broker_core.errors import InvalidConsumer
from broker_core.messages import Message

from ...helpers.broker import consumer, drain


def bodies(deliveries):
    return [d.body for d in deliveries]


def test_a_released_message_reopens_a_consumer_the_pass_had_left_out(broker):
    a = consumer(broker, prefetch=1, ack_mode="client-individual", consumer_id="A")
    consumer(broker, prefetch=10, selector="k = 'z'", consumer_id="Z")
    w = consumer(broker, prefetch=1, ack_mode="client-individual", consumer_id="W")
    broker.send("orders", [Message(body="m1"), Message(body="m2")])
    (m1,) = drain(broker, a)
    drain(broker, w)
    broker.ack(a, m1.message_id)
    broker.send("orders", Message(body="m3"))
    (m3,) = drain(broker, a)
    broker.close_consumer(w)  # m2 returns while A is full
    broker.release(a, [m3.message_id])
    assert bodies(drain(broker, a)) == ["m2"]  # A has room again and takes the oldest


def test_a_restart_at_the_tail_walks_the_queue_again_in_the_same_call(broker):
    a = consumer(broker, prefetch=1, ack_mode="client-individual", consumer_id="A")
    consumer(broker, prefetch=10, selector="k = 'z'", consumer_id="Z")
    broker.send("orders", [Message(body=f"m{i}") for i in range(3)])
    (m0,) = drain(broker, a)
    assert bodies(broker.ack_and_receive(a, m0.message_id, 1)) == ["m1"]


def test_a_group_rebound_by_sequence_one_takes_its_waiting_messages_along(broker):
    d = consumer(broker, prefetch=10, selector="x = 1", consumer_id="D")
    e = consumer(broker, prefetch=10, consumer_id="E")
    broker.send("orders", Message(body="g-first", group_id="G", properties={"x": 1}))
    broker.send("orders", Message(body="g-wait", group_id="G", group_seq=2, properties={"x": 2}))
    broker.send("orders", Message(body="g-rebind", group_id="G", group_seq=1, properties={"x": 2}))
    assert bodies(drain(broker, d)) == ["g-first"]
    assert bodies(drain(broker, e)) == ["g-rebind", "g-wait"]
    assert broker.stats("orders").pending == 0


def test_a_group_closed_by_a_negative_sequence_releases_its_waiting_messages(broker):
    d = consumer(broker, prefetch=10, selector="x = 1", consumer_id="D")
    e = consumer(broker, prefetch=10, consumer_id="E")
    broker.send("orders", Message(body="g-first", group_id="G", properties={"x": 1}))
    broker.send("orders", Message(body="g-wait", group_id="G", properties={"x": 2}))
    broker.send("orders", Message(body="g-close", group_id="G", group_seq=-1, properties={"x": 1}))
    assert bodies(drain(broker, d)) == ["g-first", "g-close"]
    assert bodies(drain(broker, e)) == ["g-wait"]


def test_a_consumer_back_from_a_lapsed_lease_sees_what_it_missed(broker, clock):
    b = consumer(broker, prefetch=5, lease_ms=1000, consumer_id="B")
    consumer(broker, prefetch=5, selector="k = 'z'", lease_ms=60_000, consumer_id="Z")
    clock.advance(1500)
    broker.send("orders", Message(body="m1"))  # B lapsed: passed over
    assert broker.renew_leases("orders", ["B"], 1000) == []
    assert bodies(drain(broker, b)) == ["m1"]


def test_an_id_named_twice_is_acked_or_released_once(broker):
    c = consumer(broker, prefetch=2, ack_mode="client-individual")
    broker.send("orders", [Message(body=f"m{i}") for i in range(4)])
    m0, m1 = drain(broker, c)
    assert broker.ack(c, [m0.message_id, m0.message_id]) == 1
    stats = broker.stats("orders")
    assert (stats.dequeued, stats.consumers[0].in_flight) == (1, 2)
    assert broker.release(c, [m1.message_id, m1.message_id]) == 1
    assert broker.stats("orders").consumers[0].in_flight == 2


def test_a_rollback_closes_the_window_its_transacted_acks_opened(broker):
    c = consumer(broker, prefetch=1, ack_mode="transacted")
    broker.send("orders", [Message(body="m0"), Message(body="m1")])
    for _ in range(3):
        got = drain(broker, c)
        tx = broker.begin()
        broker.ack(c, got[0].message_id, tx=tx)
        broker.rollback(tx)
        stats = broker.stats("orders").consumers[0]
        assert (stats.prefetch_extension, stats.in_flight) == (0, 1)


@pytest.mark.parametrize("cid", ["a:inflight", "x:outbox", "a b", "x" * 129])
def test_consumer_ids_that_could_clash_with_key_names_are_refused(broker, cid):
    with pytest.raises(InvalidConsumer, match="consumer id"):
        consumer(broker, consumer_id=cid)


def test_a_duplicate_message_id_is_dropped_counted_and_the_first_kept(broker):
    broker.send("orders", Message(body="first", message_id="X"))
    assert broker.send("orders", Message(body="second", message_id="X")) == ["X"]
    stats = broker.stats("orders")
    assert (stats.enqueued, stats.duplicates) == (1, 1)
    assert bodies(drain(broker, consumer(broker))) == ["first"]


def test_an_empty_group_id_is_a_group(broker):
    a = consumer(broker, prefetch=10, consumer_id="A")
    b = consumer(broker, prefetch=10, consumer_id="B")
    broker.send("orders", [Message(body="e1", group_id=""), Message(body="e2", group_id="")])
    assert bodies(drain(broker, a)) == ["e1", "e2"] and drain(broker, b) == []


def test_room_freed_behind_a_long_unmatched_backlog_does_not_walk_the_backlog_again(broker):
    # The pass first left A out (full) after the backlog; room freed restarts it there, not at the head.
    broker.send("orders", [Message(body=f"o{i}", properties={"k": "other"}) for i in range(300)])
    a = consumer(broker, prefetch=2, selector="k = 'w'", ack_mode="client-individual", consumer_id="A")
    broker.send("orders", [Message(body=f"w{i}", properties={"k": "w"}) for i in range(6)])
    got = broker.receive(a, 2)
    assert bodies(got) == ["w0", "w1"]
    walked = broker.stats("orders").skipped
    taken = []
    for _ in range(4):
        got = got[1:] + broker.ack_and_receive(a, got[0].message_id, 1)
        taken.append(got[-1].body)
    assert taken == ["w2", "w3", "w4", "w5"]
    assert broker.stats("orders").skipped - walked < 10
    assert broker.stats("orders").pending == 300


def test_a_pass_restarted_for_room_still_offers_what_the_full_consumer_missed_in_order(broker):
    # B (no selector) was full when m2..m4 came; X only takes k = 'x' so they were skipped. When B gets
    # room it must get m2 first, although the pass had moved past it.
    b = consumer(broker, prefetch=1, ack_mode="client-individual", consumer_id="B")
    consumer(broker, prefetch=10, selector="k = 'x'", consumer_id="X")
    broker.send("orders", [Message(body=f"m{i}") for i in range(1, 5)])
    (m1,) = drain(broker, b)
    assert bodies(broker.ack_and_receive(b, m1.message_id, 1)) == ["m2"]


def test_a_message_that_expires_as_it_is_handed_over_frees_its_slot_for_the_next(broker, clock):
    a = consumer(broker, prefetch=1, ack_mode="client", consumer_id="A")
    broker.send("orders", [Message(body="soon", expiration=clock.now_ms() + 500), Message(body="later")])
    clock.advance(1_000)
    assert broker.receive(a, 1) == []  # "soon" expired in A's window; "later" takes the freed slot at once
    assert broker.stats("orders").pending == 0  # (a pushed consumer is told now, not at its next call)
    assert bodies(broker.receive(a, 1)) == ["later"]


def test_an_expiry_while_acknowledging_and_receiving_also_frees_the_slot(broker, clock):
    a = consumer(broker, prefetch=2, ack_mode="client-individual", consumer_id="A")
    broker.send("orders", [Message(body="m1"), Message(body="soon", expiration=clock.now_ms() + 500),
                           Message(body="later"), Message(body="last")])
    (m1,) = broker.receive(a, 1)
    clock.advance(1_000)
    # the ack makes room for "later"; "soon" expires as it is handed over, which makes room for "last"
    assert broker.ack_and_receive(a, m1.message_id, 1) == []
    assert broker.stats("orders").pending == 0
    assert bodies(broker.receive(a, 2)) == ["later", "last"]
