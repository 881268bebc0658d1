"""STOMP over WebSocket through a live gateway process, measured with stomp.py's WebSocket transport.

Usage: python bench/ws_gateway.py [--redis-url URL] [--appendfsync everysec|always|no] [--messages N]
                                  [--round-trips N] [--only NAME ...]

Starts an embedded Redis with AOF (appendfsync as given; the run command's default is everysec) unless
--redis-url is given, then one gateway process (uvicorn, the project's ASGI app) on a free loopback port,
and measures:

- stream persistent / non-persistent: N 256-byte messages sent as fast as stomp.py sends them by one
  producer connection to one auto-ack subscriber connection (in a second process): produce rate (sends
  written by the client), end-to-end rate (first send to last receive), and p50 / p99 of the
  send->receive latency (CLOCK_MONOTONIC, the same clock in both processes);
- SEND->RECEIPT: one persistent send at a time, each waiting for its RECEIPT;
- ping-pong: one message at a time from a producer to a subscriber and back (p50 / p99 round trip).

Prints the machine, Redis version and fsync policy first, so figures can be compared.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import stomp  # noqa: E402
from stomp.adapter.ws import WSStompConnection  # noqa: E402

from signalbox.embedded_redis import EmbeddedRedis, free_port  # noqa: E402
from tests.helpers.gateway_server import prepare_database, start_gateway  # noqa: E402

BODY = "x" * 256


class Collector(stomp.ConnectionListener):
    """Counts MESSAGE frames and records each one's latency from its `sent-ns` header."""

    def __init__(self) -> None:
        self.count = 0
        self.latencies: list[float] = []
        self.expected = 0
        self.done = threading.Event()
        self.receipts: dict[str, threading.Event] = {}
        self.last = threading.Event()

    def on_message(self, frame) -> None:
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        sent = frame.headers.get("sent-ns")
        if sent:
            self.latencies.append((now - int(sent)) / 1e6)
        self.count += 1
        self.last.set()
        if self.count >= self.expected:
            self.done.set()

    def on_receipt(self, frame) -> None:
        event = self.receipts.get(frame.headers.get("receipt-id", ""))
        if event is not None:
            event.set()

    def on_error(self, frame) -> None:
        print(f"ERROR frame: {frame.headers} {frame.body!r}", file=sys.stderr)


def connection(port: int) -> tuple[WSStompConnection, Collector]:
    conn = WSStompConnection([("127.0.0.1", port)], ws_path="/stomp", heartbeats=(0, 0),
                             reconnect_attempts_max=1)
    listener = Collector()
    conn.set_listener("bench", listener)
    conn.connect("alice", "secret", wait=True)
    return conn, listener


def subscribe(conn: WSStompConnection, listener: Collector, destination: str, **headers: str) -> None:
    event = threading.Event()
    listener.receipts["sub"] = event
    conn.subscribe(destination, id="s", ack="auto", receipt="sub", headers=headers)
    if not event.wait(10):
        raise RuntimeError("no RECEIPT for SUBSCRIBE")


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def _stream_consumer(port: int, queue: str, n: int, ready, results) -> None:
    """The subscriber of a stream, in a process of its own (as a separate client would be): stomp.py's
    receiver thread and the producer's loop do not share one interpreter lock."""
    consumer, collected = connection(port)
    collected.expected = n
    subscribe(consumer, collected, queue)
    cpu = time.process_time()
    ready.set()
    ok = collected.done.wait(300)
    results.put((ok, collected.count, time.clock_gettime_ns(time.CLOCK_MONOTONIC), collected.latencies,
                 time.process_time() - cpu))
    consumer.disconnect()


def _cpu(process: psutil.Process | None) -> float:
    if process is None:
        return 0.0
    times = process.cpu_times()
    return times.user + times.system


def stream(port: int, n: int, persistent: bool, gateway: psutil.Process | None = None,
           redis_server: psutil.Process | None = None) -> dict[str, float]:
    queue = f"/queue/bench.stream.{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("fork")
    ready, results = ctx.Event(), ctx.Queue()
    process = ctx.Process(target=_stream_consumer, args=(port, queue, n, ready, results))
    process.start()
    if not ready.wait(30):
        raise RuntimeError("the subscriber did not start")
    producer, _ = connection(port)
    headers = {"persistent": "true"} if persistent else {}
    cpu_before = _cpu(gateway), _cpu(redis_server), time.process_time()
    start = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    clock = time.CLOCK_MONOTONIC
    for _ in range(n):
        producer.send(queue, BODY, headers={**headers, "sent-ns": str(time.clock_gettime_ns(clock))})
    produced = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    ok, count, end, latencies, consumer_cpu = results.get(timeout=330)
    cpu_after = _cpu(gateway), _cpu(redis_server), time.process_time()
    process.join(30)
    producer.disconnect()
    if not ok:
        raise RuntimeError(f"only {count} of {n} messages arrived")
    per_message = [(after - before) / n * 1e6 for before, after in zip(cpu_before, cpu_after, strict=True)]
    return {"produce": n / ((produced - start) / 1e9), "end_to_end": n / ((end - start) / 1e9),
            "p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
            "cpu_gateway": per_message[0], "cpu_redis": per_message[1], "cpu_producer": per_message[2],
            "cpu_consumer": consumer_cpu / n * 1e6}


def send_receipt(port: int, n: int, gateway: psutil.Process | None = None) -> dict[str, float]:
    queue = f"/queue/bench.receipt.{uuid.uuid4().hex[:8]}"
    producer, listener = connection(port)
    times = []
    cpu_before = _cpu(gateway)
    start = time.perf_counter()
    for i in range(n):
        event = threading.Event()
        listener.receipts[str(i)] = event
        t0 = time.perf_counter()
        producer.send(queue, BODY, headers={"persistent": "true"}, receipt=str(i))
        if not event.wait(10):
            raise RuntimeError(f"no RECEIPT for send {i}")
        times.append((time.perf_counter() - t0) * 1000)
    elapsed = time.perf_counter() - start
    cpu_gateway = (_cpu(gateway) - cpu_before) / n * 1e6
    producer.disconnect()
    return {"rate": n / elapsed, "p50": percentile(times, 50), "p99": percentile(times, 99),
            "cpu_gateway": cpu_gateway}


def ping_pong(port: int, n: int) -> dict[str, float]:
    queue = f"/queue/bench.ping.{uuid.uuid4().hex[:8]}"
    consumer, collected = connection(port)
    producer, _ = connection(port)
    subscribe(consumer, collected, queue)
    times = []
    for _ in range(n):
        collected.last.clear()
        t0 = time.perf_counter()
        producer.send(queue, BODY)
        if not collected.last.wait(10):
            raise RuntimeError("a ping got lost")
        times.append((time.perf_counter() - t0) * 1000)
    consumer.disconnect()
    producer.disconnect()
    return {"p50": percentile(times, 50), "p99": percentile(times, 99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url")
    parser.add_argument("--appendfsync", default="everysec", choices=["everysec", "always", "no"])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--round-trips", type=int, default=2_000)
    parser.add_argument("--only", nargs="*", default=["persistent", "non-persistent", "receipt", "ping"])
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="signalbox-ws-bench-"))
    server = None
    if args.redis_url:
        redis_url = args.redis_url
    else:
        server = EmbeddedRedis(work / "redis", port=free_port(), appendonly=True,
                               appendfsync=args.appendfsync)
        server.start()
        redis_url = server.url
    os.environ["REDIS_URL"] = redis_url
    client = redis.Redis.from_url(redis_url)
    info = client.info()
    fsync = client.config_get("appendfsync").get("appendfsync")
    aof = client.config_get("appendonly").get("appendonly")
    print(f"machine: {os.cpu_count()} cores {platform.machine()}, Python {platform.python_version()}, "
          f"{platform.platform()}")
    print(f"redis: {info['redis_version']} at {redis_url}, appendonly {aof}, appendfsync {fsync}")
    print(f"stomp.py {stomp.__version__ if hasattr(stomp, '__version__') else ''} WebSocket transport, "
          f"{args.messages} messages of {len(BODY)} bytes; gateway: one uvicorn process")
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    prepare_database(work / "gateway", namespace)
    gateway = start_gateway(work / "gateway", namespace)
    gateway_process = psutil.Process(gateway.process.pid)
    redis_process = psutil.Process(server.process.pid) if server is not None and server.process else None
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (other processes share "
          "the machine when this is high)")
    try:
        for name in ("persistent", "non-persistent"):
            if name in args.only:
                r = stream(gateway.port, args.messages, persistent=name == "persistent",
                           gateway=gateway_process, redis_server=redis_process)
                print(f"stream {name:<15} produce {r['produce']:>8,.0f} msgs/s   end-to-end "
                      f"{r['end_to_end']:>8,.0f} msgs/s   latency p50 {r['p50']:.1f} ms  "
                      f"p99 {r['p99']:.1f} ms")
                print(f"    CPU per message: gateway {r['cpu_gateway']:.0f} us, "
                      f"redis {r['cpu_redis']:.0f} us, "
                      f"stomp.py producer {r['cpu_producer']:.0f} us, "
                      f"subscriber {r['cpu_consumer']:.0f} us")
        if "receipt" in args.only:
            r = send_receipt(gateway.port, args.round_trips, gateway_process)
            print(f"SEND->RECEIPT persistent {r['rate']:>8,.0f} /s   p50 {r['p50']:.2f} ms  "
                  f"p99 {r['p99']:.2f} ms")
            print(f"    CPU per round trip: gateway {r['cpu_gateway']:.0f} us")
        if "ping" in args.only:
            r = ping_pong(gateway.port, args.round_trips)
            print(f"ping-pong (producer -> gateway -> subscriber)   p50 {r['p50']:.2f} ms  "
                  f"p99 {r['p99']:.2f} ms")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        gateway.stop()
        keys = list(client.scan_iter(match=f"{namespace}:*", count=5000))
        for i in range(0, len(keys), 1000):
            client.delete(*keys[i:i + 1000])
        client.close()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
