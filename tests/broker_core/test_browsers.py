"""Queue browsers counted among a queue's consumers (Broker.open_browser, scripts/lua/browsers.lua), as
ActiveMQ's ConsumerCount counts its QueueBrowserSubscriptions: in stats and summaries while open and their
lease lasts, never dispatched to, gone once closed or lapsed, and advised as consumers (ConsumerInfo
browser=true) with the count."""

from __future__ import annotations

import json

from broker_core import maintenance
from broker_core.destinations import parse_destination
from broker_core.model import ConsumerSpec
from broker_core.ops import advisory

from ..helpers.broker import consumer, drain


def _count(broker, name="orders") -> int:
    return broker.stats(name).consumer_count


async def test_an_open_browser_counts_in_stats_and_summaries_until_closed(broker, aio):
    broker.ensure_destination("orders")
    broker.open_browser("orders", "conn-1-1", lease_ms=30_000)
    consumer(broker, "orders", consumer_id="c1")
    stats = broker.stats("orders")
    assert (stats.consumer_count, stats.browsers, [c.consumer_id for c in stats.consumers]) == (2, 1, ["c1"])
    [summary] = await aio.summaries(["queue://orders"])
    assert summary.consumer_count == 2
    assert broker.close_browsers("orders", ["conn-1-1"]) == 1
    assert _count(broker) == 1
    assert broker.close_browsers("orders", ["conn-1-1"]) == 0  # (twice: once)
    [summary] = await aio.summaries(["queue://orders"])
    assert summary.consumer_count == 1


def test_a_browser_takes_no_part_in_dispatch(broker):
    broker.ensure_destination("orders")
    broker.open_browser("orders", "b1")
    broker.send("orders", "m")
    assert broker.stats("orders").pending == 1  # nobody to dispatch to
    c = consumer(broker, "orders", consumer_id="c1")
    assert [d.body for d in drain(broker, c)] == ["m"]


def test_a_browser_whose_lease_lapses_stops_counting_and_maintenance_removes_it(broker, clock, redis_client):
    broker.ensure_destination("orders")
    broker.open_browser("orders", "b1", lease_ms=1_000)
    broker.open_browser("orders", "b2", lease_ms=1_000)
    clock.advance(900)
    assert broker.renew_browsers("orders", ["b1"], lease_ms=1_000) == []
    clock.advance(200)  # b2 unrenewed, past its lease
    assert _count(broker) == 1
    key = f"{broker.ops.prefix(parse_destination('queue://orders'))}:browsers"
    assert redis_client.zcard(key) == 2  # counted no more, until the maintenance visit removes it
    maintenance.run_due(broker)
    assert [m.decode() for m in redis_client.zrange(key, 0, -1)] == ["b1"]
    assert broker.renew_browsers("orders", ["b1", "b2"], lease_ms=1_000) == ["b2"]  # (its walk is told)
    clock.advance(1_001)
    maintenance.run_due(broker)  # (scheduled for b1's lapse)
    assert _count(broker) == 0 and redis_client.zcard(key) == 0
    assert redis_client.exists(f"{key}:def") == 0  # (what the advisories' replay told of each goes too)


def test_the_open_browsers_are_listed_with_what_their_advisory_tells(broker, clock):
    """What a consumer advisory's replay tells of each open browser (gateway/stomp/advisory_replay.py):
    closed and lapsed ones are not listed; at most the number asked for."""
    broker.ensure_destination("orders")
    broker.open_browser("orders", "b1", lease_ms=5_000, prefetch=7, selector="a = 1 AND b LIKE 'x y%'")
    broker.open_browser("orders", "b2", lease_ms=1_000)
    broker.open_browser("orders", "b3", lease_ms=9_000, prefetch=500)
    assert [(b.browser_id, b.prefetch, b.selector) for b in broker.browsers("orders")] == [
        ("b2", 0, None), ("b1", 7, "a = 1 AND b LIKE 'x y%'"), ("b3", 500, None)]
    assert [b.browser_id for b in broker.browsers("orders", most=1)] == ["b2"]
    broker.close_browsers("orders", ["b3"])
    clock.advance(2_000)  # b2 lapsed
    assert [b.browser_id for b in broker.browsers("orders")] == ["b1"]


def test_lapsed_browsers_are_removed_a_bounded_part_at_a_time(broker, clock, redis_client):
    broker.ensure_destination("orders")
    for n in range(250):
        broker.open_browser("orders", f"b{n}", lease_ms=1_000)
    clock.advance(2_000)
    key = f"{broker.ops.prefix(parse_destination('queue://orders'))}:browsers"
    broker.open_browser("orders", "fresh", lease_ms=1_000)  # removes 100 lapsed on its way
    assert redis_client.zcard(key) == 151 and _count(broker) == 1
    maintenance.run_due(broker)
    assert redis_client.zcard(key) == 51  # a visit's part
    clock.advance(1_000)  # the next tick
    maintenance.run_due(broker)
    assert redis_client.zcard(key) == 1  # (the fresh one lapsed since: left for the next visit)


def test_deleting_the_queue_deletes_its_browsers(broker, redis_client):
    broker.ensure_destination("orders")
    broker.open_browser("orders", "b1")
    broker.delete_destination("orders")
    key = f"{broker.ops.prefix(parse_destination('queue://orders'))}:browsers"
    assert redis_client.exists(key, f"{key}:def") == 0


def test_a_browser_is_advised_as_a_consumer_with_the_count(broker):
    sub = broker.add_consumer(advisory.topic("Consumer", "orders"), ConsumerSpec(ack_mode="auto"))
    consumer(broker, "orders", consumer_id="c1")
    broker.open_browser("orders", "b1", prefetch=500, selector="a = 1")
    broker.close_browsers("orders", ["b1"], "unsubscribed")
    got = [(d.properties, json.loads(d.body)) for d in drain(broker, sub)]
    assert [getattr(p["consumerCount"], "value", p["consumerCount"]) for p, _ in got] == [1, 2, 1]
    added = got[1][1]["ConsumerInfo"]
    assert (added["consumerId"], added["browser"], added["prefetchSize"], added["selector"]) == (
        "b1", True, 500, "a = 1")
    assert got[0][1]["ConsumerInfo"]["browser"] is False
    assert got[2][1]["RemoveInfo"]["objectId"] == "b1"
