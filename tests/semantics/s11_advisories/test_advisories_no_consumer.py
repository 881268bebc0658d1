"""NoConsumer advisories (spec §11, `sendAdvisoryIfNoConsumers`) against a real Redis: what
BaseDestination.onMessageWithNoConsumers sends, from Topic.dispatch (no subscription, or none matching) and
Queue.messageSent (a queue without any consumer)."""

from __future__ import annotations

from broker_core.effects import Eval
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from broker_core.ops import advisory

from ...helpers.broker import consumer, drain


def watch_no_consumer(broker, dest: str):
    return broker.add_consumer(advisory.topic("NoConsumer", dest), ConsumerSpec(ack_mode="auto"))


def topic_policy(broker, pattern: str = ">", **attributes):
    broker.policies.set_entry("topic", pattern, attributes)
    broker.refresh_policies()


def test_a_non_persistent_message_no_topic_subscription_takes_goes_as_it_is_to_the_no_consumer_topic(broker):
    topic_policy(broker, "prices", sendAdvisoryIfNoConsumers=True)
    watcher = watch_no_consumer(broker, "topic://prices")
    assert watcher.destination.uri == "topic://ActiveMQ.Advisory.NoConsumer.Topic.prices"
    broker.send("topic://prices", Message(body="42", message_id="m1", persistent=False, priority=7,
                                          properties={"sym": "X"}))
    [got] = drain(broker, watcher)
    # the message itself (msg.copy()): same id, body, headers and properties, no advisory wrapping
    assert (got.message_id, got.body, got.priority, got.persistent) == ("m1", "42", 7, False)
    assert got.properties == {"sym": "X"} and got.type is None and got.original_destination is None
    assert broker.stats("topic://prices").no_subscription == 1  # still dropped on the topic


def test_a_topic_whose_subscriptions_all_refuse_the_message_advises_it_too(broker):
    topic_policy(broker, "prices", sendAdvisoryIfNoConsumers=True)
    watcher = watch_no_consumer(broker, "topic://prices")
    taker = consumer(broker, "topic://prices", selector="sym = 'A'", ack_mode="auto")
    broker.send("topic://prices", [
        Message(body="a", message_id="a1", persistent=False, properties={"sym": "A"}),
        Message(body="b", message_id="b1", persistent=False, properties={"sym": "B"})])
    assert [d.message_id for d in drain(broker, watcher)] == ["b1"]  # dispatchPolicy.dispatch was false
    assert [d.message_id for d in drain(broker, taker)] == ["a1"]


def test_persistent_messages_and_the_default_policy_send_no_no_consumer_advisory(broker):
    topic_policy(broker, "gated", sendAdvisoryIfNoConsumers=True)
    on, off = watch_no_consumer(broker, "topic://gated"), watch_no_consumer(broker, "topic://plain")
    broker.send("topic://gated", Message(body="p", message_id="p1", persistent=True))
    broker.send("topic://plain", Message(body="n", message_id="n1", persistent=False))
    assert drain(broker, on) == [] and drain(broker, off) == []
    assert broker.stats("topic://gated").forwarding == broker.stats("topic://plain").forwarding == 0


def test_a_queue_without_any_consumer_advises_the_message_and_still_keeps_it(broker, policy):
    policy("orders", sendAdvisoryIfNoConsumers=True)
    watcher = watch_no_consumer(broker, "orders")
    assert watcher.destination.uri == "topic://ActiveMQ.Advisory.NoConsumer.Queue.orders"
    broker.send("orders", Message(body="x", message_id="q1", persistent=False))
    assert [(d.message_id, d.body) for d in drain(broker, watcher)] == [("q1", "x")]
    assert broker.stats("orders").queue_size == 1
    late = consumer(broker, "orders")
    assert [d.message_id for d in drain(broker, late)] == ["q1"]


def test_a_delayed_message_is_advised_when_it_reaches_a_queue_without_consumers_not_at_the_send(
        broker, policy, clock):
    """SchedulerBroker keeps a delayed message until it is due and then sends it to the queue, whose
    Queue.messageSent checks for consumers then."""
    policy("orders", sendAdvisoryIfNoConsumers=True)
    watcher = watch_no_consumer(broker, "orders")
    broker.send("orders", Message(body="x", message_id="d1", persistent=False, delay_ms=1000))
    assert drain(broker, watcher) == []
    assert broker.stats(watcher.destination).enqueued == 0  # nothing published (not held back there)
    clock.advance(1000)
    broker.dispatch("orders")
    assert [d.message_id for d in drain(broker, watcher)] == ["d1"]  # the copy has no delay left


def test_a_queue_with_a_consumer_advises_nothing_even_when_its_selector_refuses_the_message(broker, policy):
    """Queue.messageSent checks consumers.isEmpty() only; selectors do not count there (unlike a topic)."""
    policy("orders", sendAdvisoryIfNoConsumers=True)
    watcher = watch_no_consumer(broker, "orders")
    consumer(broker, "orders", selector="region = 'eu'")
    broker.send("orders", Message(body="x", message_id="q1", persistent=False, properties={"region": "us"}))
    assert drain(broker, watcher) == []


def test_a_copy_that_had_an_original_destination_gets_the_destination_it_reached(broker, policy):
    """onMessageWithNoConsumers: `if (message.getOriginalDestination() != null)
    message.setOriginalDestination(message.getDestination())`: a composite's part names itself."""
    policy(">", sendAdvisoryIfNoConsumers=True)
    watcher = watch_no_consumer(broker, "part.b")
    broker.send("part.a,part.b", Message(body="c", message_id="c1", persistent=False))
    [got] = drain(broker, watcher)
    assert got.message_id == "c1" and got.original_destination == "queue://part.b"


def test_no_no_consumer_advisory_is_generated_about_an_advisory_topic(broker):
    topic_policy(broker, ">", sendAdvisoryIfNoConsumers=True)
    meta = watch_no_consumer(broker, "topic://ActiveMQ.Advisory.Custom")
    broker.send("topic://ActiveMQ.Advisory.Custom", Message(body="x", persistent=False))
    assert drain(broker, meta) == []


def test_without_a_no_consumer_subscriber_nothing_is_recorded(broker, policy):
    policy("orders", sendAdvisoryIfNoConsumers=True)
    broker.send("orders", Message(body="x", persistent=False))
    assert broker.stats("orders").forwarding == 0
    assert "topic://ActiveMQ.Advisory.NoConsumer.Queue.orders" not in broker.destinations()


def test_the_advisory_is_recorded_in_the_same_step_as_the_send(broker, policy):
    """The send script records it in the queue's forwarding hash; a sender dying right after the script
    leaves it there for `forward` (the maintenance job) to publish."""
    policy("orders", sendAdvisoryIfNoConsumers=True)
    watcher = watch_no_consumer(broker, "orders")
    broker.ensure_destination("orders")
    prefix = f"{broker.namespace}:{{q:orders}}"
    _, blob = Message(body="x", message_id="q1", persistent=False).pack(broker._now())
    reply = broker._step(Eval("send", (prefix,), (broker._now(), 0, "producer", "q1", blob)))
    assert reply[0] == b"ok"
    assert broker.redis.hkeys(f"{prefix}:fwd") == [b"q1|topic://ActiveMQ.Advisory.NoConsumer.Queue.orders"]
    assert drain(broker, watcher) == []
    broker.forward("orders")
    assert [d.message_id for d in drain(broker, watcher)] == ["q1"]
    assert broker.redis.hlen(f"{prefix}:fwd") == 0


def test_the_policy_no_longer_refuses_send_advisory_if_no_consumers(broker):
    broker.policies.set_entry("queue", "x", {"sendAdvisoryIfNoConsumers": True})
    broker.ensure_destination("x")
    assert broker.redis.hget(f"{broker.namespace}:{{q:x}}:policy", "sendAdvisoryIfNoConsumers") == b"1"


def test_the_no_consumer_copy_is_the_message_unchanged_when_it_had_no_original_destination():
    _, blob = Message(body="b", message_id="m", persistent=False).pack(1)
    assert advisory.no_consumer_copy(blob, "queue://q") == blob
