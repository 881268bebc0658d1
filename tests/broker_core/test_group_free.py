"""Freeing a closed consumer's message groups (issue 21): the close's first call frees them in O(1) — a
group whose owner is no consumer any more is free to dispatch and to the groups listing at once — and the
entries themselves are deleted GROUP_FREE_CHUNK (1,000) per call after it (includes/lifecycle.lua
free_groups), by the closer, or by the maintenance tick if the closer died. Each test runs in both script
forms (the function library and EVAL) on the session's server."""

from __future__ import annotations

import pytest

from broker_core import maintenance
from broker_core.effects import Eval
from broker_core.messages import Message
from broker_core.scripts.calls import ConsumerClose

from ..helpers.broker import consumer, drain
from .test_chunked_close import calls

GROUPS = 2_500  # more than two calls' worth of group entries


@pytest.fixture(params=[True, False], ids=["functions", "eval"])
def form(request, broker):
    broker.driver.functions = request.param
    return broker


def _owner_of_groups(broker, redis_client, policy) -> tuple[object, str]:
    """Consumer A owns GROUPS groups of a `simple` map and holds no message (all acknowledged)."""
    policy(messageGroupMapFactoryType="simple")
    a = consumer(broker, prefetch=GROUPS, consumer_id="A")
    broker.send("orders", [Message(body=str(i), message_id=f"m{i}", group_id=f"g{i}") for i in range(GROUPS)])
    got = drain(broker, a, GROUPS)
    assert len(got) == GROUPS and all(d.group_first_for_consumer for d in got)
    broker.ack(a, got[-1].message_id, mode="cumulative")
    p = f"{broker.namespace}:{{q:orders}}"
    assert redis_client.hlen(f"{p}:groups") == GROUPS and redis_client.scard(f"{p}:c:A:groups") == GROUPS
    return a, p


def test_a_closed_owners_groups_are_free_at_once_and_deleted_a_chunk_per_call(form, redis_client, policy):
    broker = form
    a, p = _owner_of_groups(broker, redis_client, policy)
    b = consumer(broker, prefetch=100, consumer_id="B")
    driving = calls(broker, broker.ops.close_consumer(a, broker._now(), "closed"))
    names, g7 = [], None
    for name, reply in driving:
        names.append(name)
        if name == "consumer_close":
            # first call: A is gone, its id still listed as closing while its entries are deleted
            assert ConsumerClose.parse(reply).owed > 0
            assert redis_client.hgetall(f"{p}:closing") == {b"A": b"closed"}
            left = redis_client.hlen(f"{p}:groups")
            assert GROUPS - 1000 <= left < GROUPS
            # the listing shows none of A's groups; a message of one of them goes to B, flagged first
            assert [g for g in broker.message_groups("orders") if g.owner == "A"] == []
            # (one whose entry the first call did not delete: it still names A)
            g7 = redis_client.srandmember(f"{p}:c:A:groups").decode()
            assert redis_client.hget(f"{p}:groups", g7).startswith(b"A|")
            broker.send("orders", Message(body="late", message_id="late", group_id=g7))
            got = drain(broker, b)
            assert [(d.message_id, d.group_first_for_consumer) for d in got] == [("late", True)]
            assert [(g.group_id, g.owner) for g in broker.message_groups("orders")] == [(g7, "B")]
            assert redis_client.hget(f"{p}:groups", g7).startswith(b"B|")
            # a group B took over is out of A's set: the chunks below do not delete B's entry
            assert not redis_client.sismember(f"{p}:c:A:groups", g7)
    assert names.count("return_owed") == 2  # 2,500 entries: 1,000 in the first call, then 1,000 and 500
    assert redis_client.hgetall(f"{p}:closing") == {}
    assert not redis_client.exists(f"{p}:c:A:groups", f"{p}:c:A")
    owners = {k: v.split(b"|")[0] for k, v in redis_client.hgetall(f"{p}:groups").items()}
    assert owners == {g7.encode(): b"B"}
    assert redis_client.hget(f"{p}:meta", "fence") is None
    # B owns g7 and keeps it; another of A's old groups is bound anew
    other = "g8" if g7 != "g8" else "g9"
    broker.send("orders", [Message(body="x", message_id="g7-2", group_id=g7),
                           Message(body="y", message_id="g8-2", group_id=other)])
    assert [(d.message_id, d.group_first_for_consumer) for d in drain(broker, b)] == [
        ("g7-2", False), ("g8-2", True)]


def test_the_cached_map_frees_its_entries_and_their_lru_places(form, redis_client, policy):
    broker = form
    policy(messageGroupMapFactoryType="cached", groupMapCacheSize=3000)
    a = consumer(broker, prefetch=GROUPS, consumer_id="A")
    broker.send("orders", [Message(body=str(i), message_id=f"m{i}", group_id=f"g{i}") for i in range(GROUPS)])
    broker.ack(a, drain(broker, a, GROUPS)[-1].message_id, mode="cumulative")
    p = f"{broker.namespace}:{{q:orders}}"
    assert redis_client.zcard(f"{p}:glru") == GROUPS
    broker.close_consumer(a)
    assert redis_client.hlen(f"{p}:groups") == 0 and redis_client.zcard(f"{p}:glru") == 0
    assert redis_client.hgetall(f"{p}:closing") == {}


def test_a_closer_dying_leaves_the_entries_to_the_tick_and_the_id_waits_for_them(form, redis_client, policy):
    broker = form
    a, p = _owner_of_groups(broker, redis_client, policy)
    driving = calls(broker, broker.ops.close_consumer(a, broker._now(), "closed"))
    for name, _ in driving:
        if name == "consumer_close":
            break
    driving.close()  # the closer died after the first call
    assert redis_client.hexists(f"{p}:closing", "A") and redis_client.hlen(f"{p}:groups") > 0
    # a consumer registering under the same id does not inherit the old groups: it frees them first
    again = consumer(broker, prefetch=10, consumer_id="A")
    assert redis_client.hlen(f"{p}:groups") == 0 and redis_client.hgetall(f"{p}:closing") == {}
    assert broker.message_groups("orders") == []
    broker.close_consumer(again)
    # and the tick finishes what a dead closer left
    a2 = consumer(broker, prefetch=GROUPS, consumer_id="C")
    broker.send("orders", [Message(body=str(i), message_id=f"n{i}", group_id=f"h{i}") for i in range(1500)])
    broker.ack(a2, drain(broker, a2, 1500)[-1].message_id, mode="cumulative")
    driving = calls(broker, broker.ops.close_consumer(a2, broker._now(), "closed"))
    for name, _ in driving:
        if name == "consumer_close":
            break
    driving.close()
    assert redis_client.hexists(f"{p}:closing", "C")
    assert maintenance.run_recovery(broker, "orders").ran
    assert redis_client.hlen(f"{p}:groups") == 0 and redis_client.hgetall(f"{p}:closing") == {}
    assert not redis_client.exists(f"{p}:c:C:groups")


def test_freeing_groups_does_not_hold_back_fresh_messages(form, redis_client, policy):
    """Only owed messages fence dispatch: a close with nothing held but groups to free sets no fence."""
    broker = form
    a, p = _owner_of_groups(broker, redis_client, policy)
    b = consumer(broker, prefetch=10, consumer_id="B")
    request = broker.ops.close_consumer(a, broker._now(), "closed")
    first = next(request)
    assert isinstance(first, Eval) and first.script == "consumer_close"
    broker._step(first)
    request.close()
    assert redis_client.hget(f"{p}:meta", "fence") is None
    broker.send("orders", Message(body="fresh", message_id="fresh"))
    assert [d.message_id for d in drain(broker, b)] == ["fresh"]
