"""The maintenance tick at 10,000 destinations: its time, its longest Redis call, and the reap delay.

Usage: python bench/maintenance_tick.py [--destinations 10000] [--seconds 45] [--lapsing 20]

Starts the embedded server `run` uses (as bench/adversarial.py: unix socket, no persistence, every call
in the SLOWLOG) and builds, in a namespace of its own: `--destinations` queues, created together so their
periodic jobs (the expiry sweep, every 30 s by default) fall due together, which is the worst case for a
tick; every 10th holds 5 pending messages (its sweep has something to examine), every 20th has a
consumer with a long lease. Then:

- before: the tick as it was before the maintenance index, reproduced here (`walk_everything`: every
  destination probed, its sweep run when due), once with every sweep due and once right after;
- after: `maintenance.run_due`, started once a second as Celery beat does, for `--seconds`; a sweep storm
  (every destination due at once) comes 30 s in. Per tick: wall time, entries visited, the longest
  single Redis call;
- reap delay: `--lapsing` consumers, each holding 3 messages, whose leases end at times spread over the
  run; for each, the time from its lease's end to its `consumer_remove` event (the reap, which returns
  its messages in the same step; checked: they are pending again).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from adversarial import start_server  # noqa: E402

from broker_core import maintenance  # noqa: E402
from broker_core.broker import Broker  # noqa: E402
from broker_core.event_stream import expand  # noqa: E402
from broker_core.keys import Home  # noqa: E402
from broker_core.messages import Message  # noqa: E402
from broker_core.model import ConsumerSpec  # noqa: E402
from signalbox.embedded_redis import configured_executable  # noqa: E402


def walk_everything(broker: Broker, uris: list[str]) -> None:
    """The tick before the index (broker_core/maintenance.py run_due as it was): every destination probed
    for recovery, and its expiry sweep run when due, whatever is due."""
    policy_map = broker.policies.policy_map()
    for uri in uris:
        dest = maintenance._dest(uri)
        entry = policy_map.resolve(dest)
        maintenance.run_recovery(broker, dest)
        period = entry.expire_messages_period
        state = broker.redis.hmget(maintenance._maint_key(broker, Home(dest)), "expire:started",
                                   "expire:running")
        if period > 0 and maintenance._sweep_due(state, period, broker.clock.now_ms()):
            maintenance.run_expiry_sweep(broker, dest, period_ms=period)


def reap_time(client: redis.Redis, broker: Broker, c) -> int | None:
    """When the reaper closed consumer `c` (its consumer_remove event's time, the broker clock's ms)."""
    newest = client.xrevrange(broker.ops.events_key(c.destination), count=200)
    for _, fields in reversed(expand(reversed(newest))):  # (an entry may hold several: event_stream.py)
        if fields.get(b"type") == b"consumer_remove" and fields.get(b"consumer") == c.consumer_id.encode():
            return int(fields[b"ts"])
    return None


def longest_call(client: redis.Redis) -> tuple[float, str]:
    entries = [e for e in client.slowlog_get(100_000)
               if not str(e.get("command", b"")).upper().startswith(("SLOWLOG", "B'SLOWLOG"))]
    if not entries:
        return 0.0, ""
    worst = max(entries, key=lambda e: e["duration"])
    command = worst["command"]
    command = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
    return worst["duration"] / 1000.0, command[:60]


def timed(client: redis.Redis, run) -> tuple[float, float, str, int, object]:
    """Wall time, the longest single call (SLOWLOG), and the commands Redis executed (INFO's
    total_commands_processed, which counts those a script runs too, less the measurement's own INFO):
    the count does not move with the machine's load, the times do."""
    client.slowlog_reset()
    before = client.info("stats")["total_commands_processed"]
    start = time.perf_counter()
    result = run()
    wall = time.perf_counter() - start
    calls = client.info("stats")["total_commands_processed"] - before - 1
    ms, command = longest_call(client)
    return wall, ms, command, calls, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--destinations", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--lapsing", type=int, default=20)
    parser.add_argument("--verbose", action="store_true", help="when each tick ran; the longest reap delays")
    args = parser.parse_args()
    server, socket_file = start_server()
    try:
        client = redis.Redis(unix_socket_path=socket_file)
        print(f"server: {configured_executable()} ({client.info('server')['redis_version']})")
        broker = Broker(client, f"tick{uuid.uuid4().hex[:6]}")
        n = args.destinations
        uris = [f"queue://d{i}" for i in range(n)]
        start = time.perf_counter()
        for i in range(n):
            broker.ensure_destination(uris[i])
            if i % 10 == 0:
                broker.send(uris[i], [Message(body=f"m{k}") for k in range(5)])
            if i % 20 == 5:
                broker.add_consumer(uris[i], ConsumerSpec(prefetch=0, lease_ms=3_600_000))
        print(f"{n} destinations ({n // 10} with 5 pending messages, {n // 20} with a consumer) "
              f"built in {time.perf_counter() - start:.0f} s")

        print("\nbefore (every destination walked):")
        for label in ("every sweep due", "right after"):
            wall, ms, command, calls, _ = timed(client, lambda: walk_everything(broker, uris))
            print(f"  {label:<16} tick {wall:6.2f} s, {calls:6d} Redis commands, longest call {ms:5.2f} ms  "
                  f"{command}")

        # Consumers whose leases end at times spread over the run, each holding 3 messages.
        rng = random.Random(7)
        lapsing = []
        for k in range(args.lapsing):
            uri = uris[rng.randrange(n)]
            lease = int(3_000 + (args.seconds - 6) * 1000 * k / max(args.lapsing, 1))
            spec = ConsumerSpec(prefetch=3, lease_ms=lease, ack_mode="client-individual")
            c = broker.add_consumer(uri, spec)
            broker.send(uri, [Message(body=f"l{k}-{j}") for j in range(3)])
            got = broker.receive(c, 3)
            assert len(got) == 3
            end = int(client.zscore(f"{broker.ops.prefix(c.destination)}:leases", c.consumer_id))
            lapsing.append((c, uri, end))

        print("\nafter (maintenance.run_due once a second):")
        ticks: list[tuple[float, float, int, int, int]] = []
        delays: dict[str, float] = {}
        run_end = time.monotonic() + args.seconds
        run_start_ms = time.time() * 1000
        next_start = time.monotonic()
        while time.monotonic() < run_end:
            time.sleep(max(0.0, next_start - time.monotonic()))
            next_start = time.monotonic() + 1.0
            wall, ms, command, calls, report = timed(client, lambda: maintenance.run_due(broker))
            ticks.append((wall, ms, report.destinations, report.still_due, calls))
            if args.verbose:
                ended = (time.time() * 1000 - run_start_ms) / 1000
                print(f"  tick {len(ticks)} ran {ended - wall:.2f}-{ended:.2f} s")
            if report.destinations > 50 or ms > 5 or report.reaped:
                print(f"  tick {len(ticks):3d}: {wall:6.2f} s, {calls:6d} commands, {report.destinations:5d} "
                      f"visited, {report.sweeps:5d} sweeps, {len(report.reaped)} reaped, "
                      f"longest call {ms:5.2f} ms  {command}")
            now = time.time() * 1000
            for c, uri, end in lapsing:
                if c.consumer_id in delays or now <= end:
                    continue
                reaped_at = reap_time(client, broker, c)
                stats = broker.stats(uri)
                if reaped_at and stats.in_flight == 0 and stats.pending >= 3:
                    delays[c.consumer_id] = (reaped_at - end) / 1000
        walls = sorted(t[0] for t in ticks)
        print(f"  {len(ticks)} ticks: median {statistics.median(walls) * 1000:.0f} ms, "
              f"max {walls[-1]:.2f} s; longest single call {max(t[1] for t in ticks):.2f} ms; "
              f"median entries visited {statistics.median(t[2] for t in ticks):.0f}, "
              f"median Redis commands {statistics.median(t[4] for t in ticks):.0f}")
        values = sorted(delays.values())
        if args.verbose:
            for cid, delay in sorted(delays.items(), key=lambda kv: -kv[1])[:5]:
                end = next(e for c, _, e in lapsing if c.consumer_id == cid)
                print(f"  {cid}: lease end at {(end - run_start_ms) / 1000:.2f} s, "
                      f"reaped {delay:.2f} s later")
        missing = len(lapsing) - len(values)
        print(f"\nreap delay (lease end -> reaped, its messages pending again), {len(values)} consumers"
              f"{f', {missing} not reaped within the run' if missing else ''}: "
              f"median {statistics.median(values):.2f} s, max {values[-1]:.2f} s "
              f"(issue 21: 13-20 s tick, reaped ~20 s late; target ~1 s)")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
