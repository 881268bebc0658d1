"""Messages of a group whose owner's window is full (dispatch.lua, the walk recorded in `dispatch.pass`): each
is offered to every consumer and taken by none. Within a chunk, once one such message was walked past them
all, the next ones of a group with the same owner are passed over without the walk, so the chunk's work
budget (dispatch.CONSUMER_STEPS) no longer ends it every few messages. What is stored must be what the walks
stored: the test beside the count compares a queue where every message is walked (one consumer has a selector
that matches everything: a walk that evaluates a selector is not recorded) with one where they are not."""

from __future__ import annotations

import random

import pytest

from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from broker_core.scripts import calls

CONSUMERS = 300


def prefix(broker, queue: str) -> str:
    return f"{broker.namespace}:{{q:{queue}}}"


def chunks_run(monkeypatch, send) -> int:
    """How many chunks of the pass the driver ran after `send()`'s own call (ops/context.py
    continue_dispatch)."""
    counted = []
    made = calls.Dispatch.call
    monkeypatch.setattr(calls.Dispatch, "call", lambda *a, **k: counted.append(a) or made(*a, **k))
    try:
        send()
    finally:
        monkeypatch.undo()
    return len(counted)


def group_owner(redis_client, broker, queue: str, group: str) -> str:
    return redis_client.hget(f"{prefix(broker, queue)}:groups", group).decode().split("|")[0]


def test_messages_of_a_group_whose_owner_is_full_go_past_in_one_chunk(broker, redis_client, monkeypatch):
    refs = {f"c{i}": broker.add_consumer("blocked", ConsumerSpec(prefetch=1), consumer_id=f"c{i}")
            for i in range(CONSUMERS)}
    broker.send("blocked", Message(body="w", group_id="G"))  # its owner's window is full from here
    owner = group_owner(redis_client, broker, "blocked", "G")
    p = prefix(broker, "blocked")
    clock = int(redis_client.hget(f"{p}:meta", "gclock") or 0)
    batch = [Message(body=f"m{n}", message_id=f"m{n}", group_id="G") for n in range(100)]
    # each walk is 300 consumers of OFFER_STEPS: 6 messages a chunk, 16 more chunks, when each was walked
    assert chunks_run(monkeypatch, lambda: broker.send("blocked", batch)) == 0
    stats = broker.stats("blocked")
    assert stats.pending == 100 and stats.skipped == 100
    # the owner was found full, every other consumer with room; each message touched its group's entry
    # in the cached map once (LinkedHashMap access order), as the walk's first offer does
    slow = {f"c{i}" for i in range(CONSUMERS) if redis_client.hexists(f"{p}:c:c{i}", "slow_since")}
    assert slow == {owner}
    assert int(redis_client.hget(f"{p}:meta", "gclock")) == clock + 100
    # the owner takes them, in order, as its window frees
    got = broker.receive(refs[owner], 1)
    for n in range(100):
        broker.ack(refs[owner], got[n].message_id)
        got += broker.receive(refs[owner], 1)
    assert [d.body for d in got] == ["w"] + [f"m{n}" for n in range(100)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_pass_without_the_walks_stores_what_the_walks_store(broker, redis_client, monkeypatch, seed):
    """The same consumers and messages on two queues; on "walked" one consumer's selector (1 = 1, matching
    every message) makes every message's walk evaluate it, so none is passed over. Groups with full owners,
    groups taken over (JMSXGroupSeq 1) and closed (-1), messages in no group, noLocal consumers, two
    connections, windows freed between batches: the deliveries, group owners, slow marks, skipped counts
    and the cached map's order must be the same."""
    rnd = random.Random(seed)
    n = 60
    specs = []
    for _ in range(n):
        nolocal = rnd.random() < 0.15
        specs.append(dict(prefetch=rnd.choice((1, 1, 2, 3)), priority=rnd.choice((0, 0, 0, 1)),
                          no_local=nolocal, connection_id=rnd.choice(("A", "B")) if nolocal else None))
    matcher = rnd.randrange(n)  # (never full: left out for it, its selector would not be evaluated)
    specs[matcher] = dict(prefetch=1000, priority=0, no_local=False, connection_id=None)
    refs: dict[str, dict] = {"plain": {}, "walked": {}}
    for q in ("plain", "walked"):
        for i, spec in enumerate(specs):
            selector = "1 = 1" if q == "walked" and i == matcher else None
            refs[q][i] = broker.add_consumer(q, ConsumerSpec(selector=selector, **spec), consumer_id=f"c{i}")

    def batch(round_: int) -> list[Message]:
        out = []
        for k in range(150):
            group = rnd.choice(("G0",) * 6 + ("G1", "G2", "G3", None))
            seq = rnd.choice((0,) * 12 + (1, -1, 2))
            out.append(Message(body=f"r{round_}m{k}", message_id=f"r{round_}m{k}", group_id=group,
                               group_seq=seq if group else 0, connection_id=rnd.choice(("A", "B", None))))
        return out

    def state(q: str) -> dict:
        p = prefix(broker, q)
        meta = redis_client.hgetall(f"{p}:meta")
        return {
            "outboxes": {f"c{i}": redis_client.lrange(f"{p}:c:c{i}:outbox", 0, -1) for i in range(n)},
            "slow": {f"c{i}" for i in range(n) if redis_client.hexists(f"{p}:c:c{i}", "slow_since")},
            "owners": {g: v.split(b"|")[0] for g, v in redis_client.hgetall(f"{p}:groups").items()},
            "lru": redis_client.zrange(f"{p}:glru", 0, -1, withscores=True),
            "meta": {k: meta.get(k) for k in (b"skipped", b"gclock", b"dispatched", b"cursor", b"resume")},
            "pending": redis_client.zrange(f"{p}:pending", 0, -1),
            "order": redis_client.lrange(f"{p}:corder", 0, -1),
        }

    chunks = {"plain": 0, "walked": 0}  # the chunks the driver ran after each send's own
    for round_ in range(3):
        messages = batch(round_)
        for q in ("plain", "walked"):
            chunks[q] += chunks_run(monkeypatch, lambda q=q, m=messages: broker.send(q, m))
        assert state("plain") == state("walked")
        # some windows free: each queue's consumers take and ack what they have, the same ones on both
        freed = rnd.sample(range(n), n // 3)
        for q in ("plain", "walked"):
            for i in freed:
                got = broker.receive(refs[q][i], 3)
                if got:
                    broker.ack(refs[q][i], got[-1].message_id)  # (client mode: cumulative)
        assert state("plain") == state("walked")
    assert broker.stats("plain").selector_errors == broker.stats("walked").selector_errors == 0
    assert broker.stats("plain").dispatched > 0 and broker.stats("plain").skipped > 0
    # (messages were passed over on "plain": its pass needed fewer chunks)
    assert chunks["plain"] < chunks["walked"]


def test_messages_passed_over_after_the_chunks_budget_was_spent(broker, redis_client, monkeypatch):
    """Seven groups, each owned by a full consumer: seven walks of 300 consumers (10,500 steps) spend the
    chunk's budget; the messages after them of the last group's owner are still passed over in that chunk,
    and the chunk ends before the next message that needs a walk. On "walked" the last consumer's selector
    (matching all) makes every message's walk evaluate it: what both store is the same."""
    chunks = {}
    for q in ("plain", "walked"):
        for i in range(CONSUMERS - 1):
            broker.add_consumer(q, ConsumerSpec(prefetch=1), consumer_id=f"c{i}")
        broker.add_consumer(q, ConsumerSpec(prefetch=1000, selector="1 = 1" if q == "walked" else None),
                            consumer_id="last")
        broker.send(q, [Message(body=f"w{g}", group_id=f"G{g}") for g in range(7)])  # c0..c6, full
        batch = [Message(body=f"a{g}", message_id=f"a{g}", group_id=f"G{g}") for g in range(7)]
        batch += [Message(body=f"b{n}", message_id=f"b{n}", group_id="G6") for n in range(50)]
        batch += [Message(body="c", message_id="c", group_id="G0")]
        chunks[q] = chunks_run(monkeypatch, lambda q=q, batch=batch: broker.send(q, batch))
    # the send's chunk ends before "c" (its walk would pass the budget further), the next one walks it
    assert chunks["plain"] == 1
    assert chunks["walked"] > 5

    def state(q: str) -> dict:
        p = prefix(broker, q)
        meta = redis_client.hgetall(f"{p}:meta")
        return {
            "owners": {g: v.split(b"|")[0] for g, v in redis_client.hgetall(f"{p}:groups").items()},
            "slow": {c for c in [f"c{i}" for i in range(CONSUMERS - 1)] + ["last"]
                     if redis_client.hexists(f"{p}:c:{c}", "slow_since")},
            "lru": redis_client.zrange(f"{p}:glru", 0, -1, withscores=True),
            "meta": {k: meta.get(k) for k in (b"skipped", b"gclock", b"dispatched", b"cursor", b"resume")},
            "pending": redis_client.zrange(f"{p}:pending", 0, -1),
        }

    assert state("plain") == state("walked")
    assert broker.stats("plain").skipped == 58 and broker.stats("plain").pending == 58
    assert state("plain")["slow"] == {f"c{g}" for g in range(7)}
