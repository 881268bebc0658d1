"""Message groups, spec §3: ownership, JMSXGroupSeq, JMSXGroupFirstForConsumer, the three maps."""

from __future__ import annotations

from broker_core.messages import Message

from ...helpers.broker import consumer, drain


def grouped(broker, body, group, seq=0, **kw):
    broker.send("orders", Message(body=body, group_id=group, group_seq=seq, **kw))


def take(broker, c):
    return [(d.body, d.group_first_for_consumer) for d in drain(broker, c)]


def ack_all(broker, c, deliveries):
    for d in deliveries:
        broker.ack(c, d.message_id, mode="individual")


def test_a_group_sticks_to_its_first_owner_and_only_the_first_message_is_flagged(broker):
    a = consumer(broker, prefetch=10, consumer_id="A")
    b = consumer(broker, prefetch=10, consumer_id="B")
    for i in range(3):
        grouped(broker, f"x{i}", "X")
    grouped(broker, "y0", "Y")
    assert take(broker, a) == [("x0", True), ("x1", False), ("x2", False)]
    assert take(broker, b) == [("y0", True)]
    assert {(g.group_id, g.owner) for g in broker.message_groups("orders")} == {("X", "A"), ("Y", "B")}


def test_the_spec_checked_sequence_with_prefetch_one(broker):
    # spec §3.2 "Checked (prefetch 1, consumers A and B)"
    a = consumer(broker, prefetch=1, consumer_id="A")
    b = consumer(broker, prefetch=1, consumer_id="B")
    log = []

    def step(body, group, seq):
        grouped(broker, body, group, seq)
        for c in (a, b):
            for d in broker.receive(c, 1):
                log.append((d.body, c.consumer_id, d.group_first_for_consumer))
                broker.ack(c, d.message_id)

    step("x1", "X", 1)
    step("x2", "X", 2)
    step("x3", "X", 3)
    step("y", "Y", 0)
    # the next X message is dispatched while B is next in rotation; the group is owned by A
    step("x-close", "X", -1)
    step("x7", "X", 7)
    assert log[:4] == [("x1", "A", True), ("x2", "A", False), ("x3", "A", False), ("y", "B", True)]
    assert log[4] == ("x-close", "A", False)  # the owner receives the closing message
    assert log[5][2] is True  # after the close the group is bound anew, flagged first


def test_sequence_one_rebinds_the_group_to_the_consumer_being_tried(broker):
    a = consumer(broker, prefetch=10, consumer_id="A")
    b = consumer(broker, prefetch=10, consumer_id="B")
    grouped(broker, "x1", "X", 1)  # -> A, rotation puts B next
    grouped(broker, "x1-again", "X", 1)  # seq 1 re-binds to B
    grouped(broker, "x2", "X", 2)
    assert take(broker, a) == [("x1", True)]
    assert take(broker, b) == [("x1-again", True), ("x2", False)]


def test_a_negative_sequence_closes_the_group_on_its_owner(broker):
    a = consumer(broker, prefetch=10, consumer_id="A")
    grouped(broker, "x1", "X", 1)
    grouped(broker, "x-end", "X", -5)  # any negative value closes
    assert take(broker, a) == [("x1", True), ("x-end", False)]
    assert broker.message_groups("orders") == []
    grouped(broker, "x-new", "X", 2)
    assert take(broker, a) == [("x-new", True)]


def test_a_negative_sequence_for_an_unowned_group_opens_it(broker):
    a = consumer(broker, prefetch=10, consumer_id="A")
    grouped(broker, "x-end", "X", -1)
    assert take(broker, a) == [("x-end", True)]
    assert [g.group_id for g in broker.message_groups("orders")] == ["X"]


def test_sequence_zero_is_no_sequence_and_does_not_close(broker):
    a = consumer(broker, prefetch=10, consumer_id="A")
    grouped(broker, "x", "X", 0)
    grouped(broker, "x", "X", 0)
    take(broker, a)
    assert [g.group_id for g in broker.message_groups("orders")] == ["X"]


def test_group_messages_wait_for_a_busy_owner_even_when_others_have_room(broker):
    a = consumer(broker, prefetch=1, consumer_id="A")
    b = consumer(broker, prefetch=10, consumer_id="B")
    grouped(broker, "x1", "X")
    grouped(broker, "x2", "X")
    grouped(broker, "x3", "X")
    got = drain(broker, a)
    assert [d.body for d in got] == ["x1"]
    assert drain(broker, b) == []
    ack_all(broker, a, got)
    assert [d.body for d in drain(broker, a)] == ["x2"]


def test_closing_the_owner_frees_its_groups_and_the_next_owner_is_flagged_first(broker):
    a = consumer(broker, prefetch=10, consumer_id="A")
    grouped(broker, "x1", "X")
    take(broker, a)
    b = consumer(broker, prefetch=10, consumer_id="B")
    grouped(broker, "x2", "X")
    assert take(broker, a) == [("x2", False)]  # a newcomer takes no existing group
    broker.close_consumer(a)
    got = drain(broker, b)
    assert [(d.body, d.group_first_for_consumer, d.redelivered) for d in got] == [
        ("x1", True, True), ("x2", False, True)]
    assert {g.owner for g in broker.message_groups("orders")} == {"B"}


def test_remove_all_message_groups_rebalances_later_messages_only(broker):
    a = consumer(broker, prefetch=100, consumer_id="A")
    for g in "PQRS":
        grouped(broker, f"{g}1", g)
    take(broker, a)
    consumer(broker, prefetch=100, consumer_id="B")
    assert broker.remove_all_message_groups("orders") == 4
    assert broker.stats("orders").in_flight == 4  # in-flight messages stay where they are
    for g in "PQRS":
        grouped(broker, f"{g}2", g)
    owners = {g.group_id: g.owner for g in broker.message_groups("orders")}
    assert sorted(owners.values()) == ["A", "A", "B", "B"]


def test_remove_message_group_frees_one_group(broker):
    a = consumer(broker, prefetch=100, consumer_id="A")
    grouped(broker, "x", "X")
    grouped(broker, "y", "Y")
    take(broker, a)
    assert broker.remove_message_group("orders", "X") == 1
    assert [g.group_id for g in broker.message_groups("orders")] == ["Y"]
    assert broker.remove_message_group("orders", "nope") == 0


def test_the_cached_map_evicts_the_least_recently_used_group_beyond_its_size(broker, policy):
    policy("orders", messageGroupMapFactoryType="cached?cacheSize=2")
    a = consumer(broker, prefetch=100, consumer_id="A")
    for g in "XYZ":
        grouped(broker, g, g)
    take(broker, a)
    assert sorted(g.group_id for g in broker.message_groups("orders")) == ["Y", "Z"]
    assert broker.stats("orders").consumers[0].groups == 2


def test_a_group_used_again_outlives_one_used_earlier_within_one_send_and_across_sends(broker, policy):
    # LinkedHashMap in access order: the eldest is the group least recently used, whichever call used it.
    policy("orders", messageGroupMapFactoryType="cached?cacheSize=2")
    a = consumer(broker, prefetch=100, consumer_id="A")
    grouped(broker, "x0", "X")
    grouped(broker, "y0", "Y")
    broker.send("orders", [Message(body="x1", group_id="X"), Message(body="z0", group_id="Z")])
    assert sorted(g.group_id for g in broker.message_groups("orders")) == ["X", "Z"]
    broker.send("orders", [Message(body="x2", group_id="X"), Message(body="w0", group_id="W"),
                           Message(body="v0", group_id="V")])
    assert sorted(g.group_id for g in broker.message_groups("orders")) == ["V", "W"]
    assert [body for body, _ in take(broker, a)] == ["x0", "y0", "x1", "z0", "x2", "w0", "v0"]


def test_group_counts_follow_evictions_made_within_one_send(broker, policy):
    # Sends of several messages open and evict groups in one dispatch pass; each consumer's count is the
    # number of groups it owns when the send returns.
    policy("orders", messageGroupMapFactoryType="cached?cacheSize=3")
    a = consumer(broker, prefetch=100, consumer_id="A")
    b = consumer(broker, prefetch=100, consumer_id="B")
    for first in range(0, 40, 8):
        broker.send("orders", [Message(body=str(i), group_id=f"g{i % 7}") for i in range(first, first + 8)])
        owned = {"A": 0, "B": 0}
        for g in broker.message_groups("orders"):
            owned[g.owner] += 1
        assert sum(owned.values()) == 3
        assert {c.consumer_id: c.groups for c in broker.stats("orders").consumers} == owned
    assert len(take(broker, a)) + len(take(broker, b)) == 40


def test_a_group_closed_within_one_send_leaves_room_in_the_cached_map(broker, policy):
    policy("orders", messageGroupMapFactoryType="cached?cacheSize=2")
    a = consumer(broker, prefetch=100, consumer_id="A")
    broker.send("orders", [Message(body="x0", group_id="X"), Message(body="y0", group_id="Y"),
                           Message(body="x1", group_id="X", group_seq=-1), Message(body="z0", group_id="Z")])
    assert sorted(g.group_id for g in broker.message_groups("orders")) == ["Y", "Z"]
    assert broker.stats("orders").consumers[0].groups == 2
    assert len(take(broker, a)) == 4


def test_the_bucket_map_makes_colliding_groups_share_an_owner(broker, policy):
    policy("orders", messageGroupMapFactoryType="bucket?bucketCount=1")
    a = consumer(broker, prefetch=100, consumer_id="A")
    b = consumer(broker, prefetch=100, consumer_id="B")
    grouped(broker, "x", "X")
    grouped(broker, "y", "Y")  # same (only) bucket: owned by A although B is next in rotation
    assert [d.body for d in drain(broker, a)] == ["x", "y"]
    assert drain(broker, b) == []
    assert broker.remove_message_group("orders", "Y") == 1  # frees the whole bucket, so X too
    grouped(broker, "x2", "X")
    assert [d.body for d in drain(broker, b)] == ["x2"] or [d.body for d in drain(broker, a)] == ["x2"]


def test_bucket_index_follows_java_string_hash(broker, policy):
    # "Aa" and "BB" have the same Java hashCode (2112): they always share a bucket.
    policy("orders", messageGroupMapFactoryType="bucket?bucketCount=1024")
    a = consumer(broker, prefetch=100, consumer_id="A")
    b = consumer(broker, prefetch=100, consumer_id="B")
    grouped(broker, "1", "Aa")
    grouped(broker, "2", "BB")
    assert [d.body for d in drain(broker, a)] == ["1", "2"]
    assert drain(broker, b) == []


def test_the_simple_map_keeps_every_group(broker, policy):
    policy("orders", messageGroupMapFactoryType="simple")
    a = consumer(broker, prefetch=5000, consumer_id="A")
    for i in range(1100):
        grouped(broker, str(i), f"g{i}")
    assert len(drain(broker, a, 5000)) == 1100
    assert len(broker.message_groups("orders")) == 1100


def test_consumers_before_dispatch_starts_holds_until_enough_consumers(broker, policy, clock):
    policy("orders", consumersBeforeDispatchStarts=2, timeBeforeDispatchStarts=5000)
    for i in range(4):
        grouped(broker, f"m{i}", f"g{i}")
    a = consumer(broker, prefetch=100, consumer_id="A")
    assert a.hold_until == clock.now_ms() + 5000
    assert drain(broker, a) == []
    b = consumer(broker, prefetch=100, consumer_id="B")
    assert len(drain(broker, a)) == 2 and len(drain(broker, b)) == 2  # groups spread over both


def test_consumers_before_dispatch_starts_gives_up_waiting_after_one_second_by_default(
        broker, policy, clock):
    policy("orders", consumersBeforeDispatchStarts=3)
    grouped(broker, "m", "g")
    a = consumer(broker, consumer_id="A")
    assert drain(broker, a) == []
    clock.advance(1001)
    assert broker.dispatch("orders").dispatched == 1
    assert [d.body for d in drain(broker, a)] == ["m"]


def test_time_before_dispatch_starts_delays_the_first_consumer(broker, policy, clock):
    policy("orders", timeBeforeDispatchStarts=300)
    grouped(broker, "m", "g")
    a = consumer(broker, consumer_id="A")
    assert drain(broker, a) == []
    clock.advance(301)
    assert [d.body for d in drain(broker, a)] == ["m"]  # receive runs a dispatch chunk


def test_a_group_owner_sorts_behind_consumers_owning_fewer_groups(broker):
    # §1.3: once the queue has a group map, consumers of one priority are ordered by the groups they own,
    # fewest first (Queue.orderedCompare), so the owner of G is passed over for ungrouped messages while
    # the others own none; ActiveMQ 5.17.2 gave u1..u4 to B, C, B, C (23_groups_priority.json)
    cs = [consumer(broker, prefetch=10, consumer_id=x) for x in "ABC"]
    grouped(broker, "g1", "G")
    for i in range(1, 5):
        broker.send("orders", Message(body=f"u{i}"))
    assert {c.consumer_id: [d.body for d in drain(broker, c)] for c in cs} == {
        "A": ["g1"], "B": ["u1", "u3"], "C": ["u2", "u4"]}


def test_a_group_rebound_by_sequence_one_stays_counted_on_its_old_owner(broker):
    # §3.2: assignGroup for JMSXGroupSeq=1 counts the group on its new owner and does not count it down on
    # the old one, which keeps sorting behind consumers owning none; ActiveMQ 5.17.2 gave C all of u1..u4
    cs = [consumer(broker, prefetch=10, consumer_id=x) for x in "ABC"]
    grouped(broker, "x1", "X", 1)
    grouped(broker, "x1b", "X", 1)
    for i in range(1, 5):
        broker.send("orders", Message(body=f"u{i}"))
    assert {c.consumer_id: [d.body for d in drain(broker, c)] for c in cs} == {
        "A": ["x1"], "B": ["x1b"], "C": ["u1", "u2", "u3", "u4"]}
    assert {c.consumer_id: c.groups for c in broker.stats("orders").consumers} == {"A": 1, "B": 1, "C": 0}


def test_removing_a_group_leaves_its_owners_count(broker):
    # §3.5: QueueView.removeMessageGroup calls the map's removeGroup, which adjusts no consumer's count
    consumer(broker, prefetch=10, consumer_id="A")
    consumer(broker, prefetch=10, consumer_id="B")
    grouped(broker, "x", "X")
    grouped(broker, "y", "Y")
    assert broker.remove_message_group("orders", "X") == 1
    assert {c.consumer_id: c.groups for c in broker.stats("orders").consumers} == {"A": 1, "B": 1}


def test_remove_all_message_groups_resets_the_counts_only_under_the_cached_map(broker, policy):
    # §3.1: CachedMessageGroupMap.removeAll clears every consumer's count; SimpleMessageGroupMap's and
    # MessageGroupHashBucket's do not
    for kind, after in (("cached", 0), ("simple", 1), ("bucket", 1)):
        queue = f"orders-{kind}"
        broker.policies.set_entry("queue", queue, {"messageGroupMapFactoryType": kind})
        broker.refresh_policies()
        for x in "AB":
            consumer(broker, queue, prefetch=10, consumer_id=f"{kind}-{x}")
        broker.send(queue, [Message(body="x", group_id="X"), Message(body="y", group_id="Y")])
        assert broker.remove_all_message_groups(queue) == 2
        assert [c.groups for c in broker.stats(queue).consumers] == [after, after], kind


def test_a_redelivered_message_keeps_its_first_for_consumer_flag(broker):
    # §3.3: assignGroup sets JMSXGroupFirstForConsumer on the broker's message and nothing clears it, so x1,
    # first for A, is still flagged when it comes back to B, which owns X since x1b re-bound it
    a = consumer(broker, prefetch=10, consumer_id="A")
    b = consumer(broker, prefetch=10, consumer_id="B")
    grouped(broker, "x1", "X", 1)
    grouped(broker, "x1b", "X", 1)
    assert (take(broker, a), take(broker, b)) == ([("x1", True)], [("x1b", True)])
    broker.close_consumer(a)
    assert [(d.body, d.group_first_for_consumer, d.redelivered) for d in drain(broker, b)] == [
        ("x1", True, True)]
    grouped(broker, "x2", "X", 2)
    assert take(broker, b) == [("x2", False)]
