"""broker_core/turns.py against the real Redis: one request's turn at a time on a pull consumer, what a
request that died left in flight, the ack and the turn's end in one round trip, a client's consumers."""

from __future__ import annotations

import asyncio

import pytest

from broker_core import turns
from broker_core.broker import AsyncBroker
from broker_core.drivers.loop import run_async
from broker_core.errors import NotInFlight, UnknownConsumer
from broker_core.messages import Message
from broker_core.model import ConsumerRef, ConsumerSpec
from broker_core.scripts.library import library


async def _pull_consumer(aio: AsyncBroker, queue: str) -> ConsumerRef:
    c = await aio.add_consumer(queue, ConsumerSpec(prefetch=0, ack_mode="client-individual"))
    return ConsumerRef(c.destination, c.consumer_id, "client-individual")


async def test_one_turn_at_a_time_and_settle_acks_then_ends_it(aio):
    ref = await _pull_consumer(aio, "turns.a")
    await aio.send("turns.a", [Message(body="one"), Message(body="two")])
    assert await turns.begin_turn(aio, ref, 10_000) == 0
    assert await turns.begin_turn(aio, ref, 10_000) is None  # another request's turn
    (delivery,) = await aio.receive(ref, 1)
    await turns.settle(aio, ref, delivery.message_id)
    stats = await aio.stats("turns.a")
    assert (stats.dequeued, stats.in_flight, stats.queue_size) == (1, 0, 1)
    assert await turns.begin_turn(aio, ref, 10_000) == 0  # the turn ended with the ack
    await turns.end_turn(aio, ref)


async def test_a_refused_ack_still_ends_the_turn(aio):
    ref = await _pull_consumer(aio, "turns.b")
    assert await turns.begin_turn(aio, ref, 10_000) == 0
    with pytest.raises(NotInFlight):
        await turns.settle(aio, ref, "ID:not-in-flight")
    assert await turns.begin_turn(aio, ref, 10_000) == 0
    await turns.end_turn(aio, ref)


async def test_a_turn_lapses_and_the_next_one_sees_what_was_left_in_flight(aio):
    ref = await _pull_consumer(aio, "turns.c")
    await aio.send("turns.c", Message(body="left"))
    assert await turns.begin_turn(aio, ref, 50) == 0
    assert len(await aio.receive(ref, 1)) == 1  # then the request dies: no settle, no end
    await asyncio.sleep(0.1)
    assert await turns.begin_turn(aio, ref, 10_000) == 1  # the turn lapsed; one message left in flight


async def test_the_turn_and_the_lease_in_one_call_lease_nothing_unless_the_turn_is_taken(aio):
    ref = await _pull_consumer(aio, "turns.f")
    await aio.send("turns.f", [Message(body="one"), Message(body="two")])
    left, deliveries = await turns.begin_turn_receiving(aio, ref, 50)
    assert left == 0 and [d.body for d in deliveries] == ["one"]
    assert deliveries[0].destination == "queue://turns.f" and deliveries[0].consumer_id == ref.consumer_id
    assert await turns.begin_turn_receiving(aio, ref, 10_000) == (None, None)  # another request's turn
    stats = await aio.stats("turns.f")
    assert (stats.in_flight, stats.queue_size) == (1, 2)  # the refused request leased nothing
    await asyncio.sleep(0.1)  # the request dies holding "one": its turn lapses
    assert await turns.begin_turn_receiving(aio, ref, 10_000) == (1, None)  # left in flight: nothing leased
    assert (await aio.stats("turns.f")).in_flight == 1
    await aio.close_consumer(ref)  # (as the GET does: closing gives "one" back)
    ref = await _pull_consumer(aio, "turns.f")
    left, deliveries = await turns.begin_turn_receiving(aio, ref, 10_000)
    assert left == 0 and [(d.body, d.redelivery_count) for d in deliveries] == [("one", 1)]
    await turns.settle(aio, ref, deliveries[0].message_id)
    left, deliveries = await turns.begin_turn_receiving(aio, ref, 10_000)  # the turn ended with the ack
    assert [d.body for d in deliveries] == ["two"]


async def test_the_turn_is_taken_before_an_unknown_consumer_is_reported(aio):
    ref = await _pull_consumer(aio, "turns.g")
    await aio.close_consumer(ref)
    with pytest.raises(UnknownConsumer):
        await turns.begin_turn_receiving(aio, ref, 10_000)
    assert await turns.begin_turn(aio, ref, 10_000) is None  # the caller has the turn: it makes the consumer


async def test_a_clients_consumers_are_remembered_and_forgotten(aio):
    a, b = await _pull_consumer(aio, "turns.d"), await _pull_consumer(aio, "turns.e")
    for ref in (a, b):
        await turns.remember_consumer(aio, "client-1", ref, 60_000)
    got = await turns.client_consumers(aio, "client-1", "client-individual")
    assert sorted((r.destination.uri, r.consumer_id) for r in got) == sorted(
        (r.destination.uri, r.consumer_id) for r in (a, b))
    await turns.forget_client(aio, "client-1")
    assert await turns.client_consumers(aio, "client-1", "client-individual") == []


async def test_settle_after_a_restart_lost_the_library(aio):
    """The MULTI/EXEC that acks and ends the turn meets a server without the library: the turn has ended,
    the ack runs again alone once the library is loaded (EVALSHA scripts: the ack's call loads its script)."""
    ref = await _pull_consumer(aio, "turns.f")
    await aio.send("turns.f", [Message(body="one"), Message(body="two")])
    for n in (1, 2):
        assert await turns.begin_turn(aio, ref, 10_000) == 0
        (delivery,) = await aio.receive(ref, 1)
        if n == 2:  # (the first settle loaded the library, so the driver believes it there)
            if await run_async(aio.driver.uses_functions(), aio._perform):
                await aio.redis.execute_command("FUNCTION", "DELETE", library().name)
            else:
                await aio.redis.execute_command("SCRIPT", "FLUSH")
        await turns.settle(aio, ref, delivery.message_id)
        stats = await aio.stats("turns.f")
        assert (stats.dequeued, stats.in_flight, stats.queue_size) == (n, 0, 2 - n)
    assert await turns.begin_turn(aio, ref, 10_000) == 0
    await turns.end_turn(aio, ref)


async def test_settle_on_a_topic_consumer(aio):
    """A topic consumer's ack first finds its subscription (a plain command): ack, then the turn's end."""
    c = await aio.add_consumer("topic://turns.g", ConsumerSpec(prefetch=0, ack_mode="client-individual"))
    ref = ConsumerRef(c.destination, c.consumer_id, "client-individual")
    await aio.send("topic://turns.g", Message(body="one"))
    assert await turns.begin_turn(aio, ref, 10_000) == 0
    (delivery,) = await aio.receive(ref, 1)
    assert await turns.begin_turn(aio, ref, 10_000) is None
    await turns.settle(aio, ref, delivery.message_id)
    assert await turns.begin_turn(aio, ref, 10_000) == 0  # ended, and nothing left in flight
    await turns.end_turn(aio, ref)
    with pytest.raises(NotInFlight):
        await turns.settle(aio, ref, delivery.message_id)
    assert await turns.begin_turn(aio, ref, 10_000) == 0
    await turns.end_turn(aio, ref)
