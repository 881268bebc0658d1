"""The one driver loop (broker_core/drivers/loop.py) as both brokers run it: Broker blocking, AsyncBroker with
asyncio, each in both script forms. The same work gives the same results; a server that lost its scripts
or library mid-run gets them again (on a plain call and inside a MULTI/EXEC); a script's error reply
reaches the caller as its typed error; a destination's first use writes its policy and is retried."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from broker_core import errors
from broker_core.broker import AsyncBroker, Broker
from broker_core.config.store import PolicyStore
from broker_core.destinations import parse_destination
from broker_core.effects import Eval
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from broker_core.scripts.library import library, wants_functions

FORMS = [True, False]  # the function library; EVALSHA scripts


def _forms(client: redis.Redis) -> list[bool]:
    return FORMS if wants_functions(client.info("server")) else [False]


def _lose_scripts(client: redis.Redis, functions: bool) -> None:
    """What a restart without persistence does to the server's scripts."""
    if functions:
        client.execute_command("FUNCTION", "DELETE", library().name)
    else:
        client.execute_command("SCRIPT", "FLUSH")


def _sync_work(broker: Broker, client: redis.Redis, functions: bool) -> list:
    broker.ensure_destination("Consumer.A.VirtualTopic.d")
    c = broker.add_consumer("q", ConsumerSpec(ack_mode="client-individual"))
    out: list = [broker.send("q", Message(body="1", message_id="m1"))]
    _lose_scripts(client, functions)
    out.append(broker.send("q", Message(body="2", message_id="m2")))  # one script call, loaded again
    got = broker.receive(c, 10)
    out.append([d.message_id for d in got])
    out.append(broker.ack(c, "m1"))
    _lose_scripts(client, functions)
    # a virtual topic's copy travels in a MULTI/EXEC (ops/forward.py)
    out.append(broker.send("topic://VirtualTopic.d", Message(body="3", message_id="m3")))
    out.append(broker.stats("Consumer.A.VirtualTopic.d").queue_size)
    out.append(broker.stats("q").queue_size)
    return out


async def _async_work(broker: AsyncBroker, client: redis.Redis, functions: bool) -> list:
    await broker.ensure_destination("Consumer.A.VirtualTopic.d")
    c = await broker.add_consumer("q", ConsumerSpec(ack_mode="client-individual"))
    out: list = [await broker.send("q", Message(body="1", message_id="m1"))]
    _lose_scripts(client, functions)
    out.append(await broker.send("q", Message(body="2", message_id="m2")))
    got = await broker.receive(c, 10)
    out.append([d.message_id for d in got])
    out.append(await broker.ack(c, "m1"))
    _lose_scripts(client, functions)
    out.append(await broker.send("topic://VirtualTopic.d", Message(body="3", message_id="m3")))
    out.append((await broker.stats("Consumer.A.VirtualTopic.d")).queue_size)
    out.append((await broker.stats("q")).queue_size)
    return out


def _forget(client: redis.Redis, namespace: str) -> None:
    keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i:i + 500])


async def test_both_brokers_do_the_same_work_and_reload_lost_scripts(redis_client, redis_url, clock):
    expected = [["m1"], ["m2"], ["m1", "m2"], 1, ["m3"], 1, 1]
    for functions in _forms(redis_client):
        sync_ns, async_ns = f"ds{functions:d}", f"da{functions:d}"
        broker = Broker(redis_client, sync_ns, clock)
        broker.driver.functions = functions
        aclient = redis.asyncio.Redis.from_url(redis_url)
        abroker = AsyncBroker(aclient, async_ns, clock, policies=PolicyStore(redis_client, async_ns))
        abroker.driver.functions = functions
        try:
            assert _sync_work(broker, redis_client, functions) == expected, functions
            assert await _async_work(abroker, redis_client, functions) == expected, functions
            # the single script call of the summaries (AsyncBroker._eval) reloads too
            _lose_scripts(redis_client, functions)
            prefix = abroker.ops.prefix(parse_destination("q"))
            flat = await abroker._eval(Eval("summary_many", (prefix,), (clock.now_ms(), 0)))
            assert flat, functions
        finally:
            broker.close()
            await abroker.aclose()
            await aclient.aclose()
            _forget(redis_client, sync_ns)
            _forget(redis_client, async_ns)


async def test_an_error_reply_reaches_the_caller_typed_and_changes_nothing(redis_client, redis_url, namespace,
                                                                         clock):
    broker = Broker(redis_client, namespace, clock)
    aclient = redis.asyncio.Redis.from_url(redis_url)
    abroker = AsyncBroker(aclient, namespace, clock, policies=PolicyStore(redis_client, namespace))
    try:
        c = broker.add_consumer("q", ConsumerSpec(ack_mode="client-individual"))
        broker.send("q", Message(body="1", message_id="m1"))
        with pytest.raises(errors.NotInFlight):
            broker.ack(c, "nope")
        with pytest.raises(errors.NotInFlight):
            await abroker.ack(c, "nope", tx=None)
        with pytest.raises(errors.UnknownMessage):
            broker.get_message("q", "nope")
        with pytest.raises(errors.UnknownMessage):
            await abroker.get_message("q", "nope")
        assert broker.stats("q").queue_size == 1
        assert [d.message_id for d in await abroker.receive(c, 10)] == ["m1"]
    finally:
        broker.close()
        await abroker.aclose()
        await aclient.aclose()
        _forget(redis_client, namespace)


async def test_a_first_use_writes_the_policy_and_is_retried(redis_client, redis_url, namespace, clock):
    """NO_DESTINATION: the operation asks the driver for the policy (Policy), writes it, tries again.
    An AsyncBroker with no PolicyStore cannot, and says so."""
    aclient = redis.asyncio.Redis.from_url(redis_url)
    bare = AsyncBroker(aclient, namespace, clock)
    abroker = AsyncBroker(aclient, namespace, clock, policies=PolicyStore(redis_client, namespace))
    broker = Broker(redis_client, namespace, clock)
    try:
        with pytest.raises(errors.InvalidPolicy):
            await bare.ensure_destination("fresh-a")
        assert await abroker.send("fresh-a", Message(body="1", message_id="a1")) == ["a1"]
        assert broker.send("fresh-b", Message(body="1", message_id="b1")) == ["b1"]
        assert sorted(broker.destinations()) == ["queue://fresh-a", "queue://fresh-b"]
    finally:
        broker.close()
        await bare.aclose()
        await abroker.aclose()
        await aclient.aclose()
        _forget(redis_client, namespace)
