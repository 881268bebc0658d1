"""The node's health: what Redis says of itself, the broker's memory, and the processes of the deployment.

Every long-running process (web, worker, beat, the STOMP listener) writes a **heartbeat** to Redis every
SIGNALBOX_HEARTBEAT_SECONDS (default 5) from a daemon thread: a hash `<ns>:node:process:<role>:<host>:<pid>`
(role, pid, host, name, started, last_seen, and `stopped` when it ended in order) kept for RETAIN_SECONDS,
and its id in the sorted set `<ns>:node:processes` scored by last_seen. Each beat is one pipeline of five
bounded commands, which also trims the set to what is younger than RETAIN_SECONDS and to MAX_PROCESSES
entries. A reader (`processes`) calls a process **missing** when its last beat is older than MISSING_BEATS
beats: it died without saying so (SIGKILL, a lost host) or cannot reach Redis.

The console's node page (GET /api/v1/console/node) and GET /metrics read Redis's facts with the same
`redis_facts`, and the maintenance tick with signalbox/maintenance_check.py's `check_maintenance`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import socket
import threading
import time
from typing import Any

import redis
from asgiref.sync import sync_to_async
from django.conf import settings

from broker_core import maintenance
from broker_core.broker import flow
from broker_core.keys import temp_tally_key, usage_key
from signalbox import maintenance_check

log = logging.getLogger(__name__)

ROLES = ("web", "worker", "beat", "stomp")  # the processes `./signalbox.sh run` starts
RETAIN_SECONDS = 600  # a stopped or missing process is listed this long after its last beat
MAX_PROCESSES = 200  # the set keeps at most this many, the most recently seen
MISSING_BEATS = 3  # beats a process may miss before it is called missing
SHOWN = 100  # processes a listing returns at most
NEAR_MAXMEMORY = 0.95  # used memory from this share of maxmemory on counts as full (gather)


def interval() -> float:
    return max(0.1, float(settings.SIGNALBOX_HEARTBEAT_SECONDS))


def _index_key(namespace: str) -> str:
    return f"{namespace}:node:processes"


def _process_key(namespace: str, process_id: str) -> str:
    return f"{namespace}:node:process:{process_id}"


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Heartbeat:
    """One process's heartbeat: `start()` begins the beats (idempotent), `stop()` says it ended in order."""

    def __init__(self, role: str, name: str = "", namespace: str | None = None,
                 url: str | None = None) -> None:
        self.role, self.name = role, name
        self.namespace = namespace or settings.SIGNALBOX_NAMESPACE
        self.url = url or settings.REDIS_URL
        self.pid, self.host = os.getpid(), socket.gethostname()
        self.id = f"{role}:{self.host}:{self.pid}"
        self.started_ms = int(time.time() * 1000)
        self.every = interval()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: redis.Redis | None = None

    def _redis(self) -> redis.Redis:
        if self._client is None:
            # bounded: a hung Redis must not hold the beat (nor a shutdown) for long
            self._client = redis.Redis.from_url(self.url, socket_connect_timeout=2, socket_timeout=2)
        return self._client

    def beat(self, stopped: bool = False) -> None:
        now = int(time.time() * 1000)
        key, index = _process_key(self.namespace, self.id), _index_key(self.namespace)
        fields: dict[str, Any] = {"role": self.role, "pid": self.pid, "host": self.host, "name": self.name,
                                  "started": self.started_ms, "last_seen": now}
        if stopped:
            fields["stopped"] = now
        pipe = self._redis().pipeline(transaction=False)
        pipe.hset(key, mapping=fields)
        pipe.expire(key, RETAIN_SECONDS)
        pipe.zadd(index, {self.id: now})
        pipe.zremrangebyscore(index, "-inf", now - RETAIN_SECONDS * 1000)
        pipe.zremrangebyrank(index, 0, -MAX_PROCESSES - 1)
        pipe.execute()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat()
            except (redis.RedisError, OSError) as exc:  # Redis away: the readers will call us missing
                log.debug("heartbeat of %s not written: %s", self.id, exc)
            self._stop.wait(self.every)

    def start(self) -> Heartbeat:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.role}", daemon=True)
            self._thread.start()
            atexit.register(self.stop)
        return self

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        # Redis away: then it is shown as missing, which is what a reader can know
        with contextlib.suppress(redis.RedisError, OSError):
            self.beat(stopped=True)
        if self._client is not None:
            self._client.close()


_started: dict[str, Heartbeat] = {}


def start_heartbeat(role: str, name: str = "") -> Heartbeat:
    """The process's heartbeat for `role`, started once per process (a forked child starts its own)."""
    key = f"{role}:{os.getpid()}"
    if key not in _started:
        _started[key] = Heartbeat(role, name).start()
    return _started[key]


def stop_heartbeat(role: str) -> None:
    beat = _started.get(f"{role}:{os.getpid()}")
    if beat is not None:
        beat.stop()


async def processes(client: Any, namespace: str, now_ms: int | None = None) -> dict[str, Any]:
    """The processes seen within RETAIN_SECONDS (the SHOWN seen last, by role), each with its state
    (`running`, `stopped`, `missing`) and uptime, and per role how many run: a role of ROLES with none
    running is listed in `absent`."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    missing_ms = int(MISSING_BEATS * interval() * 1000)
    ids = [_text(i) for i in await client.zrevrange(_index_key(namespace), 0, SHOWN - 1)]
    pipe = client.pipeline(transaction=False)
    for process_id in ids:
        pipe.hgetall(_process_key(namespace, process_id))
    rows = []
    for raw in await pipe.execute() if ids else []:
        if not raw:
            continue  # expired since the ZREVRANGE
        p = {_text(k): _text(v) for k, v in raw.items()}
        for field in ("pid", "started", "last_seen", "stopped"):
            if field in p:
                p[field] = int(p[field])
        age = now_ms - p["last_seen"]
        p["state"] = "stopped" if "stopped" in p else "missing" if age > missing_ms else "running"
        p["last_seen_age_ms"] = age
        p["uptime_ms"] = (p["last_seen"] if p["state"] != "running" else now_ms) - p["started"]
        rows.append(p)
    # by role as ROLES lists them, then oldest first (the listing itself is by last heartbeat)
    order = {role: i for i, role in enumerate(ROLES)}
    rows.sort(key=lambda p: (order.get(p["role"], len(ROLES)), p["role"], p["started"]))
    running = {role: sum(1 for p in rows if p["role"] == role and p["state"] == "running") for role in ROLES}
    return {"processes": rows, "running": running, "absent": [r for r in ROLES if not running[r]],
            "heartbeat_seconds": interval(), "missing_after_seconds": missing_ms / 1000}


async def redis_facts(client: Any) -> dict[str, Any]:
    """What Redis says of itself, in one round trip: version and uptime, memory (used, peak, maxmemory and
    its policy), the AOF (enabled, appendfsync, the last write's and rewrite's status, a rewrite running,
    fsyncs pending or delayed), clients and operations per second. Redis does not report when it last
    fsynced; `aof_delayed_fsync` counts the times an `everysec` fsync was late (the disk fell behind)."""
    pipe = client.pipeline(transaction=False)
    for section in ("server", "memory", "persistence", "clients", "stats"):
        pipe.info(section)
    server, memory, persistence, clients, stats = await pipe.execute()
    try:
        appendfsync = _text((await client.config_get("appendfsync")).get("appendfsync", ""))
    except redis.ResponseError:  # CONFIG renamed or refused (a managed Redis)
        appendfsync = ""
    return {
        "version": str(server.get("valkey_version") or server.get("redis_version", "")),
        "server": str(server.get("server_name", "redis")),
        "uptime_seconds": int(server.get("uptime_in_seconds", 0)),
        "memory": {"used": int(memory.get("used_memory", 0)), "peak": int(memory.get("used_memory_peak", 0)),
                   "rss": int(memory.get("used_memory_rss", 0)), "max": int(memory.get("maxmemory", 0)),
                   "policy": str(memory.get("maxmemory_policy", ""))},
        "aof": {"enabled": bool(int(persistence.get("aof_enabled", 0))), "appendfsync": appendfsync,
                "last_write_status": str(persistence.get("aof_last_write_status", "")),
                "last_rewrite_status": str(persistence.get("aof_last_bgrewrite_status", "")),
                "rewrite_in_progress": bool(int(persistence.get("aof_rewrite_in_progress", 0))),
                "pending_fsync": int(persistence.get("aof_pending_bio_fsync", 0)),
                "delayed_fsync": int(persistence.get("aof_delayed_fsync", 0)),
                "current_size": int(persistence.get("aof_current_size", 0))},
        "clients": {"connected": int(clients.get("connected_clients", 0)),
                    "blocked": int(clients.get("blocked_clients", 0)),
                    "max": int(clients.get("maxclients", 0))},
        "ops_per_second": int(stats.get("instantaneous_ops_per_sec", 0)),
        "commands_processed": int(stats.get("total_commands_processed", 0)),
    }


async def broker_memory(client: Any, namespace: str) -> dict[str, int]:
    """The broker-wide memory limit and usage of flow control (broker_core Broker.memory, read with
    an async client)."""
    used, limit = await client.hmget(usage_key(namespace), "used", "limit")
    usage = flow.memory_usage(used, limit)
    return {"used": usage.used, "limit": usage.limit, "percent": usage.percent_usage}


async def temporary_destinations(client: Any, namespace: str) -> dict[str, int]:
    """The temporary destinations deleted because their connection ended, and the messages they held
    (Broker.temp_tally, read with an async client)."""
    temps, messages = await client.hmget(temp_tally_key(namespace), "destinations", "messages")
    return {"deleted": int(temps or 0), "deleted_messages": int(messages or 0)}


async def gather(client: Any, namespace: str) -> dict[str, Any]:
    """Everything the node page shows (GET /api/v1/console/node, docs/api.md): Redis's facts, the broker's
    memory, the processes and the maintenance tick (as /healthz judges it) with its recent errors. Redis
    unreachable or too slow (HEALTH_CHECK_TIMEOUT) is reported in `redis`, with no processes listed."""
    timeout = settings.HEALTH_CHECK_TIMEOUT
    tick = asyncio.ensure_future(sync_to_async(maintenance_check.check_maintenance, thread_sensitive=False)())
    out: dict[str, Any] = {"now": int(time.time() * 1000)}
    try:
        facts, memory, temps, procs, errors = await asyncio.wait_for(asyncio.gather(
            redis_facts(client), broker_memory(client, namespace), temporary_destinations(client, namespace),
            processes(client, namespace),
            client.lrange(maintenance.errors_key(namespace), 0, maintenance.RECENT_ERRORS - 1)), timeout)
        out.update(redis={"status": "ok", **facts}, broker_memory=memory, temporary_destinations=temps,
                   **procs, recent_errors=maintenance.recent_errors(errors))
        # At maxmemory (noeviction) Redis refuses the heartbeats' writes too: processes then read missing.
        # Within NEAR_MAXMEMORY of it, since Redis counts a command's own input when it refuses, and what it
        # reports between commands stays just under the limit.
        limit = facts["memory"]["max"]
        out["redis"]["near_maxmemory"] = limit > 0 and facts["memory"]["used"] >= NEAR_MAXMEMORY * limit
    except (redis.RedisError, OSError, TimeoutError) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else "no answer"
        out.update(redis={"status": "error", "error": f"{type(exc).__name__}: {text}"}, broker_memory=None,
                   temporary_destinations=None, processes=None, running=None, absent=None, recent_errors=None)
    out["maintenance"] = await tick
    return out
