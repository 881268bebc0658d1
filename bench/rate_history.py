"""The rate history's sampler at 10,000 destinations: a pass's cost, the longest call, memory, and the tick
with and without it.

Usage: python bench/rate_history.py [--destinations 10000] [--rounds 5]

Starts the embedded server `run` uses (as bench/maintenance_tick.py: unix socket, no persistence, every
call in the SLOWLOG) and creates `--destinations` queues in a namespace of its own, every 3rd with traffic
between passes (so its rings are written). Then, on the real clock:

- a pass (`rates.sample_due` called as the tick does, 0.5 s per call, until the pass is done): the calls
  it took, its wall time, the longest single Redis call;
- memory: Redis's used_memory before the first ring was written and after the passes, per destination;
- the idle tick (`maintenance.run_due`, nothing due) with the sampler's share and with it switched off,
  alternated `--rounds` times in one run, medians and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from adversarial import start_server  # noqa: E402
from maintenance_tick import timed  # noqa: E402

from broker_core import maintenance, rates  # noqa: E402
from broker_core.broker import Broker  # noqa: E402
from broker_core.messages import Message  # noqa: E402
from signalbox.embedded_redis import configured_executable  # noqa: E402


def full_pass(broker: Broker) -> tuple[int, float, float, str, int, int]:
    """One whole pass as the tick runs it: (tick calls, wall s, longest call ms, its command, sampled,
    Redis commands executed, scripts' own included: a count the machine's load does not move)."""
    while int(time.time() * 1000) // rates.PASS_MS == int(broker.redis.hget(
            f"{broker.namespace}:rates", "pass_at") or 0) // rates.PASS_MS:
        time.sleep(0.05)  # wait for the next 5 s epoch: a pass starts once per epoch
    calls, sampled, wall, longest, command, commands = 0, 0, 0.0, 0.0, "", 0
    while True:
        w, ms, cmd, executed, n = timed(broker.redis, lambda: rates.sample_due(broker))
        calls += 1
        commands += executed
        wall += w
        sampled += n
        if ms > longest:
            longest, command = ms, cmd
        if broker.redis.hget(f"{broker.namespace}:rates", "cursor") in (b"0", None):
            return calls, wall, longest, command, sampled, commands


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--destinations", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    server, socket_file = start_server()
    try:
        client = redis.Redis(unix_socket_path=socket_file)
        info = client.info("server")
        print(f"server: {configured_executable()} ({info.get('redis_version')}); "
              f"machine: {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; persistence off")
        broker = Broker(client, f"bench{uuid.uuid4().hex[:6]}")
        names = [f"d{i:05d}" for i in range(args.destinations)]
        for name in names:
            broker.ensure_destination(name)
        busy = names[::3]
        before = client.info("memory")["used_memory"]
        for round_ in range(4):
            for name in busy:
                broker.send(name, [Message(body="x")])
            calls, wall, ms, command, sampled, commands = full_pass(broker)
            print(f"pass {round_ + 1}: {sampled} destinations in {calls} tick calls, "
                  f"{wall:.2f} s of sampling, {commands / sampled:.1f} Redis commands per destination "
                  f"({commands / sampled * rates.SAMPLE_CHUNK:.0f} per script call); "
                  f"longest Redis call {ms:.2f} ms ({command})", flush=True)
        grown = client.info("memory")["used_memory"] - before
        print(f"memory: +{grown / 1e6:.1f} MB for {len(busy)} destinations with traffic "
              f"({grown / len(busy):,.0f} bytes each; the rings' bound is {rates.RING_BYTES:,})")

        original = rates.sample_due
        with_, without = [], []
        for _ in range(args.rounds):
            for label, out in (("with", with_), ("without", without)):
                rates.sample_due = original if label == "with" else (lambda broker, seconds=0: 0)
                while int(time.time() * 1000) % rates.PASS_MS > 500:  # a new epoch: the sampler's pass is due
                    time.sleep(0.02)
                w, ms, _, _, report = timed(client, lambda: maintenance.run_due(broker))
                out.append((w, ms, report.sampled))
        rates.sample_due = original
        w1 = statistics.median(w for w, _, _ in with_)
        w0 = statistics.median(w for w, _, _ in without)
        print(f"idle tick at {args.destinations} destinations, median of {args.rounds}: with the sampler "
              f"{w1 * 1000:.0f} ms (sampled {statistics.median(s for _, _, s in with_):.0f}, longest call "
              f"{max(m for _, m, _ in with_):.2f} ms), without {w0 * 1000:.0f} ms; ratio {w1 / w0:.1f}; "
              f"load average {os.getloadavg()[0]:.2f}")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
