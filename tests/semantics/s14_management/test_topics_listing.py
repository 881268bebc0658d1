"""The subscription listing (`broker.subscriptions`, spec §14.4) shows whether a subscription was recovered
retroactively (§7.5) and the pending-message limit in force (§8.5)."""

from __future__ import annotations

from broker_core.messages import Message

from ..s07_topics.test_topics import sub

T = "topic://listing"


def topic_policy(broker, **attributes):
    broker.policies.set_entry("topic", "listing", attributes)
    broker.refresh_policies()


def listing(broker):
    return {s.consumer_id or s.key: s for s in broker.subscriptions(T)}


def test_retroactive_is_listed_as_the_consumer_asked_it(broker):
    sub(broker, T, consumer_id="plain")
    sub(broker, T, consumer_id="retro", retroactive=True)
    sub(broker, T, consumer_id="dur", client_id="app", subscription_name="d", retroactive=True)
    got = listing(broker)
    assert {k: s.retroactive for k, s in got.items()} == {"plain": False, "retro": True, "dur": True}


def test_always_retroactive_makes_non_durable_subscriptions_retroactive_but_not_durable_ones(broker):
    """§7.5: Topic.addSubscription honours alwaysRetroactive; recoverRetroactiveMessages of a durable
    subscription needs the consumer's own flag."""
    topic_policy(broker, alwaysRetroactive=True)
    sub(broker, T, consumer_id="plain")
    sub(broker, T, consumer_id="dur", client_id="app", subscription_name="d")
    got = listing(broker)
    assert (got["plain"].retroactive, got["dur"].retroactive) == (True, False)


def test_without_a_strategy_the_pending_message_limit_is_unlimited(broker):
    sub(broker, T, consumer_id="plain")
    assert listing(broker)["plain"].pending_message_limit == -1


def test_a_constant_limit_and_the_consumers_own_smaller_limit_are_listed(broker):
    topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=5)
    sub(broker, T, consumer_id="policy")
    sub(broker, T, consumer_id="own", maximum_pending_message_limit=3)
    sub(broker, T, consumer_id="bigger", maximum_pending_message_limit=9)  # the smaller one wins
    sub(broker, T, consumer_id="dur", client_id="app", subscription_name="d")
    got = listing(broker)
    assert {k: s.pending_message_limit for k, s in got.items()} == {"policy": 5, "own": 3, "bigger": 5,
                                                                     "dur": -1}


def test_a_prefetch_rate_limit_is_the_prefetch_times_the_multiplier(broker):
    topic_policy(broker, pendingMessageLimitStrategy="prefetchRate", pendingMessageLimitMultiplier=2.5)
    sub(broker, T, consumer_id="p10", prefetch=10)
    assert listing(broker)["p10"].pending_message_limit == 25


def test_the_listed_limit_is_the_one_the_send_applies(broker):
    topic_policy(broker, pendingMessageLimitStrategy="constant", pendingMessageLimit=2)
    c = sub(broker, T, consumer_id="slow", prefetch=1)
    broker.send(T, [Message(body=str(i)) for i in range(6)])
    [s] = broker.subscriptions(T)
    assert s.pending == s.pending_message_limit == 2 and s.evicted == 3
    assert c


def test_the_topic_stats_carry_the_same_fields(broker):
    sub(broker, T, consumer_id="retro", retroactive=True)
    [s] = broker.stats(T).subscriptions
    assert s.retroactive is True and s.pending_message_limit == -1
