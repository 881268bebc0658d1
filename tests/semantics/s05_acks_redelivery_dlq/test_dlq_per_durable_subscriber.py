"""IndividualDeadLetterStrategy's destinationPerDurableSubscriber (spec §5.4, issue 5), against a real Redis:
a durable subscription's dead letters go to `<topicPrefix><topic>.<clientId>:<subscriptionName><topicSuffix>`
(createDestination with DurableTopicSubscription.getSubscriptionKey); queues keep the destination's own DLQ,
and a non-durable subscription's poison ack dead-letters nothing."""

from __future__ import annotations

import pytest

from broker_core.broker import Broker
from broker_core.config.entry import PolicyEntry
from broker_core.destinations import Destination
from broker_core.errors import InvalidPolicy
from broker_core.messages import Message

from ...helpers.broker import consumer, drain

PER_SUBSCRIBER = {"deadLetterStrategy": "individual", "destinationPerDurableSubscriber": True}


def durable(broker: Broker, client: str, name: str, topic: str = "topic://prices"):
    return consumer(broker, topic, client_id=client, subscription_name=name, ack_mode="client-individual")


def poison(broker: Broker, c) -> str:
    (d,) = drain(broker, c)
    broker.nack(c, d.message_id, poison=True)
    return d.message_id


def dead_letters(broker: Broker, dlq: str) -> list[str]:
    if dlq not in broker.destinations():
        return []
    return [b.message.message_id for b in broker.browse(dlq, limit=100).messages]


def test_a_durable_subscriptions_dead_letter_goes_to_its_own_dlq(broker):
    broker.policies.set_entry("topic", "prices", PER_SUBSCRIBER)
    c = durable(broker, "app-1", "audit")
    broker.send("topic://prices", Message(body="42", message_id="m1"))
    assert poison(broker, c) == "m1"
    assert dead_letters(broker, "queue://ActiveMQ.DLQ.Topic.prices.app-1:audit") == ["m1"]
    assert dead_letters(broker, "queue://ActiveMQ.DLQ.Topic.prices") == []
    (dead,) = broker.browse("queue://ActiveMQ.DLQ.Topic.prices.app-1:audit", limit=1).messages
    assert dead.message.original_destination == "topic://prices"
    assert broker.stats("topic://prices").deadlettered == 1


def test_a_non_durable_subscriptions_poison_ack_dead_letters_nothing(broker):
    """TopicSubscription.acknowledge only counts a POISON ack: neither the topic's DLQ nor a
    per-subscriber one gets the message."""
    broker.policies.set_entry("topic", "prices", PER_SUBSCRIBER)
    c = consumer(broker, "topic://prices", ack_mode="client-individual")
    broker.send("topic://prices", Message(body="42", message_id="m1"))
    poison(broker, c)
    assert dead_letters(broker, "queue://ActiveMQ.DLQ.Topic.prices") == []


def test_two_durable_subscriptions_each_get_the_message_in_their_own_dlq(broker):
    broker.policies.set_entry("topic", "prices", PER_SUBSCRIBER)
    a, b = durable(broker, "app-1", "audit"), durable(broker, "app-2", "billing")
    broker.send("topic://prices", Message(body="42", message_id="m1"))
    poison(broker, a)
    poison(broker, b)
    assert dead_letters(broker, "queue://ActiveMQ.DLQ.Topic.prices.app-1:audit") == ["m1"]
    assert dead_letters(broker, "queue://ActiveMQ.DLQ.Topic.prices.app-2:billing") == ["m1"]


def test_an_expired_message_of_a_durable_subscription_goes_to_its_dlq_with_prefix_and_suffix(broker, clock):
    broker.policies.set_entry("topic", "prices",
                              {**PER_SUBSCRIBER, "topicPrefix": "DLQ.", "topicSuffix": ".dead"})
    c = durable(broker, "app-1", "audit")
    broker.close_consumer(c)  # offline: the message waits, and expires there
    broker.send("topic://prices", Message(body="42", message_id="m1", expiration=clock.now_ms() + 10))
    clock.advance(20)
    while not broker.sweep_expired("topic://prices").done:
        pass
    assert dead_letters(broker, "queue://DLQ.prices.app-1:audit.dead") == ["m1"]


def test_without_the_flag_a_durable_subscription_uses_the_topics_dlq(broker):
    broker.policies.set_entry("topic", "prices", {"deadLetterStrategy": "individual"})
    c = durable(broker, "app-1", "audit")
    broker.send("topic://prices", Message(body="42", message_id="m1"))
    poison(broker, c)
    assert dead_letters(broker, "queue://ActiveMQ.DLQ.Topic.prices") == ["m1"]
    assert dead_letters(broker, "queue://ActiveMQ.DLQ.Topic.prices.app-1:audit") == []


def test_the_flag_with_another_strategy_is_refused_and_changes_nothing(broker):
    with pytest.raises(InvalidPolicy, match="destinationPerDurableSubscriber applies only when"):
        broker.policies.set_entry("topic", "prices", {"destinationPerDurableSubscriber": True})
    c = durable(broker, "app-1", "audit")
    broker.send("topic://prices", Message(body="42", message_id="m1"))
    poison(broker, c)
    assert dead_letters(broker, "queue://ActiveMQ.DLQ") == ["m1"]


def test_a_subscription_key_that_makes_no_valid_name_falls_back_to_the_topics_dlq(broker):
    """Whitespace makes no valid destination name: the dead letter still leaves, to the topic's own DLQ,
    and forwarding from the topic goes on."""
    broker.policies.set_entry("topic", "prices", PER_SUBSCRIBER)
    c = durable(broker, "app 1", "audit")
    broker.send("topic://prices", Message(body="42", message_id="m1"))
    poison(broker, c)
    assert dead_letters(broker, "queue://ActiveMQ.DLQ.Topic.prices") == ["m1"]
    assert broker.stats("topic://prices").forwarding == 0


def test_the_policy_names_the_per_subscriber_dlq_around_the_key():
    entry = PolicyEntry(dead_letter_strategy="individual", destination_per_durable_subscriber=True,
                        topic_suffix=".dlq", use_queue_for_topic_messages=False)
    assert entry.dead_letter_per_subscriber(Destination("topic", "prices")) == (
        "topic://ActiveMQ.DLQ.Topic.prices.", ".dlq")
    assert entry.dead_letter_per_subscriber(Destination("queue", "orders")) is None
    assert entry.dead_letter_per_subscriber(Destination("topic", "prices.>")) is None  # a wildcard's
    assert PolicyEntry(dead_letter_strategy="individual").dead_letter_per_subscriber(
        Destination("topic", "prices")) is None
    assert entry.dead_letter_destination_for(Destination("topic", "prices"), durable_subscription="a:b") == \
        Destination("topic", "ActiveMQ.DLQ.Topic.prices.a:b.dlq")
