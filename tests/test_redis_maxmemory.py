"""The embedded server's backstop: `maxmemory` with `noeviction`. A real server (the embedded Valkey) in each
script form (EVALSHA scripts, as on a Redis 6.2; the function library) filled with messages until the server
itself refuses: the send fails with the named error, nothing already stored is lost, consumers drain it."""

from __future__ import annotations

import uuid

import pytest
import redis

from broker_core import errors
from broker_core.broker import Broker
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from signalbox.embedded_redis import EmbeddedRedis, free_port, maxmemory_setting, total_memory

FORMS = [pytest.param("0", id="eval"), pytest.param("1", id="functions")]


def test_maxmemory_defaults_to_half_the_memory_and_takes_redis_sizes():
    assert int(maxmemory_setting(None)) == total_memory() // 2
    assert maxmemory_setting(" 2GB ") == "2gb" and maxmemory_setting("0") == "0"
    with pytest.raises(ValueError, match="SIGNALBOX_REDIS_MAXMEMORY='lots' is not a memory size"):
        maxmemory_setting("lots")


def test_run_refuses_a_maxmemory_that_is_not_a_size_in_one_clear_line(tmp_path):
    from tests.helpers.processes import launcher_env, run_launcher_to_completion

    result = run_launcher_to_completion(["--data-dir", str(tmp_path)],
                                        launcher_env(SIGNALBOX_REDIS_MAXMEMORY="plenty"))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert lines == ["signalbox: error: SIGNALBOX_REDIS_MAXMEMORY='plenty' is not a memory size; give bytes "
                     "or a number with kb, mb or gb (e.g. 2gb), or 0 for no limit"]


def test_the_embedded_servers_config_has_maxmemory_and_noeviction(tmp_path):
    text = EmbeddedRedis(tmp_path, port=free_port(), maxmemory="2GB").config_text()
    assert "maxmemory 2gb\n" in text and "maxmemory-policy noeviction\n" in text
    default = EmbeddedRedis(tmp_path, port=free_port()).config_text()
    assert f"maxmemory {total_memory() // 2}\n" in default


@pytest.fixture(params=FORMS)
def small_server(request, tmp_path, monkeypatch):
    monkeypatch.setenv("SIGNALBOX_REDIS_FUNCTIONS", request.param)  # the form the brokers below choose
    server = EmbeddedRedis(tmp_path / "redis", port=free_port(), appendonly=False, maxmemory="8mb")
    server.start()
    client = redis.Redis.from_url(server.url)
    try:
        assert client.config_get("maxmemory") == {"maxmemory": str(8 << 20)}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        yield client
    finally:
        client.close()
        server.stop()


def test_at_maxmemory_a_send_is_refused_by_name_and_nothing_stored_is_lost(small_server):
    broker = Broker(small_server, f"t{uuid.uuid4().hex[:8]}")
    body = "x" * 2_000
    sent: list[str] = []
    refused = None
    while refused is None and len(sent) < 100_000:
        try:
            sent += broker.send("orders", [Message(body=body) for _ in range(20)])
        except errors.RedisMaxMemory as exc:
            refused = exc
    assert refused is not None and len(sent) > 200  # Redis's limit, not the broker's 1 GiB memoryLimit
    assert refused.code == "redis_maxmemory" and "maxmemory" in refused.message
    assert refused.details["scope"] == "redis" and refused.retry_after == 1.0
    assert broker.stats("orders").queue_size == len(sent)  # the refused batch stored nothing

    # Consumers drain it: every stored message once, then sends are accepted again.
    c = broker.add_consumer("orders", ConsumerSpec(prefetch=100, ack_mode="client-individual"))
    got: list[str] = []
    while deliveries := broker.receive(c, 100):
        ids = [d.message_id for d in deliveries]
        broker.ack(c, ids)
        got += ids
    assert sorted(got) == sorted(sent)
    assert broker.send("orders", Message(body="again"))


def _a_transaction_sending_and_acking(server) -> tuple[Broker, str]:
    """An open transaction that sends one message to `audit` and acks one of `orders`."""
    broker = Broker(server, f"t{uuid.uuid4().hex[:8]}")
    c = broker.add_consumer("orders", ConsumerSpec(prefetch=10, ack_mode="transacted"))
    broker.send("orders", Message(body="first"))
    (d,) = broker.receive(c, 1)
    tx = broker.begin()
    broker.send("audit", Message(body="in-tx"), tx=tx)
    broker.ack(c, d.message_id, tx=tx)
    return broker, tx


def test_at_maxmemory_a_commit_applies_nothing_and_commits_whole_once_there_is_room(small_server):
    """Redis refuses every command a MULTI queues while it is over maxmemory, so a COMMIT then applies
    nothing (its ack neither: it is an allow-oom script) and the transaction stays open; once there is
    room the same transaction commits whole."""
    broker, tx = _a_transaction_sending_and_acking(small_server)
    with pytest.raises(errors.RedisMaxMemory):
        for _ in range(100_000):
            broker.send("filler", [Message(body="x" * 2_000) for _ in range(20)])
    # surely over it: the refused batch's memory goes back, and Redis may then be a few KB under it
    small_server.config_set("maxmemory", str(4 << 20))
    with pytest.raises(errors.RedisMaxMemory):
        broker.commit(tx)
    assert (broker.stats("orders").dequeued, broker.stats("audit").enqueued) == (0, 0)
    small_server.config_set("maxmemory", str(64 << 20))  # room
    broker.commit(tx)
    assert (broker.stats("orders").dequeued, broker.stats("audit").enqueued) == (1, 1)


def test_a_commit_that_meets_maxmemory_between_its_queueing_and_its_exec_applies_whole_or_not_at_all(
        small_server):
    """Redis refuses a MULTI's commands while it is over maxmemory when they are queued; one that gets
    over between the queueing and the EXEC runs the block: the function form's EXEC is refused whole (it
    holds functions without allow-oom), while the EVAL form's scripts meet the limit at their first write,
    a runtime error. Either way the commit applies whole or not at all (the steps' refusal key,
    includes/base.lua begin_call): never its ack without its send."""
    from broker_core.drivers.loop import Transaction

    broker, tx = _a_transaction_sending_and_acking(small_server)
    broker.stats("audit"), broker.stats("orders")  # (their scripts loaded before the limit)
    perform = broker._perform

    def over_the_limit_at_exec(io):
        if not isinstance(io, Transaction):
            return perform(io)
        conn = small_server.connection_pool.get_connection()
        try:
            conn.send_command("MULTI")
            conn.read_response()
            for command in io.commands:
                conn.send_command(*command)
                conn.read_response()  # QUEUED
            small_server.config_set("maxmemory", "1")  # over it from now on
            conn.send_command("EXEC")
            try:
                return conn.read_response()
            except redis.ResponseError as exc:  # EXECABORT
                raise exc from None
        finally:
            small_server.config_set("maxmemory", str(8 << 20))
            small_server.connection_pool.release(conn)

    broker._perform = over_the_limit_at_exec
    try:
        broker.commit(tx)
        committed = True
    except (errors.TransactionError, errors.RedisMaxMemory, redis.ResponseError):
        committed = False
    broker._perform = perform
    applied = (broker.stats("orders").dequeued, broker.stats("audit").enqueued)
    assert applied == ((1, 1) if committed else (0, 0)), (committed, applied)
    if not committed:
        broker.commit(tx)  # still open, whole once there is room
        assert (broker.stats("orders").dequeued, broker.stats("audit").enqueued) == (1, 1)
