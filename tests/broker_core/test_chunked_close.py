"""Closing and reaping a consumer that holds many messages (issue 21 §2): it leaves dispatch in the first
script call, its messages go back `return_chunk` per call, and if the process driving the close dies
between chunks the maintenance tick returns the rest, each message once.

The chunk is made small through the broker's own parameter (`broker.ops.return_chunk`), so a few hundred
messages take many calls; each call is run by hand here (`calls`) and the state checked after it."""

from __future__ import annotations

from collections import Counter

import pytest

from broker_core import maintenance
from broker_core.broker import Broker
from broker_core.destinations import parse_destination
from broker_core.effects import Eval
from broker_core.event_stream import expand
from broker_core.keys import Home
from broker_core.messages import Message
from broker_core.model import ConsumerRef, ConsumerSpec
from broker_core.scripts.calls import Abort, Reap

from ..helpers.broker import consumer, drain

HELD = 230  # messages the closing consumer holds
CHUNK = 40
FRESH = 25  # messages still pending behind its window when it closes


def calls(broker: Broker, op):
    """Drive operation `op` one Redis request at a time; yields (script name or None, reply) after each.
    Closing the generator stops driving: the process died there."""
    request = next(op)
    try:
        while True:
            reply = broker._step(request)
            yield (request.script if isinstance(request, Eval) else None), reply
            request = op.send(reply)
    except StopIteration:
        return


class Queue:
    """Views of the queue's keys in Redis."""

    def __init__(self, broker: Broker, redis_client, name: str = "orders") -> None:
        self.r = redis_client
        self.p = f"{broker.namespace}:{{q:{name}}}"

    def pending(self) -> list[str]:
        return [m.decode() for m in self.r.zrange(f"{self.p}:pending", 0, -1)]

    def inflight(self) -> dict[str, str]:
        return {k.decode(): v.decode().split("|")[0] for k, v in self.r.hgetall(f"{self.p}:inflight").items()}

    def window(self, cid: str) -> list[str]:
        return [m.decode() for m in self.r.zrange(f"{self.p}:c:{cid}:inflight", 0, -1)]

    def redeliveries(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.r.hgetall(f"{self.p}:redeliv").items()}

    def returns(self) -> Counter:
        return Counter(e[b"msg"].decode() for _, e in expand(self.r.xrange(f"{self.p}:events"))
                       if e[b"type"] == b"return")

    def owed(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.r.hgetall(f"{self.p}:closing").items()}

    def fence(self):
        return self.r.hget(f"{self.p}:meta", "fence")


ORDERS = parse_destination("orders")


def _setup(broker, *, received: int, lease_ms: int = 30_000):
    """Consumer A holds HELD messages (the adapter received the first `received`); consumer B, with room
    for everything, arrives after A filled its window."""
    a = consumer(broker, prefetch=HELD, consumer_id="A", lease_ms=lease_ms)
    ids = broker.send("orders", [Message(body=str(i), message_id=f"m{i:04d}") for i in range(HELD)])
    if received:
        assert len(broker.receive(a, received)) == received
    b = consumer(broker, prefetch=1000, consumer_id="B")
    return a, b, ids


def _send_fresh(broker, ids: list[str]) -> None:
    """FRESH messages sent while the close is under way (once)."""
    if len(ids) == HELD:
        ids += broker.send("orders", [Message(body=str(i), message_id=f"m{i:04d}")
                                      for i in range(HELD, HELD + FRESH)])


def _check_between_chunks(q: Queue, ids: list[str], name: str, owed_before: int):
    """What holds after every call of a close: every message is in exactly one place, A's counters match
    what it still holds, and nothing sent during the close went out ahead of A's messages."""
    held = set(q.window("A"))
    inflight = q.inflight()
    pending = q.pending()
    assert {m for m, c in inflight.items() if c == "A"} == held
    assert not set(pending) & set(inflight)
    assert set(pending) | set(inflight) == set(ids), "a message is in no place, or in two"
    n = q.r.hget(f"{q.p}:c:A", "n")
    if held:
        assert int(n) == len(held) and q.owed() == {"A": name} and q.fence() == b"0"
        # a message sent during the close waits until all of A's are back, as after a one-step close
        assert not any(inflight.get(m) == "B" for m in ids[HELD:])
    else:
        assert n is None and q.owed() == {} and q.fence() is None
    # a call returns at most CHUNK messages
    assert owed_before - len(held) <= CHUNK


def _after(q: Queue, broker, b, ids: list[str], received: int):
    # each of A's messages came back exactly once, the counter raised only for those the adapter had
    assert q.returns() == Counter(ids[:HELD])
    assert q.redeliveries() == {m: 1 for m in ids[:received]}
    assert q.owed() == {} and q.fence() is None
    assert not q.r.exists(f"{q.p}:c:A", f"{q.p}:c:A:inflight", f"{q.p}:c:A:outbox")
    # B gets A's messages first, in order, then the ones sent during the close
    got = drain(broker, b)
    assert [d.message_id for d in got] == ids
    assert [d.redelivered for d in got] == [True] * received + [False] * (len(ids) - received)
    stats = broker.stats("orders")
    assert stats.in_flight == len(ids) and [c.consumer_id for c in stats.consumers] == ["B"]
    assert stats.consumers[0].in_flight == len(ids)


@pytest.mark.parametrize("received", [0, 70, HELD])
def test_a_close_returns_the_messages_a_chunk_per_call(broker, redis_client, received):
    broker.ops.return_chunk = CHUNK
    a, b, ids = _setup(broker, received=received)
    q = Queue(broker, redis_client)
    names = []
    owed_before = HELD
    for name, _reply in calls(broker, broker.ops.close_consumer(a, broker._now(), "closed")):
        if name in ("consumer_close", "return_owed"):
            names.append(name)
            if name == "consumer_close":  # gone from dispatch, counts, ownership in the first call
                assert not redis_client.hexists(f"{q.p}:consumers", "A")
                assert b"A" not in redis_client.lrange(f"{q.p}:corder", 0, -1)
                assert [c.consumer_id for c in broker.stats("orders").consumers] == ["B"]
            _check_between_chunks(q, ids, "closed", owed_before)
            owed_before = len(q.window("A"))
            _send_fresh(broker, ids)
    assert names == ["consumer_close"] + ["return_owed"] * (-(-HELD // CHUNK) - 1)
    _after(q, broker, b, ids, received)


def test_a_reap_returns_the_messages_a_chunk_per_call(broker, redis_client, clock):
    broker.ops.return_chunk = CHUNK
    a, b, ids = _setup(broker, received=HELD, lease_ms=1_000)
    clock.advance(1_500)
    broker.renew_leases("orders", ["B"], 30_000)
    q = Queue(broker, redis_client)
    owed_before, reaped, chunks = HELD, None, 0
    for name, reply in calls(broker, broker.ops.reap(Home(ORDERS), broker._now(), 100)):
        if name == "reap":
            reaped = reply
        if name in ("reap", "return_owed"):
            chunks += 1
            _check_between_chunks(q, ids, "lease_expired", owed_before)
            owed_before = len(q.window("A"))
            _send_fresh(broker, ids)
    assert reaped[0] == b"A" and chunks == -(-HELD // CHUNK)
    _after(q, broker, b, ids, HELD)


def test_a_closer_dying_between_chunks_leaves_the_rest_to_the_tick(broker, redis_client):
    broker.ops.return_chunk = CHUNK
    a, b, ids = _setup(broker, received=100)
    q = Queue(broker, redis_client)
    driving = calls(broker, broker.ops.close_consumer(a, broker._now(), "closed"))
    for name, _ in driving:
        if name == "return_owed":
            break  # two chunks back: the process dies here
    driving.close()
    assert len(q.window("A")) == HELD - 2 * CHUNK and q.owed() == {"A": "closed"}
    _send_fresh(broker, ids)
    # B got A's returned messages (dispatchable as they land), nothing sent since
    assert sorted(m for m, c in q.inflight().items() if c == "B") == ids[:2 * CHUNK]
    _check_between_chunks(q, ids, "closed", len(q.window("A")))
    recovery = maintenance.run_recovery(broker, "orders")
    assert recovery.ran
    _after(q, broker, b, ids, 100)


def test_two_drivers_at_once_return_each_message_once(broker, redis_client):
    """The closer and the tick drive the same owed returns: each call takes what no other has taken."""
    broker.ops.return_chunk = CHUNK
    a, b, ids = _setup(broker, received=HELD)
    q = Queue(broker, redis_client)
    driving = calls(broker, broker.ops.close_consumer(a, broker._now(), "closed"))
    for name, _ in driving:
        if name == "consumer_close":
            break
    maintenance.run_recovery(broker, "orders")  # returns everything still owed
    rest = [name for name, _ in driving]  # the closer carries on: it finds nothing left
    assert rest.count("return_owed") == 1
    _after(q, broker, b, ids, HELD)


def test_a_consumer_id_reused_while_its_returns_are_owed_waits_for_them(broker, redis_client):
    broker.ops.return_chunk = CHUNK
    a, b, ids = _setup(broker, received=HELD)
    q = Queue(broker, redis_client)
    driving = calls(broker, broker.ops.close_consumer(a, broker._now(), "closed"))
    next(driving)
    driving.close()
    assert q.owed() == {"A": "closed"}
    again = consumer(broker, prefetch=5, consumer_id="A")  # returns the rest first, then registers
    assert q.owed() == {} and q.returns() == Counter(ids[:HELD])
    assert redis_client.hget(f"{q.p}:c:A", "n") == b"0"
    broker.close_consumer(again)
    _after(q, broker, b, ids, HELD)


def test_groups_and_exclusive_ownership_move_in_the_first_call(broker, redis_client):
    """The closing owner's groups are free and the exclusive owner handed on at once; the group's owed
    messages still reach the new owner before the group's later ones."""
    broker.ops.return_chunk = 10
    a = consumer(broker, prefetch=60, consumer_id="A", exclusive=True)
    sent = broker.send("orders", [Message(body=str(i), message_id=f"g{i:03d}", group_id="G")
                                  for i in range(80)])
    assert len(broker.receive(a, 60)) == 60
    b = consumer(broker, prefetch=100, consumer_id="B", exclusive=True)
    q = Queue(broker, redis_client)
    driving = calls(broker, broker.ops.close_consumer(a, broker._now(), "closed"))
    for name, _ in driving:
        if name == "consumer_close":
            break
    assert redis_client.hget(f"{q.p}:meta", "owner") == b"B"
    assert all(g.owner != "A" for g in broker.message_groups("orders"))
    for _ in driving:
        pass
    got = drain(broker, b)
    assert [d.message_id for d in got] == sent
    assert [g.owner for g in broker.message_groups("orders")] == ["B"]


def test_prioritized_messages_wait_for_every_return(broker, redis_client, policy):
    """With prioritizedMessages the returned messages merge back at their old places, so nothing is
    dispatched until the last is back."""
    policy("orders", prioritizedMessages=True)
    broker.ops.return_chunk = 7
    a = consumer(broker, prefetch=40, consumer_id="A")
    sent = broker.send("orders", [Message(body=str(i), message_id=f"p{i:03d}", priority=i % 10)
                                  for i in range(40)])
    assert len(broker.receive(a, 30)) == 30
    b = consumer(broker, prefetch=100, consumer_id="B")
    q = Queue(broker, redis_client)
    for name, _ in calls(broker, broker.ops.close_consumer(a, broker._now(), "closed")):
        if name in ("consumer_close", "return_owed") and q.window("A"):
            assert q.fence() == b"-inf" and "B" not in q.inflight().values()
    got = [d.message_id for d in drain(broker, b)]
    assert sorted(got) == sorted(sent)
    # all at once, in priority order, as the one-step close gives
    priorities = [int(m[1:]) % 10 for m in got]
    assert priorities == sorted(priorities, reverse=True)


def test_a_durable_subscription_goes_offline_and_gets_its_messages_back_in_chunks(broker, redis_client):
    broker.ops.return_chunk = 9
    spec = ConsumerSpec(client_id="cl", subscription_name="s", prefetch=50)
    d = broker.add_consumer("topic://news", spec, consumer_id="d1")
    broker.send("topic://news", [Message(body=str(i), message_id=f"n{i:03d}") for i in range(60)])
    assert len(broker.receive(d, 50)) == 50
    reads = [name for name, _ in calls(broker, broker.ops.close_consumer(d, broker._now(), "closed"))
             if name in ("consumer_close", "return_owed")]
    assert reads == ["consumer_close"] + ["return_owed"] * 5
    again = broker.add_consumer("topic://news", spec, consumer_id="d2")
    got = drain(broker, again)
    assert [m.message_id for m in got] == [f"n{i:03d}" for i in range(50)]
    assert all(m.redelivered for m in got)


def test_a_subscription_whose_last_consumer_id_is_still_returning_waits_for_it(broker, redis_client):
    broker.ops.return_chunk = 9
    spec = ConsumerSpec(client_id="cl", subscription_name="s", prefetch=50)
    d = broker.add_consumer("topic://news", spec, consumer_id="d1")
    broker.send("topic://news", [Message(body=str(i), message_id=f"n{i:03d}") for i in range(60)])
    assert len(broker.receive(d, 50)) == 50
    driving = calls(broker, broker.ops.close_consumer(d, broker._now(), "closed"))
    for name, _ in driving:
        if name == "consumer_close":
            break
    driving.close()
    again = broker.add_consumer("topic://news", spec, consumer_id="d1")
    got = drain(broker, again)
    assert [m.message_id for m in got] == [f"n{i:03d}" for i in range(50)]


def test_deleting_or_purging_while_returns_are_owed_leaves_nothing_behind(broker, redis_client):
    broker.ops.return_chunk = CHUNK
    a, b, ids = _setup(broker, received=HELD)
    q = Queue(broker, redis_client)
    driving = calls(broker, broker.ops.close_consumer(a, broker._now(), "closed"))
    next(driving)
    driving.close()
    broker.purge("orders")
    assert q.inflight() == {} and q.pending() == []
    maintenance.run_recovery(broker, "orders")  # finds A's window empty: forgets it, lifts the fence
    assert q.owed() == {} and q.fence() is None and not redis_client.exists(f"{q.p}:c:A")
    broker.send("orders", Message(body="after", message_id="after"))
    assert [d.message_id for d in drain(broker, b)] == ["after"]
    driving = calls(broker, broker.ops.close_consumer(ConsumerRef(ORDERS, "B"), broker._now(), "closed"))
    next(driving)
    driving.close()
    broker.delete_destination("orders")
    assert list(redis_client.scan_iter(match=f"{q.p}:*")) == []


# -- non-durable topic subscriptions: they end with their consumer ------------------------------------


def _topic_keys(broker, redis_client, topic="news"):
    p = f"{broker.namespace}:{{t:{topic}}}"
    return p, {k.decode() for k in redis_client.scan_iter(match=f"{p}:*")}


def test_a_non_durable_subscription_ends_at_once_and_its_messages_are_released_a_chunk_per_call(
        broker, redis_client):
    broker.ops.return_chunk = 40
    gone = broker.add_consumer("topic://news", ConsumerSpec(prefetch=200), consumer_id="gone")
    stays = broker.add_consumer("topic://news", ConsumerSpec(prefetch=1000, selector="n < 100"),
                                consumer_id="stays")
    ids = broker.send("topic://news", [Message(body=str(i), message_id=f"t{i:03d}", properties={"n": i})
                                       for i in range(300)])
    assert len(broker.receive(gone, 150)) == 150  # 150 received, 50 dispatched only, 100 pending
    p, _ = _topic_keys(broker, redis_client)
    released_before = None
    driving = calls(broker, broker.ops.close_consumer(gone, broker._now(), "closed"))
    for name, _ in driving:
        if name not in ("consumer_close", "return_owed"):
            continue
        stored = {m.decode() for m in redis_client.hkeys(f"{p}:msgs")}
        refs = {k.decode(): int(v) for k, v in redis_client.hgetall(f"{p}:refs").items()}
        ended = [k.decode() for k in redis_client.smembers(f"{p}:ended")]
        waiting = {m.decode() for k in ended for m in redis_client.zrange(k, 0, -1)}
        if name == "consumer_close":  # gone, counted, at once
            assert redis_client.hget(f"{p}:subof", "gone") is None
            assert len(broker.subscriptions("topic://news")) == 1
            assert broker.stats("topic://news").removed_with_subscription == 300
            assert not list(redis_client.scan_iter(match=f"{p}:s:c.gone:*"))
            released_before = 300
        # a message is stored exactly while a subscription holds it or the ended one still has to release it
        for m in ids:
            expected = (m in waiting) + (int(m[1:]) < 100)
            assert refs.get(m, 0) == expected and (m in stored) == (expected > 0), m
        assert released_before - len(waiting) <= 40
        released_before = len(waiting)
    assert released_before == 0 and not redis_client.exists(f"{p}:ended")
    assert broker.stats("topic://news").memory_usage == 100 * 1024  # the 100 the other one holds
    assert len(drain(broker, stays)) == 100


def test_an_ended_subscription_left_half_released_is_finished_by_the_tick(broker, redis_client):
    broker.ops.return_chunk = 40
    gone = broker.add_consumer("topic://news", ConsumerSpec(prefetch=200), consumer_id="gone")
    broker.send("topic://news", [Message(body=str(i), message_id=f"t{i:03d}") for i in range(300)])
    assert len(broker.receive(gone, 200)) == 200
    p, _ = _topic_keys(broker, redis_client)
    driving = calls(broker, broker.ops.close_consumer(gone, broker._now(), "closed"))
    for name, _ in driving:
        if name == "return_owed":
            break
    driving.close()
    assert redis_client.hlen(f"{p}:msgs") == 300 - 40  # the first call releases none
    assert maintenance.run_recovery(broker, "topic://news").ran
    _, keys = _topic_keys(broker, redis_client)
    assert not {k for k in keys if k.rsplit(":", 1)[-1] in ("msgs", "refs", "order", "ended")}
    assert not [k for k in keys if ":ended:" in k]
    assert broker.stats("topic://news").memory_usage == 0


def test_unsubscribing_a_durable_subscription_releases_its_messages_a_chunk_per_call(broker, redis_client):
    broker.ops.return_chunk = 40
    spec = ConsumerSpec(client_id="cl", subscription_name="s", prefetch=100)
    d = broker.add_consumer("topic://news", spec, consumer_id="d1")
    broker.send("topic://news", [Message(body=str(i), message_id=f"t{i:03d}") for i in range(250)])
    assert len(broker.receive(d, 60)) == 60
    broker.close_consumer(d)
    p, _ = _topic_keys(broker, redis_client)
    reads = [name for name, _ in calls(broker, broker.ops.return_owed(Home(parse_destination("topic://news")),
                                                                        broker._now()))]
    assert reads == ["return_owed"]  # nothing owed after the close: its returns went back in that call
    assert broker.unsubscribe("topic://news", client_id="cl", subscription_name="s") == 250
    assert redis_client.hlen(f"{p}:msgs") == 0 and not redis_client.exists(f"{p}:ended")
    assert broker.stats("topic://news").memory_usage == 0


def test_deleting_a_topic_while_an_ended_subscription_is_being_released(broker, redis_client):
    broker.ops.return_chunk = 40
    gone = broker.add_consumer("topic://news", ConsumerSpec(prefetch=200), consumer_id="gone")
    broker.send("topic://news", [Message(body=str(i), message_id=f"t{i:03d}") for i in range(300)])
    driving = calls(broker, broker.ops.close_consumer(gone, broker._now(), "closed"))
    for name, _ in driving:
        if name == "return_owed":
            break
    driving.close()
    usage = f"{broker.namespace}:usage"
    used_before = int(redis_client.hget(usage, "used"))
    broker.delete_destination("topic://news")
    p, keys = _topic_keys(broker, redis_client)
    assert keys == set()
    assert int(redis_client.hget(usage, "used")) == used_before - 260 * 1024


def test_lapsed_consumers_reaped_together_share_one_chunk_per_call(broker, redis_client, clock):
    broker.ops.return_chunk = 40
    a = consumer(broker, prefetch=60, consumer_id="A", lease_ms=1_000)
    c = consumer(broker, prefetch=60, consumer_id="C", lease_ms=1_000)
    ids = broker.send("orders", [Message(body=str(i), message_id=f"m{i:04d}") for i in range(120)])
    assert len(broker.receive(a, 60)) == 60 and len(broker.receive(c, 60)) == 60
    clock.advance(1_500)
    q = Queue(broker, redis_client)
    returned_before, reaped = 0, None
    for name, reply in calls(broker, broker.ops.reap(Home(ORDERS), broker._now(), 100)):
        if name == "reap":
            reaped = sorted(Reap.parse(reply).closed)
        if name in ("reap", "return_owed"):
            returned = sum(q.returns().values())
            assert returned - returned_before <= 40
            returned_before = returned
            assert set(q.owed()) == {cid for cid in ("A", "C") if q.window(cid)}
    assert reaped == ["A", "C"]
    assert q.returns() == Counter(ids) and q.redeliveries() == dict.fromkeys(ids, 1)
    assert q.owed() == {} and q.fence() is None and sorted(q.pending()) == ids


def test_an_aborted_consumer_returns_its_messages_in_chunks(broker, redis_client):
    broker.ops.return_chunk = 40
    a, b, ids = _setup(broker, received=HELD)
    q = Queue(broker, redis_client)
    # (maintenance.abort_consumer runs this operation)
    now = broker._now()
    op = broker.ops.run(maintenance._abort_op(broker, Home(ORDERS), now, Abort.abort(
        broker.ops.prefix(ORDERS), now, maintenance.TOMBSTONES_MAX, maintenance.TOMBSTONE_MS, "A", "too slow",
        False)))
    names = [name for name, _ in calls(broker, op) if name in ("abort", "return_owed")]
    assert names == ["abort"] + ["return_owed"] * -(-HELD // 40)  # the abort returns none itself
    assert maintenance.abort_notice(broker, "orders", "A").reason == "too slow"
    assert q.returns() == Counter(ids) and q.owed() == {} and q.fence() is None
    assert [d.message_id for d in drain(broker, b)] == ids
