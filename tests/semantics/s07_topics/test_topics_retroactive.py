"""Retroactive subscribers and the subscription recovery policies (spec §7.5)."""

from __future__ import annotations

import pytest

from broker_core.messages import Message

from ...helpers.broker import drain
from .test_topics import bodies, stored, sub

T = "topic://feed"


def set_topic_policy(broker, **attributes):
    broker.policies.set_entry("topic", ">", attributes)
    broker.refresh_policies()


def retro(broker, **kw):
    return sub(broker, T, retroactive=True, **kw)


def send(broker, *texts, **props):
    return broker.send(T, [Message(body=t, properties=dict(props)) for t in texts])


def test_by_default_a_retroactive_subscriber_gets_only_the_retained_message(broker):
    send(broker, "a", "b")
    broker.send(T, Message(body="retained", properties={"ActiveMQ.Retain": True}))
    send(broker, "c")
    [got] = drain(broker, retro(broker))
    assert got.body == "retained"
    assert got.properties["ActiveMQ.Retained"] is True
    assert "ActiveMQ.Retain" not in got.properties


def test_the_retain_property_is_stripped_from_the_published_message(broker):
    live = sub(broker, T)
    broker.send(T, Message(body="r", properties={"ActiveMQ.Retain": "true", "x": 1}))
    [got] = drain(broker, live)
    assert got.properties == {"x": 1}


def test_only_the_last_retained_message_is_kept_and_an_empty_body_clears_it(broker):
    broker.send(T, Message(body="one", properties={"ActiveMQ.Retain": True}))
    broker.send(T, Message(body="two", properties={"ActiveMQ.Retain": True}))
    assert bodies(drain(broker, retro(broker))) == ["two"]
    broker.send(T, Message(body="", properties={"ActiveMQ.Retain": True}))
    assert drain(broker, retro(broker)) == []


def test_a_plain_subscriber_gets_no_history(broker):
    broker.send(T, Message(body="r", properties={"ActiveMQ.Retain": True}))
    assert drain(broker, sub(broker, T)) == []


def test_always_retroactive_makes_every_non_durable_subscriber_retroactive(broker):
    set_topic_policy(broker, alwaysRetroactive=True, subscriptionRecoveryPolicy="lastImage")
    send(broker, "a", "b")
    assert bodies(drain(broker, sub(broker, T))) == ["b"]


def test_fixed_count_recovery_replays_the_last_n_messages(broker):
    set_topic_policy(broker, subscriptionRecoveryPolicy="fixedCount", subscriptionRecoveryMaximumSize=3)
    send(broker, *"abcde")
    assert bodies(drain(broker, retro(broker))) == ["c", "d", "e"]


def test_fixed_count_recovery_defaults_to_100(broker):
    set_topic_policy(broker, subscriptionRecoveryPolicy="fixedCount")
    send(broker, *[str(i) for i in range(105)])
    got = bodies(drain(broker, retro(broker)))
    assert got == [str(i) for i in range(5, 105)]


def test_fixed_size_recovery_keeps_the_last_messages_within_the_byte_budget(broker):
    set_topic_policy(broker, subscriptionRecoveryPolicy="fixedSized", subscriptionRecoveryMaximumSize=600)
    send(broker, *[c * 100 for c in "abcdef"])
    got = bodies(drain(broker, retro(broker)))
    assert 1 <= len(got) < 6 and got[-1] == "f" * 100
    assert got == [c * 100 for c in "abcdef"][-len(got):]


def test_last_image_recovery_replays_only_the_last_message(broker):
    set_topic_policy(broker, subscriptionRecoveryPolicy="lastImage")
    send(broker, "a", "b", "c")
    assert bodies(drain(broker, retro(broker))) == ["c"]


def test_timed_recovery_replays_the_last_60_seconds(broker, clock):
    set_topic_policy(broker, subscriptionRecoveryPolicy="timed")
    send(broker, "old")
    clock.advance(30_000)
    send(broker, "recent")
    clock.advance(30_001)
    assert bodies(drain(broker, retro(broker))) == ["recent"]


def test_no_recovery_policy_still_replays_the_retained_message(broker):
    set_topic_policy(broker, subscriptionRecoveryPolicy="none")
    send(broker, "a")
    broker.send(T, Message(body="kept", properties={"ActiveMQ.Retain": True}))
    assert bodies(drain(broker, retro(broker))) == ["kept"]


def test_recovered_messages_go_through_the_subscribers_selector(broker):
    set_topic_policy(broker, subscriptionRecoveryPolicy="fixedCount")
    broker.send(T, [Message(body=s, properties={"s": s}) for s in "xyx"])
    assert bodies(drain(broker, retro(broker, selector="s = 'x'"))) == ["x", "x"]


def test_a_recovered_message_still_held_by_another_subscription_is_shared(broker):
    set_topic_policy(broker, subscriptionRecoveryPolicy="lastImage")
    holder = sub(broker, T, prefetch=1)
    [mid] = send(broker, "a")
    late = retro(broker)
    assert stored(broker, T) == 1
    [got] = broker.receive(late)
    broker.ack(late, got.message_id)
    assert stored(broker, T) == 1
    [own] = broker.receive(holder)
    broker.ack(holder, own.message_id)
    assert stored(broker, T) == 0 and got.message_id == mid


def test_expired_messages_are_not_recovered(broker, clock):
    set_topic_policy(broker, subscriptionRecoveryPolicy="fixedCount")
    broker.send(T, [Message(body="gone", expiration=clock.now_ms() + 10), Message(body="ok")])
    clock.advance(100)
    assert bodies(drain(broker, retro(broker))) == ["ok"]


def test_always_retroactive_alone_does_nothing_for_durable_subscribers(broker):
    set_topic_policy(broker, alwaysRetroactive=True, subscriptionRecoveryPolicy="lastImage")
    send(broker, "a")
    d = sub(broker, T, client_id="c", subscription_name="d")
    assert drain(broker, d) == []


def test_a_retroactive_durable_subscriber_gets_the_recovery_policys_messages(broker):
    set_topic_policy(broker, subscriptionRecoveryPolicy="fixedCount")
    send(broker, "a", "b")
    d = sub(broker, T, client_id="c", subscription_name="d", retroactive=True)
    assert bodies(drain(broker, d)) == ["a", "b"]


def test_a_new_retroactive_durable_gets_what_is_stored_for_other_durables(broker):
    set_topic_policy(broker, subscriptionRecoveryPolicy="none")
    first = sub(broker, T, client_id="c", subscription_name="first")
    broker.close_consumer(first)
    send(broker, "a", "b")
    late = sub(broker, T, client_id="c", subscription_name="late", retroactive=True)
    assert bodies(drain(broker, late)) == ["a", "b"]


def test_a_returning_retroactive_durable_with_pending_messages_gets_only_the_retained_one(broker):
    set_topic_policy(broker, subscriptionRecoveryPolicy="fixedCount")
    d = sub(broker, T, client_id="c", subscription_name="d", retroactive=True)
    broker.close_consumer(d)
    send(broker, "a")
    broker.send(T, Message(body="r", properties={"ActiveMQ.Retain": True}))
    again = sub(broker, T, client_id="c", subscription_name="d", retroactive=True)
    got = bodies(drain(broker, again))
    assert got == ["a", "r"]  # its own pending ones; nothing replayed twice


def taken(broker, consumer):
    """Everything dispatched to the consumer, received and acknowledged."""
    got = drain(broker, consumer)
    broker.ack(consumer, [d.message_id for d in got])
    return got


def test_a_returning_retroactive_durable_is_not_given_again_what_it_acknowledged(broker):
    """The buffer still holds "before" (replayed when the subscription was made) and "after" (it had it
    when it was sent); both were acknowledged, so coming back retroactive replays neither. The one sent
    while it was away it gets from its own store."""
    set_topic_policy(broker, subscriptionRecoveryPolicy="fixedCount")
    send(broker, "before")
    d = sub(broker, T, client_id="c", subscription_name="d", retroactive=True)
    send(broker, "after")
    assert bodies(taken(broker, d)) == ["before", "after"]
    broker.close_consumer(d)
    again = sub(broker, T, client_id="c", subscription_name="d", retroactive=True)
    assert drain(broker, again) == []
    broker.close_consumer(again)
    send(broker, "away")
    back = sub(broker, T, client_id="c", subscription_name="d", retroactive=True)
    assert bodies(drain(broker, back)) == ["away"]


def test_a_durable_made_without_replay_may_later_replay_what_came_before_it(broker):
    set_topic_policy(broker, subscriptionRecoveryPolicy="fixedCount")
    send(broker, "old")
    d = sub(broker, T, client_id="c", subscription_name="d")
    send(broker, "new")
    assert bodies(taken(broker, d)) == ["new"]
    broker.close_consumer(d)
    again = sub(broker, T, client_id="c", subscription_name="d", retroactive=True)
    assert bodies(drain(broker, again)) == ["old"]  # never had it; "new" it acknowledged


@pytest.mark.parametrize("policy", ["fixedCount", "lastImage", "timed", "fixedSized"])
def test_recovery_buffers_survive_with_no_subscription(broker, policy):
    set_topic_policy(broker, subscriptionRecoveryPolicy=policy)
    send(broker, "only")
    assert broker.stats(T).no_subscription == 1
    assert bodies(drain(broker, retro(broker))) == ["only"]


def test_replayed_messages_evicted_by_the_pending_limit_reach_the_dlq_at_once(broker):
    """Found by TopicMachine: a retroactive non-durable subscriber's pending-message limit applies to
    what is replayed (§8.5); the evicted ones are dead-lettered by the subscribe itself, not left in the
    topic's forwards until a maintenance tick."""
    set_topic_policy(broker, subscriptionRecoveryPolicy="fixedCount", pendingMessageLimitStrategy="constant",
                     pendingMessageLimit=1)
    send(broker, "1", "2", "3", "4")
    c = retro(broker, prefetch=1)
    [s] = broker.subscriptions(T)
    assert (s.in_flight, s.pending, s.evicted) == (1, 1, 2)
    assert broker.stats("queue://ActiveMQ.DLQ").enqueued == 2
    assert broker.stats(T).forwarding == 0
    assert c
