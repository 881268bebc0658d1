"""Throughput and latency of the REST gateway over HTTP on loopback, one keep-alive connection per client.

Usage: python bench/http_gateway.py [--messages N] [--url URL --token KEY] [--scenario NAME ...]

Scenarios (each prints msgs/s and the p50/p99 latency of one request):
  produce-1      POST /api/v1/queues/<q>/messages, one message per request
  produce-100    the same with {"messages": [100 envelopes]}
  consume-ack-1  one request per message: POST .../ack?receive=1 acknowledges the previous message
                 and hands over the next one (the first request is a receive)
  consume-ack-1x4  consume-ack-1 by 4 consumers at once, each its own process and connection
  consume-100    POST .../ack?receive=100 acknowledges 100 and hands over the next 100
  amq-post       ActiveMQ's POST /api/message/<q>?type=queue, one message per request
  amq-get        ActiveMQ's GET /api/message/<q>?type=queue&clientId=bench (acknowledged once answered)
  amq-get-session  the same GET without clientId: the consumer is kept in the session (JSESSIONID cookie)
  empty          the floor: GET / of a bare ASGI app (bench/asgi_floor.py) in its own uvicorn, started with
                 the gateway's flags; no gateway can answer faster on this machine

Without --url it starts its own server: Redis at REDIS_URL or an embedded one (AOF on, appendfsync
everysec, as `./signalbox.sh run` had it until session 20), a fresh SQLite database, and one
uvicorn process serving signalbox.asgi (as the launcher does). The client is the standard library's
http.client, so the figures are the server's, not a client library's. Bodies are 256 bytes.

Each scenario also prints the CPU time spent per 10,000 messages by the gateway process (psutil, the
server's pid: its own with no --url, else --server-pid), by Redis (its process_id from INFO, when it
runs on this machine) and by this client, and Redis's `INFO commandstats` microseconds per message.
CPU time does not depend on how loaded the machine is; wall-clock rates do.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BODY = "x" * 256
BATCH = 100


class CpuMeter:
    """CPU seconds of the gateway, Redis and this client between `start` and `stop`, and Redis's own
    accounting of its commands (`INFO commandstats` usec)."""

    def __init__(self, server_pid: int | None, redis_url: str | None) -> None:
        import psutil

        self.redis = None
        self.processes: dict[str, psutil.Process] = {}
        if server_pid:
            self.processes["gateway"] = psutil.Process(server_pid)
        if redis_url:
            import redis

            self.redis = redis.Redis.from_url(redis_url)
            # Redis on another machine: commandstats only.
            if urlsplit(redis_url).hostname in ("127.0.0.1", "localhost", None):
                with contextlib.suppress(psutil.Error, TypeError, ValueError):
                    self.processes["redis"] = psutil.Process(int(self.redis.info("server")["process_id"]))

    def _sample(self) -> dict[str, float]:
        sample = {name: sum(p.cpu_times()[:2]) for name, p in self.processes.items()}
        sample["client"] = time.process_time()
        if self.redis is not None:
            stats = self.redis.info("commandstats")
            sample["redis commands"] = sum(v["usec"] for v in stats.values()) / 1e6
            for name, value in stats.items():
                sample[f"calls {name.removeprefix('cmdstat_')}"] = value["calls"]
        return sample

    def start(self) -> None:
        self.before = self._sample()

    def stop(self, messages: int) -> str:
        after = self._sample()
        per = {name: (after[name] - self.before.get(name, 0)) / max(1, messages) * 1e4 for name in after}
        calls = {name[6:]: value / 1e4 for name, value in per.items() if name.startswith("calls ") and value}
        cpu = {name: value for name, value in per.items() if not name.startswith("calls ")}
        ordered = sorted(calls.items(), key=lambda item: -item[1])
        cpu_text = ", ".join(f"{name} {value:.2f}" for name, value in cpu.items())
        calls_text = ", ".join(f"{name} {value:.2f}" for name, value in ordered)
        return f"    CPU s per 10,000 msgs: {cpu_text}\n    Redis commands per message: {calls_text}"


class Client:
    """One keep-alive HTTP/1.1 connection; `call` returns (status, body bytes, headers)."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        self.headers = headers
        self.filler: Client | None = None  # fills queues when `headers` is not a token (Basic)

    def call(self, method: str, path: str, body: bytes | None = None,
             content_type: str = "application/json") -> tuple[int, bytes, http.client.HTTPResponse]:
        headers = dict(self.headers)
        if body is not None:
            headers["Content-Type"] = content_type
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        data = response.read()
        return response.status, data, response

    def json(self, method: str, path: str, payload: object = None, expect: int = 200) -> dict:
        body = json.dumps(payload).encode() if payload is not None else None
        status, data, _ = self.call(method, path, body)
        if status != expect:
            raise SystemExit(f"{method} {path}: {status} {data[:300]!r}")
        return json.loads(data) if data else {}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def timed(requests: int, step: Callable[[], int]) -> tuple[float, list[float], int]:
    """Run `step` `requests` times; returns (seconds, per-request latencies, messages moved)."""
    latencies: list[float] = []
    moved = 0
    start = time.perf_counter()
    for _ in range(requests):
        t0 = time.perf_counter()
        moved += step()
        latencies.append(time.perf_counter() - t0)
    return time.perf_counter() - start, latencies, moved


def fill(client: Client, queue: str, n: int) -> None:
    if client.filler is not None:  # a connection of its own each time (uvicorn closes idle ones after 5 s)
        filler = Client(f"http://{client.connection.host}:{client.connection.port}", client.filler.headers)
        try:
            return fill(filler, queue, n)
        finally:
            filler.connection.close()
    for i in range(0, n, 1000):
        count = min(1000, n - i)
        client.json("POST", f"/api/v1/queues/{queue}/messages",
                    {"messages": [{"body": BODY}] * count}, expect=201)


def new_consumer(client: Client, queue: str, prefetch: int) -> str:
    created = client.json("POST", f"/api/v1/queues/{queue}/consumers",
                          {"prefetch": prefetch, "lease_ms": 120_000}, expect=201)
    return f"/api/v1/queues/{queue}/consumers/{created['consumer_id']}"


def scenario_produce_1(client: Client, n: int) -> tuple[float, list[float], int]:
    queue = f"bench.p1.{uuid.uuid4().hex[:6]}"
    payload = json.dumps({"body": BODY}).encode()
    path = f"/api/v1/queues/{queue}/messages"

    def step() -> int:
        status, data, _ = client.call("POST", path, payload)
        assert status == 201, data
        return 1

    return timed(n, step)


def scenario_produce_100(client: Client, n: int) -> tuple[float, list[float], int]:
    queue = f"bench.p100.{uuid.uuid4().hex[:6]}"
    payload = json.dumps({"messages": [{"body": BODY}] * BATCH}).encode()
    path = f"/api/v1/queues/{queue}/messages"

    def step() -> int:
        status, data, _ = client.call("POST", path, payload)
        assert status == 201, data
        return BATCH

    return timed(max(1, n // BATCH), step)


def scenario_consume_ack_1(client: Client, n: int) -> tuple[float, list[float], int]:
    queue = f"bench.c1.{uuid.uuid4().hex[:6]}"
    fill(client, queue, n)
    consumer = new_consumer(client, queue, 1000)
    last: list[str] = []

    def step() -> int:
        if last:
            body = json.dumps({"message_ids": last}).encode()
            status, data, _ = client.call("POST", f"{consumer}/ack?receive=1", body)
        else:
            status, data, _ = client.call("POST", f"{consumer}/receive?max_messages=1")
        assert status == 200, data
        messages = json.loads(data)["messages"]
        last[:] = [m["message_id"] for m in messages]
        return 1

    result = timed(n, step)
    client.json("POST", f"{consumer}/ack", {"message_ids": last})
    return result


PARALLEL = 4  # consumer processes of consume-ack-1x4


def _consume_one_per_request(url: str, headers: dict[str, str], consumer: str, start: Any,
                             results: Any) -> None:
    """A consumer process of consume-ack-1x4: ack?receive=1 on its own connection until its window
    comes back empty; puts (first request, last answer, latencies) on `results`."""
    client = Client(url, headers)
    latencies: list[float] = []
    last: list[str] = []
    start.wait()
    began = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        if last:
            body = json.dumps({"message_ids": last}).encode()
            status, data, _ = client.call("POST", f"{consumer}/ack?receive=1", body)
        else:
            status, data, _ = client.call("POST", f"{consumer}/receive?max_messages=1")
        latencies.append(time.perf_counter() - t0)
        assert status == 200, data
        last = [m["message_id"] for m in json.loads(data)["messages"]]
        if not last:
            break
    results.put((began, time.perf_counter(), latencies[:-1]))


def scenario_consume_ack_1_parallel(client: Client, n: int) -> tuple[float, list[float], int]:
    """consume-ack-1 by PARALLEL consumers at once, each its own process and keep-alive connection (how a
    server's throughput is measured: with requests in flight together). The consumers register before
    the messages arrive, so dispatch spreads them round-robin; the rate is all messages over the time from
    the first request to the last answer."""
    import multiprocessing

    queue = f"bench.c1p.{uuid.uuid4().hex[:6]}"
    consumers = [new_consumer(client, queue, 1000) for _ in range(PARALLEL)]
    fill(client, queue, n)
    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(PARALLEL), context.Queue()
    url = f"http://{client.connection.host}:{client.connection.port}"
    workers = [context.Process(target=_consume_one_per_request,
                               args=(url, client.headers, consumer, start, results))
               for consumer in consumers]
    for worker in workers:
        worker.start()
    done = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    latencies = [latency for _b, _e, own in done for latency in own]
    seconds = max(end for _b, end, _l in done) - min(began for began, _e, _l in done)
    return seconds, latencies, len(latencies)


def scenario_consume_100(client: Client, n: int) -> tuple[float, list[float], int]:
    queue = f"bench.c100.{uuid.uuid4().hex[:6]}"
    fill(client, queue, n)
    consumer = new_consumer(client, queue, 1000)
    last: list[str] = []

    def step() -> int:
        if last:
            body = json.dumps({"message_ids": last}).encode()
            status, data, _ = client.call("POST", f"{consumer}/ack?receive={BATCH}", body)
        else:
            status, data, _ = client.call("POST", f"{consumer}/receive?max_messages={BATCH}")
        assert status == 200, data
        messages = json.loads(data)["messages"]
        last[:] = [m["message_id"] for m in messages]
        return len(messages)

    result = timed(max(1, n // BATCH), step)
    if last:
        client.json("POST", f"{consumer}/ack", {"message_ids": last})
    return result


def scenario_amq_post(client: Client, n: int) -> tuple[float, list[float], int]:
    path = f"/api/message/bench.amq.{uuid.uuid4().hex[:6]}?type=queue"
    body = BODY.encode()

    def step() -> int:
        status, data, _ = client.call("POST", path, body, content_type="text/plain")
        assert status == 200, data
        return 1

    return timed(n, step)


def scenario_amq_get(client: Client, n: int) -> tuple[float, list[float], int]:
    queue = f"bench.amqget.{uuid.uuid4().hex[:6]}"
    fill(client, queue, n)
    path = f"/api/message/{queue}?type=queue&clientId=bench-{uuid.uuid4().hex[:6]}&readTimeout=2000"

    def step() -> int:
        status, data, _ = client.call("GET", path)
        assert status == 200, (status, data)
        return 1

    return timed(n, step)


def scenario_amq_get_session(client: Client, n: int) -> tuple[float, list[float], int]:
    """As the ActiveMQ harness's rest_get_session: no clientId, the JSESSIONID cookie names the consumer."""
    queue = f"bench.amqses.{uuid.uuid4().hex[:6]}"
    fill(client, queue, n)
    path = f"/api/message/{queue}?type=queue&readTimeout=2000"
    cookie: list[str] = []

    def step() -> int:
        if cookie:
            client.headers["Cookie"] = cookie[0]
        status, data, response = client.call("GET", path)
        assert status == 200, (status, data)
        set_cookie = response.getheader("Set-Cookie")
        if set_cookie and not cookie:
            cookie.append(set_cookie.split(";")[0])
        return 1

    try:
        return timed(n, step)
    finally:
        client.headers.pop("Cookie", None)


def scenario_empty(client: Client, n: int) -> tuple[float, list[float], int]:
    """GET / of bench/asgi_floor.py in its own uvicorn (the gateway's flags), on its own connection."""
    import subprocess

    from signalbox.embedded_redis import PortNotOpen, free_port, wait_for_port

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "bench.asgi_floor:app", "--host", "127.0.0.1", "--port", str(port),
         "--lifespan", "off", "--log-level", "warning", "--no-access-log"], cwd=ROOT)
    try:
        try:
            wait_for_port(port, process=process)
        except PortNotOpen as exc:
            raise SystemExit(f"the floor's uvicorn did not start: {exc}") from None
        floor = Client(f"http://127.0.0.1:{port}", {})

        def step() -> int:
            status, data, _ = floor.call("GET", "/")
            assert status == 200, data
            return 1

        return timed(n, step)
    finally:
        process.terminate()
        process.wait(timeout=10)


SCENARIOS: dict[str, tuple[str, Callable[[Client, int], tuple[float, list[float], int]]]] = {
    "produce-1": ("produce, one message per request", scenario_produce_1),
    "produce-100": ("produce, batches of 100", scenario_produce_100),
    "consume-ack-1": ("consume and ack, one message per request", scenario_consume_ack_1),
    "consume-ack-1x4": (f"consume and ack, one per request, {PARALLEL} consumers",
                        scenario_consume_ack_1_parallel),
    "consume-100": ("consume and ack, batches of 100", scenario_consume_100),
    "amq-post": ("ActiveMQ-compatible POST, one per request", scenario_amq_post),
    "amq-get": ("ActiveMQ-compatible GET, one per request", scenario_amq_get),
    "amq-get-session": ("ActiveMQ-compatible GET, session consumer", scenario_amq_get_session),
    "empty": ("floor: empty answer of a bare ASGI app", scenario_empty),
}


def start_own_server(tmp: Path) -> tuple[str, str, Callable[[], None], int]:
    """Redis (REDIS_URL or embedded, AOF everysec), a migrated SQLite database, one uvicorn."""
    from signalbox.embedded_redis import EmbeddedRedis, free_port

    stops: list[Callable[[], object]] = []
    if not os.environ.get("REDIS_URL"):
        embedded = EmbeddedRedis(tmp / "redis", free_port(), appendonly=True, appendfsync="everysec")
        embedded.start()
        stops.append(embedded.stop)
        os.environ["REDIS_URL"] = embedded.url
    from tests.helpers.gateway_server import ALICE_TOKEN, prepare_database, start_gateway

    namespace = f"bench{uuid.uuid4().hex[:8]}"
    prepare_database(tmp / "gateway", namespace)
    server = start_gateway(tmp / "gateway", namespace, name="bench")
    stops.insert(0, server.stop)

    def stop() -> None:
        for fn in stops:
            fn()

    return f"http://127.0.0.1:{server.port}", ALICE_TOKEN, stop, server.process.pid


def describe_machine(redis_url: str | None) -> None:
    import django
    import uvicorn

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"python {platform.python_version()}, django {django.get_version()}, uvicorn {uvicorn.__version__}")
    if redis_url:
        import redis

        client = redis.Redis.from_url(redis_url)
        info = client.info("server")
        persistence = client.info("persistence")
        fsync = client.config_get("appendfsync").get("appendfsync")
        print(f"redis {info['redis_version']} at {redis_url}, aof "
              f"{'on' if persistence.get('aof_enabled') else 'off'}, appendfsync {fsync}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--url", help="a running gateway (default: start one)")
    parser.add_argument("--token", help="API token of a user allowed everything on bench.>")
    parser.add_argument("--basic", help="user:password for the ActiveMQ scenarios (default: the token)")
    parser.add_argument("--scenario", action="append", choices=list(SCENARIOS))
    parser.add_argument("--server-pid", type=int, help="the gateway's pid with --url, for its CPU time")
    args = parser.parse_args()
    stop: Callable[[], None] = lambda: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="signalbox-bench-") as tmp:
        if args.url:
            url, token, server_pid = args.url, args.token or "", args.server_pid
        else:
            url, token, stop, server_pid = start_own_server(Path(tmp))
        try:
            describe_machine(os.environ.get("REDIS_URL"))
            print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            meter = CpuMeter(server_pid, os.environ.get("REDIS_URL"))
            print(f"server {url}, {args.messages} messages per scenario, {len(BODY)}-byte bodies, one "
                  "keep-alive connection, http.client (consume-ack-1x4: one per consumer process, whose CPU "
                  "the client figure leaves out)")
            headers = {"Authorization": f"Token {token}"}
            basic_headers = headers
            if args.basic:
                basic_headers = {"Authorization": "Basic " + base64.b64encode(args.basic.encode()).decode()}
            for name in args.scenario or list(SCENARIOS):
                title, run = SCENARIOS[name]
                client = Client(url, basic_headers if name.startswith("amq") else headers)
                if client.headers is not headers:
                    client.filler = Client(url, headers)
                run(client, min(200, args.messages))  # warm up: connection, caches, scripts
                meter.start()
                seconds, latencies, moved = run(client, args.messages)
                cpu = meter.stop(moved)
                p50, p99 = percentile(latencies, 0.5) * 1e3, percentile(latencies, 0.99) * 1e3
                print(f"{title:<45} {moved / seconds:>9,.0f} msgs/s   p50 {p50:6.2f} ms   p99 {p99:6.2f} ms"
                      f"   ({len(latencies)} requests, mean {statistics.fmean(latencies) * 1e3:.2f} ms)")
                print(cpu, flush=True)
                client.connection.close()
            print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        finally:
            stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
