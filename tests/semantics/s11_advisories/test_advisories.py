"""Advisory topics (spec §11, issue 5 item 7) against a real Redis: ActiveMQ's names, generated from the
lifecycle events in the same atomic step, subscribable like any topic."""

from __future__ import annotations

import json

import pytest
import redis

from broker_core import maintenance
from broker_core.broker import Broker
from broker_core.destinations import parse_destination
from broker_core.drivers.loop import typed_error as _typed_error
from broker_core.effects import Command
from broker_core.errors import ResourceAllocationError
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from broker_core.ops import advisory

from ...helpers.broker import consumer, drain


def watch(broker: Broker, kind: str, dest: str):
    """Subscribe to the advisory topic of `kind` about `dest` (creating the topic, as a subscriber does)."""
    return broker.add_consumer(advisory.topic(kind, dest), ConsumerSpec(ack_mode="auto"))


def advisories(broker: Broker, sub) -> list[tuple[dict, dict]]:
    """(properties, JSON body) of each advisory the subscription received."""
    out = []
    for d in drain(broker, sub):
        assert d.type == "Advisory" and not d.persistent
        out.append((d.properties, json.loads(d.body)))
    return out


def value(v):
    return getattr(v, "value", v)


def test_consumer_added_and_removed_are_advised_with_the_consumer_count(broker):
    sub = watch(broker, "Consumer", "orders")
    assert sub.destination.uri == "topic://ActiveMQ.Advisory.Consumer.Queue.orders"
    c1 = consumer(broker, "orders", consumer_id="c1", prefetch=7, selector="a = 1")
    consumer(broker, "orders", consumer_id="c2")
    broker.close_consumer(c1)
    got = advisories(broker, sub)
    assert [value(p["consumerCount"]) for p, _ in got] == [1, 2, 1]
    added = got[0][1]["ConsumerInfo"]
    assert added["consumerId"] == "c1" and added["destination"] == "queue://orders"
    assert added["prefetchSize"] == 7 and added["selector"] == "a = 1"
    assert got[2][1]["RemoveInfo"]["objectId"] == "c1"
    assert got[0][0]["originBrokerName"] == "localhost"


def test_without_a_subscriber_no_advisory_topic_is_created_and_nothing_waits(broker):
    c = consumer(broker, "orders")
    broker.close_consumer(c)
    assert broker.destinations() == ["queue://orders"]
    assert broker.stats("orders").forwarding == 0


def test_expired_messages_are_advised_with_a_copy_without_its_body(broker, clock):
    sub = watch(broker, "Expired", "orders")
    broker.send("orders", Message(body="secret", message_id="m1", expiration=clock.now_ms() + 10,
                                  properties={"region": "eu"}))
    clock.advance(20)
    broker.sweep_expired("orders")
    [(props, body)] = advisories(broker, sub)
    assert props["orignalMessageId"] == "m1"
    assert body["message"]["messageId"] == "m1" and body["message"]["properties"] == {"region": "eu"}
    assert "body" not in body["message"]


def test_include_body_for_advisory_puts_the_body_in_the_copy(broker, policy, clock):
    policy("orders", includeBodyForAdvisory=True)
    sub = watch(broker, "Expired", "orders")
    broker.send("orders", Message(body="visible", message_id="m1", expiration=clock.now_ms() + 10))
    clock.advance(20)
    broker.sweep_expired("orders")
    [(_, body)] = advisories(broker, sub)
    assert body["message"]["body"] == "visible"


def test_a_message_sent_to_the_dead_letter_queue_is_advised(broker, policy):
    policy("orders", maximumRedeliveries=0)
    sub = watch(broker, "MessageDLQd", "orders")
    broker.send("orders", Message(body="x", message_id="m1"))
    c = consumer(broker, "orders")
    broker.nack(c, drain(broker, c)[0].message_id)
    [(_, body)] = advisories(broker, sub)
    assert body["message"]["messageId"] == "m1" and body["event"]["target"] == "queue://ActiveMQ.DLQ"
    assert broker.stats("ActiveMQ.DLQ").queue_size == 1


def test_a_slow_queue_consumer_is_advised_only_with_advisory_for_slow_consumers(broker, policy):
    """ActiveMQ 5.17.2's Queue.doActualDispatch never reports a full subscription (5.17.3's AMQ-9153
    calls broker.slowConsumer there, whatever the flags); its slow mark (PrefetchSubscription.
    dispatchPending, our dispatch's `slow` flag, spec §8.1) reaches BaseDestination.slowConsumer, which
    advises only when advisoryForSlowConsumers is set."""
    quiet = watch(broker, "SlowConsumer", "quiet")
    consumer(broker, "quiet", prefetch=1)
    broker.send("quiet", [Message(body="1"), Message(body="2")])  # its window is full, one waits
    assert advisories(broker, quiet) == []
    policy("orders", advisoryForSlowConsumers=True)
    sub = watch(broker, "SlowConsumer", "orders")
    c = consumer(broker, "orders", consumer_id="slowpoke", prefetch=1)
    broker.send("orders", [Message(body="1"), Message(body="2")])
    [(props, body)] = advisories(broker, sub)
    assert props["consumerId"] == "slowpoke" and body["ConsumerInfo"]["consumerId"] == "slowpoke"
    assert c.consumer_id == "slowpoke"


def test_a_full_destination_is_advised_only_with_advisory_when_full(broker, policy):
    policy("orders", memoryLimit=1100, sendFailIfNoSpace=True)
    policy("gated", memoryLimit=1100, sendFailIfNoSpace=True, advisoryWhenFull=True)
    quiet, loud = watch(broker, "FULL", "orders"), watch(broker, "FULL", "gated")
    for name in ("orders", "gated"):
        broker.send(name, Message(body="x" * 1000))
        with pytest.raises(ResourceAllocationError):
            broker.send(name, Message(body="x" * 1000))
    assert advisories(broker, quiet) == []
    [(props, body)] = advisories(broker, loud)
    assert props["usageName"] == "queue://gated:memory"
    assert value(props["usageCount"]) == broker.stats("gated").memory_usage
    assert body["usage"]["limit"] == 1100


def test_delivered_dispatched_and_consumed_advisories_follow_their_policy_flags(broker, policy):
    policy("orders", advisoryForDelivery=True, advisoryForDispatched=True, advisoryForConsumed=True)
    policy("plain")
    kinds = ("MessageDelivered", "MessageDispatched", "MessageConsumed")
    subs = {k: watch(broker, k, "orders") for k in kinds}
    plain = watch(broker, "MessageDelivered", "plain")
    broker.send("plain", Message(body="p"))
    broker.send("orders", Message(body="o", message_id="m1"))
    c = consumer(broker, "orders", consumer_id="c1")
    broker.ack(c, drain(broker, c)[0].message_id)
    assert advisories(broker, plain) == []
    [(delivered, _)] = advisories(broker, subs["MessageDelivered"])
    assert delivered["orignalMessageId"] == "m1" and delivered["orignalDestination"] == "queue://orders"
    [(dispatched, _)] = advisories(broker, subs["MessageDispatched"])
    assert dispatched["consumerId"] == "c1"
    [(consumed, _)] = advisories(broker, subs["MessageConsumed"])
    assert consumed["orignalMessageId"] == "m1"


def test_topic_consumers_are_advised_on_the_topic_advisory(broker):
    sub = watch(broker, "Consumer", "topic://prices")
    assert sub.destination.uri == "topic://ActiveMQ.Advisory.Consumer.Topic.prices"
    durable = broker.add_consumer("topic://prices", ConsumerSpec(client_id="app", subscription_name="s"))
    broker.close_consumer(durable)  # offline, still counted as ActiveMQ's ConsumerCount does
    got = advisories(broker, sub)
    assert [body.get("ConsumerInfo", body.get("RemoveInfo")) is not None for _, body in got] == [True, True]
    assert [value(p["consumerCount"]) for p, _ in got] == [1, 1]


def test_no_advisory_is_generated_about_an_advisory_topic(broker):
    meta = watch(broker, "Consumer", "topic://ActiveMQ.Advisory.Consumer.Queue.orders")
    watch(broker, "Consumer", "orders")  # a consumer on an advisory topic
    assert advisories(broker, meta) == []


def test_an_advisory_recorded_before_a_crash_is_published_once_by_maintenance(broker, clock):
    sub = watch(broker, "Consumer", "orders")
    op = broker.ops.add_consumer(parse_destination("orders"), ConsumerSpec(), clock.now_ms(), "c1")
    request = next(op)
    while not (isinstance(request, Command) and request.args[0] == "HSCAN"):  # dies before publishing
        try:
            request = op.send(broker._step(request))
        except redis.ResponseError as exc:
            request = op.throw(_typed_error(exc))
    op.close()
    assert advisories(broker, sub) == [] and broker.stats("orders").forwarding == 1
    maintenance.run_recovery(broker, "orders")
    clock.advance(3_000)
    maintenance.run_recovery(broker, "orders")
    assert len(advisories(broker, sub)) == 1
    assert broker.forward("orders") == 0
    assert advisories(broker, sub) == []


def test_advisory_topic_names_are_activemqs():
    assert advisory.topic("MessageDLQd", "topic://a.b").uri == "topic://ActiveMQ.Advisory.MessageDLQd.Topic.a.b"
    assert advisory.topic("FULL", "orders").uri == "topic://ActiveMQ.Advisory.FULL.Queue.orders"
    assert advisory.is_advisory("topic://ActiveMQ.Advisory.Expired.Queue.x")
    with pytest.raises(ValueError, match="unknown advisory kind 'Full'"):
        advisory.topic("Full", "orders")


def test_an_advisory_counts_towards_memory_until_its_subscriber_has_it(broker):
    sub = watch(broker, "Consumer", "orders")
    consumer(broker, "orders")
    assert broker.memory().used == broker.stats(sub.destination).memory_usage > 0
    assert len(advisories(broker, sub)) == 1  # auto-acknowledged as it is handed over
    assert broker.memory().used == 0


def test_messages_a_topic_subscription_discards_are_advised_when_the_policy_asks(broker):
    broker.policies.set_entry("topic", "ticks", {"pendingMessageLimitStrategy": "constant",
                                                 "pendingMessageLimit": 1,
                                                 "advisoryForDiscardingMessages": True})
    sub = watch(broker, "MessageDiscarded", "topic://ticks")
    consumer(broker, "topic://ticks", prefetch=1)
    broker.send("topic://ticks", [Message(body=str(i), message_id=f"t{i}") for i in range(5)])
    got = advisories(broker, sub)
    evicted = broker.stats("topic://ticks").evicted
    assert evicted > 0 and len(got) == evicted
    props, body = got[0]
    assert props["orignalDestination"] == "topic://ticks" and props["orignalMessageId"].startswith("t")
    assert props["consumerId"] and body["event"]["type"] == "evict"


def test_destinations_created_and_deleted_are_advised_on_activemqs_destination_topics(broker):
    queues = broker.add_consumer("topic://ActiveMQ.Advisory.Queue", ConsumerSpec(ack_mode="auto"))
    topics = broker.add_consumer("topic://ActiveMQ.Advisory.Topic", ConsumerSpec(ack_mode="auto"))
    broker.send("orders", Message(body="x"))  # created on first use
    broker.send("orders", Message(body="y"))  # already there: no advisory
    broker.ensure_destination("topic://prices")
    broker.delete_destination("orders")
    got = advisories(broker, queues)
    assert [b["DestinationInfo"] for _, b in got] == [
        {"destination": "queue://orders", "operationType": 0},
        {"destination": "queue://orders", "operationType": 1}]
    [(_, body)] = advisories(broker, topics)
    assert body["DestinationInfo"] == {"destination": "topic://prices", "operationType": 0}
