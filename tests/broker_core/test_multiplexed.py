"""The connection AsyncBroker's script calls share (broker_core/drivers/multiplexed.py), against the real
Redis:
replies matched to their calls under concurrency, errors raised as redis-py raises them, MULTI/EXEC
blocks kept whole, a lost connection failing its waiting calls and the next call reconnecting."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.exceptions import NoScriptError

from broker_core.broker import AsyncBroker
from broker_core.config.store import PolicyStore
from broker_core.drivers import multiplexed
from broker_core.drivers.multiplexed import MultiplexedConnection
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from broker_core.resp import pack
from signalbox.embedded_redis import EmbeddedRedis, free_port
from tests.helpers.redis_urls import with_database


@pytest.fixture
async def link(redis_url):
    client = redis.asyncio.Redis.from_url(redis_url)
    connection = MultiplexedConnection.for_client(client)
    assert connection is not None
    yield connection
    connection.close()
    await client.aclose()


def test_pack_writes_resp_bulk_strings():
    assert pack(("SET", "k", b"\x00v", 12, 1.5)) == (
        b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\x00v\r\n$2\r\n12\r\n$3\r\n1.5\r\n")
    with pytest.raises(redis.DataError, match="invalid argument None"):
        pack(("SET", "k", None))


async def test_concurrent_calls_each_get_their_own_reply(link, namespace):
    replies = await asyncio.gather(*(link.call("ECHO", f"{namespace}-{i}") for i in range(500)))
    assert replies == [f"{namespace}-{i}".encode() for i in range(500)]


async def test_an_error_reply_is_raised_and_the_connection_goes_on(link, namespace, redis_client):
    redis_client.set(f"{namespace}:s", "text")
    with pytest.raises(redis.ResponseError, match="not an integer"):
        await link.call("INCR", f"{namespace}:s")
    with pytest.raises(NoScriptError):
        await link.call("EVALSHA", "0" * 40, 0)
    assert await link.call("INCRBY", f"{namespace}:n", 5) == 5


async def test_a_transaction_gives_each_reply_or_its_error(link, namespace, redis_client):
    redis_client.set(f"{namespace}:s", "text")
    replies = await link.transaction([("INCR", f"{namespace}:a"), ("INCR", f"{namespace}:s"),
                                      ("INCR", f"{namespace}:a")])
    assert replies[0] == 1 and replies[2] == 2
    assert isinstance(replies[1], redis.ResponseError)


async def test_a_transaction_refused_while_queueing_raises_and_applies_nothing(link, namespace, redis_client):
    with pytest.raises(redis.ResponseError, match="(?i)unknown command"):
        await link.transaction([("INCR", f"{namespace}:a"), ("NOSUCHCOMMAND",)])
    assert redis_client.get(f"{namespace}:a") is None
    assert await link.call("INCR", f"{namespace}:a") == 1  # still in step afterwards


async def test_calls_around_a_transaction_are_not_mixed_into_it(link, namespace):
    key = f"{namespace}:t"
    results = await asyncio.gather(
        link.call("RPUSH", key, "before"),
        link.transaction([("RPUSH", key, "in-1"), ("RPUSH", key, "in-2")]),
        link.call("RPUSH", key, "after"))
    assert results == [1, [2, 3], 4]
    assert await link.call("LRANGE", key, 0, -1) == [b"before", b"in-1", b"in-2", b"after"]


async def test_a_killed_connection_fails_its_waiting_call_and_the_next_call_reconnects(link, namespace,
                                                                                      redis_client):
    await link.call("CLIENT", "SETNAME", f"{namespace}-link")
    waiting = asyncio.ensure_future(link.call("BLPOP", f"{namespace}:never", 5))
    await asyncio.sleep(0.1)
    link_id = _client_id(redis_client, f"{namespace}-link")
    assert redis_client.execute_command("CLIENT", "KILL", "ID", link_id) == 1
    with pytest.raises(redis.ConnectionError, match="connection to Redis lost"):
        await waiting
    assert await link.call("ECHO", "again") == b"again"


async def test_a_reply_later_than_the_socket_timeout_drops_the_connection(redis_url, namespace):
    client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=0.3)
    link = MultiplexedConnection.for_client(client)
    try:
        with pytest.raises(redis.TimeoutError, match="no reply from Redis in 0.3 s"):
            await link.call("BLPOP", f"{namespace}:never", 2)
        assert await link.call("ECHO", "fresh connection") == b"fresh connection"
    finally:
        link.close()
        await client.aclose()


async def test_the_database_of_the_url_is_selected(redis_url, namespace, redis_client):
    other = with_database(redis_url, 3)
    client = redis.asyncio.Redis.from_url(other)
    link = MultiplexedConnection.for_client(client)
    try:
        # Issued together: none may run before the connection's SELECT.
        await asyncio.gather(*(link.call("SET", f"{namespace}:db{i}", "3") for i in range(20)))
        assert redis_client.get(f"{namespace}:db0") is None
        assert redis.Redis.from_url(other).get(f"{namespace}:db19") == b"3"
    finally:
        link.close()
        redis.Redis.from_url(other).delete(*(f"{namespace}:db{i}" for i in range(20)))
        await client.aclose()


def test_a_client_it_cannot_mirror_keeps_redis_py(redis_url):
    decoding = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    assert MultiplexedConnection.for_client(decoding) is None
    assert MultiplexedConnection.for_client(redis.asyncio.Redis.from_url(redis_url, protocol=3)) is None


def test_the_connection_follows_the_client_to_a_new_event_loop(redis_url, namespace):
    client = redis.asyncio.Redis.from_url(redis_url)
    link = MultiplexedConnection.for_client(client)
    assert asyncio.run(link.call("ECHO", "first loop")) == b"first loop"
    assert asyncio.run(link.call("ECHO", "second loop")) == b"second loop"
    assert asyncio.run(link.transaction([("ECHO", "x")])) == [b"x"]
    link.close()


def test_after_a_move_to_a_new_event_loop_a_reply_too_late_still_drops_the_connection(redis_url, namespace,
                                                                                     redis_client):
    """The socket-timeout watchdog is a timer of the loop the call was made on: one still pending when
    that loop closed was never cleared, and no call on the next loop got a watchdog of its own (a Redis
    that stopped answering held them for ever)."""
    client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=0.5)
    link = MultiplexedConnection.for_client(client)
    try:
        assert asyncio.run(link.call("ECHO", "first loop")) == b"first loop"  # its watchdog outlives it

        async def late() -> None:
            redis_client.client_pause(2000)  # no reply for 2 s
            started = time.monotonic()
            with pytest.raises(redis.TimeoutError, match="no reply from Redis in 0.5 s"):
                await link.call("PING")
            assert time.monotonic() - started < 1.5

        asyncio.run(late())
    finally:
        redis_client.client_unpause()
        link.close()


def test_calls_of_a_loop_the_connection_left_fail_rather_than_wait_for_ever(redis_url, namespace):
    """A connection taken over by another event loop (`_ready`) dropped the calls the first loop still had
    held or waiting, without failing them: their callers waited for ever. They fail, on their own loop."""
    import threading

    client = redis.asyncio.Redis.from_url(redis_url)
    link = MultiplexedConnection.for_client(client)
    outcome: list[BaseException | str] = []
    held_made = threading.Event()

    async def first() -> None:
        await link.call("PING")
        held = asyncio.ensure_future(_held_call(link, "INCR", f"{namespace}:n", seconds=0.5))
        await asyncio.sleep(0.01)
        held_made.set()
        try:
            await asyncio.wait_for(held, 3)
            outcome.append("ran")
        except BaseException as exc:  # noqa: BLE001 - what the held call ended with is the result
            outcome.append(exc)

    thread = threading.Thread(target=asyncio.run, args=(first(),))
    thread.start()
    try:
        assert held_made.wait(5)
        assert asyncio.run(link.call("ECHO", "second loop")) == b"second loop"  # takes the connection over
        thread.join(10)
        (result,) = outcome
        assert isinstance(result, redis.ConnectionError), result
        assert "another event loop" in str(result)
    finally:
        link.close()


async def test_async_broker_runs_its_scripts_over_it(redis_url, namespace, clock, broker):
    client = redis.asyncio.Redis.from_url(redis_url)
    aio = AsyncBroker(client, namespace, clock, policies=broker.policies)
    try:
        assert aio.link is not None
        c = await aio.add_consumer("orders", ConsumerSpec(prefetch=10, ack_mode="client-individual"))
        ids = await asyncio.gather(*(aio.send("orders", Message(body=f"m{i}")) for i in range(50)))
        got = await aio.receive(c, 50)
        assert len(got) == 10  # the prefetch window
        assert {d.message_id for d in got} <= {i[0] for i in ids}
        assert await aio.ack(c, [d.message_id for d in got]) == 10
        stats = await aio.stats("orders")
        assert (stats.enqueued, stats.dequeued) == (50, 10)
    finally:
        await aio.aclose()
        await client.aclose()


async def _an_ack_held(aio: AsyncBroker, namespace: str, hold: float) -> tuple[asyncio.Future, Any]:
    consumer = await aio.add_consumer("held", ConsumerSpec(prefetch=10, ack_mode="client-individual"))
    await aio.send("held", Message(body="m"))
    (delivery,) = await aio.receive(consumer, 1)
    await aio.stats("held")  # (the CONFIG GET of _syncs_each_write is not what the ack waits for)
    ack = asyncio.ensure_future(aio.ack(consumer, delivery.message_id, hold=hold))
    await asyncio.sleep(0.1)
    return ack, consumer


async def test_an_ack_held_on_a_redis_that_syncs_every_write_rides_with_the_next_call(tmp_path, namespace,
                                                                                      clock, broker):
    store = EmbeddedRedis(tmp_path / "redis", port=free_port(), appendfsync="always")
    store.start()
    client = redis.asyncio.Redis.from_url(store.url)
    policies = PolicyStore(redis.Redis.from_url(store.url), namespace)
    aio = AsyncBroker(client, namespace, clock, policies=policies)
    try:
        assert aio.holds_acks is None  # (not asked yet)
        assert await aio._syncs_each_write()
        assert aio.holds_acks is True  # what the link reads to give an auto ack a task of its own
        ack, _ = await _an_ack_held(aio, namespace, hold=5.0)
        assert not ack.done()  # waiting for this process's next call
        assert (await aio.stats("held")).dequeued == 1  # that call: the ack ran just before it
        assert await asyncio.wait_for(ack, 1.0) == 1
    finally:
        await aio.aclose()
        await client.aclose()
        store.stop()


async def test_an_ack_held_on_a_redis_that_does_not_sync_every_write_goes_at_once(redis_url, namespace, clock,
                                                                                   broker, redis_client):
    conf = redis_client.config_get("append*")
    assert (conf["appendonly"], conf["appendfsync"]) != ("yes", "always")  # the tests' Redis
    client = redis.asyncio.Redis.from_url(redis_url)
    aio = AsyncBroker(client, namespace, clock, policies=broker.policies)
    try:
        assert aio.holds_acks is None
        assert not await aio._syncs_each_write()
        assert aio.holds_acks is False  # what the link reads to acknowledge a lone message in place
        ack, _ = await _an_ack_held(aio, namespace, hold=5.0)
        assert ack.done() and ack.result() == 1
    finally:
        await aio.aclose()
        await client.aclose()


def _client_id(client: redis.Redis, name: str) -> str:
    return next(str(c["id"]) for c in client.client_list() if c.get("name") == name)


async def _held_call(link, *args, seconds: float):
    token = multiplexed.hold(seconds)
    try:
        return await link.call(*args)
    finally:
        multiplexed.release_hold(token)


async def test_a_held_call_goes_out_ahead_of_the_next_call_in_one_write(link, namespace, redis_client):
    key = f"{namespace}:n"
    await link.call("PING")  # connected: the held call is not written by the connect itself
    held = asyncio.ensure_future(_held_call(link, "INCR", key, seconds=5.0))
    await asyncio.sleep(0.05)
    assert not held.done() and redis_client.get(key) is None  # waiting, not written
    started = time.monotonic()
    assert await link.call("GET", key) == b"1"  # the held INCR ran first, in the same write
    assert await held == 1 and time.monotonic() - started < 1.0
    # only the first call of the held context waits: the next one goes at once
    token = multiplexed.hold(5.0)
    try:
        assert await link.call("INCR", key) == 2
        assert await asyncio.wait_for(link.call("INCR", key), 1.0) == 3
    finally:
        multiplexed.release_hold(token)


async def test_a_held_call_with_no_call_after_it_goes_after_its_time(link, namespace, redis_client):
    key = f"{namespace}:n"
    await link.call("PING")
    started = time.monotonic()
    first = asyncio.ensure_future(_held_call(link, "RPUSH", key, "a", seconds=0.2))
    second = asyncio.ensure_future(_held_call(link, "RPUSH", key, "b", seconds=0.2))
    assert await first == 1 and await second == 2  # in the order they were made
    assert time.monotonic() - started >= 0.19
    assert redis_client.lrange(key, 0, -1) == [b"a", b"b"]


async def test_a_held_call_cancelled_before_it_went_is_never_written(link, namespace, redis_client):
    key = f"{namespace}:n"
    await link.call("PING")
    held = asyncio.ensure_future(_held_call(link, "INCR", key, seconds=5.0))
    await asyncio.sleep(0.01)
    held.cancel()
    assert await link.call("GET", key) is None
    assert redis_client.get(key) is None


async def test_a_lost_connection_fails_the_held_calls(link, namespace):
    await link.call("PING")
    held = asyncio.ensure_future(_held_call(link, "INCR", f"{namespace}:n", seconds=5.0))
    await asyncio.sleep(0.01)
    link.abort(redis.ConnectionError("gone"))
    with pytest.raises(redis.ConnectionError, match="gone"):
        await held
    assert await link.call("INCR", f"{namespace}:n") == 1  # reconnected; the held one never ran
