"""Every script call bounded whatever the sizes: purge, removeAllMessageGroups, browse with a selector,
batch sends and acks larger than one call take several bounded calls behind one call of the API, and
keep what the API promises. Each test runs on both script forms: EVALSHA on the session's Redis and the
function library on a Redis >= 7 (test_script_forms.py)."""

from __future__ import annotations

import uuid

import pytest

from broker_core import errors
from broker_core.broker import Broker
from broker_core.destinations import parse_destination
from broker_core.event_stream import expand
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from broker_core.ops import flow, homes, queues

from .test_script_forms import client7, functions_url  # noqa: F401  (fixtures: a Redis >= 7)

# counts what the server ran (INFO commandstats): on a server of its own (tests/conftest.py redis_url)
pytestmark = pytest.mark.private_redis


@pytest.fixture(params=["eval", "functions"])
def sized(request, redis_client, clock):
    """A Broker on the script form the test is run for, in a namespace of its own."""
    if request.param == "eval":
        client, functions = redis_client, False
    else:
        client, functions = request.getfixturevalue("client7"), True
    broker = Broker(client, f"t{uuid.uuid4().hex[:12]}", clock)
    broker.driver.functions = functions
    yield broker
    broker.close()


def fill(broker, n, dest="orders", tag="old", **kw):
    ids = []
    for start in range(0, n, 100):
        ids += broker.send(dest, [Message(body=tag, message_id=f"{tag}-{i}", **kw)
                                  for i in range(start, min(n, start + 100))])
    return ids


def bodies(broker, dest="orders"):
    """What the queue holds, by body (browse: pending, parked, in flight)."""
    out, cursor = [], None
    while True:
        page = broker.browse(dest, cursor=cursor, limit=1000)
        out += [b.message.body for b in page.messages]
        cursor = page.next_cursor
        if cursor is None:
            return out


# -- purge -----------------------------------------------------------------------------------------------

def test_purge_takes_bounded_calls_and_removes_what_was_there_wherever_it_is(sized, clock):
    sized.policies.set_entry("queue", "orders", {"prioritizedMessages": True})
    fill(sized, 2_400)
    fill(sized, 30, tag="delayed", delay_ms=60_000)  # parked
    c = sized.add_consumer("orders", ConsumerSpec(prefetch=300, ack_mode="client-individual"))
    held = sized.receive(c, 100)  # 100 received, 200 dispatched and still in the outbox
    calls: list[int] = []
    sent_during = 0

    def during(removed, total):
        # between two calls: sends of every kind, at the head of the queue too (priority 9), and delayed
        nonlocal sent_during
        calls.append(removed)
        n = len(calls)
        sized.send("orders", [Message(body="new", priority=9, message_id=f"new-{n}-a"),
                              Message(body="new", message_id=f"new-{n}-b"),
                              Message(body="new", delay_ms=60_000, message_id=f"new-{n}-c")])
        sent_during += 3

    removed = sized.purge("orders", progress=during)
    assert removed == 2_430 and len(calls) >= 2_430 // queues.PURGE_EXAMINE
    left = bodies(sized)
    assert left == ["new"] * sent_during  # every old message gone, pending, parked or in flight; no new one
    stats = sized.stats("orders")
    # (the delayed ones were not on the queue yet: cancelled, not purged)
    assert (stats.purged, stats.cancelled) == (2_400, 30) and stats.queue_size + stats.parked == sent_during
    assert sum(int(e["count"]) for e in _events(sized) if e["type"] == "purge") == 2_430
    del held


def test_a_purge_meeting_consumers_that_take_and_acknowledge_messages_loses_nothing(sized):
    fill(sized, 1_500)
    a = sized.add_consumer("orders", ConsumerSpec(prefetch=50, ack_mode="client-individual"))
    b = sized.add_consumer("orders", ConsumerSpec(prefetch=50, ack_mode="client-individual"))
    acked = 0

    def during(removed, total):
        nonlocal acked
        for d in sized.receive(a, 10):  # a consumer goes on, acknowledging
            if sized.ack(a, d.message_id) and d.body == "old":
                acked += 1
        sized.send("orders", Message(body="new"))

    removed = sized.purge("orders", progress=during)
    stats = sized.stats("orders")
    # each message ends exactly once: purged, acknowledged, or (sent during the purge) still there
    assert removed == stats.purged and acked > 0
    assert removed + acked == 1_500 and "old" not in bodies(sized)
    del b


def _events(broker, dest="orders"):
    key = broker.ops.events_key(parse_destination(dest))
    entries = broker.redis.xrange(key)
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in expand(entries)]


# -- removeAllMessageGroups ------------------------------------------------------------------------------

def test_remove_all_message_groups_of_many_groups_is_one_call_that_frees_them_all(sized):
    sized.policies.set_entry("queue", "orders", {"messageGroupMapFactoryType": "simple"})
    a = sized.add_consumer("orders", ConsumerSpec(prefetch=2_000))
    b = sized.add_consumer("orders", ConsumerSpec(prefetch=2_000))
    for start in range(0, 3_000, 100):
        sized.send("orders", [Message(body="g", group_id=f"g{n}") for n in range(start, start + 100)])
    assert sized.stats("orders").group_count == 3_000
    assert sized.remove_all_message_groups("orders") == 3_000
    stats = sized.stats("orders")
    assert stats.group_count == 0
    assert sized.message_groups("orders") == []
    prefix = sized.ops.prefix(parse_destination("orders"))
    assert not sized.redis.exists(f"{prefix}:groups", f"{prefix}:c:{a.consumer_id}:groups",
                                  f"{prefix}:c:{b.consumer_id}:groups")
    sized.send("orders", Message(body="again", group_id="g1"))  # assigned again
    assert sized.message_groups("orders")[0].group_id == "g1"


# -- batch send ------------------------------------------------------------------------------------------

def _script_calls(broker) -> int:
    stats = broker.redis.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval", "fcall"))


def test_a_batch_of_1000_is_stored_in_order_in_bounded_parts(sized):
    before = _script_calls(sized)
    batch = [Message(body=str(i), message_id=f"m-{i}") for i in range(1_000)]
    sent = sized.send("orders", batch)
    assert [s.status for s in sent] == ["ok"] * 1_000 and sent == [f"m-{i}" for i in range(1_000)]
    # a check of each part, then each part: never one call for the whole batch
    assert _script_calls(sized) - before >= 2 * 1_000 // flow.SEND_PART
    assert bodies(sized) == [str(i) for i in range(1_000)]


def test_a_batch_with_one_message_over_a_limit_is_refused_whole_whatever_part_it_is_in(sized):
    sized.policies.set_entry("queue", "orders", {"maxMessageSize": 1024})
    sized.ensure_destination("orders")
    batch = [Message(body="x", message_id=f"m-{i}") for i in range(450)] + [Message(body="y" * 2000)]
    with pytest.raises(errors.MessageTooLarge, match="maxMessageSize=1024"):
        sized.send("orders", batch)
    assert sized.stats("orders").enqueued == 0 and bodies(sized) == []


def test_a_part_refused_for_memory_says_how_many_went_and_the_same_batch_again_sends_the_rest(sized):
    sized.policies.set_entry("queue", "orders", {"memoryLimit": 250 * 1100, "sendFailIfNoSpace": True})
    batch = [Message(body=str(i), message_id=f"m-{i}") for i in range(400)]
    with pytest.raises(errors.BrokerError, match=r"after 200 of the batch.s 400 messages") as failed:
        sized.send("orders", batch)
    assert failed.value.details["sent"] == 200 and sized.stats("orders").queue_size == 200
    sized.purge("orders")  # room again
    again = sized.send("orders", batch)
    assert [s.status for s in again] == ["duplicate"] * 200 + ["ok"] * 200
    assert bodies(sized) == [str(i) for i in range(200, 400)]


def test_a_topic_batch_goes_in_parts_too(sized):
    c = sized.add_consumer("topic://news", ConsumerSpec(prefetch=1_000))
    before = _script_calls(sized)
    sent = sized.send("topic://news", [Message(body=str(i)) for i in range(300)])
    assert len(sent) == 300 and _script_calls(sized) - before >= 6
    got = []
    while batch := sized.receive(c, 1_000):
        got += [d.body for d in batch]
    assert got == [str(i) for i in range(300)]


# -- batch ack -------------------------------------------------------------------------------------------

def _holding(broker, n):
    fill(broker, n)
    c = broker.add_consumer("orders", ConsumerSpec(prefetch=n, ack_mode="client-individual"))
    got = []
    while batch := broker.receive(c, 1_000):
        got += batch
    return c, [d.message_id for d in got]


def test_an_ack_of_1000_ids_is_applied_in_bounded_parts(sized):
    c, ids = _holding(sized, 1_000)
    before = _script_calls(sized)
    assert sized.ack(c, ids + ids[:5]) == 1_000  # (an id named twice is acknowledged once)
    assert _script_calls(sized) - before >= 2 * 1_000 // homes.ACK_PART
    stats = sized.stats("orders")
    assert stats.queue_size == 0 and stats.dequeued == 1_000


def test_an_ack_of_many_ids_with_one_not_in_flight_changes_nothing(sized):
    c, ids = _holding(sized, 700)
    with pytest.raises(errors.NotInFlight, match="ID:nope"):
        sized.ack(c, ids[:650] + ["ID:nope"] + ids[650:])
    assert sized.stats("orders").in_flight == 700  # the check of every part came first


def test_ack_and_receive_of_many_ids_hands_over_the_next_messages_with_the_last_part(sized):
    fill(sized, 450)
    c = sized.add_consumer("orders", ConsumerSpec(prefetch=300, ack_mode="client-individual"))
    ids = [d.message_id for d in sized.receive(c, 300)]
    after = sized.ack_and_receive(c, ids, 200)
    assert [d.body for d in after] == ["old"] * 150 and sized.stats("orders").in_flight == 150


# -- browse with a selector ------------------------------------------------------------------------------

def test_a_browse_with_a_selector_examines_a_bounded_number_per_call_and_goes_on_with_a_cursor(sized):
    fill(sized, 1_000, properties={"n": 1})
    sized.send("orders", Message(body="match", properties={"n": 2}))
    first = sized.browse("orders", selector="n = 2", limit=10)
    assert first.messages == [] and first.next_cursor  # nothing among the first ones: say where to go on
    pages, found, cursor = 1, [], first.next_cursor
    while cursor:
        page = sized.browse("orders", selector="n = 2", cursor=cursor, limit=10)
        found += [b.message.body for b in page.messages]
        cursor, pages = page.next_cursor, pages + 1
    assert found == ["match"] and pages >= 1_001 // queues.BROWSE_EXAMINE


# -- the destination registry and statistics at many destinations ----------------------------------------

def test_the_destination_list_is_read_in_pages_in_creation_order(sized, clock):
    names = []
    for n in range(1_200):
        names.append(f"queue://d{(n * 7919) % 1_200:04d}")  # created out of name order
        sized.ensure_destination(names[-1])
        if n % 3 == 0:
            clock.advance(1)  # and some in the same millisecond
    scans = sized.redis.info("commandstats").get("cmdstat_zscan", {}).get("calls", 0)
    listed = sized.destinations()
    by_creation = sorted(names, key=lambda uri: (sized.redis.zscore(sized.ops.registry_key, uri), uri))
    assert listed == by_creation and len(set(listed)) == 1_200
    assert sized.redis.info("commandstats")["cmdstat_zscan"]["calls"] - scans >= 2


async def test_summaries_of_many_queues_come_in_bounded_calls(redis_client, redis_url, namespace):
    import redis.asyncio

    from broker_core import broker as broker_module
    from broker_core.broker import AsyncBroker

    sync = Broker(redis_client, namespace)
    for n in range(250):
        sync.send(f"s{n}", [Message(body="x")] * (n % 4))
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        broker = AsyncBroker(client, namespace)
        before = _script_calls(sync)
        summaries = await broker.summaries([f"s{n}" for n in range(250)] + ["gone"])
        assert [s.pending for s in summaries[:-1]] == [n % 4 for n in range(250)] and summaries[-1] is None
        assert _script_calls(sync) - before >= 251 // broker_module.SUMMARY_CHUNK
    finally:
        await client.aclose()


# -- message groups, a page at a time ----------------------------------------------------------------------

def test_message_groups_come_in_pages_that_together_list_every_group_once(sized):
    sized.policies.set_entry("queue", "orders", {"messageGroupMapFactoryType": "simple"})
    sized.add_consumer("orders", ConsumerSpec(prefetch=2_000))
    for start in range(0, 1_500, 100):
        sized.send("orders", [Message(body="g", group_id=f"g{n}") for n in range(start, start + 100)])
    seen, pages, cursor = [], 0, None
    while True:
        page = sized.message_groups_page("orders", cursor=cursor, limit=200)
        assert len(page.groups) <= 400
        seen += [g.group_id for g in page.groups]
        pages, cursor = pages + 1, page.next_cursor
        if cursor is None:
            break
    assert sorted(set(seen)) == sorted(f"g{n}" for n in range(1_500)) and pages >= 5
    assert sorted(g.group_id for g in sized.message_groups("orders")) == sorted(set(seen))
    with pytest.raises(errors.InvalidConsumer, match="cursor"):
        sized.message_groups_page("orders", cursor="-1")


def test_the_bucket_map_lists_its_recent_group_names_in_pages_too(sized):
    sized.policies.set_entry("queue", "orders", {"messageGroupMapFactoryType": "bucket?bucketCount=64"})
    sized.add_consumer("orders", ConsumerSpec(prefetch=2_000))
    for start in range(0, 1_000, 100):
        sized.send("orders", [Message(body="g", group_id=f"g{n}") for n in range(start, start + 100)])
    whole = sized.message_groups_page("orders", limit=1_000)
    assert whole.next_cursor is None and len(whole.groups) > 10
    seen, cursor = [], None
    while True:
        page = sized.message_groups_page("orders", cursor=cursor, limit=7)
        assert len(page.groups) <= 7
        seen += page.groups
        if (cursor := page.next_cursor) is None:
            break
    assert sorted(seen, key=str) == sorted(whole.groups, key=str)


def test_a_cumulative_ack_over_thousands_acknowledges_them_all_in_bounded_calls(sized):
    fill(sized, 2_600)
    c = sized.add_consumer("orders", ConsumerSpec(prefetch=3_000, ack_mode="client"))
    got = []
    while batch := sized.receive(c, 1_000):
        got += batch
    before = _script_calls(sized)
    assert sized.ack(c, got[2_499].message_id) == 2_500  # cumulative: everything up to it
    assert _script_calls(sized) - before >= (2_500 - homes.CUMULATIVE_MOST) // homes.ACK_PART
    stats = sized.stats("orders")
    assert stats.dequeued == 2_500 and stats.in_flight == 100
    assert sized.ack(c, got[2_599].message_id) == 100  # (and the usual one-call ack still works)


@pytest.mark.parametrize("body", [b"\x00" * (200 * 1024), "é" * (100 * 1024)], ids=["bytes", "text"])
def test_a_large_message_keeps_every_field_around_its_skipped_body(sized, clock, body):
    """Scripts decode a large message without its body (message.lua message.unpack): the fields before it
    (group, properties a selector reads, expiration) and after it (its delay, user, original destination)
    must still be read as sent."""
    spec = ConsumerSpec(prefetch=10, selector="colour = 'red' AND size > 3", ack_mode="client-individual")
    consumer = sized.add_consumer("big", spec)
    sized.send("big", [Message(body=body, group_id="g1", properties={"colour": "red", "size": 4},
                               expiration=clock.now_ms() + 60_000, delay_ms=500, user_id="alice",
                               message_id="late"),
                       Message(body=body, properties={"colour": "blue", "size": 9}, message_id="blue"),
                       Message(body=body, properties={"colour": "red", "size": 5}, group_id="g1",
                               message_id="now")])
    assert [d.message_id for d in sized.receive(consumer, 10)] == ["now"]  # the delayed one is parked
    assert sized.stats("big").parked == 1
    clock.advance(500)
    sized.dispatch("big")
    (late,) = sized.receive(consumer, 10)
    assert (late.message_id, late.body, late.group_id, late.user_id, late.properties["colour"]) == \
        ("late", body, "g1", "alice", "red")
    sized.send("big.expiring", Message(body=body, expiration=clock.now_ms() + 1000, message_id="old"))
    clock.advance(1001)
    assert sized.sweep_expired("big.expiring").expired == 1  # its expiration read from the decoded fields
