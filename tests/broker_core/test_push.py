"""Pushed deliveries (docs/broker_core.md "The delivery path"): a consumer whose adapter waits with an empty
outbox gets a dispatched message from the dispatch itself, published on its notify channel (or, for the
calling process's own channel, in the send's reply), with no receive call; what a push hands over stays in
flight, so a lost push is found again by `receive_after` and a lapsed lease returns it."""

from __future__ import annotations

from broker_core.messages import Message
from broker_core.model import is_push, unpack_pushed

from ..helpers.broker import consumer, published


def test_an_armed_consumer_gets_the_message_from_the_send_itself(broker, channel):
    name, pubsub = channel
    c = consumer(broker, prefetch=10, notify=name, consumer_id="A")
    assert broker.receive_after(c, 0, 10, push=5) == ([], 0)  # nothing yet: armed for 5
    broker.send("orders", [Message(body="m0", properties={"k": 1}), Message(body="m1")])
    payload = published(pubsub)
    assert is_push(payload)
    pushed = unpack_pushed(payload)
    assert (pushed.consumer_id, pushed.after) == ("A", 0)
    deliveries = pushed.deliveries(c)
    assert [d.body for d in deliveries] == ["m0", "m1"]
    assert deliveries[0].properties == {"k": 1} and not deliveries[0].redelivered
    assert pubsub.get_message(timeout=0.2) is None  # no wake-up besides: the outbox stayed empty
    stats = broker.stats("orders")
    assert stats.in_flight == 2 and stats.pending == 0  # in flight, leased: never only in the message
    # the next push chains on the last
    broker.send("orders", Message(body="m2"))
    second = unpack_pushed(published(pubsub))
    assert second.after == pushed.last and [d.body for d in second.deliveries(c)] == ["m2"]
    # nothing is in the outbox: a receive_after from the last one has nothing more
    assert broker.receive_after(c, second.last, 10, push=5) == ([], second.last)


def test_the_push_credit_runs_out_and_the_rest_wait_in_the_outbox_with_a_wake_up(broker, channel):
    name, pubsub = channel
    c = consumer(broker, prefetch=10, notify=name, consumer_id="A")
    broker.receive_after(c, 0, 10, push=2)
    for body in ("m0", "m1", "m2", "m3"):
        broker.send("orders", Message(body=body))
    first, second = unpack_pushed(published(pubsub)), unpack_pushed(published(pubsub))
    assert [d.body for p in (first, second) for d in p.deliveries(c)] == ["m0", "m1"]
    assert published(pubsub) == b"A"  # the credit is spent: the outbox, and the usual wake-up
    assert pubsub.get_message(timeout=0.2) is None
    deliveries, last = broker.receive_after(c, second.last, 10, push=2)
    assert [d.body for d in deliveries] == ["m2", "m3"]
    broker.send("orders", Message(body="m4"))  # armed again: the outbox was left empty
    assert unpack_pushed(published(pubsub)).after == last


def test_a_lost_push_is_handed_over_again_by_receive_after(broker, channel):
    name, pubsub = channel
    c = consumer(broker, prefetch=10, notify=name, consumer_id="A")
    broker.receive_after(c, 0, 10, push=10)
    broker.send("orders", [Message(body="m0"), Message(body="m1")])
    broker.send("orders", Message(body="m2"))
    published(pubsub), published(pubsub)  # the adapter never saw these (its subscription dropped)
    deliveries, last = broker.receive_after(c, 0, 10, push=10)
    assert [d.body for d in deliveries] == ["m0", "m1", "m2"]
    # at most `max` at a time, in order
    broker.send("orders", [Message(body="m3"), Message(body="m4")])
    published(pubsub)
    got, upto = broker.receive_after(c, last, 1)
    assert [d.body for d in got] == ["m3"]
    got, _ = broker.receive_after(c, upto, 1)
    assert [d.body for d in got] == ["m4"]


def test_the_calling_process_gets_its_own_consumers_pushes_in_the_send_reply(broker, channel):
    name, pubsub = channel
    local: list[bytes] = []
    broker.ops.local_channel, broker.ops.local_push = name, local.append
    try:
        c = consumer(broker, prefetch=10, notify=name, consumer_id="A")
        other = consumer(broker, "orders.other", prefetch=10, notify=name + "-elsewhere", consumer_id="B")
        broker.receive_after(c, 0, 10, push=10)
        broker.receive_after(other, 0, 10, push=10)
        broker.send("orders", Message(body="here"))
        assert len(local) == 1 and [d.body for d in unpack_pushed(local[0]).deliveries(c)] == ["here"]
        assert pubsub.get_message(timeout=0.2) is None  # nothing went through pub/sub
        broker.send("orders.other", Message(body="there"))  # another process's consumer: published
        assert len(local) == 1
    finally:
        broker.ops.local_channel = broker.ops.local_push = None


def test_auto_ack_waits_for_the_adapter_and_a_lapsed_lease_returns_a_pushed_message(broker, channel, clock):
    name, pubsub = channel
    c = consumer(broker, prefetch=10, notify=name, consumer_id="A", ack_mode="auto", lease_ms=1000)
    broker.receive_after(c, 0, 10, push=10)
    (sent,) = broker.send("orders", Message(body="m0"))
    pushed = unpack_pushed(published(pubsub))
    assert broker.stats("orders").in_flight == 1  # not acknowledged by the push: the adapter acks it
    # the owning process dies before writing it: the lease lapses and the reaper returns the message
    clock.advance(1500)
    broker.reap_lapsed("orders")
    again = consumer(broker, prefetch=10, consumer_id="B")
    (d,) = broker.receive(again, 10)
    assert (d.message_id, d.body, d.redelivered) == (pushed.entries[0][0], "m0", True)
    assert d.message_id == sent


def test_an_auto_consumer_acknowledges_what_it_wrote(broker, channel):
    name, pubsub = channel
    c = consumer(broker, prefetch=1, notify=name, consumer_id="A", ack_mode="auto")
    broker.receive_after(c, 0, 10, push=10)
    broker.send("orders", [Message(body="m0"), Message(body="m1")])
    pushed = unpack_pushed(published(pubsub))
    assert [d.body for d in pushed.deliveries(c)] == ["m0"]  # the window of 1 holds it until the ack
    broker.ack(c, [pushed.entries[0][0]], mode="individual")
    nxt = unpack_pushed(published(pubsub))  # the ack's dispatch pushes the next
    assert nxt.after == pushed.last and [d.body for d in nxt.deliveries(c)] == ["m1"]


def test_closing_with_what_was_written_returns_the_unwritten_pushes_as_never_received(broker, channel):
    name, pubsub = channel
    c = consumer(broker, prefetch=10, notify=name, consumer_id="A")
    broker.receive_after(c, 0, 10, push=10)
    broker.send("orders", Message(body="written"))
    first = unpack_pushed(published(pubsub))
    broker.send("orders", Message(body="never written"))
    published(pubsub)  # pushed, but the adapter closes before writing it
    broker.close_consumer(c, written=first.last)
    other = consumer(broker, prefetch=10, consumer_id="B")
    got = {d.body: d.redelivered for d in broker.receive(other, 10)}
    assert got == {"written": True, "never written": False}


def test_closing_without_what_was_written_counts_every_push_as_received(broker, channel):
    name, pubsub = channel
    c = consumer(broker, prefetch=10, notify=name, consumer_id="A")
    broker.receive_after(c, 0, 10, push=10)
    broker.send("orders", Message(body="pushed"))
    published(pubsub)
    broker.close_consumer(c)  # (a crash, the reaper: the process may have written it)
    other = consumer(broker, prefetch=10, consumer_id="B")
    assert [(d.body, d.redelivered) for d in broker.receive(other, 10)] == [("pushed", True)]
