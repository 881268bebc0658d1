"""A queue's statistics read its consumers a page a call (session 32): stats.lua's first call reads the
counters and the first calls.STATS_PAGE consumers of the dispatch order and copies the order; each call
after it reads a page of the copy, the last one deleting it. Nothing limits a queue's consumers, and one
call reading them all took 104 ms of CPU at 5,000 (docs/benchmarks.md, "Session 32")."""

from __future__ import annotations

from broker_core.destinations import parse_destination
from broker_core.effects import Eval
from broker_core.messages import Message
from broker_core.model import ConsumerRef, ConsumerSpec
from broker_core.scripts.calls import STATS_PAGE

MANY = 2 * STATS_PAGE + 50


def _consumers(broker, queue: str, count: int) -> list[str]:
    for i in range(count):
        broker.add_consumer(queue, ConsumerSpec(priority=i % 2, prefetch=i), consumer_id=f"c{i}")
    return _order(broker, queue)


def _order(broker, queue: str) -> list[str]:
    return [c.decode() for c in broker.redis.lrange(f"{broker.namespace}:{{q:{queue}}}:corder", 0, -1)]


def _stats_calls(broker, queue: str, between=None):
    """Drive the stats operation by hand: its result and the stats.lua calls it made; `between` runs after
    the first call."""
    op = broker.ops.stats(parse_destination(queue), broker._now())
    request, made = next(op), 0
    try:
        while True:
            reply = broker._step(request)
            if isinstance(request, Eval) and request.script == "stats":
                made += 1
                if made == 1 and between:
                    between()
            request = op.send(reply)
    except StopIteration as stop:
        return stop.value, made


def test_the_consumers_a_page_a_call(broker):
    order = _consumers(broker, "crowd", MANY)
    stats, made = _stats_calls(broker, "crowd")
    assert made == 3  # the first page with the counters, then two pages of the rest
    assert [c.consumer_id for c in stats.consumers] == order
    assert stats.consumer_count == MANY
    assert {c.consumer_id: c.prefetch for c in stats.consumers} == {f"c{i}": i for i in range(MANY)}
    assert broker.stats("crowd") == stats
    assert not broker.redis.keys(f"{broker.namespace}:*statsorder*")  # (the copy went with the last page)


def test_the_order_of_the_first_call(broker):
    """Deliveries between the pages rotate the order; the pages read the copy the first call made."""
    order = _consumers(broker, "crowd", MANY)
    stats, _ = _stats_calls(broker, "crowd", lambda: broker.send("crowd", [Message(body="m")] * 20))
    assert [c.consumer_id for c in stats.consumers] == order
    assert _order(broker, "crowd") != order  # (rotated meanwhile)


def test_a_consumer_closed_between_pages_is_left_out(broker):
    order = _consumers(broker, "crowd", MANY)
    late = order[-1]
    stats, made = _stats_calls(broker, "crowd", lambda: broker.close_consumer(
        ConsumerRef(parse_destination("crowd"), late)))
    assert made == 3
    assert [c.consumer_id for c in stats.consumers] == order[:-1]
    assert stats.consumer_count == MANY - 1


async def test_many_queues_stats_with_a_crowded_one(broker, aio):
    order = _consumers(broker, "crowd", MANY)
    _consumers(broker, "few", 3)
    crowd, few, gone = await aio.stats_many(["crowd", "few", "never.made"])
    assert [c.consumer_id for c in crowd.consumers] == order
    assert len(few.consumers) == 3 and gone is None
