"""signalbox/node.py on the session's Redis: heartbeats become running / missing / stopped processes and
absent roles, the heartbeat set stays bounded, Redis's facts and the broker memory are read as the server
and broker_core report them."""

from __future__ import annotations

import redis.asyncio

from broker_core.broker import Broker
from broker_core.ops import flow
from signalbox import node


async def test_heartbeats_become_running_missing_and_stopped_processes(redis_url, namespace, settings):
    settings.SIGNALBOX_HEARTBEAT_SECONDS = 1.0
    worker = node.Heartbeat("worker", "w1@host", namespace=namespace, url=redis_url)
    web = node.Heartbeat("web", namespace=namespace, url=redis_url)
    worker.beat()
    web.beat()
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        now = worker.started_ms + 1500
        seen = await node.processes(client, namespace, now)
        assert [p["role"] for p in seen["processes"]] == ["web", "worker"]  # in ROLES order
        assert {p["state"] for p in seen["processes"]} == {"running"}
        assert seen["running"] == {"web": 1, "worker": 1, "beat": 0, "stomp": 0}
        assert seen["absent"] == ["beat", "stomp"]
        w = seen["processes"][1]
        assert (w["pid"], w["name"], w["uptime_ms"]) == (worker.pid, "w1@host", now - worker.started_ms)
        # three missed beats (1 s each): missing, and its role absent
        last = max(p["last_seen"] for p in seen["processes"])
        later = await node.processes(client, namespace, last + 3001)
        assert {p["state"] for p in later["processes"]} == {"missing"}
        first = min(p["last_seen"] for p in seen["processes"])
        assert (await node.processes(client, namespace, first + 2999))["absent"] == ["beat", "stomp"]
        assert later["absent"] == list(node.ROLES)
        worker.stop()  # an orderly end says so
        after = await node.processes(client, namespace, now)
        assert [p["state"] for p in after["processes"]] == ["running", "stopped"]
        assert after["absent"] == ["worker", "beat", "stomp"]
    finally:
        web.stop()
        await client.aclose()


async def test_the_heartbeat_set_keeps_the_most_recent_max_processes(redis_url, namespace, monkeypatch):
    monkeypatch.setattr(node, "MAX_PROCESSES", 5)
    beats = [node.Heartbeat("worker", namespace=namespace, url=redis_url) for _ in range(8)]
    for i, beat in enumerate(beats):
        beat.id = f"worker:host:{i}"
        beat.beat()
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        assert await client.zcard(f"{namespace}:node:processes") == 5
        ttl = await client.ttl(f"{namespace}:node:process:worker:host:7")
        assert 0 < ttl <= node.RETAIN_SECONDS
    finally:
        for beat in beats:
            beat._stop.set()
            if beat._client is not None:
                beat._client.close()
        await client.aclose()


async def test_redis_facts_and_broker_memory_are_the_servers_and_the_brokers(redis_url, namespace,
                                                                           redis_client):
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        facts = await node.redis_facts(client)
        assert facts["memory"]["max"] == int(redis_client.config_get("maxmemory")["maxmemory"])
        assert facts["aof"]["enabled"] == bool(redis_client.info("persistence")["aof_enabled"])
        assert facts["aof"]["appendfsync"] == redis_client.config_get("appendfsync")["appendfsync"]
        assert facts["clients"]["connected"] >= 1
        assert facts["version"]
        broker = Broker(redis_client, namespace)
        flow.configure(broker, flow.SystemUsage(memory_limit=123_456))
        assert await node.broker_memory(client, namespace) == {"used": 0, "limit": 123_456, "percent": 0}
        assert broker.memory().limit == 123_456
    finally:
        await client.aclose()


async def test_at_maxmemory_the_node_says_so(tmp_path, namespace):
    """noeviction at maxmemory refuses writes, a heartbeat's too when its input tips it over (the beat thread
    catches the error and goes on): gather() says Redis is at its maxmemory, so the page can say why
    processes may read missing. Between commands Redis reports a little under the limit."""
    import redis as sync_redis

    from signalbox.embedded_redis import EmbeddedRedis, free_port

    server = EmbeddedRedis(tmp_path / "redis", port=free_port(), appendonly=False, maxmemory="8mb")
    server.start()
    filler = sync_redis.Redis.from_url(server.url)
    client = redis.asyncio.Redis.from_url(server.url)
    beat = node.Heartbeat("worker", namespace=namespace, url=server.url)
    try:
        beat.beat()
        assert (await node.gather(client, namespace))["redis"]["near_maxmemory"] is False
        try:
            for i in range(10_000):
                filler.set(f"{namespace}:fill:{i}", "x" * 10_000)
        except sync_redis.ResponseError as exc:
            assert "maxmemory" in str(exc)
        with_full = await node.gather(client, namespace)
        assert with_full["redis"]["near_maxmemory"] is True, with_full["redis"]["memory"]
        assert [p["state"] for p in with_full["processes"]] == ["running"]  # (its earlier beat)
    finally:
        beat._stop.set()
        if beat._client is not None:
            beat._client.close()
        filler.close()
        await client.aclose()
        server.stop()
