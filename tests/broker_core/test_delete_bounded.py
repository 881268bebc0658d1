"""A destination's deletion in bounded calls (session 30): what grows with the data (forward records of
virtual copies still owed, consumers and closed consumers, ended subscriptions' keys) is drained
admin.DELETE_CHUNK entries a call before the call that deletes the rest (destination_delete.lua); a
deletion stopped between calls leaves the targets' counts right and is finished by the maintenance tick
once DELETION_GRACE_MS have passed (or by a repeated delete), counted once; a consumer added or a copy
owed meanwhile goes with it. And release_ended looks at a bounded number of ended subscriptions' keys a
call (lifecycle.lua ENDED_LOOKS)."""

from __future__ import annotations

import msgpack
import pytest
import redis

from broker_core import maintenance
from broker_core.config.virtual import VirtualConfig
from broker_core.connections import ConnectionRecord
from broker_core.destinations import parse_destination, temporary_name
from broker_core.drivers.loop import typed_error
from broker_core.effects import Eval
from broker_core.errors import UnknownConsumer
from broker_core.keys import Home, durables_key, usage_key
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from broker_core.ops import admin, topics, virtual
from broker_core.scripts import calls

# counts what the server ran (INFO commandstats): on a server of its own (tests/conftest.py redis_url)
pytestmark = pytest.mark.private_redis

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


# -- a deletion whose driver died is finished by maintenance -------------------------------------------


def requests(broker, op):
    """Drive operation `op` one Redis request at a time, as the driver does (a script's error reply goes
    back into it, typed); yields the name of each script it ran (None for a command), once it ran."""
    request = next(op)
    try:
        while True:
            done = request.script if isinstance(request, Eval) else None
            try:
                reply = broker._step(request)
            except redis.ResponseError as exc:
                yield done
                request = op.throw(typed_error(exc))
            else:
                yield done
                request = op.send(reply)
    except StopIteration:
        return


def driven_until(broker, op, script: str, n: int = 1):
    """Drive operation `op` until its `n`th call of `script` ran; returns the driver, paused there: left
    alone, the process died there; driven on (`for _ in driver`), it was only slow."""
    driver, seen = requests(broker, op), 0
    for name in driver:
        seen += name == script
        if seen == n:
            return driver
    raise AssertionError(f"the operation ended after {seen} calls of {script}")


def gone(broker, redis_client, dest: str) -> bool:
    """Nothing is left of the destination: unlisted, no key under its prefix, no deletion record."""
    prefix = broker.ops.prefix(parse_destination(dest))
    return (dest not in broker.destinations() and not list(redis_client.scan_iter(match=f"{prefix}*"))
            and not redis_client.exists(broker.ops.deletions_key, f"{broker.ops.deletions_key}:tally"))


def test_a_queue_s_deletion_whose_driver_died_is_finished_by_the_tick_after_its_grace(
        broker, composite, clock, redis_client):
    """The driver dies after the first drain call: the queue stays listed, half-drained, until the tick
    after DELETION_GRACE_MS finishes it (not one before: its driver may still be going), its owed copies'
    charges off their targets, its messages off the broker's memory usage, nothing left of it."""
    owing(broker, 6)  # 12 forward records
    for i in range(7):
        broker.add_consumer("x", ConsumerSpec(prefetch=1), consumer_id=f"c{i}")
    assert int(redis_client.hget(usage_key(broker.namespace), "used")) > 0
    driven_until(broker, broker.ops.delete_destination(parse_destination("x"), broker._now()),
                 "destination_delete")  # its process died after one drain call
    prefix = broker.ops.prefix(parse_destination("x"))
    assert redis_client.hlen(f"{prefix}:fwd") + redis_client.hlen(f"{prefix}:consumers") == 12 + 7 - CHUNK
    clock.advance(maintenance.DELETION_GRACE_MS - 1)
    assert maintenance.run_due(broker).deletions_finished == []  # within the grace: left to its driver
    assert "queue://x" in broker.destinations()
    clock.advance(1)
    assert maintenance.run_due(broker).deletions_finished == ["queue://x"]
    assert gone(broker, redis_client, "queue://x")
    assert [memfwd(broker, t) for t in TARGETS] == [0, 0]
    assert int(redis_client.hget(usage_key(broker.namespace), "used")) == 0
    clock.advance(maintenance.DELETION_GRACE_MS)
    assert maintenance.run_due(broker).deletions_finished == []


def test_a_topic_s_deletion_whose_driver_died_among_its_subscriptions_is_finished_by_the_tick(
        broker, clock, redis_client, monkeypatch):
    """The driver dies after the first call removing the topic's subscriptions (durable ones, offline and
    active, and plain ones): the tick finishes it, every subscription gone with its durable registry
    entry, the topic unlisted, no key left, its messages off the broker's memory usage."""
    monkeypatch.setattr(topics, "DELETE_SUBSCRIPTIONS", 3)
    topic = "topic://news"
    for i in range(4):
        spec = ConsumerSpec(client_id="app", subscription_name=f"d{i}")
        broker.close_consumer(broker.add_consumer(topic, spec))
    active = [broker.add_consumer(topic, spec) for spec in (
        ConsumerSpec(client_id="app", subscription_name="live", prefetch=1), ConsumerSpec(prefetch=1),
        ConsumerSpec())]
    broker.send(topic, [Message(body=f"m{i}") for i in range(5)])
    op = broker.ops.delete_destination(parse_destination(topic), broker._now())
    driven_until(broker, op, "topic_admin")
    # (the first three in subscription order went: d0, d1, d2)
    assert topic in broker.destinations() and redis_client.hlen(durables_key(broker.namespace)) == 2
    clock.advance(maintenance.DELETION_GRACE_MS)
    assert maintenance.run_due(broker).deletions_finished == [topic]
    assert gone(broker, redis_client, topic)
    assert redis_client.hlen(durables_key(broker.namespace)) == 0
    assert int(redis_client.hget(usage_key(broker.namespace), "used")) == 0
    for ref in active:
        with pytest.raises(UnknownConsumer):
            broker.receive(ref)


OWNER = "ws-0123456789abcdef"


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_a_temporary_destination_s_deletion_finished_by_the_tick_and_its_slow_driver_counts_once(
        broker, clock, redis_client, monkeypatch, kind):
    """Its connection ended and the deletion stopped after its first call (a temporary queue's purge, a
    temporary topic's first subscriptions' removal), its connection's lease not lapsed yet: the tick after
    the grace finishes it, counted in the temporary destinations' tally with what it held. Its driver,
    only slow, then goes on: nothing more is counted, nothing is left (nor made again)."""
    monkeypatch.setattr(topics, "DELETE_SUBSCRIPTIONS", 2)
    monkeypatch.setattr("broker_core.ops.queues.PURGE_EXAMINE", 2)
    broker.connection_put(ConnectionRecord(OWNER, "stomp+tcp", "p1", user="alice"), lease_ms=3_600_000)
    dest = parse_destination(f"{kind}://{temporary_name(OWNER, 1)}")
    broker.ensure_destination(dest)
    if kind == "topic":  # its connection's subscriptions, which keep what it holds
        for _ in range(5):
            broker.add_consumer(dest, ConsumerSpec(prefetch=1, connection_id=OWNER))
    broker.send(dest, [Message(body=f"m{i}") for i in range(5)])
    driver = driven_until(broker, broker.ops.delete_temporary(dest, broker._now()),
                          "topic_admin" if kind == "topic" else "purge")
    assert dest.uri in broker.destinations()
    clock.advance(maintenance.DELETION_GRACE_MS)
    assert maintenance.run_due(broker).deletions_finished == [dest.uri]
    assert gone(broker, redis_client, dest.uri)
    assert broker.temp_tally() == {"destinations": 1, "messages": 5}
    for _ in driver:  # the slow driver's next calls find it deleted
        pass
    assert gone(broker, redis_client, dest.uri)
    assert broker.temp_tally() == {"destinations": 1, "messages": 5}
    assert int(redis_client.hget(usage_key(broker.namespace), "used")) == 0


def test_a_deletion_whose_driver_is_still_going_is_not_taken_over(broker, composite, clock, redis_client):
    """Within the grace period the tick leaves a deletion under way alone, and the driver finishes it,
    its record with it: no later tick finds anything to finish."""
    owing(broker, 6)
    driver = driven_until(broker, broker.ops.delete_destination(parse_destination("x"), broker._now()),
                          "destination_delete", 2)
    clock.advance(maintenance.DELETION_GRACE_MS // 2)
    assert maintenance.run_due(broker).deletions_finished == []
    prefix = broker.ops.prefix(parse_destination("x"))
    assert redis_client.hlen(f"{prefix}:fwd") == 12 - 2 * CHUNK  # untouched by the tick
    for _ in driver:
        pass
    assert gone(broker, redis_client, "queue://x")
    clock.advance(maintenance.DELETION_GRACE_MS)
    assert maintenance.run_due(broker).deletions_finished == []
    assert [memfwd(broker, t) for t in TARGETS] == [0, 0]
