"""The client side's Python per operation, the store's reply canned: what broker_core's AsyncBroker spends
on one `send` of one message, one `ack` of one message and the parsing of one pushed delivery, without
the round trip to Redis (which bench/floor.py measures) and without Redis's own work (which
bench/redis_instructions.py counts).

Usage: python bench/client_cpu.py [--checkout DIR ...] [--rounds 3] [--callgrind]

Each checkout runs in a process of its own (its modules on the path) against a private redis-server: a
real send and a real ack first, whose replies are kept; then every later call gets that reply at once
instead of going to Redis (the multiplexed connection's `call` replaced). Printed per checkout and
operation: microseconds of process time (best of 9 batches, a round per checkout in turn, A B A B) and,
with --callgrind, instructions per operation counted by valgrind (a run of N operations less a run of
none, divided by N: repeatable whatever the machine's load; needs Debian's valgrind).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = ("send", "ack", "pushed")


def child(port: int, iterations: int | None) -> None:
    """In the checkout's process: time each operation (iterations None), or run `iterations` of the one
    named by BENCH_OPERATION (for callgrind)."""
    import asyncio

    import msgpack
    import redis
    import redis.asyncio

    from broker_core.broker import AsyncBroker
    from broker_core.config.store import PolicyStore
    from broker_core.messages import Message
    from broker_core.model import ConsumerSpec, unpack_pushed

    async def main() -> None:
        client = redis.asyncio.Redis(port=port)
        namespace = f"cpu{os.getpid()}"
        broker = AsyncBroker(client, namespace, policies=PolicyStore(redis.Redis(port=port), namespace))
        message = Message(body="x" * 256, persistent=False)
        await broker.send("q", message)
        link = broker.link
        real, replies = link.call, []

        async def kept(*args):
            reply = await real(*args)
            replies.append(reply)
            return reply

        link.call = kept
        await broker.send("q", message)
        send_reply = replies[-1]
        consumer = await broker.add_consumer("qa", ConsumerSpec(prefetch=10, ack_mode="client-individual"))
        await broker.send("qa", message)
        (delivery,) = await broker.receive(consumer, 1)
        await broker.ack(consumer, delivery.message_id, mode="individual")
        ack_reply = replies[-1]
        pushed_id, blob = Message(body="x" * 256, properties={"a": 1, "b": "two"}).pack(1_700_000_000_000)
        payload = msgpack.packb([consumer.consumer_id.encode(), 7, 8, pushed_id.encode(), blob, 0, 0])

        def canned(reply):
            async def call(*args):
                return reply
            return call

        async def send() -> None:
            await broker.send("q", message)

        async def ack() -> None:
            await broker.ack(consumer, delivery.message_id, mode="individual")

        async def pushed() -> None:
            unpack_pushed(payload).deliveries(consumer)

        cases = {"send": (send, send_reply), "ack": (ack, ack_reply), "pushed": (pushed, None)}
        if iterations is not None:
            run, reply = cases[os.environ["BENCH_OPERATION"]]
            link.call = canned(reply)
            for _ in range(iterations):
                await run()
            return
        for name, (run, reply) in cases.items():
            link.call = canned(reply)
            for _ in range(1000):
                await run()
            best = float("inf")
            for _ in range(9):
                start = time.process_time()
                for _ in range(5000):
                    await run()
                best = min(best, (time.process_time() - start) / 5000 * 1e6)
            print(f"{name} {best:.2f}", flush=True)

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


def instructions(checkout: Path, port: int, operation: str, n: int) -> float:
    """Instructions per operation: callgrind's total for n operations less that for none, over n."""
    totals = []
    for iterations in (0, n):
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", sys.executable,
                 __file__, "--child", str(port), str(iterations)],
                cwd=checkout, env=dict(os.environ, PYTHONPATH=str(checkout), PYTHONHASHSEED="0",
                                       BENCH_OPERATION=operation),
                capture_output=True, text=True, timeout=900)
            lines = [line for line in out.stderr.splitlines() if "Collected" in line]
            if out.returncode or not lines:
                raise SystemExit(out.stderr[-2000:])
            totals.append(int(lines[-1].split()[-1]))
    return (totals[1] - totals[0]) / n


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), int(sys.argv[3]) if sys.argv[3] != "time" else None)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", action="append", help="a Signalbox checkout (repeat to compare)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--n", type=int, default=2000, help="operations per callgrind run")
    args = parser.parse_args()
    checkouts = [Path(c).resolve() for c in (args.checkout or [str(ROOT)])]
    sys.path.insert(0, str(ROOT / "bench"))
    from scratch_redis import run_in_checkout, scratch_redis

    times: dict[tuple[Path, str], list[float]] = {}
    with scratch_redis() as port:
        for round_ in range(args.rounds):
            for checkout in checkouts:
                for line in run_in_checkout(__file__, checkout, str(port), "time"):
                    name, value = line.split()
                    times.setdefault((checkout, name), []).append(float(value))
                print(f"round {round_ + 1} {checkout}: " + ", ".join(
                    f"{name} {times[(checkout, name)][-1]:.2f} us" for name in OPERATIONS), flush=True)
        print("\nmedians over the rounds, microseconds of process time per operation:")
        for name in OPERATIONS:
            medians = (statistics.median(times[(c, name)]) for c in checkouts)
            print(f"  {name}: " + "; ".join(f"{c} {m:.2f}" for c, m in zip(checkouts, medians, strict=True)))
        if args.callgrind:
            print(f"\ninstructions per operation (callgrind, {args.n} operations less none):")
            for name in OPERATIONS:
                counts = [instructions(c, port, name, args.n) for c in checkouts]
                ratio = f" (last / first {counts[-1] / counts[0]:.3f})" if len(counts) > 1 else ""
                each = "; ".join(f"{c} {n:,.0f}" for c, n in zip(checkouts, counts, strict=True))
                print(f"  {name}: {each}{ratio}", flush=True)


if __name__ == "__main__":
    main()
