"""A queue consumer's add without reading the other consumers (session 30): consumer_add.lua puts the
newcomer where ActiveMQ's sort of every consumer puts it (priority, then assigned group count once the queue
has a group map; ties in their order) from the kept priority counts (`<queue>:prios`) and, when the order is
known to be sorted (meta `ordered`), a binary search of the newcomer's band; otherwise it reads and sorts
them all, as before. (A queue's consumers are limited, SIGNALBOX_MAX_CONSUMERS: test_consumer_limit.py.)"""

from __future__ import annotations

import random

import pytest

from broker_core.destinations import parse_destination
from broker_core.messages import Message
from broker_core.model import ConsumerRef, ConsumerSpec
from broker_core.scripts import calls

# counts what the server ran (INFO commandstats): on a server of its own (tests/conftest.py redis_url)
pytestmark = pytest.mark.private_redis

CONSUMERS = 300


def prefix(broker, queue: str) -> str:
    return f"{broker.namespace}:{{q:{queue}}}"


def order(broker, queue: str) -> list[str]:
    return [c.decode() for c in broker.redis.lrange(f"{prefix(broker, queue)}:corder", 0, -1)]


def command_calls(client, *names: str) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{n}", {}).get("calls", 0)) for n in names)


def test_an_add_reads_no_other_consumer(broker, redis_client):
    gone = broker.add_consumer("many", ConsumerSpec(), consumer_id="gone")
    for i in range(CONSUMERS):
        broker.add_consumer("many", ConsumerSpec(priority=i % 3), consumer_id=f"c{i}")
    broker.close_consumer(gone)  # (the queue's group map: the order is by group count too)
    # a group assigned (the dispatch pass sorts the consumers again after the delivery, as it rotates them)
    broker.send("many", Message(body="g", group_id="G"))
    reads = command_calls(redis_client, "hmget", "hget", "lindex")
    broker.add_consumer("many", ConsumerSpec(priority=1), consumer_id="last")
    reads = command_calls(redis_client, "hmget", "hget", "lindex") - reads
    # each consumer's definition and counters were read (2 a consumer); now the kept counts and a binary
    # search of the band (log2(100) group counts, each an LINDEX and an HGET) and the add's own reads
    assert reads < 60
    ids = order(broker, "many")
    # after every consumer of priority 2 but the one that took the group, which went last of them; after
    # those of priority 1 that were there before (none has a group)
    twos = [f"c{i}" for i in range(2, CONSUMERS, 3)]
    assert ids[:CONSUMERS // 3] == twos[1:] + ["c2"]
    assert ids.index("last") == CONSUMERS // 3 * 2
    assert ids[-CONSUMERS // 3:] == [f"c{i}" for i in range(0, CONSUMERS, 3)]


def _step(broker, rnd: random.Random, queue: str, n: int, live: list) -> None:
    """One random change to `queue` (the same on each queue for the same `rnd` state)."""
    kind = rnd.random()
    if kind < 0.45 or len(live) < 2:
        spec = ConsumerSpec(priority=rnd.choice((-1, 0, 0, 2)), prefetch=50, exclusive=rnd.random() < 0.05)
        c = broker.add_consumer(queue, spec, consumer_id=f"c{n}")
        live.append(c)
    elif kind < 0.6:
        broker.close_consumer(live.pop(rnd.randrange(len(live))))
    elif kind < 0.9:
        group = f"G{rnd.randrange(6)}"
        seq = -1 if rnd.random() < 0.25 else 0
        broker.send(queue, Message(body="m", group_id=group, group_seq=seq))
    else:
        c = rnd.choice(live)
        for d in broker.receive(c, 5):
            broker.ack(c, d.message_id)


def test_the_order_is_the_full_sorts(broker):
    """The same random adds, closes, grouped sends (group closes among them) and acks on two queues; on
    one, the order is forgotten as sorted before each add, so each add reads and sorts every consumer, as
    every add did before. The orders stay the same throughout, and so do the deliveries."""
    bounded = 0  # adds on the first queue that found the order sorted (so read no other consumer)
    for seed in range(4):
        queues = (f"kept{seed}", f"full{seed}")
        lives: dict[str, list] = {q: [] for q in queues}
        rnds = {q: random.Random(seed) for q in queues}
        for n in range(120):
            for q in queues:
                ordered = broker.redis.hget(f"{prefix(broker, q)}:meta", "ordered") == b"1"
                if q.startswith("full"):
                    broker.redis.hdel(f"{prefix(broker, q)}:meta", "ordered")
                size = len(lives[q])
                _step(broker, rnds[q], q, n, lives[q])
                bounded += q.startswith("kept") and ordered and len(lives[q]) > size
            kept, full = (order(broker, q) for q in queues)
            assert kept == full, (seed, n)
        assert broker.stats(queues[0]).dispatched == broker.stats(queues[1]).dispatched
    assert bounded >= 40


def test_priorities_once_counted_survive_closes(broker, redis_client):
    for i in range(6):
        broker.add_consumer("p", ConsumerSpec(priority=i % 2), consumer_id=f"c{i}")
    for i in (1, 3, 5):
        broker.close_consumer(ConsumerRef(parse_destination("p"), f"c{i}"))
    counts = {k.decode(): int(v) for k, v in redis_client.hgetall(f"{prefix(broker, 'p')}:prios").items()}
    assert counts == {"0": 3}
    broker.add_consumer("p", ConsumerSpec(priority=0), consumer_id="c6")
    assert redis_client.hget(f"{prefix(broker, 'p')}:meta", "cprio") == b"0"
    assert order(broker, "p") == ["c0", "c2", "c4", "c6"]


def test_a_queue_of_more_consumers_than_one_command_takes(redis_client, namespace, clock):
    """Past about 8,000 consumers every list of them the scripts passed to one command (Lua's `unpack`
    limit) failed: the dispatch pass's read of the definitions, the order written back, the full
    consumers left out; so did an add that sorts them all (meta `ordered` gone). They are passed in slices.
    (Past the default SIGNALBOX_MAX_CONSUMERS: a broker without the limit, as an operator may run one.)"""
    from broker_core.broker import Broker

    broker = Broker(redis_client, namespace, clock, max_consumers=0)
    many = 9_000
    for i in range(many):
        broker.add_consumer("crowd", ConsumerSpec(prefetch=1), consumer_id=f"c{i}")
    # two messages: the first goes to the head of the order, the second needs the next consumer, which
    # reads the others' definitions, and the rotation writes the order back
    broker.send("crowd", [Message(body="a"), Message(body="b")])
    ids = order(broker, "crowd")
    assert len(ids) == many and ids[-2:] == ["c0", "c1"]
    redis_client.hdel(f"{prefix(broker, 'crowd')}:meta", "ordered")
    broker.add_consumer("crowd", ConsumerSpec(prefetch=1), consumer_id="last")
    assert order(broker, "crowd")[-3:] == ["c0", "c1", "last"]


def test_a_pass_that_sorts_every_consumer_per_delivery_stops_at_its_budget_and_goes_on(broker, redis_client,
                                                                                      monkeypatch):
    """With a group map or mixed priorities each delivery re-sorts every consumer (the round-robin), and a
    message whose group's owner is full is offered to each: a chunk of the pass counts that work
    (dispatch.lua dispatch.CONSUMER_STEPS, 10,000) and ends with `more` past it, the driver going
    on in the next call. Its deliveries are those of the same messages sent one at a time (a pass of one
    message each, which never reaches the budget): the same consumers, in the same order."""
    queues = ("batched", "single")
    for q in queues:
        gone = broker.add_consumer(q, ConsumerSpec(), consumer_id="gone")
        for i in range(CONSUMERS):
            broker.add_consumer(q, ConsumerSpec(priority=i % 3, prefetch=2), consumer_id=f"c{i}")
        broker.close_consumer(gone)  # (the group map: the order is by group count too)
    rnd = random.Random(7)
    batch = [Message(body=f"m{n}", message_id=f"m{n}", group_id=f"G{rnd.randrange(120)}") for n in range(200)]
    chunks = []  # the chunks the driver ran after the send's own (ops/context.py continue_dispatch)
    made = calls.Dispatch.call
    monkeypatch.setattr(calls.Dispatch, "call", lambda *a, **k: chunks.append(a) or made(*a, **k))
    broker.send("batched", batch)
    monkeypatch.undo()
    # stored 100 a call (docs/api.md "Batch send"): each part's 100 deliveries walk 300 consumers in the
    # sort, 30,000 steps: each part's pass goes on in calls of their own
    assert len(chunks) >= 4
    for message in batch:
        broker.send("single", message)

    def given(q: str) -> dict[str, list[str]]:
        p = prefix(broker, q)
        return {f"c{i}": [m.decode() for m in redis_client.lrange(f"{p}:c:c{i}:outbox", 0, -1)]
                for i in range(CONSUMERS)}

    assert given("batched") == given("single")
    assert order(broker, "batched") == order(broker, "single")
    assert broker.stats("batched").dispatched == broker.stats("single").dispatched > 0
