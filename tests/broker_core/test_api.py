"""The API surface: the asyncio driver runs the same operations; noLocal; selector modes at dispatch."""

from __future__ import annotations

import msgpack
import redis.asyncio

from broker_core import messages
from broker_core.broker import AsyncBroker
from broker_core.messages import Message, TypedValue
from broker_core.model import ConsumerSpec

from ..helpers.broker import consumer, drain


async def test_the_async_broker_sends_dispatches_and_acks_like_the_blocking_one(
        broker, redis_url, namespace, clock):
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        aio = AsyncBroker(client, namespace, clock, policies=broker.policies)
        c = await aio.add_consumer("orders", ConsumerSpec(prefetch=5, ack_mode="client-individual"))
        ids = await aio.send("orders", [Message(body="a"), Message(body=b"\x00\xff")])
        got = await aio.receive(c, 10)
        assert [d.message_id for d in got] == ids and got[1].body == b"\x00\xff"
        assert await aio.ack(c, ids[0]) == 1
        stats = await aio.stats("orders")
        assert (stats.dequeued, stats.in_flight) == (1, 1)
        assert broker.stats("orders").in_flight == 1  # the same state, seen through the blocking API
    finally:
        await client.aclose()


def test_a_no_local_consumer_does_not_get_its_own_connections_messages(broker):
    mine = consumer(broker, no_local=True, connection_id="conn-1", consumer_id="mine")
    other = consumer(broker, connection_id="conn-2", consumer_id="other")
    broker.send("orders", Message(body="from-1", connection_id="conn-1"))
    broker.send("orders", Message(body="from-2", connection_id="conn-2"))
    assert [d.body for d in drain(broker, mine)] == ["from-2"]
    assert [d.body for d in drain(broker, other)] == ["from-1"]


def test_a_jms_selector_does_not_coerce_but_a_stomp_selector_does(broker):
    jms = consumer(broker, selector="count > 1", consumer_id="jms", prefetch=10)
    broker.send("orders", Message(body="text-two", properties={"count": "2"}))
    assert drain(broker, jms) == []
    stomp = consumer(broker, selector="count > 1", stomp_selector=True, consumer_id="stomp")
    assert [d.body for d in drain(broker, stomp)] == ["text-two"]


def test_selectors_see_headers_and_typed_properties(broker):
    c = consumer(broker, selector="JMSPriority > 6 AND big = 5000000000 AND JMSDeliveryMode = 'PERSISTENT'")
    broker.send("orders", Message(body="no", priority=9, properties={"big": TypedValue("long", 5)}))
    broker.send("orders", Message(body="yes", priority=7, properties={"big": 5_000_000_000}))
    broker.send("orders", Message(body="no", priority=7, persistent=False, properties={"big": 5_000_000_000}))
    assert [d.body for d in drain(broker, c)] == ["yes"]


def test_delivered_properties_keep_their_types(broker):
    c = consumer(broker)
    props = {"s": "x", "b": True, "i": 7, "l": TypedValue("long", 8), "d": 1.5, "big": 2**40}
    broker.send("orders", Message(body="m", properties=props, correlation_id="corr", reply_to="queue://r",
                                  type="t"))
    (d,) = drain(broker, c)
    assert d.properties == {"s": "x", "b": True, "i": 7, "l": TypedValue("long", 8), "d": 1.5, "big": 2**40}
    headers = (d.correlation_id, d.reply_to, d.type, d.priority, d.persistent)
    assert headers == ("corr", "queue://r", "t", 4, True)


def test_the_owner_of_a_consumer_is_woken_when_its_empty_outbox_gets_messages(
        broker, redis_client, namespace):
    pubsub = redis_client.pubsub()
    channel = f"{namespace}:wake:gateway-1"
    pubsub.subscribe(channel)
    assert pubsub.get_message(timeout=1)["type"] == "subscribe"
    c = consumer(broker, prefetch=10, notify=channel, consumer_id="A")
    broker.send("orders", [Message(body="m0"), Message(body="m1")])
    broker.send("orders", Message(body="m2"))  # the outbox was not empty: no second wake-up
    wake = pubsub.get_message(timeout=1)
    assert (wake["channel"].decode(), wake["data"]) == (channel, b"A")
    assert pubsub.get_message(timeout=0.2) is None
    drain(broker, c)
    broker.send("orders", Message(body="m3"))
    assert pubsub.get_message(timeout=1)["data"] == b"A"
    pubsub.close()


def test_a_pull_consumer_is_not_woken_for_what_its_own_receive_hands_over(broker, redis_client, namespace):
    pubsub = redis_client.pubsub()
    channel = f"{namespace}:wake:gateway-1"
    pubsub.subscribe(channel)
    assert pubsub.get_message(timeout=1)["type"] == "subscribe"
    c = consumer(broker, prefetch=0, notify=channel, consumer_id="P")
    broker.send("orders", [Message(body="m0"), Message(body="m1")])
    assert [d.body for d in broker.receive(c, 1)] == ["m0"]  # dispatched and handed over in one call
    assert [d.body for d in broker.receive(c, 1)] == ["m1"]
    assert pubsub.get_message(timeout=0.2) is None
    assert broker.receive(c, 1) == []  # nothing there: the pull stays open (until cancel_pull)
    broker.send("orders", Message(body="m2"))  # dispatched to the open pull by the send: its owner is woken
    assert pubsub.get_message(timeout=1)["data"] == b"P"
    assert [d.body for d in broker.receive(c, 1)] == ["m2"]
    assert pubsub.get_message(timeout=0.2) is None
    pubsub.close()


async def test_every_async_call_gives_what_the_blocking_one_gives(broker, redis_url, namespace, clock):
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        aio = AsyncBroker(client, namespace, clock, policies=broker.policies)
        (m,) = await aio.send("orders", Message(body="x"))
        assert await aio.remove_message("orders", m) is True
        assert await aio.remove_message("orders", m) is False
    finally:
        await client.aclose()


def test_a_send_of_no_messages_stores_nothing_and_a_batch_with_a_repeated_id_stores_it_once(broker):
    assert broker.send("q.empty", []) == []
    assert broker.stats("q.empty").enqueued == 0
    same = "ID:same"
    batch = [Message(body="a", message_id=same), Message(body="b", message_id=same), Message(body="c")]
    sent = broker.send("q.empty", batch)
    assert [s.status for s in sent] == ["ok", "duplicate", "ok"]
    c = consumer(broker, "q.empty")
    assert [d.body for d in broker.receive(c, 10)] == ["a", "c"]


def test_generated_message_ids_differ_across_forked_processes_that_seed_random_alike():
    # The random half of an id comes from the module's own generator, reseeded in a forked child: two
    # processes forked from one parent, each seeding `random` the same way, still make different ids
    # (a repeated id would be taken for a duplicate send and dropped). The children are bare os.fork()s
    # that write to a pipe and leave with os._exit: nothing else of the test process runs in them.
    import os
    import random
    import types

    from broker_core import messages

    def child_ids() -> list[str]:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            try:
                os.close(read)
                random.seed(7)
                # the same millisecond for every id: only the random half can tell them apart
                messages.time = types.SimpleNamespace(time_ns=lambda: 1_700_000_000_000_000_000)
                os.write(write, " ".join(messages.new_message_id() for _ in range(200)).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            text = pipe.read().decode()
        os.waitpid(pid, 0)
        return text.split()

    ids = child_ids() + child_ids()
    assert len(set(ids)) == 400 and all(i.startswith("ID:") and len(i) == 19 for i in ids)


def test_a_message_packs_alike_before_and_after_one_larger_than_the_packers_buffer():
    """Message.pack reuses its thread's msgpack Packer, and drops it after a message that outgrew the
    buffer it started with (messages.py): what it packs is msgpack's own packing either way."""
    small = Message(body="small", message_id="ID:s")
    large = Message(body="x" * (messages.PACKER_BUFFER + 1), message_id="ID:l")
    first = small.pack(1)[1]
    packer_before = messages._PACKERS.packer
    packed_large = large.pack(1)[1]
    assert messages._PACKERS.packer is None  # dropped: its buffer does not stay at the large size
    assert small.pack(1)[1] == first
    assert messages._PACKERS.packer is not packer_before
    for packed in (first, packed_large):
        assert msgpack.packb(msgpack.unpackb(packed, raw=True), use_bin_type=False) == packed
