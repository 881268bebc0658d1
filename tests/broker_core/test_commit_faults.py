"""A transaction's commit stays all-or-nothing when one of its calls fails other than by refusing: a Lua
runtime error (a script error, not its error reply) or a call Redis refuses before it runs."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio

from broker_core.broker import AsyncBroker, Broker
from broker_core.clock import SystemClock
from broker_core.errors import TransactionError
from broker_core.messages import Message
from broker_core.model import TransactionLimits

from ..helpers.broker import KB, consumer, drain, full_queue

# counts what the server ran (INFO commandstats): on a server of its own (tests/conftest.py redis_url)
pytestmark = pytest.mark.private_redis


def _send_and_ack_in_a_transaction(broker: Broker) -> str:
    """An open transaction of two steps, for a fault to meet at its commit: a send to `audit`, then the
    ack of a message of `orders` (consumer `C`, transacted). Returns the transaction."""
    c = consumer(broker, prefetch=10, ack_mode="transacted", consumer_id="C")
    broker.send("orders", Message(body="m0"))
    (d,) = drain(broker, c)
    tx = broker.begin()
    broker.send("audit", Message(body="in-tx"), tx=tx)
    broker.ack(c, d.message_id, tx=tx)
    return tx


def test_a_step_that_dies_with_a_runtime_error_applies_nothing_after_it(broker, redis_client, namespace):
    """A step's script that raises (here: WRONGTYPE from a corrupted consumer key) never reaches the
    end of its call, where a refusal is recorded: the later steps must not apply, nor the commit end."""
    tx = _send_and_ack_in_a_transaction(broker)
    (inflight,) = [k for k in redis_client.keys(f"{namespace}*") if b"inflight" in k and b"C" in k]
    saved = redis_client.dump(inflight)
    redis_client.delete(inflight)
    redis_client.set(inflight, b"corrupt")  # the ack's ZSCORE raises WRONGTYPE
    with pytest.raises(TransactionError):
        broker.commit(tx)
    assert broker.stats("audit").enqueued == 0  # the send after the check that died did not land
    redis_client.delete(inflight)
    redis_client.restore(inflight, 0, saved)
    broker.commit(tx)  # still open, whole
    assert (broker.stats("audit").enqueued, broker.stats("orders").dequeued) == (1, 1)


def test_a_send_that_outlives_its_transaction_does_not_make_it_again(redis_url, namespace, redis_client):
    """A transacted send waiting for space (flow control) while its transaction ends (rolled back by its
    connection's close, or expired: its owner stopped renewing it) must not write a new transaction key
    when it gets room: one without a lifetime would hold its record (and its reservation) forever."""

    async def scenario():
        async with full_queue(redis_url, namespace, wait_ms=5000) as broker:
            tx = await broker.begin(60_000)
            waiting = asyncio.ensure_future(broker.send("orders", Message(body=KB), tx=tx))
            await asyncio.sleep(0.3)
            assert not waiting.done()  # waiting for room
            await broker.rollback(tx)
            await broker.purge("orders")  # room
            with pytest.raises(TransactionError, match="no open transaction"):
                await asyncio.wait_for(waiting, 5)

    asyncio.run(scenario())
    assert [k for k in redis_client.keys(f"{namespace}:tx:*")] == []


def test_a_call_over_several_destinations_is_not_taken_for_a_commit_step(redis_url, namespace, broker):
    """A commit's step has its transaction's key second (includes/base.lua begin_call); a script over
    several destinations has the second one's prefix there, which must not make it a step (it was: every
    summary of more than one destination was refused NOT_APPLIED)."""
    broker.send("a", Message(body="1"))
    broker.send("b", [Message(body="2"), Message(body="3")])

    async def main() -> list:
        client = redis.asyncio.Redis.from_url(redis_url)
        aio = AsyncBroker(client, namespace, SystemClock())
        try:
            found = await aio.summaries(["queue://a", "queue://b", "topic://t"])
            assert aio._summary_many  # (not given up as on a Redis Cluster: one call for both queues)
            return found
        finally:
            await aio.aclose()
            await client.aclose()

    broker.ensure_destination("topic://t")
    a, b, t = asyncio.run(main())
    assert (a.pending, b.pending, t.pending) == (1, 2, 0)


def test_a_namespace_with_a_hash_tag_keeps_the_commit_whole(redis_client, namespace):
    """A commit's step is known by its second key, the transaction's: `<ns>:tx:<id>`. One holding a `{`
    was taken for a script over several destinations, so with a namespace such as `{sb}` (one hash tag
    for every key, on a Redis Cluster) no step was one: a refused step left the later ones to apply and
    the commit ended as done, the refused send dropped without a word."""
    broker = Broker(redis_client, "{" + namespace + "}", SystemClock())
    tx = _send_and_ack_in_a_transaction(broker)
    broker.delete_destination("queue://audit")  # the send's step is refused
    with pytest.raises(TransactionError, match="nothing was applied"):
        broker.commit(tx)
    assert broker.stats("orders").dequeued == 0  # the ack after it did not apply
    broker.rollback(tx)


def _script_calls(redis_client) -> int:
    stats = redis_client.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval", "fcall"))


def test_a_transaction_alternating_between_destinations_commits_in_few_calls(redis_client, namespace, clock):
    """A commit is one MULTI/EXEC: every call in it holds Redis for every client. Taken in record order,
    a transaction that alternates between two queues (an order and its audit record, 250 times) made a
    call per message, and one acknowledging two consumers' messages in turn a call per ack: 500 sends
    held Redis 44-140 ms, 500 acks 38-98 ms (SLOWLOG), against about 10 ms for 500 sends to one queue.
    Each destination's sends, and each consumer's individual acks, go together in calls of up to 100, in
    their own order (within the MULTI/EXEC nothing sees the order across destinations). (700 sends and
    acks: past the default TransactionLimits, which this grouping is not about.)"""
    broker = Broker(redis_client, namespace, clock, transaction_limits=TransactionLimits(size=1000))
    c1 = consumer(broker, "in1", prefetch=1000, ack_mode="transacted", consumer_id="C1")
    c2 = consumer(broker, "in2", prefetch=1000, ack_mode="transacted", consumer_id="C2")
    broker.send("in1", [Message(body=f"a{n}") for n in range(100)])
    broker.send("in2", [Message(body=f"b{n}") for n in range(100)])
    d1, d2 = drain(broker, c1), drain(broker, c2)
    tx = broker.begin()
    for n in range(250):
        broker.send("orders", Message(body=f"o{n}"), tx=tx)
        broker.send("audit", Message(body=f"r{n}"), tx=tx)
    for a, b in zip(d1, d2, strict=True):
        broker.ack(c1, a.message_id, tx=tx)
        broker.ack(c2, b.message_id, tx=tx)
    before = _script_calls(redis_client)
    broker.commit(tx)
    calls = _script_calls(redis_client) - before
    # sends: 3 parts per queue, checked then applied; acks: 1 part per consumer, the same; 2 releases,
    # the end, and the dispatch passes after
    assert calls <= 40, calls
    orders, audit = consumer(broker, "orders", prefetch=1000), consumer(broker, "audit", prefetch=1000)
    assert [d.body for d in drain(broker, orders)] == [f"o{n}" for n in range(250)]
    assert [d.body for d in drain(broker, audit)] == [f"r{n}" for n in range(250)]
    assert (broker.stats("in1").dequeued, broker.stats("in2").dequeued) == (100, 100)


def test_a_commit_carries_each_body_once_and_still_checks_its_size(broker, policy, monkeypatch):
    """The commit's one MULTI/EXEC checks every send before any is stored, and each body Redis is given
    costs it a copy or two a byte while every client waits: the check gets each message's packed size and
    the message without its body, and refuses as before (here a maxMessageSize lowered since the send)."""
    from broker_core.drivers.loop import Transaction
    from broker_core.errors import TransactionError

    body = "b" * 100_000
    tx = broker.begin()
    broker.send("orders", Message(body=body), tx=tx)
    multi: list[tuple] = []
    perform = broker._perform

    def recorded(io):
        if isinstance(io, Transaction):
            multi.extend(io.commands)
        return perform(io)

    monkeypatch.setattr(broker, "_perform", recorded)
    policy("orders", maxMessageSize=50_000)
    with pytest.raises(TransactionError, match=r"is 1000\d\d bytes packed, over the destination limit "
                                               r"maxMessageSize=50000"):
        broker.commit(tx)
    carried = sum(len(arg) for command in multi for arg in command if isinstance(arg, bytes | str))
    assert len(body) < carried < 2 * len(body), carried
    policy("orders", maxMessageSize=1_000_000)
    broker.commit(tx)  # still open, whole
    assert broker.stats("orders").queue_size == 1
