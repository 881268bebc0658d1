"""The connections Broker's script calls use (broker_core/drivers/direct.py), against the real Redis: each
call
gets its own reply under threads, errors raised as redis-py raises them, MULTI/EXEC blocks kept whole,
an idle connection the server closed replaced before anything is written, a call whose connection dies
raised and never repeated, a forked child on its own connections."""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from redis.exceptions import NoScriptError

from broker_core.broker import Broker
from broker_core.drivers.direct import DirectConnections
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from tests.helpers.redis_urls import with_database


@pytest.fixture
def link(redis_url):
    connections = DirectConnections.for_client(redis.Redis.from_url(redis_url))
    assert connections is not None
    yield connections
    connections.close()


def test_calls_from_many_threads_each_get_their_own_reply(link, namespace):
    def echo(i: int) -> bytes:
        return link.call("ECHO", f"{namespace}-{i}")

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(echo, range(2000)))
    assert replies == [f"{namespace}-{i}".encode() for i in range(2000)]
    assert 1 <= len(link._idle) <= 8  # connections are reused, at most one per thread at a time


def test_an_error_reply_is_raised_and_the_connection_goes_on(link, namespace, redis_client):
    redis_client.set(f"{namespace}:s", "text")
    with pytest.raises(redis.ResponseError, match="not an integer"):
        link.call("INCR", f"{namespace}:s")
    with pytest.raises(NoScriptError):
        link.call("EVALSHA", "0" * 40, 0)
    assert link.call("INCRBY", f"{namespace}:n", 5) == 5
    assert len(link._idle) == 1


def test_a_transaction_gives_each_reply_or_its_error(link, namespace, redis_client):
    redis_client.set(f"{namespace}:s", "text")
    replies = link.transaction([("INCR", f"{namespace}:a"), ("INCR", f"{namespace}:s"),
                                ("INCR", f"{namespace}:a")])
    assert replies[0] == 1 and replies[2] == 2
    assert isinstance(replies[1], redis.ResponseError)


def test_a_transaction_refused_while_queueing_raises_and_applies_nothing(link, namespace, redis_client):
    with pytest.raises(redis.ResponseError, match="(?i)unknown command"):
        link.transaction([("INCR", f"{namespace}:a"), ("NOSUCHCOMMAND",)])
    assert redis_client.get(f"{namespace}:a") is None
    assert link.call("INCR", f"{namespace}:a") == 1  # still in step afterwards


def test_an_idle_connection_the_server_closed_is_replaced_before_the_next_call(link, namespace, redis_client):
    link.call("CLIENT", "SETNAME", f"{namespace}-idle")
    idle_id = _client_id(redis_client, f"{namespace}-idle")
    assert redis_client.execute_command("CLIENT", "KILL", "ID", idle_id) == 1
    assert link.call("INCR", f"{namespace}:once") == 1
    assert redis_client.get(f"{namespace}:once") == b"1"  # written once, on the new connection


def test_a_call_whose_connection_dies_raises_and_is_not_repeated(link, namespace, redis_client):
    link.call("CLIENT", "SETNAME", f"{namespace}-busy")
    link_id = _client_id(redis_client, f"{namespace}-busy")
    # A BLPOP repeated on a new connection would wait its 5 s out and return None instead of raising.
    killer = threading.Timer(0.2, redis_client.execute_command, ("CLIENT", "KILL", "ID", link_id))
    killer.start()
    with pytest.raises(redis.ConnectionError, match="connection to Redis lost"):
        link.call("BLPOP", f"{namespace}:never", 5)
    killer.join()
    assert link._idle == []  # the dead connection was not kept
    assert link.call("ECHO", "again") == b"again"


def test_a_reply_later_than_the_socket_timeout_drops_the_connection(redis_url, namespace):
    link = DirectConnections.for_client(redis.Redis.from_url(redis_url, socket_timeout=0.3))
    try:
        with pytest.raises(redis.TimeoutError, match="no reply from Redis in 0.3 s"):
            link.call("BLPOP", f"{namespace}:never", 2)
        assert link._idle == []
        assert link.call("ECHO", "fresh connection") == b"fresh connection"
    finally:
        link.close()


def test_the_database_of_the_url_is_selected(redis_url, namespace, redis_client):
    other = with_database(redis_url, 3)
    link = DirectConnections.for_client(redis.Redis.from_url(other))
    try:
        link.call("SET", f"{namespace}:db", "3")
        assert redis_client.get(f"{namespace}:db") is None
        assert redis.Redis.from_url(other).get(f"{namespace}:db") == b"3"
    finally:
        link.close()
        redis.Redis.from_url(other).delete(f"{namespace}:db")


def _child_call(link: DirectConnections, key: str, out: multiprocessing.Queue) -> None:
    out.put(link.call("INCR", key))


def test_a_forked_child_opens_its_own_connection(link, namespace):
    key = f"{namespace}:forked"
    assert link.call("INCR", key) == 1
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_call, args=(link, key, out))
    child.start()
    assert out.get(timeout=30) == 2
    child.join(timeout=30)
    assert child.exitcode == 0
    # Had the child written on the parent's socket, its reply would have been left for the parent here.
    assert link.call("INCR", key) == 3
    assert link.call("ECHO", "in step") == b"in step"


def test_a_client_it_cannot_mirror_keeps_redis_py(redis_url, namespace):
    assert DirectConnections.for_client(redis.Redis.from_url(redis_url, decode_responses=True)) is None
    client = redis.Redis.from_url(redis_url, protocol=3)
    assert DirectConnections.for_client(client) is None
    broker = Broker(client, namespace)
    assert broker.link is None
    c = broker.add_consumer("fallback", ConsumerSpec(prefetch=5))
    broker.send("fallback", Message(body="via redis-py"))
    (delivery,) = broker.receive(c, 5)
    assert delivery.body == "via redis-py"


def test_broker_runs_its_scripts_over_it(broker, redis_client, namespace):
    assert broker.link is not None
    c = broker.add_consumer("orders", ConsumerSpec(prefetch=10, ack_mode="client-individual"))
    ids = set(broker.send("orders", [Message(body=f"m{i}") for i in range(50)]))
    got = broker.receive(c, 50)
    assert len(got) == 10 and {d.message_id for d in got} <= ids
    assert broker.ack(c, [d.message_id for d in got]) == 10
    stats = broker.stats("orders")
    assert (stats.enqueued, stats.dequeued) == (50, 10)
    assert len(broker.link._idle) == 1  # one thread, one connection, kept between calls


def _client_id(client: redis.Redis, name: str) -> str:
    return next(str(c["id"]) for c in client.client_list() if c.get("name") == name)
