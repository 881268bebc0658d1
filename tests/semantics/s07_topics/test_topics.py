"""Topics (spec §7.1-§7.3): fan-out to every matching subscription, messages stored once, dispatch
policies, prefetch defaults, acks, redelivery and dead letters of topic subscriptions."""

from __future__ import annotations

import pytest

from broker_core.broker import Broker
from broker_core.destinations import parse_destination
from broker_core.errors import InvalidConsumer, UnknownConsumer
from broker_core.event_stream import count, expand
from broker_core.keys import Home
from broker_core.messages import Message
from broker_core.model import ConsumerRef, ConsumerSpec

from ...helpers.broker import drain

T = "topic://prices"


def sub(broker: Broker, dest: str = T, consumer_id: str | None = None, **kw):
    kw.setdefault("ack_mode", "client-individual")
    return broker.add_consumer(dest, ConsumerSpec(**kw), consumer_id=consumer_id)


def bodies(deliveries) -> list[str]:
    return [d.body for d in deliveries]


def stored(broker: Broker, dest: str = T) -> int:
    return broker.redis.hlen(f"{broker.namespace}:{{t:{dest.removeprefix('topic://')}}}:msgs")


def events(broker: Broker, dest: str = T) -> list[dict[str, str]]:
    raw = expand(broker.redis.xrange(f"{broker.namespace}:{{t:{dest.removeprefix('topic://')}}}:events"))
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in raw]


def test_every_subscription_gets_each_message_in_order(broker):
    a, b, c = sub(broker), sub(broker), sub(broker)
    broker.send(T, [Message(body=str(i)) for i in range(5)])
    for consumer in (a, b, c):
        assert bodies(drain(broker, consumer)) == ["0", "1", "2", "3", "4"]


def test_a_message_is_stored_once_and_deleted_when_the_last_subscription_acks(broker):
    a, b = sub(broker), sub(broker)
    [mid] = broker.send(T, Message(body="x"))
    assert stored(broker) == 1
    [da] = broker.receive(a)
    [db] = broker.receive(b)
    assert da.message_id == db.message_id == mid
    broker.ack(a, mid)
    assert stored(broker) == 1  # b still holds it
    broker.ack(b, mid)
    assert stored(broker) == 0
    assert broker.redis.hlen(f"{broker.namespace}:{{t:prices}}:refs") == 0


def test_a_message_no_subscription_matches_is_dropped_and_counted(broker):
    sub(broker, selector="sym = 'A'")
    ids = broker.send(T, [Message(body="b", properties={"sym": "B"}), Message(body="none")])
    assert [i.status for i in ids] == ["ok", "ok"]
    st = broker.stats(T)
    assert st.no_subscription == 2
    assert st.enqueued == 2
    assert stored(broker) == 0
    assert [e["type"] for e in events(broker)].count("no_subscription") == 2


def test_a_topic_without_subscriptions_drops_what_is_sent(broker):
    broker.send(T, Message(body="lost"))
    st = broker.stats(T)
    assert st.no_subscription == 1 and st.queue_size == 0 and st.subscriptions == []


def test_selectors_choose_per_subscription(broker):
    a = sub(broker, selector="sym = 'A'")
    b = sub(broker, selector="sym IN ('A', 'B')")
    everyone = sub(broker)
    broker.send(T, [Message(body=s, properties={"sym": s}) for s in "ABC"])
    assert bodies(drain(broker, a)) == ["A"]
    assert bodies(drain(broker, b)) == ["A", "B"]
    assert bodies(drain(broker, everyone)) == ["A", "B", "C"]


def test_no_local_subscription_skips_its_own_connections_messages(broker):
    mine = sub(broker, no_local=True, connection_id="conn-1")
    other = sub(broker, connection_id="conn-2")
    broker.send(T, [Message(body="own", connection_id="conn-1"),
                    Message(body="theirs", connection_id="conn-9")])
    assert bodies(drain(broker, mine)) == ["theirs"]
    assert bodies(drain(broker, other)) == ["own", "theirs"]


def test_non_durable_prefetch_defaults_to_32767_and_the_policy_replaces_the_default(broker):
    assert sub(broker).prefetch == 32767
    assert sub(broker, prefetch=5).prefetch == 5
    broker.policies.set_entry("topic", "limited.>", {"topicPrefetch": 7})
    assert sub(broker, "topic://limited.x").prefetch == 7
    assert sub(broker, "topic://limited.x", prefetch=3).prefetch == 3


def test_durable_prefetch_defaults_to_100(broker):
    d = sub(broker, client_id="app", subscription_name="s1")
    assert d.prefetch == 100
    broker.policies.set_entry("topic", "limited.>", {"durableTopicPrefetch": 9})
    assert sub(broker, "topic://limited.y", client_id="app", subscription_name="s2").prefetch == 9
    optimized = sub(broker, "topic://limited.y", client_id="app", subscription_name="s3", prefetch=1000)
    assert optimized.prefetch == 9


def test_prefetch_window_holds_the_rest_pending_for_that_subscription_only(broker):
    slow = sub(broker, prefetch=2)
    fast = sub(broker)
    broker.send(T, [Message(body=str(i)) for i in range(5)])
    assert bodies(drain(broker, fast)) == ["0", "1", "2", "3", "4"]
    assert bodies(drain(broker, slow)) == ["0", "1"]
    subs = {s.consumer_id: s for s in broker.subscriptions(T)}
    assert subs[slow.consumer_id].pending == 3 and subs[slow.consumer_id].in_flight == 2
    first = broker.stats(T).consumers
    assert {c.consumer_id for c in first} == {slow.consumer_id, fast.consumer_id}


def test_acking_frees_the_window_and_the_next_messages_follow(broker):
    c = sub(broker, prefetch=1)
    ids = broker.send(T, [Message(body=str(i)) for i in range(3)])
    got = []
    for mid in ids:
        [d] = broker.receive(c)
        got.append(d.body)
        broker.ack(c, mid)
    assert got == ["0", "1", "2"]
    assert stored(broker) == 0


def test_closing_a_non_durable_subscription_drops_its_messages_and_counts_them(broker):
    keep = sub(broker)
    gone = sub(broker, prefetch=1)
    broker.send(T, [Message(body=str(i)) for i in range(3)])
    broker.receive(gone)
    broker.close_consumer(gone)
    st = broker.stats(T)
    assert st.removed_with_subscription == 3
    assert len(st.subscriptions) == 1
    assert stored(broker) == 3  # still held by `keep`
    for d in drain(broker, keep):
        broker.ack(keep, d.message_id)
    assert stored(broker) == 0
    with pytest.raises(UnknownConsumer):
        broker.receive(gone)


def test_a_consumer_ref_built_from_the_ids_finds_its_subscription(broker):
    c = sub(broker, consumer_id="web-1")
    broker.send(T, Message(body="hi"))
    ref = ConsumerRef(c.destination, "web-1", "client-individual")
    [d] = broker.receive(ref)
    broker.ack(ref, d.message_id)
    assert stored(broker) == 0


def test_the_same_consumer_id_twice_on_a_topic_is_refused(broker):
    sub(broker, consumer_id="dup")
    with pytest.raises(InvalidConsumer):
        sub(broker, consumer_id="dup")


def test_nack_redelivers_to_the_same_subscription_with_the_counter_raised(broker, clock):
    c = sub(broker)
    other = sub(broker)
    [mid] = broker.send(T, Message(body="x"))
    broker.receive(c)
    broker.nack(c, mid)
    clock.advance(1_000)
    broker.dispatch(T)
    [again] = broker.receive(c)
    assert again.redelivered and again.delivery_count == 2
    [first] = broker.receive(other)
    assert not first.redelivered


def test_poison_nack_drops_the_topic_message_for_that_subscription_only(broker):
    """A non-durable subscription's POISON ack only counts the message (TopicSubscription.acknowledge,
    spec Appendix A): nothing is dead-lettered, and the other subscriptions keep their copies."""
    c = sub(broker)
    other = sub(broker)
    [mid] = broker.send(T, Message(body="x"))
    broker.receive(c)
    assert broker.nack(c, mid, poison=True) == (1, 0)
    dlq = broker.add_consumer("queue://ActiveMQ.DLQ", ConsumerSpec())
    assert broker.receive(dlq) == []
    assert broker.stats(T).deadlettered == 0
    assert [s.dropped for s in broker.subscriptions(T)] in ([1, 0], [0, 1])  # counted where it ended
    [still] = broker.receive(other)
    assert still.message_id == mid
    broker.ack(other, mid)
    assert stored(broker) == 0


def test_past_maximum_redeliveries_a_topic_message_is_dropped(broker, clock):
    """What a JMS client sends past its redelivery limit is a POISON ack, which a non-durable
    subscription does not dead-letter (as the STOMP NACK above)."""
    broker.policies.set_entry("topic", ">", {"maximumRedeliveries": 1, "initialRedeliveryDelay": 0,
                                             "redeliveryDelay": 0})
    c = sub(broker)
    [mid] = broker.send(T, Message(body="x"))
    for _ in range(2):
        broker.receive(c)
        broker.nack(c, mid)
        broker.dispatch(T)
    assert broker.stats(T).deadlettered == 0
    assert "queue://ActiveMQ.DLQ" not in broker.destinations()
    assert stored(broker) == 0


def test_release_on_a_topic_subscription_returns_the_messages_ahead_in_order(broker):
    c = sub(broker)
    ids = broker.send(T, [Message(body=str(i)) for i in range(3)])
    drain(broker, c)
    broker.release(c, ids[:2])
    assert bodies(drain(broker, c)) == ["0", "1"]


@pytest.mark.parametrize("policy", ["simple", "roundRobin", "strictOrder", "priority"])
def test_every_dispatch_policy_delivers_every_message_to_every_matching_subscription(broker, policy):
    broker.policies.set_entry("topic", ">", {"dispatchPolicy": policy})
    subs = [sub(broker, priority=p) for p in (0, 5, 9)]
    broker.send(T, [Message(body=str(i)) for i in range(4)])
    for c in subs:
        assert bodies(drain(broker, c)) == ["0", "1", "2", "3"]


def test_priority_dispatch_policy_visits_higher_priority_subscriptions_first(broker):
    broker.policies.set_entry("topic", ">", {"dispatchPolicy": "priority"})
    low = sub(broker, consumer_id="low", priority=0)
    high = sub(broker, consumer_id="high", priority=9)
    [mid] = broker.send(T, Message(body="x"))
    order = [e["consumer"] for e in events(broker) if e["type"] == "dispatch" and e["msg"] == mid]
    assert order == [high.consumer_id, low.consumer_id]


def test_round_robin_dispatch_policy_rotates_which_subscription_is_served_first(broker):
    broker.policies.set_entry("topic", ">", {"dispatchPolicy": "roundRobin"})
    sub(broker, consumer_id="a")
    sub(broker, consumer_id="b")
    ids = broker.send(T, [Message(body="1")]) + broker.send(T, [Message(body="2")])
    firsts = []
    for mid in ids:
        order = [e["consumer"] for e in events(broker) if e["type"] == "dispatch" and e["msg"] == mid]
        firsts.append(order[0])
    assert firsts[0] != firsts[1]


def test_events_of_a_subscription_carry_its_key(broker):
    c = sub(broker, consumer_id="k1")
    [mid] = broker.send(T, Message(body="x"))
    dispatched = [e for e in events(broker) if e["type"] == "dispatch"]
    assert dispatched[0]["sub"] == c.subscription == "c.k1"
    assert dispatched[0]["msg"] == mid
    assert any(e["type"] == "subscription_add" for e in events(broker))


def test_events_gathered_into_one_entry_keep_each_subscription_key(broker):
    # a send of four messages to two subscriptions: four enqueues and eight dispatches in one call, all
    # but the first two written as one packed entry (broker_core/event_stream.py)
    a, b = sub(broker, consumer_id="k1"), sub(broker, consumer_id="k2")
    ids = broker.send(T, [Message(body=str(i)) for i in range(4)])
    dispatched = {(e["sub"], e["msg"]) for e in events(broker) if e["type"] == "dispatch"}
    assert dispatched == {(s.subscription, mid) for s in (a, b) for mid in ids}
    assert [e["msg"] for e in events(broker) if e["type"] == "enqueue"] == ids
    raw = broker.redis.xrange(f"{broker.namespace}:{{t:prices}}:events")
    assert max(count(fields) for _, fields in raw) > 2  # (the premise: some entry holds several)


def test_a_duplicate_message_id_on_a_topic_is_accepted_once(broker):
    c = sub(broker)
    first = broker.send(T, Message(body="x", message_id="ID:same"))
    again = broker.send(T, Message(body="x", message_id="ID:same"))
    assert [first[0].status, again[0].status] == ["ok", "duplicate"]
    assert len(drain(broker, c)) == 1


def test_an_expired_message_is_not_delivered_to_topic_subscribers(broker, clock):
    c = sub(broker, prefetch=1)
    broker.send(T, [Message(body="a"), Message(body="b", expiration=clock.now_ms() + 10)])
    clock.advance(100)
    [a] = broker.receive(c)
    broker.ack(c, a.message_id)
    assert broker.receive(c) == []
    # discarded as ActiveMQ 5.17.2's dispatchMatched does, not counted expired (s06_expiry/test_expiry.py)
    assert (broker.stats(T).expired, broker.stats(T).evicted) == (0, 1)
    assert stored(broker) == 0


def test_durable_subscription_and_retroactive_flags_are_refused_on_queues(broker):
    with pytest.raises(InvalidConsumer):
        broker.add_consumer("queue://q", ConsumerSpec(client_id="a", subscription_name="s"))
    with pytest.raises(InvalidConsumer):
        broker.add_consumer("queue://q", ConsumerSpec(retroactive=True))


def test_a_subscription_addresses_like_its_topic(broker):
    c = sub(broker, consumer_id="z")
    s = Home(parse_destination(T), c.subscription)
    assert s.uri == T and s.destination.uri == T
    assert broker.ops.home_prefix(s).endswith(":s:c.z")


def test_transactions_send_to_topics_on_commit_and_ack_topic_messages(broker):
    c = sub(broker)
    tx = broker.begin()
    broker.send(T, Message(body="in tx"), tx=tx)
    assert broker.receive(c) == []
    broker.commit(tx)
    [d] = broker.receive(c)
    tx2 = broker.begin()
    broker.ack(c, d.message_id, tx=tx2)
    broker.commit(tx2)
    assert stored(broker) == 0


def test_a_delayed_message_reaches_each_subscription_after_its_delay(broker, clock):
    c = sub(broker)
    broker.send(T, Message(body="later", delay_ms=5_000))
    assert broker.receive(c) == []
    clock.advance(5_000)
    broker.dispatch(T)
    assert bodies(broker.receive(c)) == ["later"]


async def test_the_async_broker_runs_topics_like_the_blocking_one(broker, redis_url, namespace, clock):
    import redis.asyncio

    from broker_core.broker import AsyncBroker

    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        aio = AsyncBroker(client, namespace, clock, policies=broker.policies)
        d = await aio.add_consumer(T, ConsumerSpec(client_id="app", subscription_name="s",
                                                   ack_mode="client-individual"))
        n = await aio.add_consumer(T, ConsumerSpec(ack_mode="client-individual"))
        [mid] = await aio.send(T, Message(body="hi"))
        for c in (d, n):
            [got] = await aio.receive(c, 10)
            assert got.message_id == mid
            assert await aio.ack(c, mid) == 1
        await aio.close_consumer(d)
        assert [s.active for s in await aio.subscriptions(T)] == [False, True]
        assert await aio.unsubscribe(T, client_id="app", subscription_name="s") == 0
        [st] = await aio.stats_many([T])
        assert st.enqueued == 1 and len(st.subscriptions) == 1
        assert await aio.expire_offline_durables(T) == []
    finally:
        await client.aclose()


def test_deleting_a_topic_removes_every_subscription_and_message(broker):
    sub(broker)
    sub(broker, client_id="app", subscription_name="d")
    broker.send(T, [Message(body="a"), Message(body="b")])
    # what each subscription held is counted (the topic's Pending: 2 subscriptions x 2 messages)
    assert broker.delete_destination(T) == 4
    assert T not in broker.destinations()
    leftovers = list(broker.redis.scan_iter(match=f"{broker.namespace}:{{t:prices}}*"))
    assert leftovers == []


def test_the_maintenance_tick_reaps_a_lapsed_non_durable_subscriber_and_drops_its_subscription(broker, clock):
    from broker_core import maintenance

    gone = sub(broker, lease_ms=1_000)
    broker.send(T, Message(body="a"))
    clock.advance(5_000)
    report = maintenance.run_due(broker)
    assert report.reaped == [f"{T}#{gone.consumer_id}"]
    assert broker.subscriptions(T) == []
    assert stored(broker) == 0


def test_a_large_batch_reaches_every_subscription_in_order(broker):
    a, b = sub(broker, prefetch=5_000), sub(broker, prefetch=5_000, selector="n >= 2500")
    broker.send(T, [Message(body=str(n), properties={"n": n}) for n in range(3_000)])
    assert bodies(drain(broker, a, 3_000)) == [str(n) for n in range(3_000)]
    assert bodies(drain(broker, b, 3_000)) == [str(n) for n in range(2_500, 3_000)]
