"""A destination's deletion in bounded calls (session 30): what grows with the data (forward records of
virtual copies still owed, consumers and closed consumers, ended subscriptions' keys) is drained
admin.DELETE_CHUNK entries a call before the call that deletes the rest (destination_delete.lua); a
deletion stopped between calls leaves the targets' counts right and is finished by a repeated delete; a
consumer added or a copy owed meanwhile goes with it. And release_ended looks at a bounded number of
ended subscriptions' keys a call (lifecycle.lua ENDED_LOOKS)."""

from __future__ import annotations

import msgpack
import pytest

from broker_core.config.virtual import VirtualConfig
from broker_core.destinations import parse_destination
from broker_core.effects import Eval
from broker_core.errors import UnknownConsumer
from broker_core.keys import Home
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from broker_core.ops import admin, virtual
from broker_core.scripts import calls

CHUNK = 5
TARGETS = ("x.a", "x.b")


class Crash(Exception):
    pass


@pytest.fixture(autouse=True)
def _small_chunk(monkeypatch):
    monkeypatch.setattr(admin, "DELETE_CHUNK", CHUNK)


def deletion_calls(broker, dest, between=None, stop_after=None):
    """Drive the deletion of `dest` one request at a time; before each destination_delete call, `between`
    (call number) runs, and the sizes of the parts it drains are read. Raises Crash before call number
    `stop_after` + 1 (a process dying there). Returns the sizes seen before each call, and the last."""
    op = broker.ops.delete_destination(parse_destination(dest), broker._now())
    prefix = broker.ops.prefix(parse_destination(dest))
    seen, request, n = [], next(op), 0
    try:
        while True:
            if isinstance(request, Eval) and request.script == "destination_delete":
                if stop_after is not None and n == stop_after:
                    op.close()
                    raise Crash
                if between:
                    between(n)
                seen.append((broker.redis.hlen(f"{prefix}:fwd"), broker.redis.hlen(f"{prefix}:consumers")))
                n += 1
            request = op.send(broker._step(request))
    except StopIteration:
        pass
    seen.append((broker.redis.hlen(f"{prefix}:fwd"), broker.redis.hlen(f"{prefix}:consumers")))
    return seen


def owing(broker, count: int) -> None:
    """Composite queue x owing `count` copies to each of TARGETS: its sends' forwards never ran."""
    op = broker.ops.send(parse_destination("x"), [Message(body="s") for _ in range(count)], broker._now())
    request = next(op)
    while not (hasattr(request, "args") and request.args[0] == "HSCAN"):  # stop where it would forward
        request = op.send(broker._step(request))
    op.close()


def memfwd(broker, name: str) -> int:
    return int(broker.redis.hget(f"{broker.ops.prefix(parse_destination(name))}:meta", "memfwd") or 0)


@pytest.fixture
def composite(broker):
    virtual.configure(broker, VirtualConfig.from_config(
        {"compositeQueue": [{"name": "x", "forwardTo": list(TARGETS), "forwardOnly": False}]}))
    for name in (*TARGETS, "x"):
        broker.ensure_destination(name)


def test_owed_copies_are_drained_a_chunk_a_call_each_uncharged_from_its_target(broker, composite):
    owing(broker, 11)  # 22 records
    assert memfwd(broker, "x.a") > 0
    seen = deletion_calls(broker, "x")
    drained = [a[0] - b[0] for a, b in zip(seen, seen[1:], strict=False)]
    assert seen[0][0] == 22 and seen[-1][0] == 0
    assert max(drained) <= CHUNK and len(drained) == 5  # 5, 5, 5, 5, then the last 2 with the rest
    assert [memfwd(broker, t) for t in TARGETS] == [0, 0]
    assert "queue://x" not in broker.destinations()


def test_a_deletion_stopped_between_calls_leaves_counts_right_and_a_repeat_finishes_it(broker, composite):
    owing(broker, 6)  # 12 records, each charging its target the same
    charge = memfwd(broker, "x.a") // 6
    with pytest.raises(Crash):
        deletion_calls(broker, "x", stop_after=2)  # two drain calls of 5 records ran
    left = broker.redis.hvals(f"{broker.ops.prefix(parse_destination('x'))}:fwd")
    assert len(left) == 2
    # what is left still counts against its target, what was drained no longer does
    owed = {t: 0 for t in TARGETS}
    for packed in left:
        record = msgpack.unpackb(packed, raw=True)
        owed[record[0].decode().removeprefix("queue://")] += record[5]
    assert [memfwd(broker, t) for t in TARGETS] == [owed[t] for t in TARGETS]
    assert sum(owed.values()) == 2 * charge
    assert "queue://x" in broker.destinations()  # not deleted yet: listed, its messages there
    assert broker.delete_destination("x") == 6  # the repeat finishes it, counting what it held
    assert [memfwd(broker, t) for t in TARGETS] == [0, 0]
    assert "queue://x" not in broker.destinations()
    assert list(broker.redis.scan_iter(match=f"{broker.ops.prefix(parse_destination('x'))}*")) == []


def test_a_copy_owed_or_a_consumer_added_between_calls_goes_with_the_deletion(broker, composite):
    owing(broker, 6)
    for i in range(7):
        broker.add_consumer("x", ConsumerSpec(prefetch=1), consumer_id=f"c{i}")
    late = []

    def meanwhile(n: int) -> None:
        if n == 1:
            owing(broker, 1)  # two more records
            late.append(broker.add_consumer("x", ConsumerSpec(prefetch=1), consumer_id="late"))

    seen = deletion_calls(broker, "x", between=meanwhile)
    assert max(a[0] - b[0] + a[1] - b[1] for a, b in zip(seen, seen[1:], strict=False)) <= CHUNK + 2
    assert [memfwd(broker, t) for t in TARGETS] == [0, 0]
    assert list(broker.redis.scan_iter(match=f"{broker.ops.prefix(parse_destination('x'))}*")) == []
    with pytest.raises(UnknownConsumer):
        broker.receive(late[0])


def test_many_consumers_go_a_chunk_a_call_with_their_keys(broker, redis_client):
    refs = [broker.add_consumer("q", ConsumerSpec(prefetch=1), consumer_id=f"c{i}") for i in range(13)]
    broker.send("q", [Message(body="m") for _ in range(4)])
    broker.close_consumer(refs[0])
    seen = deletion_calls(broker, "q")
    consumers = [s[1] for s in seen]
    assert consumers[0] == 12 and consumers[-1] == 0
    assert max(a - b for a, b in zip(consumers, consumers[1:], strict=False)) <= CHUNK
    assert list(redis_client.scan_iter(match=f"{broker.ops.prefix(parse_destination('q'))}*")) == []


def test_a_deletion_stopped_after_some_consumers_went_leaves_the_others_served_in_order(broker, redis_client):
    """The drain takes consumers off the head of the dispatch order: the ones left stay in it, so a queue
    whose deletion stopped there (its driver died) still delivers to them, and a consumer added then is
    placed among them by a sort of whoever is left."""
    refs = [broker.add_consumer("q", ConsumerSpec(prefetch=10), consumer_id=f"c{i}") for i in range(8)]
    with pytest.raises(Crash):
        deletion_calls(broker, "q", stop_after=1)  # one drain call: CHUNK consumers gone, 3 left
    prefix = broker.ops.prefix(parse_destination("q"))
    left = [c.decode() for c in redis_client.lrange(f"{prefix}:corder", 0, -1)]
    assert left == ["c5", "c6", "c7"] and redis_client.hlen(f"{prefix}:consumers") == 3
    broker.send("q", [Message(body=f"m{i}") for i in range(6)])
    got = {r.consumer_id: len(broker.receive(r, 10)) for r in refs[5:]}
    assert sum(got.values()) == 6 and all(got.values()), got
    with pytest.raises(UnknownConsumer):
        broker.receive(refs[0], 1)
    late = broker.add_consumer("q", ConsumerSpec(prefetch=10, priority=9), consumer_id="late")
    assert redis_client.lindex(f"{prefix}:corder", 0) == b"late"  # (the highest priority first)
    broker.delete_destination("q")
    assert list(redis_client.scan_iter(match=f"{prefix}*")) == []
    with pytest.raises(UnknownConsumer):
        broker.receive(late, 1)


def command_calls(redis_client, command: str) -> int:
    return int(redis_client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_release_of_ended_subscriptions_looks_at_a_bounded_number_of_their_keys(broker, redis_client):
    """300 offline durable subscriptions, each holding a message, end at once (their pending sets in the
    topic's :ended): one return_owed call of 1 message looked at every one of them (a ZCARD each, 35 ms a
    call at 10,000); now at most ENDED_LOOKS (100)."""
    topic = "topic://ended"
    for i in range(300):
        spec = ConsumerSpec(client_id="app", subscription_name=f"d{i}")
        broker.close_consumer(broker.add_consumer(topic, spec))
    broker.send(topic, Message(body="x"))
    dest = parse_destination(topic)
    prefix = broker.ops.prefix(dest)
    # removed, but their messages not released yet: the expiry's own return_owed stopped before it ran
    op = broker.ops.expire_offline_durables(dest, 0, broker._now() + 1)
    request = next(op)
    while not (isinstance(request, Eval) and request.script == "return_owed"):
        request = op.send(broker._step(request))
    op.close()
    assert redis_client.scard(f"{prefix}:ended") == 300
    before = command_calls(redis_client, "zcard")
    owed = calls.ReturnOwed.parse(broker._step(calls.ReturnOwed.call(prefix, broker._now(), 1))).owed
    assert command_calls(redis_client, "zcard") - before <= 100 + 5  # (a few of its other ZCARDs)
    assert owed == 299
    broker._run(broker.ops.return_owed(Home(dest), broker._now()))  # the rest, a chunk a call
    assert redis_client.scard(f"{prefix}:ended") == 0
    assert redis_client.hlen(f"{prefix}:msgs") == 0  # each released: the message no longer stored


def test_transactions_reservations_go_a_chunk_a_call(broker, redis_client):
    """Open transactions' reservations on a queue with a memory limit (its `:memres`, and the broker's
    `flow.usage:res`) are drained with it: none is left holding the broker's space."""
    broker.policies.set_entry("queue", "r", {"memoryLimit": 10_000_000})
    broker.refresh_policies()
    prefix = broker.ops.prefix(parse_destination("r"))
    for _ in range(2 * CHUNK + 1):
        broker.send("r", Message(body="s"), tx=broker.begin())
    assert redis_client.hlen(f"{prefix}:memres") == 2 * CHUNK + 1
    usage_res = f"{broker.namespace}:usage:res"
    assert sum(1 for k in redis_client.hkeys(usage_res) if k.endswith(prefix.encode())) == 2 * CHUNK + 1
    left = []
    deletion_calls(broker, "r", between=lambda n: left.append(redis_client.hlen(f"{prefix}:memres")))
    assert left == [11, 6, 1]  # 5 a call, the last with the rest
    assert not [k for k in redis_client.hkeys(usage_res) if k.endswith(prefix.encode())]
    assert list(redis_client.scan_iter(match=f"{prefix}*")) == []


def test_a_topic_s_queued_fan_outs_go_a_chunk_a_call(broker, redis_client):
    """Fan-outs a sender left unfinished (each message to more subscriptions than a call takes: its own
    list of their keys, fanout.lua) are dropped with the topic, CHUNK of them a call."""
    topic = "topic://wide"
    for i in range(40):  # more than fanout.MAX_TAKERS
        spec = ConsumerSpec(client_id="app", subscription_name=f"d{i}")
        broker.close_consumer(broker.add_consumer(topic, spec))
    dest = parse_destination(topic)
    prefix = broker.ops.prefix(dest)
    op = broker.ops.send(dest, [Message(body="x") for _ in range(12)], broker._now())
    request = next(op)
    while not (isinstance(request, Eval) and request.script == "topic_fanout"):  # the sender dies here
        request = op.send(broker._step(request))
    op.close()
    assert redis_client.llen(f"{prefix}:fanout") == 12
    queued = []
    deletion_calls(broker, topic, between=lambda n: queued.append(redis_client.llen(f"{prefix}:fanout")))
    queued.append(redis_client.llen(f"{prefix}:fanout"))
    assert queued[0] == 12 and queued[-1] == 0
    # (the removed subscriptions' ended keys share the calls)
    assert max(a - b for a, b in zip(queued, queued[1:], strict=False)) <= CHUNK
    assert list(redis_client.scan_iter(match=f"{prefix}*")) == []
