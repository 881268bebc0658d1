"""Exclusive consumers, spec §2 (checked against ActiveMQ 5.17.2 by the spec's author)."""

from __future__ import annotations

from broker_core.messages import Message

from ...helpers.broker import consumer, drain


def owner(broker):
    return broker.stats("orders").exclusive_owner


def test_the_first_registered_exclusive_consumer_wins(broker):
    consumer(broker, exclusive=True, consumer_id="E1")
    consumer(broker, exclusive=True, consumer_id="E2")
    assert owner(broker) == "E1"


def test_a_strictly_higher_priority_exclusive_consumer_takes_over_and_hands_back_on_close(broker):
    e1 = consumer(broker, exclusive=True, consumer_id="E1")
    e2 = consumer(broker, exclusive=True, consumer_id="E2")
    e3 = consumer(broker, exclusive=True, priority=5, consumer_id="E3")
    assert owner(broker) == "E3"
    broker.close_consumer(e3)
    assert owner(broker) == "E1"
    broker.close_consumer(e1)
    assert owner(broker) == "E2"
    broker.close_consumer(e2)
    assert owner(broker) is None


def test_equal_priority_does_not_take_over_but_priority_127_always_does(broker):
    consumer(broker, exclusive=True, priority=127, consumer_id="E1")
    consumer(broker, exclusive=True, priority=127, consumer_id="E2")
    assert owner(broker) == "E2"


def test_on_close_the_earliest_exclusive_with_the_highest_priority_takes_over(broker):
    top = consumer(broker, exclusive=True, priority=9, consumer_id="top")
    consumer(broker, exclusive=True, priority=3, consumer_id="early3")
    consumer(broker, exclusive=True, priority=4, consumer_id="late4")
    consumer(broker, exclusive=True, priority=4, consumer_id="later4")
    consumer(broker, priority=8, consumer_id="plain8")  # non-exclusive consumers are never promoted
    broker.close_consumer(top)
    assert owner(broker) == "late4"


def test_non_owners_get_nothing_while_an_owner_exists(broker):
    ex = consumer(broker, exclusive=True, prefetch=1, consumer_id="X")
    plain = consumer(broker, prefetch=10, consumer_id="N")
    broker.send("orders", [Message(body=f"m{i}") for i in range(3)])
    assert [d.body for d in drain(broker, ex)] == ["m0"]
    assert drain(broker, plain) == []  # even though the owner is full


def test_a_message_the_owners_selector_refuses_waits_until_the_owner_closes(broker):
    x1 = consumer(broker, exclusive=True, selector="color = 'red'", consumer_id="X1")
    n1 = consumer(broker, consumer_id="N1")
    broker.send("orders", Message(body="blue", properties={"color": "blue"}))
    assert drain(broker, n1) == [] and drain(broker, x1) == []
    broker.close_consumer(x1)
    assert [d.body for d in drain(broker, n1)] == ["blue"]


def test_all_consumers_exclusive_by_default_makes_the_first_the_owner_and_recomputes_on_any_close(
        broker, policy):
    policy("orders", allConsumersExclusiveByDefault=True)
    a = consumer(broker, consumer_id="A")
    b = consumer(broker, consumer_id="B")
    c = consumer(broker, priority=2, consumer_id="C")
    assert owner(broker) == "C"
    broker.close_consumer(c)
    assert owner(broker) == "A"
    broker.close_consumer(b)  # removing any consumer recomputes
    assert owner(broker) == "A"
    assert broker.stats("orders").consumers[0].exclusive is False  # flag-made exclusivity is not reported
    broker.close_consumer(a)
    assert owner(broker) is None


def test_the_owner_is_not_rotated(broker):
    ex = consumer(broker, exclusive=True, prefetch=10, consumer_id="X")
    broker.send("orders", [Message(body=f"m{i}") for i in range(4)])
    assert [d.body for d in drain(broker, ex)] == ["m0", "m1", "m2", "m3"]


def test_a_takeover_leaves_what_the_old_owner_already_holds_with_it(broker):
    # §2: the owner changes for later dispatches only; messages dispatched to the old owner stay with it
    e1 = consumer(broker, exclusive=True, prefetch=10, consumer_id="E1")
    broker.send("orders", [Message(body=f"m{i}") for i in range(3)])
    e2 = consumer(broker, exclusive=True, prefetch=10, priority=5, consumer_id="E2")
    broker.send("orders", [Message(body=f"n{i}") for i in range(2)])
    assert [d.body for d in drain(broker, e1)] == ["m0", "m1", "m2"]
    assert [d.body for d in drain(broker, e2)] == ["n0", "n1"]


def test_with_all_consumers_exclusive_an_explicit_owner_leaving_promotes_no_plain_consumer(broker, policy):
    # §2 Queue.removeSubscription: a removed consumer whose own ConsumerInfo is exclusive takes the first
    # branch, which looks for exclusive consumers only; allConsumersExclusiveByDefault's recomputation is
    # the else branch and does not run. With no owner the others share in turn, and the next consumer added
    # becomes the owner (addSubscription: no owner yet).
    policy("orders", allConsumersExclusiveByDefault=True)
    a = consumer(broker, prefetch=10, exclusive=True, consumer_id="A")
    b = consumer(broker, prefetch=10, consumer_id="B")
    c = consumer(broker, prefetch=10, consumer_id="C")
    assert owner(broker) == "A"
    broker.close_consumer(a)
    assert owner(broker) is None
    broker.send("orders", [Message(body=f"m{i}") for i in range(4)])
    assert ([d.body for d in drain(broker, b)], [d.body for d in drain(broker, c)]) == (
        ["m0", "m2"], ["m1", "m3"])
    d = consumer(broker, prefetch=10, consumer_id="D")
    assert owner(broker) == "D"
    broker.send("orders", [Message(body=f"n{i}") for i in range(2)])
    assert [x.body for x in drain(broker, d)] == ["n0", "n1"]
    assert drain(broker, b) == drain(broker, c) == []


def test_with_all_consumers_exclusive_a_close_hands_over_by_the_group_sorted_order(broker, policy):
    # §2 + §1.3: the recomputation on a close takes the first consumer of the highest priority in the
    # consumer list, which (with a group map) is sorted by group count at each add: D, added after A
    # took a group, sorts ahead of A, and closing B makes D the owner though A, the owner, is still there.
    policy("orders", allConsumersExclusiveByDefault=True)
    a = consumer(broker, prefetch=10, consumer_id="A")
    b = consumer(broker, prefetch=10, consumer_id="B")
    broker.send("orders", Message(body="g", group_id="G"))
    d = consumer(broker, prefetch=10, consumer_id="D")
    assert owner(broker) == "A"
    broker.close_consumer(b)
    assert owner(broker) == "D"
    broker.send("orders", Message(body="m"))
    assert ([x.body for x in drain(broker, a)], [x.body for x in drain(broker, d)]) == (["g"], ["m"])
