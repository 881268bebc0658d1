"""Edges of wildcard topic subscriptions and the NoConsumer advisory (the review of issue #5;
docs/broker_core.md "Wildcard subscriptions" and "Advisory topics"): a wildcard subscription is one of
the topic's consumers when its selector is asked, a pattern's pseudo-topic is no destination (refused
where one is needed, no DLQ mark, no orphan keys, nothing lost when its last subscription goes), and a
repeating message's every firing is a send."""

from __future__ import annotations

import pytest

from broker_core import maintenance
from broker_core.destinations import parse_destination
from broker_core.errors import InvalidDestination
from broker_core.keys import wildcards_key
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from broker_core.ops import advisory

from ...helpers.broker import consumer, drain
from .test_flow_virtual_edges import Crash, drive


def topic_policy(broker, pattern: str = ">", **attributes):
    broker.policies.set_entry("topic", pattern, attributes)
    broker.refresh_policies()


def pattern_keys(broker, pattern: str = "orders.>") -> list[bytes]:
    return broker.redis.keys(f"{broker.namespace}:{{t:{pattern}}}*")


def idle(broker) -> set[str]:
    return {m.decode() for m in broker.redis.smembers(f"{wildcards_key(broker.namespace)}:idle")}


# -- a wildcard subscription's selector decides for the topic ---------------------------------------------

def test_no_consumer_advisory_when_the_only_wildcard_subscription_refuses_the_message(broker):
    """Topic.dispatch: a wildcard subscription is one of the topic's consumers; when its selector refuses
    the message, nobody took it and onMessageWithNoConsumers advises it on the real topic."""
    topic_policy(broker, ">", sendAdvisoryIfNoConsumers=True)
    watcher = broker.add_consumer(advisory.topic("NoConsumer", "topic://orders.eu"),
                                  ConsumerSpec(ack_mode="auto"))
    wild = consumer(broker, "topic://orders.>", selector="region = 'us'", ack_mode="auto")
    broker.send("topic://orders.eu", [
        Message(body="x", message_id="m1", persistent=False, properties={"region": "eu"}),
        Message(body="y", message_id="m2", persistent=False, properties={"region": "us"}),
    ])
    assert [d.message_id for d in drain(broker, wild)] == ["m2"]
    assert [d.message_id for d in drain(broker, watcher)] == ["m1"]  # m2 was taken: no advisory


def test_no_subscription_counts_on_the_topic_when_a_wildcard_selector_refuses_it(broker):
    """`no_subscription` counts messages nobody, exact or wildcard, took, on the topic they were sent to;
    a pattern none of whose subscriptions takes the message gets no copy (nothing counted there)."""
    consumer(broker, "topic://orders.>", selector="region = 'us'", ack_mode="auto")
    broker.send("topic://orders.eu", Message(body="x", message_id="m1", properties={"region": "eu"}))
    assert broker.stats("topic://orders.eu").no_subscription == 1
    pattern = broker.stats("topic://orders.>")
    assert (pattern.enqueued, pattern.no_subscription, pattern.forwarding) == (0, 0, 0)


def test_only_the_patterns_whose_subscriptions_take_the_message_get_a_copy(broker):
    refusing = consumer(broker, "topic://orders.>", selector="region = 'us'", ack_mode="auto")
    taking = consumer(broker, "topic://*.eu", selector="region = 'eu'", ack_mode="auto")
    broker.send("topic://orders.eu", Message(body="x", message_id="m1", properties={"region": "eu"}))
    assert [d.message_id for d in drain(broker, taking)] == ["m1"]
    assert drain(broker, refusing) == []
    assert broker.stats("topic://orders.eu").no_subscription == 0
    assert broker.stats("topic://orders.>").no_subscription == 0


# -- a pattern's pseudo-topic is no destination ------------------------------------------------------------

def test_a_wildcard_copy_does_not_mark_the_patterns_topic_as_a_dead_letter_queue(broker):
    """ops/forward.py marks only a dead letter's target as a DLQ (meta dlq=1, which retry needs)."""
    c = consumer(broker, "topic://orders.>", ack_mode="auto")
    broker.send("topic://orders.eu", Message(body="x", message_id="m1"))
    assert [d.message_id for d in drain(broker, c)] == ["m1"]
    prefix = broker.ops.prefix(parse_destination("topic://orders.>", allow_wildcards=True))
    assert broker.redis.hget(f"{prefix}:meta", "dlq") is None


def test_ensuring_a_topic_pattern_is_refused_and_leaves_no_keys(broker):
    with pytest.raises(InvalidDestination, match=r"cannot create topic://orders\.>"):
        broker.ensure_destination("topic://orders.>")
    assert broker.redis.keys(f"{broker.namespace}:*orders*") == []


def test_the_apis_that_need_a_destination_refuse_a_pattern_and_change_nothing(broker):
    c = consumer(broker, "topic://orders.>", ack_mode="client")
    broker.send("topic://orders.eu", Message(body="x", message_id="m1"))
    consumer(broker, "queue://target")
    before = sorted(broker.redis.keys(f"{broker.namespace}:*"))
    calls = {
        "browse": lambda: broker.browse("topic://orders.>"),
        "read from": lambda: broker.get_message("topic://orders.>", "m1"),
        "remove from": lambda: broker.remove_message("topic://orders.>", "m1"),
        "purge": lambda: broker.purge("topic://orders.>"),
        "pause": lambda: broker.pause("topic://orders.>"),
        "resume": lambda: broker.resume("topic://orders.>"),
        "move messages to": lambda: broker.move_message("queue://target", "m1", "topic://orders.*"),
        "copy messages from": lambda: broker.copy_matching("topic://orders.>", None, "queue://target"),
        "list groups of": lambda: broker.message_groups("topic://orders.>"),
        "create": lambda: broker.ensure_destination("topic://*.eu"),
    }
    for action, call in calls.items():
        with pytest.raises(InvalidDestination, match=f"cannot {action} topic://") as refused:
            call()
        assert refused.value.details["destination"].startswith("topic://")
    assert sorted(broker.redis.keys(f"{broker.namespace}:*")) == before
    # what acts on the pattern's subscriptions still takes it
    assert broker.stats("topic://orders.>").enqueued == 1
    assert len(broker.subscriptions("topic://orders.>")) == 1
    assert broker.renew_leases("topic://orders.>", [c.consumer_id]) == []
    assert [d.message_id for d in drain(broker, c)] == ["m1"]


# -- nothing lost, nothing left, when a pattern's last subscription goes -----------------------------------

def test_a_dead_letter_left_on_a_patterns_topic_is_delivered_after_its_last_subscription_went(
        broker, clock):
    """A wildcard subscription's dead letter waits in the pseudo-topic's forwarding hash; when the process
    dies before delivering it and the subscription then goes, maintenance still delivers it (the pattern
    waits in <ns>:wildcards:idle), then removes the pseudo-topic's keys."""
    topic_policy(broker, ">", deadLetterStrategy="individual")
    # durable: a non-durable subscription's poison ack dead-letters nothing (TopicSubscription)
    c = consumer(broker, "topic://orders.>", ack_mode="client-individual", client_id="app",
                 subscription_name="s")
    broker.send("topic://orders.eu", Message(body="x", message_id="m1"))
    assert [d.message_id for d in drain(broker, c)] == ["m1"]
    op = broker.ops.nack(c, ["m1"], True, clock.now_ms(), 0.0)
    with pytest.raises(Crash):
        drive(broker, op, stop_at=lambda request: isinstance(request, list))  # dies before the forward
    prefix = broker.ops.prefix(parse_destination("topic://orders.>", allow_wildcards=True))
    assert broker.redis.hlen(f"{prefix}:fwd") == 1  # the dead letter's record survived the crash
    broker.close_consumer(c)
    broker.unsubscribe("topic://orders.>", client_id="app", subscription_name="s")
    assert idle(broker) == {"orders.>"}
    for _ in range(3):
        maintenance.run_due(broker)
        clock.advance(3_000)
    dlq = consumer(broker, "queue://ActiveMQ.DLQ.Topic.orders.eu")
    assert [d.message_id for d in drain(broker, dlq)] == ["m1"]
    assert pattern_keys(broker) == []
    assert idle(broker) == set()


def test_an_idle_patterns_keys_go_at_the_next_tick_and_it_can_be_subscribed_again(broker):
    c = consumer(broker, "topic://orders.>", ack_mode="auto")
    broker.send("topic://orders.eu", Message(body="x", message_id="m1"))
    broker.close_consumer(c)
    assert pattern_keys(broker) != []  # counters, policy... until maintenance
    maintenance.run_due(broker)
    assert pattern_keys(broker) == [] and idle(broker) == set()
    again = consumer(broker, "topic://orders.>", ack_mode="auto")
    broker.send("topic://orders.eu", Message(body="y", message_id="m2"))
    assert [d.message_id for d in drain(broker, again)] == ["m2"]


def test_an_idle_patterns_keys_wait_for_its_unfinished_fan_outs(broker):
    """A pattern's pseudo-topic whose last subscription went while a fan-out of its own was still queued
    (includes/fanout.lua: maintenance's recovery finishes it) keeps its keys until that is done, then they
    all go, the fan-out's among them."""
    c = consumer(broker, "topic://orders.>", ack_mode="auto")
    broker.send("topic://orders.eu", Message(body="x", message_id="m1"))
    broker.close_consumer(c)
    queued = f"{broker.namespace}:{{t:orders.>}}:fanout"
    broker.redis.rpush(queued, "m9")  # (a fan-out still queued there: what a cut send leaves)
    broker.redis.hset(f"{queued}:n", "m9", "0|0")
    broker._run(broker.ops.drop_idle_pattern(parse_destination("topic://orders.>", allow_wildcards=True),
                                             broker.clock.now_ms(), ()))
    assert f"{broker.namespace}:{{t:orders.>}}:meta".encode() in pattern_keys(broker)
    broker.redis.delete(queued)  # (finished)
    maintenance.run_due(broker)
    assert pattern_keys(broker) == [] and idle(broker) == set()


def test_a_pattern_subscribed_again_before_the_tick_keeps_its_keys(broker):
    c = consumer(broker, "topic://orders.>", ack_mode="auto")
    broker.close_consumer(c)
    again = consumer(broker, "topic://orders.>", ack_mode="auto")
    assert idle(broker) == set()
    maintenance.run_due(broker)
    broker.send("topic://orders.eu", Message(body="y", message_id="m2"))
    assert [d.message_id for d in drain(broker, again)] == ["m2"]
    assert broker.stats("topic://orders.>").consumer_count == 1


def test_deleting_a_patterns_topic_leaves_nothing_idle(broker):
    consumer(broker, "topic://orders.>", client_id="app", subscription_name="s")
    broker.delete_destination("topic://orders.>")
    assert idle(broker) == set()
    assert pattern_keys(broker) == []


# -- every firing of a repeating scheduled message is a send ------------------------------------------

def test_each_firing_of_a_repeating_message_on_a_queue_without_consumers_is_advised_no_consumer(
        broker, policy, clock):
    """SchedulerBroker re-sends each firing (Queue.messageSent, onMessageWithNoConsumers); the original
    send goes to the scheduler, not to the queue, so it is not advised itself."""
    policy("orders", sendAdvisoryIfNoConsumers=True)
    watcher = broker.add_consumer(advisory.topic("NoConsumer", "queue://orders"),
                                  ConsumerSpec(ack_mode="auto"))
    broker.send("orders", Message(body="r", message_id="r1", persistent=False, period_ms=1_000, repeat=1,
                                  delay_ms=500))
    assert drain(broker, watcher) == []  # scheduled, not sent to the queue yet
    for _ in range(3):
        clock.advance(1_000)
        broker.dispatch("orders")
    assert broker.stats("orders").queue_size == 2  # both firings were enqueued
    advised = drain(broker, watcher)
    assert [d.message_id for d in advised] == ["r1#1", "r1#2"]
    assert {d.body for d in advised} == {"r"}
