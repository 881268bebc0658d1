"""AsyncBroker's group commit (broker_core/drivers/coalesce.py): concurrent sends to one queue, and
concurrent acks
of its consumers, share script calls, and each caller still gets exactly what it would have got alone."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from broker_core.broker import AsyncBroker
from broker_core.destinations import Destination
from broker_core.drivers.coalesce import Coalescer
from broker_core.errors import InvalidMessage, MessageTooLarge, NotInFlight, ResourceAllocationError
from broker_core.messages import Message
from broker_core.model import ConsumerSpec

from ..helpers.broker import drain


class CountingBroker(AsyncBroker):
    """The real AsyncBroker, counting the send and ack script calls its sends and acks make."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.send_calls: list[int] = []  # messages per call
        self.ack_calls: list[int] = []  # consumers per call

    async def _send_groups(self, dest, groups):
        self.send_calls.append(sum(len(packed) for packed in groups))
        return await super()._send_groups(dest, groups)

    async def _ack_groups(self, dest, requests):
        self.ack_calls.append(len(requests))
        return await super()._ack_groups(dest, requests)


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


async def test_a_group_over_a_memory_limit_that_fails_at_once_is_sent_again_one_by_one(aio, broker, policy):
    policy("orders", memoryLimit=3 * 1100, sendFailIfNoSpace=True)  # the warm-up message holds 1,024
    kb = "k" * 1000
    results = await asyncio.gather(*(aio.send("orders", Message(body=kb)) for _ in range(3)),
                                   return_exceptions=True)
    # the first went alone; the other two did not fit together, so each went on its own: one fitted
    assert [type(r).__name__ for r in results] == ["list", "list", "ResourceAllocationError"]
    assert aio.send_calls == [1, 2, 1, 1]
    assert broker.stats("orders").enqueued == 3


async def test_a_group_that_waited_for_space_in_vain_fails_as_a_whole(aio, broker, policy):
    policy("orders", memoryLimit=2 * 1100, sendFailIfNoSpaceAfterTimeout=200)
    kb = "k" * 1000
    results = await asyncio.gather(*(aio.send("orders", Message(body=kb)) for _ in range(3)),
                                   return_exceptions=True)
    assert isinstance(results[0], list)
    # the group waited its 200 ms for room for both and gave up: each of them had waited that long
    assert all(isinstance(r, ResourceAllocationError) and r.details["waited_ms"] >= 200 for r in results[1:])
    assert aio.send_calls == [1, 2]  # not sent again one by one, which would wait as long again
    assert broker.stats("orders").enqueued == 2


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


async def _consumers_with_one_message_each(aio, broker, n):
    consumers = [await aio.add_consumer("work", ConsumerSpec(prefetch=1, ack_mode="client-individual"))
                 for _ in range(n)]
    await aio.send("work", [Message(body=f"w{i}") for i in range(3 * n)])
    firsts = [(await aio.receive(c, 1))[0] for c in consumers]
    return consumers, firsts


async def test_concurrent_acks_of_different_consumers_share_a_call_and_each_gets_its_next_one(aio, broker):
    consumers, firsts = await _consumers_with_one_message_each(aio, broker, 8)
    pairs = zip(consumers, firsts, strict=True)
    nexts = await asyncio.gather(*(aio.ack_and_receive(c, d.message_id) for c, d in pairs))
    assert aio.ack_calls[0] == 1 and sum(aio.ack_calls) == 8 and len(aio.ack_calls) < 8
    assert all(len(got) == 1 for got in nexts)  # each window had room again: one more message each
    seen = [d.message_id for d in firsts] + [got[0].message_id for got in nexts]
    assert len(set(seen)) == 16  # no message handed to two consumers
    for c, got in zip(consumers, nexts, strict=True):
        assert got[0].consumer_id == c.consumer_id
    stats = broker.stats("work")
    assert (stats.dequeued, stats.in_flight, stats.queue_size) == (8, 8, 16)


async def test_an_ack_the_script_refuses_fails_alone_and_the_others_are_applied(aio, broker):
    consumers, firsts = await _consumers_with_one_message_each(aio, broker, 6)
    acks = [aio.ack(c, "ID:not-in-flight" if i == 2 else d.message_id)
            for i, (c, d) in enumerate(zip(consumers, firsts, strict=True))]
    results = await asyncio.gather(*acks, return_exceptions=True)
    assert isinstance(results[2], NotInFlight) and "ID:not-in-flight" in str(results[2])
    assert [r for i, r in enumerate(results) if i != 2] == [1] * 5
    assert max(aio.ack_calls) > 1  # grouped, refused as a whole, then one by one
    assert broker.stats("work").dequeued == 5


async def test_two_acks_of_one_consumer_never_share_a_call(aio, broker):
    c = await aio.add_consumer("work", ConsumerSpec(prefetch=10, ack_mode="client-individual"))
    other = await aio.add_consumer("work", ConsumerSpec(prefetch=10, ack_mode="client-individual"))
    await aio.send("work", [Message(body=f"w{i}") for i in range(6)])
    mine, theirs = await aio.receive(c, 10), await aio.receive(other, 10)
    results = await asyncio.gather(aio.ack(other, theirs[0].message_id), aio.ack(c, mine[0].message_id),
                                   aio.ack(c, mine[1].message_id), aio.ack(other, theirs[1].message_id))
    assert results == [1, 1, 1, 1]
    # the first went at once; then the second ack of `c` waited for its first, and so did what came after it
    assert aio.ack_calls == [1, 1, 2]
    assert broker.stats("work").dequeued == 4


def test_one_ack_call_naming_a_consumer_twice_or_a_message_not_in_flight_changes_nothing(broker):
    a = broker.add_consumer("work", ConsumerSpec(prefetch=10, ack_mode="client-individual"))
    b = broker.add_consumer("work", ConsumerSpec(prefetch=10, ack_mode="client-individual"))
    broker.send("work", [Message(body=f"w{i}") for i in range(4)])
    got_a, got_b = broker.receive(a, 10), broker.receive(b, 10)
    dest = a.destination
    with pytest.raises(NotInFlight, match="named twice"):
        broker._run(broker.ops.ack_many(dest, [(a, [got_a[0].message_id], "individual", 0),
                                               (a, [got_a[1].message_id], "individual", 0)], 0))
    with pytest.raises(NotInFlight, match="not in flight"):
        broker._run(broker.ops.ack_many(dest, [(a, [got_a[0].message_id], "individual", 0),
                                               (b, ["ID:nope"], "individual", 0)], 0))
    assert broker.stats("work").dequeued == 0  # the first consumer's valid ack was not applied either
    acked = broker._run(broker.ops.ack_many(dest, [(a, [got_a[0].message_id], "individual", 1),
                                                   (b, [got_b[0].message_id], "individual", 0)], 0))
    assert [n for n, _ in acked] == [1, 1] and acked[1][1] == []
    assert broker.stats("work").dequeued == 2


async def test_calls_waiting_behind_a_cancelled_group_still_go():
    """The grouping itself (coalesce.py): a group task cancelled while its call is under way (its event
    loop closing, say) leaves none of the calls behind it waiting for ever."""
    gates = {"first": asyncio.Event(), "held": asyncio.Event()}
    calls: list[list[str]] = []

    async def store(dest, items):
        calls.append(list(items))
        if items[0] in gates:
            await gates[items[0]].wait()  # under way until the test says
        return [f"done {item}" for item in items]

    grouped = Coalescer(store, refused=lambda error: False, tag=lambda item: item.split()[0])
    dest = Destination("queue", "q")
    lone = asyncio.ensure_future(grouped.run(dest, "first"))
    await asyncio.sleep(0)  # under way
    held = asyncio.ensure_future(grouped.run(dest, "held"))
    after = asyncio.ensure_future(grouped.run(dest, "held again"))  # same tag: the next call, not this one
    await asyncio.sleep(0)  # both waiting
    gates["first"].set()
    assert await lone == "done first"
    await asyncio.sleep(0)  # the group of "held" under way
    [group_task] = list(grouped._tasks)
    group_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held  # its call was under way when its group was cancelled
    assert await asyncio.wait_for(after, 2) == "done held again"
    assert calls == [["first"], ["held"], ["held again"]]
