"""A virtualTopic entry's selectorAware and dropOnResourceLimit (spec §10.3, issue 5), against a real Redis:
SelectorAwareVirtualTopicInterceptor copies a message only to consumer queues with a consumer that takes
it; VirtualTopicInterceptor with dropOnResourceLimit drops the copy a full consumer queue's flow control
would fail instead of failing the producer's send."""

from __future__ import annotations

import time

import pytest

from broker_core.broker import Broker
from broker_core.config.virtual import VirtualConfig
from broker_core.destinations import parse_destination
from broker_core.errors import InvalidPolicy, ResourceAllocationError
from broker_core.event_stream import expand
from broker_core.messages import Message
from broker_core.ops import virtual

from ...helpers.broker import consumer

KB = "x" * 1000  # packs to a little over 1,000 bytes
TOPIC = "topic://VirtualTopic.Orders"


def configure(broker: Broker, **entry) -> VirtualConfig:
    config = VirtualConfig.from_config({"virtualTopic": [{"name": "VirtualTopic.>", **entry}]})
    virtual.configure(broker, config)
    return config


def queue(who: str) -> str:
    return f"Consumer.{who}.VirtualTopic.Orders"


def ids_on(broker: Broker, dest: str) -> list[str]:
    return [b.message.message_id for b in broker.browse(dest, limit=100).messages]


def events(broker: Broker, dest: str, kind: str) -> list[dict[bytes, bytes]]:
    key = broker.ops.events_key(parse_destination(dest))
    return [e for _, e in expand(broker.redis.xrange(key)) if e[b"type"] == kind.encode()]


# -- selectorAware ---------------------------------------------------------------------------------------

def test_selector_aware_copies_only_to_queues_with_a_consumer_that_takes_the_message(broker):
    configure(broker, selectorAware=True)
    consumer(broker, queue("eu"), selector="region = 'eu'")
    consumer(broker, queue("us"), selector="region = 'us'")
    consumer(broker, queue("all"))  # no selector: takes everything
    broker.ensure_destination(queue("idle"))  # no consumer at all: gets nothing (no selector cache plugin)
    broker.send(TOPIC, [Message(body="1", message_id="eu-1", properties={"region": "eu"}),
                        Message(body="2", message_id="us-1", properties={"region": "us"})])
    on = {who: ids_on(broker, queue(who)) for who in ("eu", "us", "all", "idle")}
    assert on == {"eu": ["eu-1"], "us": ["us-1"], "all": ["eu-1", "us-1"], "idle": []}


def test_selector_aware_matches_any_of_a_queues_consumers_and_follows_them_as_they_come_and_go(broker):
    configure(broker, selectorAware=True)
    eu = consumer(broker, queue("q"), selector="region = 'eu'")
    consumer(broker, queue("q"), selector="region = 'us'")
    broker.send(TOPIC, [Message(body="1", message_id="eu-1", properties={"region": "eu"}),
                        Message(body="2", message_id="us-1", properties={"region": "us"}),
                        Message(body="3", message_id="apac-1", properties={"region": "apac"})])
    assert sorted(ids_on(broker, queue("q"))) == ["eu-1", "us-1"]
    broker.close_consumer(eu)
    broker.send(TOPIC, Message(body="4", message_id="eu-2", properties={"region": "eu"}))
    assert "eu-2" not in ids_on(broker, queue("q"))  # evaluated against the consumers present at the send


def test_without_selector_aware_every_existing_consumer_queue_gets_a_copy(broker):
    configure(broker)  # selectorAware defaults to false (ActiveMQ's)
    consumer(broker, queue("us"), selector="region = 'us'")
    broker.ensure_destination(queue("idle"))
    broker.send(TOPIC, Message(body="1", message_id="eu-1", properties={"region": "eu"}))
    assert ids_on(broker, queue("us")) == ["eu-1"] and ids_on(broker, queue("idle")) == ["eu-1"]


def test_selector_aware_leaves_topic_subscribers_and_composites_alone(broker):
    virtual.configure(broker, VirtualConfig.from_config({
        "virtualTopic": [{"name": "VirtualTopic.>", "selectorAware": True}],
        "compositeTopic": [{"name": "VirtualTopic.Orders", "forwardOnly": False, "forwardTo": ["audit"]}]}))
    sub = consumer(broker, TOPIC, selector="region = 'us'")
    broker.ensure_destination("audit")
    broker.ensure_destination(queue("idle"))
    broker.send(TOPIC, Message(body="1", message_id="us-1", properties={"region": "us"}))
    assert [d.message_id for d in broker.receive(sub, 10)] == ["us-1"]
    assert ids_on(broker, "audit") == ["us-1"] and ids_on(broker, queue("idle")) == []


# -- dropOnResourceLimit ---------------------------------------------------------------------------------

def limit_queue(broker: Broker, who: str, **attributes) -> None:
    broker.policies.set_entry("queue", queue(who), {"memoryLimit": 2 * 1100, **attributes})
    broker.ensure_destination(queue(who))


def test_a_copy_for_a_full_queue_that_fails_sends_is_dropped_and_counted_and_the_send_goes_on(broker):
    configure(broker, dropOnResourceLimit=True)
    limit_queue(broker, "slow", sendFailIfNoSpace=True)
    broker.ensure_destination(queue("fast"))
    sub = consumer(broker, TOPIC, prefetch=10)
    broker.send(TOPIC, [Message(body=KB, message_id="m1"), Message(body=KB, message_id="m2")])
    (sent,) = broker.send(TOPIC, Message(body=KB, message_id="m3"))  # no ResourceAllocationError
    assert sent.status == "ok"
    assert ids_on(broker, queue("slow")) == ["m1", "m2"]
    assert ids_on(broker, queue("fast")) == ["m1", "m2", "m3"]
    assert [d.message_id for d in broker.receive(sub, 10)] == ["m1", "m2", "m3"]
    stats = broker.stats(TOPIC)
    assert stats.forward_dropped == 1 and stats.blocked_sends == 0
    (dropped,) = events(broker, TOPIC, "forward_dropped")
    assert dropped[b"msg"] == b"m3" and dropped[b"target"] == f"queue://{queue('slow')}".encode()
    assert int(dropped[b"limit"]) == 2 * 1100


def test_without_drop_on_resource_limit_the_full_queue_fails_the_send(broker):
    configure(broker)  # dropOnResourceLimit defaults to false
    limit_queue(broker, "slow", sendFailIfNoSpace=True)
    broker.send(TOPIC, [Message(body=KB), Message(body=KB)])
    with pytest.raises(ResourceAllocationError):
        broker.send(TOPIC, Message(body=KB, message_id="m3"))
    assert broker.stats(TOPIC).forward_dropped == 0


def test_a_copy_for_a_full_queue_that_waits_is_dropped_once_the_producer_waited_its_time(broker):
    """ActiveMQ swallows only the ResourceAllocationException: a queue that makes producers wait still
    does, and its copy is dropped when the wait times out (sendFailIfNoSpaceAfterTimeout)."""
    configure(broker, dropOnResourceLimit=True)
    limit_queue(broker, "slow", sendFailIfNoSpaceAfterTimeout=300)
    broker.ensure_destination(queue("fast"))
    broker.send(TOPIC, [Message(body=KB, message_id="m1"), Message(body=KB, message_id="m2")])
    started = time.monotonic()
    (sent,) = broker.send(TOPIC, Message(body=KB, message_id="m3"))
    assert 0.3 <= time.monotonic() - started < 2
    assert sent.status == "ok"
    assert ids_on(broker, queue("slow")) == ["m1", "m2"]
    assert ids_on(broker, queue("fast")) == ["m1", "m2", "m3"]
    stats = broker.stats(TOPIC)
    assert stats.forward_dropped == 1 and stats.blocked_sends == 1 and stats.total_blocked_time >= 300


def test_a_dropped_copy_is_only_the_one_that_does_not_fit(broker):
    configure(broker, dropOnResourceLimit=True)
    limit_queue(broker, "slow", sendFailIfNoSpace=True)
    broker.send(TOPIC, Message(body=KB, message_id="m1"))
    broker.send(TOPIC, [Message(body=KB, message_id="m2"), Message(body=KB, message_id="m3")])
    assert ids_on(broker, queue("slow")) == ["m1", "m2"]
    assert broker.stats(TOPIC).forward_dropped == 1


def test_virtual_topic_options_are_validated_and_described(broker):
    with pytest.raises(InvalidPolicy, match="selectorAware must be true or false") as bad:
        VirtualConfig.from_config({"virtualTopic": [{"selectorAware": "yes"}]})
    assert bad.value.details["key"] == "selectorAware"
    with pytest.raises(InvalidPolicy, match="dropOnResourceLimit must be true or false"):
        VirtualConfig.from_config({"virtualTopic": [{"dropOnResourceLimit": 1}]})
    config = configure(broker, selectorAware=True, dropOnResourceLimit=True)
    (row,) = virtual.describe(config)
    assert row["selectorAware"] is True and row["dropOnResourceLimit"] is True
    assert broker.virtual_routing()[0]["selectorAware"] is True
