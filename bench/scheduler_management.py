"""Scheduler management over many jobs: the longest Redis call of a BROWSE and a REMOVEALL
(AsyncBroker.manage_scheduler) over --jobs scheduled messages (default 100,000) on one queue, and the
longest of a ping another client makes meanwhile.

Usage: python bench/scheduler_management.py [--jobs 100000] [--body 100]

A private Redis (bench/scratch_redis.py); the jobs are sent 500 a call with an hour's delay (each due 1 ms
after the one before, so due order is send order). SLOWLOG (calls over 1 ms) gives script calls' durations
as Redis measured them. Prints per action the whole time, the calls over 1 ms and the longest, and the
longest PING of another process meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis  # noqa: E402
import redis.asyncio  # noqa: E402
from scratch_redis import scratch_redis  # noqa: E402

from broker_core.broker import AsyncBroker  # noqa: E402
from broker_core.config.store import PolicyStore  # noqa: E402
from broker_core.destinations import Destination  # noqa: E402
from broker_core.messages import Message  # noqa: E402
from broker_core.scheduler import SchedulerRequest  # noqa: E402


async def allowed(dest: Destination, action: str) -> bool:
    return True


# Another client, a process of its own (a thread here would wait for this one's GIL): how long a PING
# waits at most, until its stdin closes.
PINGER = """
import select, sys, time, redis
client, worst = redis.Redis(port=int(sys.argv[1])), 0.0
while not select.select([sys.stdin], [], [], 0.002)[0]:
    start = time.perf_counter()
    client.ping()
    worst = max(worst, (time.perf_counter() - start) * 1000)
print(worst)
"""


async def measure(port: int, jobs: int, body: int) -> None:
    sync = redis.Redis(port=port)
    client = redis.asyncio.Redis(port=port)
    broker = AsyncBroker(client, "bench", policies=PolicyStore(sync, "bench"))
    for start in range(0, jobs, 500):
        await broker.send("queue://jobs", [Message(body="x" * body, delay_ms=3_600_000 + start + i)
                                           for i in range(min(500, jobs - start))])
    await broker.ensure_destination(Destination("queue", "replies"))
    sync.config_set("slowlog-log-slower-than", 1000)  # (1 ms: a script's own commands are logged too)
    sync.config_set("slowlog-max-len", 1_000_000)
    for action in ("BROWSE", "REMOVEALL"):
        request = SchedulerRequest(action, reply_to=Destination("queue", "replies") if action == "BROWSE"
                                   else None)  # type: ignore[arg-type]
        sync.slowlog_reset()
        other = subprocess.Popen([sys.executable, "-c", PINGER, str(port)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        began = time.perf_counter()
        done = await broker.manage_scheduler(request, allowed)
        took = time.perf_counter() - began
        worst = float(other.communicate("")[0])
        calls = [e for e in sync.slowlog_get(1_000_000) if e["command"].startswith((b"EVALSHA", b"FCALL"))]
        longest = max((e["duration"] for e in calls), default=0) / 1000
        print(f"{action}: {done} jobs in {took:.1f} s, {len(calls)} script calls over 1 ms, the longest "
              f"{longest:.2f} ms; another client's PING waited at most {worst:.1f} ms")
    stats = await broker.stats("queue://jobs")
    print(f"left parked: {stats.parked}, cancelled: {stats.cancelled}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--body", type=int, default=100)
    args = parser.parse_args()
    with scratch_redis() as port:
        asyncio.run(measure(port, args.jobs, args.body))


if __name__ == "__main__":
    main()
