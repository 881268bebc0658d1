"""Messages stored by an earlier version stay readable: the 21st field of a packed message became a cron
schedule's compact form (session 24), where a wildcard subscription's copy kept the topic it was published
to; such a copy still in Redis after an upgrade keeps that topic as its destination, delivered and dead-
lettered."""

from __future__ import annotations

import msgpack
import pytest

from broker_core.destinations import parse_destination
from broker_core.messages import Message, dead_letter_copy, unpack_delivery
from broker_core.model import ConsumerRef, ConsumerSpec
from broker_core.topics import durable_key, wildcard_copy

from ..helpers.broker import drain
from .test_chunked_close import calls


def _legacy_wildcard_copy(blob: bytes, published_to: str) -> bytes:
    """A wildcard copy as the version before cron schedules packed it: 20 fields, then the topic."""
    record = msgpack.unpackb(blob, raw=True)[:20]
    return msgpack.packb([*record, published_to], use_bin_type=False)


def test_a_wildcard_copy_of_either_layout_is_delivered_with_the_topic_it_was_published_to():
    message_id, blob = Message("hi").pack(1_000)
    for copy in (wildcard_copy(blob, "topic://orders.eu"), _legacy_wildcard_copy(blob, "topic://orders.eu")):
        delivery = unpack_delivery(message_id, "topic://orders.>", "c1", copy, 0, False)
        assert (delivery.destination, delivery.body) == ("topic://orders.eu", "hi")
        assert "scheduledJobId" not in delivery.properties
        dead = msgpack.unpackb(dead_letter_copy(copy, "topic://orders.>", "poison", 1), raw=False)
        # (no topic kept beside it; the dead letter reaches its queue at 1: messages.py ARRIVED, last)
        assert dead[16] == "topic://orders.eu" and len(dead) == 23 and dead[21:] == [None, 1]
    assert msgpack.unpackb(wildcard_copy(blob, "topic://orders.eu"))[22] == 1_000  # (kept: the message's)
    plain = unpack_delivery(message_id, "queue://q", "c1", blob, 0, False)
    assert plain.destination == "queue://q"


def test_a_cron_message_is_not_taken_for_a_legacy_copy():
    message_id, blob = Message("tick", cron="0 3 * * *").pack(1_000)
    delivery = unpack_delivery(message_id, "queue://q", "c1", blob, 0, False)
    assert delivery.destination == "queue://q" and delivery.properties["scheduledJobId"] == message_id


def test_a_topic_messages_reference_count_stored_before_durable_references_weighed_more(broker):
    """<topic>:refs counted every holder 1 before session 29 (a durable subscription's reference now weighs
    2^32, lifecycle.lua ref_weight): a message stored then, held by a durable and a non-durable
    subscription, stays stored when the durable one acknowledges it, and goes with the last holder."""
    from broker_core.model import ConsumerSpec

    topic, p = "topic://layout", f"{broker.namespace}:{{t:layout}}"
    held = broker.add_consumer(topic, ConsumerSpec(client_id="app", subscription_name="d",
                                                   ack_mode="client-individual"))
    live = broker.add_consumer(topic, ConsumerSpec(ack_mode="client-individual"))
    broker.send(topic, Message("old", message_id="m1"))
    broker.redis.hset(f"{p}:refs", "m1", 2)  # as the earlier version stored it
    broker.ack(held, broker.receive(held, 1)[0].message_id)
    assert broker.redis.hget(f"{p}:refs", "m1") == b"1" and broker.redis.hexists(f"{p}:msgs", "m1")
    assert [d.body for d in broker.receive(live, 1)] == ["old"]
    broker.ack(live, "m1")
    assert not broker.redis.hexists(f"{p}:msgs", "m1") and not broker.redis.hexists(f"{p}:refs", "m1")


# -- a topic whose references were counted 1 each (session 28 and earlier) ---------------------------------

def _subscriber(client_id, name, **kw):
    return ConsumerSpec(client_id=client_id, subscription_name=name, ack_mode="client-individual", **kw)


def _as_stored_before_weights(broker, p):
    """Rewrite the topic's references as session 28 stored them: every subscription holding a message
    (pending, parked, in flight) counts 1, a durable one too, and the topic's meta has no mark of weighted
    references (an earlier version's topic)."""
    r = broker.redis
    counts: dict[bytes, int] = {}
    for key in r.lrange(f"{p}:sorder", 0, -1):
        s = f"{p}:s:{key.decode()}"
        held = {*r.zrange(f"{s}:pending", 0, -1), *r.zrange(f"{s}:parked", 0, -1), *r.hkeys(f"{s}:inflight")}
        for m in held:
            counts[m] = counts.get(m, 0) + 1
    assert counts and set(counts) == set(r.hkeys(f"{p}:refs"))
    r.hset(f"{p}:refs", mapping=counts)
    r.hdel(f"{p}:meta", "weighted_after")


def _old_backlog(broker, topic, p):
    """Durable subscriptions `third` (every third message) and `low` (the first four), offline, and a live
    non-durable one holding all 12 messages, stored with session 28's counts."""
    for name, selector in SELECTORS:
        broker.close_consumer(broker.add_consumer(topic, _subscriber("app", name, selector=selector)))
    live = broker.add_consumer(topic, ConsumerSpec(ack_mode="client-individual"))
    broker.send(topic, [Message(f"m{i}", properties={"n": i}) for i in range(12)])
    _as_stored_before_weights(broker, p)
    return live


SELECTORS = (("third", "n % 3 = 0"), ("low", "n < 4"))
HELD_BY_A_DURABLE = ["m0", "m1", "m2", "m3", "m6", "m9"]


@pytest.mark.parametrize("checks", [1, 1_000_000])
def test_a_retroactive_subscription_gets_what_durables_hold_on_a_topic_stored_before_weights(broker, checks):
    """A new retroactive durable subscription on a topic stored by session 28 (every reference 1) gets
    exactly the stored messages another durable subscription holds, in topic order, whatever the budget;
    afterwards every holder letting go empties the store (no count left over, none short)."""
    topic, p = "topic://layout", f"{broker.namespace}:{{t:layout}}"
    broker.ops.backlog_checks = checks
    live = _old_backlog(broker, topic, p)
    late = broker.add_consumer(topic, _subscriber("app", "late", retroactive=True, prefetch=100))
    got = drain(broker, late)
    assert [d.body for d in got] == HELD_BY_A_DURABLE
    broker.send(topic, Message("new", properties={"n": 100}))  # stored after: weighted
    back = [broker.add_consumer(topic, _subscriber("app", name, selector=sel)) for name, sel in SELECTORS]
    for consumer, delivered in ((late, got), (live, []), *((c, []) for c in back)):
        for delivery in delivered + drain(broker, consumer):
            broker.ack(consumer, delivery.message_id)
    assert broker.redis.hlen(f"{p}:msgs") == 0 and broker.redis.hlen(f"{p}:refs") == 0


def test_a_topic_made_by_this_version_is_marked_weighted_and_an_earlier_one_at_its_first_catch_up(broker):
    """A new topic's references are all weighted (its meta's weighted_after 0: the catch-up's one read a
    message); an earlier version's topic is marked at its first retroactive catch-up, whose sequence then
    bounds the messages it asks the durable subscriptions about."""
    topic, p = "topic://layout", f"{broker.namespace}:{{t:layout}}"
    broker.ensure_destination(topic)
    assert broker.redis.hget(f"{p}:meta", "weighted_after") == b"0"
    _old_backlog(broker, topic, p)
    broker.add_consumer(topic, _subscriber("app", "late", retroactive=True))
    assert broker.redis.hget(f"{p}:meta", "weighted_after") == b"12"


def test_subscriptions_removed_while_an_old_backlog_is_walked_are_asked_about_no_more(broker):
    """The catch-up on a topic stored by session 28 asks its durable subscriptions one at a time here (a
    budget of 1): one unsubscribed before its message is reached no longer holds it, so that message is not
    replayed; the one the walk had asked last unsubscribed while its walk was on a later message (its
    place in :sorder gone, then made again under its key at the end of :sorder) makes that message's
    questions start over, and the walk misses nothing. A durable subscription made meanwhile holds none of
    the old messages. Then every holder letting go empties the store."""
    topic, p = "topic://layout", f"{broker.namespace}:{{t:layout}}"
    broker.ops.backlog_checks = 1
    parts = 6
    for i in range(parts):  # p<i> holds m<i> alone
        broker.close_consumer(broker.add_consumer(topic, _subscriber("app", f"p{i}", selector=f"n = {i}")))
    live = broker.add_consumer(topic, ConsumerSpec(ack_mode="client-individual"))
    broker.send(topic, [Message(f"m{i}", properties={"n": i}) for i in range(parts)])
    _as_stored_before_weights(broker, p)
    late_meta = f"{p}:s:{durable_key('app', 'late')}:meta"
    names = {durable_key("app", f"p{i}"): f"p{i}" for i in range(parts)}
    removed: list[str] = []
    op = broker.ops.add_consumer(parse_destination(topic), _subscriber("app", "late", retroactive=True),
                                 broker._now(), "late")
    for script, _ in calls(broker, op):
        if script not in ("topic_subscribe", "topic_catchup"):
            continue
        cursor = (broker.redis.hget(late_meta, "catchup_sub") or b"").decode()
        if not removed:  # after the first call (m0 asked about): p3, whose m3 is not reached yet
            removed.append("p3")
            broker.close_consumer(broker.add_consumer(topic, _subscriber("app", "new", selector="n = 4")))
        elif len(removed) == 1 and cursor:  # the subscription last asked, about a later message
            removed.append(names[cursor.partition("|")[2]])
        else:
            continue
        broker.unsubscribe(topic, client_id="app", subscription_name=removed[-1])
        if len(removed) == 2:  # made again under its key: another subscription, at the end of :sorder
            again = broker.add_consumer(topic, _subscriber("app", removed[-1], selector="n = 100"))
            broker.close_consumer(again)
    assert len(removed) == 2 and removed[1] not in ("p3", f"p{parts - 1}")
    late = ConsumerRef(parse_destination(topic), "late")
    got = drain(broker, late)
    assert [d.body for d in got] == [f"m{i}" for i in range(parts) if i != 3]
    for delivery in got:
        broker.ack(late, delivery.message_id)
    for delivery in drain(broker, live):
        broker.ack(live, delivery.message_id)
    for name in {f"p{i}" for i in range(parts)} - {"p3"}:
        held = broker.add_consumer(topic, _subscriber("app", name, selector=(
            "n = 100" if name == removed[1] else f"n = {name[1:]}")))
        for delivery in drain(broker, held):
            broker.ack(held, delivery.message_id)
    assert broker.redis.hlen(f"{p}:msgs") == 0 and broker.redis.hlen(f"{p}:refs") == 0
