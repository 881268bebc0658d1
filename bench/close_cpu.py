"""The Redis CPU time of each call of a close and of a reap of a consumer holding 32,767 messages.

Usage: python bench/close_cpu.py [--chunk N]

`bench/adversarial.py` reports the longest call as the server's SLOWLOG records it: wall time, which on a
machine other processes keep busy includes the time the server waited for a core. This runs the same three
cases (its "close and reap" section) on the same server, drives each operation one Redis call at a time,
and reads the server's own CPU time around every call (`/proc/<pid>/schedstat`, nanoseconds), which no
other process adds to. Prints, per script, the number of calls and their CPU time (median, 90th
percentile, largest) next to the SLOWLOG's largest wall time. Linux only.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import adversarial  # noqa: E402

from broker_core.broker import Broker  # noqa: E402
from broker_core.clock import FakeClock  # noqa: E402
from broker_core.destinations import parse_destination  # noqa: E402
from broker_core.effects import Eval  # noqa: E402
from broker_core.keys import Home  # noqa: E402


def cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def per_call(broker: Broker, op, pid: int) -> dict[str, list[float]]:
    """Drive `op` one request at a time; the server's CPU ms of each script call, by script."""
    out: dict[str, list[float]] = defaultdict(list)
    request = next(op)
    try:
        while True:
            before = cpu_ns(pid)
            reply = broker._step(request)
            if isinstance(request, Eval):
                out[request.script].append((cpu_ns(pid) - before) / 1e6)
            request = op.send(reply)
    except StopIteration:
        return out


def report(name: str, calls: dict[str, list[float]], wall_ms: float) -> None:
    print(f"{name}  (SLOWLOG's largest wall time: {wall_ms:.2f} ms)")
    for script, times in sorted(calls.items()):
        times.sort()
        print(f"   {script:15} calls {len(times):4}   CPU ms: median {times[len(times) // 2]:6.2f}   "
              f"p90 {times[int(len(times) * 0.9)]:6.2f}   largest {times[-1]:6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk", type=int, default=None,
                        help="messages returned per call (default: the broker's)")
    args = parser.parse_args()
    server, socket_file = adversarial.start_server()
    try:
        client = redis.Redis(unix_socket_path=socket_file)
        print(f"server: {adversarial.configured_executable()} ({client.info('server')['redis_version']})")
        for case in ("close", "reap", "topic"):
            clock = FakeClock(int(time.time() * 1000))
            broker = Broker(client, adversarial.Context(client).broker.namespace, clock)
            if args.chunk:
                broker.ops.return_chunk = args.chunk
            if case == "topic":
                holder = adversarial._topic_holding(broker)
            else:
                holder = adversarial._holding(broker, lease_ms=1_000 if case == "reap" else 60_000)
            if case == "reap":
                clock.advance(2_000)
                broker.renew_leases("close.q", ["other"], 60_000)
                op = broker.ops.reap(Home(parse_destination("close.q")), clock.now_ms(), 100)
            else:
                op = broker.ops.close_consumer(holder, clock.now_ms(), "closed")
            client.slowlog_reset()
            calls = per_call(broker, op, server.pid)
            entries = [e for e in client.slowlog_get(adversarial.SLOWLOG_ENTRIES)
                       if not adversarial._command(e).upper().startswith("SLOWLOG")]
            title = "close: a non-durable topic consumer" if case == "topic" else f"{case}: a consumer"
            chunk = broker.ops.return_chunk
            report(f"{title} holding {adversarial.HELD:,} received messages (chunk {chunk})", calls,
                   max(e["duration"] for e in entries) / 1000)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
