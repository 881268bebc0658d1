"""The consumers one queue may have (SIGNALBOX_MAX_CONSUMERS, broker_core/model.py MAX_CONSUMERS): the
dispatch pass and an add that sorts the order read every consumer of the queue, so their number bounds the
work of those calls. An add past the limit is refused by consumer_add.lua before it writes anything, naming
the setting and its value; a topic's subscriptions are not counted (each has its own dispatch)."""

from __future__ import annotations

import pytest

from broker_core.broker import Broker
from broker_core.errors import TooManyConsumers
from broker_core.messages import Message
from broker_core.model import MAX_CONSUMERS, ConsumerSpec


def _keys(redis_client, namespace: str, queue: str) -> dict[bytes, object]:
    """Every key of the queue with its value (what a refused add must leave as it was)."""
    out: dict[bytes, object] = {}
    for key in redis_client.scan_iter(match=f"{namespace}:{{q:{queue}}}*", count=1000):
        kind = redis_client.type(key)
        if kind == b"hash":
            out[key] = redis_client.hgetall(key)
        elif kind == b"list":
            out[key] = redis_client.lrange(key, 0, -1)
        elif kind == b"zset":
            out[key] = redis_client.zrange(key, 0, -1, withscores=True)
        elif kind == b"set":
            out[key] = redis_client.smembers(key)
        elif kind == b"stream":
            out[key] = redis_client.xlen(key)
        else:
            out[key] = redis_client.get(key)
    return out


def test_an_add_past_the_limit_is_refused_naming_it_and_changes_nothing(redis_client, namespace, clock):
    broker = Broker(redis_client, namespace, clock, max_consumers=3)
    first = [broker.add_consumer("crowd", ConsumerSpec(priority=i), consumer_id=f"c{i}") for i in range(3)]
    broker.send("crowd", Message(body="m", group_id="G"))
    before = _keys(redis_client, namespace, "crowd")
    with pytest.raises(TooManyConsumers) as refused:
        broker.add_consumer("crowd", ConsumerSpec(priority=9, exclusive=True), consumer_id="late")
    assert refused.value.code == "too_many_consumers"
    assert refused.value.message == ("too many consumers: queue://crowd has 3 consumers; the limit is 3 "
                                     "(SIGNALBOX_MAX_CONSUMERS); one must close before another is added")
    assert refused.value.details == {"setting": "SIGNALBOX_MAX_CONSUMERS", "limit": 3,
                                     "destination": "queue://crowd"}
    assert _keys(redis_client, namespace, "crowd") == before
    broker.close_consumer(first[0])  # room again
    broker.add_consumer("crowd", ConsumerSpec(), consumer_id="late")
    assert broker.stats("crowd").consumer_count == 3


def test_the_default_limit(redis_client, namespace, clock):
    """MAX_CONSUMERS, unless the broker is given another; its queues' consumers count apart."""
    broker = Broker(redis_client, namespace, clock)
    assert MAX_CONSUMERS == 1_000
    for i in range(MAX_CONSUMERS):
        broker.add_consumer("crowd", ConsumerSpec(), consumer_id=f"c{i}")
    with pytest.raises(TooManyConsumers, match=r"the limit is 1000 \(SIGNALBOX_MAX_CONSUMERS\)"):
        broker.add_consumer("crowd", ConsumerSpec(), consumer_id="one.more")
    broker.add_consumer("other", ConsumerSpec(), consumer_id="one.more")  # another queue's are its own


def test_no_limit_and_topics(redis_client, namespace, clock):
    """0: no limit (ActiveMQ's); a topic's subscriptions are not counted, whatever the limit."""
    unlimited = Broker(redis_client, namespace, clock, max_consumers=0)
    for i in range(5):
        unlimited.add_consumer("free", ConsumerSpec(), consumer_id=f"c{i}")
    limited = Broker(redis_client, namespace, clock, max_consumers=2)
    for i in range(4):
        limited.add_consumer("topic://news", ConsumerSpec(), consumer_id=f"t{i}")
    with pytest.raises(TooManyConsumers):
        limited.add_consumer("free", ConsumerSpec(), consumer_id="c5")


def test_an_add_refused_after_returning_a_closed_consumers_messages_names_the_limit_too(
        redis_client, namespace, clock):
    """The add of a consumer id whose earlier consumer's messages are still going back (consumer_add.lua
    answers 'closing') returns them and asks again: that second call's refusal is the same as the first's."""
    broker = Broker(redis_client, namespace, clock, max_consumers=2)
    broker.ops.return_chunk = 5
    a = broker.add_consumer("crowd", ConsumerSpec(prefetch=50), consumer_id="A")
    broker.send("crowd", [Message(body=str(i)) for i in range(20)])
    closing = broker.ops.close_consumer(a, broker._now(), "closed")
    request = next(closing)
    closing.send(broker._step(request))  # the first call of the close only: A's returns are owed
    closing.close()
    assert redis_client.hexists(f"{namespace}:{{q:crowd}}:closing", "A")
    for cid in ("B", "C"):
        broker.add_consumer("crowd", ConsumerSpec(), consumer_id=cid)
    with pytest.raises(TooManyConsumers) as refused:
        broker.add_consumer("crowd", ConsumerSpec(), consumer_id="A")
    assert refused.value.details == {"setting": "SIGNALBOX_MAX_CONSUMERS", "limit": 2,
                                     "destination": "queue://crowd"}
    assert not redis_client.hexists(f"{namespace}:{{q:crowd}}:closing", "A")  # (its messages went back)
