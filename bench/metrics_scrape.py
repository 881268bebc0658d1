"""Time of a GET /metrics scrape with 10,000 queues and 10,000 topics (issue 25: under 1 s), before and
after a change in one run, and the longest single Redis call a scrape makes (against the 20 ms bound).

    .venv/bin/python bench/metrics_scrape.py [--queues 10000] [--topics 10000] [--runs 10] [--before REF]

Starts a throw-away system (console/demo.py: embedded Redis without persistence, SQLite, uvicorn) with a
metrics token and creates the destinations: one message waiting in each queue (so every queue's
oldest-message lookup runs), and on each topic an offline durable subscription holding one message. With
`--before REF` a second gateway runs the code of git revision REF (extracted to a temporary folder) on the
same Redis and namespace, and the scrapes alternate between the two, so both meet the same load. Each
scrape is timed over HTTP from this machine, with the CPU the gateway process and Redis spent on it (wall
time on a busy machine says more about the machine). Then, for this checkout's code: one scrape with every
Redis call recorded (SLOWLOG at 0 µs, which slows Redis: not during the timed scrapes) for the script
calls' durations, and in this process the CPU of the two parts, reading Redis (`signalbox.metrics.gather`)
and writing the text (`exposition`, against prometheus_client's generate_latest for the same snapshot).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker_core.messages import Message  # noqa: E402
from broker_core.model import ConsumerSpec  # noqa: E402
from console.demo import DemoSystem  # noqa: E402
from signalbox.embedded_redis import PortNotOpen, wait_for_port  # noqa: E402

TOKEN = "bench-metrics-token-0123456789"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def fill(system: DemoSystem, queues: int, topics: int) -> None:
    started = time.monotonic()
    for i in range(queues):
        system.broker.send(f"bench.q{i:05d}", Message(body="x" * 100))
    for i in range(topics):
        uri = f"topic://bench.t{i:05d}"
        durable = system.broker.add_consumer(uri, ConsumerSpec(client_id=f"bench{i}", subscription_name="s"))
        system.broker.close_consumer(durable)  # offline: keeps what is sent
        system.broker.send(uri, Message(body="y" * 100))
    print(f"created {queues} queues (one message each) and {topics} topics (an offline durable "
          f"subscription holding one message each) in {time.monotonic() - started:.0f} s", flush=True)


def _redis_cpu(client) -> float:
    """Seconds of CPU the Redis server has used (INFO cpu)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class Gateway:
    """A uvicorn process serving the code in `root`."""

    def __init__(self, label: str, process: subprocess.Popen, port: int) -> None:
        self.label, self.process, self.url = label, process, f"http://127.0.0.1:{port}/metrics"
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.redis_cpu: list[float] = []
        self.size = 0


def start_before(system: DemoSystem, ref: str, folder: Path) -> Gateway:
    """The gateway of git revision `ref`, on the system's Redis, namespace and database."""
    tree = folder / "before"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    from signalbox.embedded_redis import free_port

    port = free_port()
    env = system.env()
    env["PYTHONPATH"] = str(tree)
    log = open(folder / "before.log", "wb")  # noqa: SIM115 - the child writes to it
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "signalbox.asgi:application", "--host", "127.0.0.1", "--port",
         str(port), "--lifespan", "off", "--log-level", "warning", "--no-access-log"],
        cwd=tree, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, process=process)
    except PortNotOpen:
        raise RuntimeError((folder / "before.log").read_text(errors="replace")) from None
    return Gateway(f"before ({ref})", process, port)


def timed_scrape(system: DemoSystem, gateway: Gateway) -> None:
    proc = psutil.Process(gateway.process.pid)
    before = proc.cpu_times(), _redis_cpu(system.redis)
    started = time.perf_counter()
    reply = requests.get(gateway.url, headers=HEADERS, timeout=600)
    gateway.times.append(time.perf_counter() - started)
    after = proc.cpu_times(), _redis_cpu(system.redis)
    reply.raise_for_status()
    gateway.cpu.append(after[0].user + after[0].system - before[0].user - before[0].system)
    gateway.redis_cpu.append(after[1] - before[1])
    gateway.size = len(reply.content)


def _command(entry: dict) -> str:
    command = entry["command"]
    return command.decode(errors="replace") if isinstance(command, bytes) else str(command)


def script_calls(system: DemoSystem, gateway: Gateway) -> None:
    """One scrape with every Redis call in the SLOWLOG: the script calls' durations, the longest call."""
    system.redis.config_set("slowlog-log-slower-than", 0)
    system.redis.config_set("slowlog-max-len", 1_000_000)
    system.redis.slowlog_reset()
    requests.get(gateway.url, headers=HEADERS, timeout=600).raise_for_status()
    entries = system.redis.slowlog_get(1_000_000)
    system.redis.config_set("slowlog-log-slower-than", 10_000)
    calls: dict[str, list[int]] = {}
    longest = (0, "")
    for entry in entries:
        command = _command(entry)
        words = command.split()
        if words[0].upper() in ("FCALL", "EVALSHA"):
            # (FCALL sb<hash>_summary_many / sb<hash>_topic_summary_many; EVALSHA names a hash)
            name = next((n for n in ("topic_summary_many", "summary_many") if words[1].endswith(n)), "script")
            calls.setdefault(name, []).append(entry["duration"])
            if entry["duration"] > longest[0]:
                longest = (entry["duration"], command[:60])
    for name, durations in sorted(calls.items()):
        durations.sort()
        print(f"  {name}: {len(durations)} calls, median {statistics.median(durations) / 1000:.2f} ms, 99th "
              f"percentile {durations[int(len(durations) * 0.99)] / 1000:.2f} ms, longest "
              f"{durations[-1] / 1000:.2f} ms (with every call recorded, which slows each)", flush=True)


def in_process(system: DemoSystem, runs: int) -> None:
    os.environ.update(REDIS_URL=system.redis_url, SIGNALBOX_NAMESPACE=system.namespace,
                      DJANGO_SETTINGS_MODULE="signalbox.settings", SIGNALBOX_DATA_DIR=str(system.folder))
    import django

    django.setup()
    import redis.asyncio
    from prometheus_client import generate_latest

    from broker_core.broker import AsyncBroker
    from signalbox.metrics import BrokerCollector, exposition, gather

    async def once() -> tuple[float, float, float, int]:
        client = redis.asyncio.Redis.from_url(system.redis_url)
        broker = AsyncBroker(client, system.namespace)
        try:
            started = time.process_time()
            snapshot = await gather(broker)
            read = time.process_time() - started
            started = time.process_time()
            text = exposition(snapshot)
            written = time.process_time() - started
            started = time.process_time()
            assert generate_latest(BrokerCollector(snapshot)) == text
            return read, written, time.process_time() - started, len(text)
        finally:
            await broker.aclose()
            await client.aclose()

    figures = [asyncio.run(once()) for _ in range(runs)]
    read, written, library = (statistics.median(f[i] for f in figures) * 1000 for i in range(3))
    print(f"in process, this process's CPU (median of {runs}): reading Redis {read:.0f} ms; writing the "
          f"text {written:.0f} ms (prometheus_client's generate_latest for the same snapshot: {library:.0f} "
          f"ms, {library / written:.1f}x; the same bytes) ({figures[0][3] / 1e6:.1f} MB)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--before", metavar="REF", help="also scrape a gateway running git revision REF, "
                        "alternating")
    args = parser.parse_args()
    os.environ["SIGNALBOX_METRICS_TOKEN"] = TOKEN
    # both sides show every destination (the limit's default changed with this bench's change)
    os.environ["SIGNALBOX_METRICS_MAX_DESTINATIONS"] = str(args.queues + args.topics)
    with DemoSystem() as system, tempfile.TemporaryDirectory() as folder:
        fill(system, args.queues, args.topics)
        after = Gateway("after (this checkout)", system.process, system.port)
        gateways = [after]
        if args.before:
            gateways.insert(0, start_before(system, args.before, Path(folder)))
        try:
            system.redis.config_set("slowlog-log-slower-than", 10_000)
            system.redis.config_set("slowlog-max-len", 1_000_000)  # (default 128: the count would stop there)
            for gateway in gateways:  # warm: scripts loaded, imports done
                requests.get(gateway.url, headers=HEADERS, timeout=600).raise_for_status()
            print(f"load average before the runs: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
                  flush=True)
            for _ in range(args.runs):
                for gateway in gateways:
                    timed_scrape(system, gateway)
            load = os.getloadavg()[0]
            slow = [e for e in system.redis.slowlog_get(1_000_000)
                    if not _command(e).upper().startswith(("SLOWLOG", "CONFIG"))]
            for gateway in gateways:
                times = sorted(gateway.times)
                print(f"{gateway.label}: GET /metrics, {args.queues} queues + {args.topics} topics, "
                      f"{args.runs} runs: median {statistics.median(times) * 1000:.0f} ms, max "
                      f"{times[-1] * 1000:.0f} ms; CPU per scrape (median) gateway "
                      f"{statistics.median(gateway.cpu) * 1000:.0f} ms + Redis "
                      f"{statistics.median(gateway.redis_cpu) * 1000:.0f} ms; {gateway.size / 1e6:.1f} MB",
                      flush=True)
            if args.before:
                ratio = statistics.median(gateways[0].times) / statistics.median(after.times)
                print(f"ratio before / after (median wall time): {ratio:.1f}x", flush=True)
            print(f"Redis calls over 10 ms during the timed scrapes (both sides): {len(slow)}"
                  + (f", longest {max(e['duration'] for e in slow) / 1000:.1f} ms" if slow else "")
                  + f"; load average after the runs: {load:.1f}", flush=True)
            print("script calls of one scrape (this checkout):", flush=True)
            script_calls(system, after)
        finally:
            if args.before:
                gateways[0].process.terminate()
                gateways[0].process.wait(10)
        in_process(system, min(args.runs, 5))


if __name__ == "__main__":
    main()
