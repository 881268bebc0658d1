"""Time of a GET /metrics scrape with 10,000 destinations (issue 25: under 1 s), and the longest single
Redis call it makes (SLOWLOG, against the 20 ms bound).

    .venv/bin/python bench/metrics_scrape.py [--destinations 10000] [--topics 0] [--runs 10]

Starts a throw-away system (console/demo.py: embedded Redis, SQLite, uvicorn) with a metrics token,
creates the destinations (one message waiting in each queue, so every queue's oldest-message lookup
runs), then times the scrape over HTTP from the same machine with the CPU the gateway process and Redis
spent on it (wall time on a busy machine says more about the machine), and, in this process, the CPU of
its two parts: reading Redis (`signalbox.metrics.gather`) and formatting the text (prometheus_client).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import psutil
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker_core.messages import Message  # noqa: E402
from console.demo import DemoSystem  # noqa: E402

TOKEN = "bench-metrics-token-0123456789"


def fill(system: DemoSystem, destinations: int, topics: int) -> None:
    started = time.monotonic()
    pipe_size = 500
    for start in range(0, destinations - topics, pipe_size):
        for i in range(start, min(start + pipe_size, destinations - topics)):
            system.broker.send(f"bench.q{i:05d}", Message(body="x" * 100))
    for i in range(topics):
        system.broker.ensure_destination(f"topic://bench.t{i:05d}")
    print(f"created {destinations - topics} queues (one message each) and {topics} topics in "
          f"{time.monotonic() - started:.1f} s", flush=True)


def _redis_cpu(client) -> float:
    """Seconds of CPU the Redis server has used (INFO cpu), with the main thread's share of the work."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def in_process(system: DemoSystem, runs: int) -> None:
    os.environ.update(REDIS_URL=system.redis_url, SIGNALBOX_NAMESPACE=system.namespace,
                      DJANGO_SETTINGS_MODULE="signalbox.settings",
                      SIGNALBOX_DATA_DIR=str(system.folder))
    import django

    django.setup()
    import redis.asyncio
    from prometheus_client import generate_latest

    from broker_core.broker import AsyncBroker
    from signalbox.metrics import BrokerCollector, gather

    async def once() -> tuple[float, float, int]:
        client = redis.asyncio.Redis.from_url(system.redis_url)
        broker = AsyncBroker(client, system.namespace)
        try:
            started = time.process_time()
            snapshot = await gather(broker)
            read = time.process_time() - started
            started = time.process_time()
            text = generate_latest(BrokerCollector(snapshot))
            return read, time.process_time() - started, len(text)
        finally:
            await broker.aclose()
            await client.aclose()

    reads, formats = [], []
    size = 0
    for _ in range(runs):
        read, fmt, size = asyncio.run(once())
        reads.append(read)
        formats.append(fmt)
    print(f"in process, this process's CPU (median): reading Redis {statistics.median(reads) * 1000:.0f} ms, "
          f"formatting {statistics.median(formats) * 1000:.0f} ms ({size / 1e6:.1f} MB of text)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--destinations", type=int, default=10_000)
    parser.add_argument("--topics", type=int, default=0, help="how many of the destinations are topics")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    os.environ["SIGNALBOX_METRICS_TOKEN"] = TOKEN
    with DemoSystem() as system:
        fill(system, args.destinations, args.topics)
        url = f"{system.url}/metrics"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        requests.get(url, headers=headers, timeout=60).raise_for_status()  # warm: scripts loaded
        system.redis.config_set("slowlog-log-slower-than", 0)
        system.redis.config_set("slowlog-max-len", 100_000)
        times, longest, gateway_cpu, redis_cpu, script_calls = [], (0, ""), [], [], []
        gateway = psutil.Process(system.process.pid)
        for _ in range(args.runs):
            system.redis.slowlog_reset()
            before = gateway.cpu_times(), _redis_cpu(system.redis)
            started = time.perf_counter()
            reply = requests.get(url, headers=headers, timeout=60)
            times.append(time.perf_counter() - started)
            after = gateway.cpu_times(), _redis_cpu(system.redis)
            gateway_cpu.append(after[0].user + after[0].system - before[0].user - before[0].system)
            redis_cpu.append(after[1] - before[1])
            reply.raise_for_status()
            for entry in system.redis.slowlog_get(100_000):
                command = entry["command"]
                command = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
                if command.upper().startswith(("FCALL", "EVALSHA")):
                    script_calls.append(entry["duration"])
                if entry["duration"] > longest[0] and not command.upper().startswith(("SLOWLOG", "CONFIG")):
                    longest = (entry["duration"], command[:50])
        times.sort()
        print(f"GET /metrics, {args.destinations} destinations, {args.runs} runs: median "
              f"{statistics.median(times) * 1000:.0f} ms, max {times[-1] * 1000:.0f} ms; "
              f"{len(reply.content) / 1e6:.1f} MB; longest Redis call {longest[0] / 1000:.1f} ms "
              f"({longest[1]}...)", flush=True)
        script_calls.sort()
        p99 = script_calls[int(len(script_calls) * 0.99)]
        print(f"script calls (summary_many; topics' statistics make others): {len(script_calls)}, "
              f"median {statistics.median(script_calls) / 1000:.1f} "
              f"ms, 99th percentile {p99 / 1000:.1f} ms", flush=True)
        print(f"CPU per scrape (median): gateway process {statistics.median(gateway_cpu) * 1000:.0f} ms, "
              f"Redis {statistics.median(redis_cpu) * 1000:.0f} ms (what an idle machine's wall time is "
              f"made of; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)", flush=True)
        in_process(system, min(args.runs, 5))


if __name__ == "__main__":
    main()
