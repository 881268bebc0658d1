"""How long a transaction's COMMIT holds Redis: one MULTI/EXEC with every send and ack the transaction
recorded (broker_core/ops/transactions.py), during which every other client waits.

Usage: python bench/tx_commit.py [--sizes 100,500,1000,5000] [--rounds 3] [--checkout DIR ...]

Per size: BEGIN, that many 1 KiB sends to one queue inside the transaction (not timed), then the COMMIT
timed from the client (one round trip, the MULTI/EXEC's execution inside it). A private Redis of the bench's
own (bench/scratch_redis.py: `redis-server` on PATH, nothing persisted). With several --checkout, each round
runs every checkout in turn (A B A B), each in a process of its own with that checkout's code.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(port: int, sizes: list[int]) -> None:
    """Runs in the checkout's own process (its modules first on the path): one line per size."""
    import redis

    from broker_core.broker import Broker
    from broker_core.messages import Message

    broker = Broker(redis.Redis(port=port), f"txc{os.getpid()}")
    for size in sizes:
        tx = broker.begin()
        for _ in range(size):
            broker.send(f"q{size}", Message(body="x" * 1024), tx=tx)
        started = time.perf_counter()
        broker.commit(tx)
        print(size, (time.perf_counter() - started) * 1000, flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, os.getcwd())
        child(int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,500,1000,5000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checkout", action="append", help="a Signalbox checkout (repeat to compare)")
    args = parser.parse_args()
    checkouts = [Path(c).resolve() for c in (args.checkout or [str(ROOT)])]
    sys.path.insert(0, str(ROOT / "bench"))
    from scratch_redis import run_in_checkout, scratch_redis

    results: dict[tuple[Path, int], list[float]] = {}
    with scratch_redis() as port:
        for round_ in range(args.rounds):
            for checkout in checkouts:
                for line in run_in_checkout(__file__, checkout, str(port), args.sizes):
                    size, ms = line.split()
                    results.setdefault((checkout, int(size)), []).append(float(ms))
                    print(f"round {round_ + 1} {checkout} {size} sends: commit {float(ms):.1f} ms",
                          flush=True)
    print("\nmedians over the rounds:")
    for (checkout, size), times in results.items():
        print(f"  {checkout} {size} sends: commit {statistics.median(times):.1f} ms")


if __name__ == "__main__":
    main()
