"""AsyncBroker's group commit (broker_core/coalesce.py): concurrent sends to one queue share a script call,
and each sender still gets exactly what it would have got on its own."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from broker_core.broker import AsyncBroker
from broker_core.errors import InvalidMessage, MessageTooLarge
from broker_core.messages import Message
from broker_core.operations import ConsumerSpec

from .conftest import drain


class CountingBroker(AsyncBroker):
    """The real AsyncBroker, counting the send script calls its sends make."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.send_calls: list[int] = []  # messages per call

    async def _send_packed(self, dest, packed):
        self.send_calls.append(len(packed))
        return await super()._send_packed(dest, packed)


@pytest.fixture
async def aio(broker, redis_url, namespace, clock):
    client = redis.asyncio.Redis.from_url(redis_url)
    b = CountingBroker(client, namespace, clock, policies=broker.policies)
    await b.send("orders", Message(body="warm-up"))  # the destination made, the scripts loaded
    b.send_calls.clear()
    yield b
    await b.aclose()
    await client.aclose()


async def test_concurrent_sends_to_a_queue_share_script_calls_and_each_gets_its_own_ids(aio, broker):
    replies = await asyncio.gather(*(aio.send("orders", Message(body=f"m{i}")) for i in range(150)))
    assert all(len(ids) == 1 for ids in replies)
    ids = [ids[0] for ids in replies]
    assert len(set(ids)) == 150 and all(i.status == "ok" for i in ids)
    # the first went at once; the rest waited for it and went together, at most 100 to a call
    assert aio.send_calls == [1, 100, 49]
    stats = broker.stats("orders")
    assert (stats.queue_size, stats.enqueued) == (151, 151)
    c = broker.add_consumer("orders", ConsumerSpec(prefetch=1000))
    assert [d.message_id for d in drain(broker, c)][1:] == ids  # stored in the order the sends came


async def test_a_lone_send_goes_at_once(aio):
    ids = await aio.send("orders", [Message(body="a"), Message(body="b")])
    assert len(ids) == 2 and aio.send_calls == [2]


async def test_each_sender_keeps_its_own_order(aio, broker):
    async def producer(p: int) -> None:
        for n in range(15):
            await aio.send("orders", Message(body=f"{p}:{n}"))

    await asyncio.gather(*(producer(p) for p in range(8)))
    assert len(aio.send_calls) < 8 * 15  # grouped
    c = broker.add_consumer("orders", ConsumerSpec(prefetch=1000))
    bodies = [d.body for d in drain(broker, c)][1:]
    assert len(bodies) == 120
    for p in range(8):
        assert [b for b in bodies if b.startswith(f"{p}:")] == [f"{p}:{n}" for n in range(15)]


async def test_a_send_the_script_refuses_fails_alone_and_the_others_are_stored(aio, broker, policy):
    policy("orders", maxMessageSize=1024)
    sends = [aio.send("orders", Message(body="x" * 2000 if i == 5 else f"ok{i}")) for i in range(12)]
    results = await asyncio.gather(*sends, return_exceptions=True)
    assert isinstance(results[5], MessageTooLarge) and "maxMessageSize=1024" in str(results[5])
    assert all(isinstance(r, list) and r[0].status == "ok" for i, r in enumerate(results) if i != 5)
    assert max(aio.send_calls) > 1  # the others were grouped: the group was refused, then sent one by one
    assert broker.stats("orders").enqueued == 1 + 11


async def test_an_invalid_message_fails_its_own_send_before_any_grouping(aio, broker):
    results = await asyncio.gather(aio.send("orders", Message(body="a")),
                                   aio.send("orders", Message(body="b", priority=12)),
                                   aio.send("orders", Message(body="c")), return_exceptions=True)
    assert isinstance(results[1], InvalidMessage) and "priority" in str(results[1])
    assert [r[0].status for r in (results[0], results[2])] == ["ok", "ok"]
    assert sum(aio.send_calls) == 2
    assert broker.stats("orders").enqueued == 3


async def test_a_cancelled_waiting_send_is_not_sent(aio, broker):
    first = asyncio.ensure_future(aio.send("orders", Message(body="first")))
    await asyncio.sleep(0)  # under way
    waiting = asyncio.ensure_future(aio.send("orders", Message(body="never")))
    kept = asyncio.ensure_future(aio.send("orders", Message(body="kept")))
    await asyncio.sleep(0)
    waiting.cancel()
    await first
    assert (await kept)[0].status == "ok"
    with pytest.raises(asyncio.CancelledError):
        await waiting
    c = broker.add_consumer("orders", ConsumerSpec(prefetch=1000))
    assert [d.body for d in drain(broker, c)] == ["warm-up", "first", "kept"]
