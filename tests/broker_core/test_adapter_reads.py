"""What the facade gives the adapters beside the operations (issue #22: adapters call the facade only):
the registry's size and first names, the durable registry, the newest event id, the client-id claims.
Against the real Redis, blocking and asyncio."""

from __future__ import annotations

from broker_core.broker import Broker
from broker_core.destinations import parse_destination
from broker_core.messages import Message
from broker_core.model import ConsumerSpec


def _created(broker: Broker, n: int) -> list[str]:
    names = [f"queue://reads.{i:02d}" for i in range(n)]
    for name in names:
        broker.ensure_destination(name)
        broker.clock.advance(1)  # (the registry orders by creation time)
    return names


def test_the_registrys_size_and_first_names_in_creation_order(broker):
    names = _created(broker, 7)
    assert broker.destination_count() == 7
    assert broker.destination_names(3) == names[:3]
    assert broker.destination_names(7, page=2) == names  # four ZRANGEs in one MULTI/EXEC
    assert broker.destination_names(100) == names
    assert broker.destination_names(0) == []


async def test_the_registry_reads_through_the_async_broker_too(broker, aio):
    names = _created(broker, 5)
    assert await aio.destination_count() == 5
    assert await aio.destination_names(5, page=2) == names
    assert await aio.destination_names(2) == names[:2]


async def test_the_durable_registry_names_the_topic_or_pattern(broker, aio):
    for topic, name in (("topic://reads.news", "audit"), ("topic://reads.>", "all")):
        c = broker.add_consumer(topic, ConsumerSpec(client_id="app", subscription_name=name))
        broker.close_consumer(c)
        assert broker.durable_topic("app", name) == parse_destination(topic, allow_wildcards=True)
        assert await aio.durable_topic("app", name) == parse_destination(topic, allow_wildcards=True)
    assert broker.durable_topic("app", "nothing") is None
    assert broker.durable_topic("other", "audit") is None


def test_the_newest_event_id_is_the_streams_last(broker, redis_client):
    broker.send("reads.events", [Message(body="one"), Message(body="two")])
    key = broker.ops.events_key(parse_destination("reads.events"))
    ((newest, _),) = redis_client.xrevrange(key, count=1)
    assert broker.last_event_id("reads.events") == newest.decode()
    redis_client.delete(key)
    assert broker.last_event_id("reads.events") is None


async def test_a_client_id_is_held_by_one_connection_at_a_time(broker, aio):
    assert await aio.claim_client_id("app", "c1|ws://a", 10_000) is None
    assert await aio.claim_client_id("app", "c2|ws://b", 10_000) == "c1|ws://a"  # the holder's value
    assert broker.claim_client_id("other", "c2|ws://b", 10_000) is None  # another id is free
    assert await aio.renew_client_id("app", "c1|ws://a", 10_000) is True
    assert await aio.renew_client_id("app", "c2|ws://b", 10_000) is False  # not the holder's
    await aio.release_client_id("app", "c2|ws://b")  # not the holder: nothing happens
    assert await aio.claim_client_id("app", "c2|ws://b", 10_000) == "c1|ws://a"
    await aio.release_client_id("app", "c1|ws://a")
    assert await aio.claim_client_id("app", "c2|ws://b", 10_000) is None
    assert await aio.renew_client_id("app", "c1|ws://a", 10_000) is False  # its claim is gone
