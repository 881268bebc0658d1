"""What the gateway's Python spends per client-acknowledged STOMP 1.2 message on a connection holding many
subscriptions: the session's `deliver` (the MESSAGE frame and its ack id) and the ACK (the frame to its
subscription, `Link.ack`), in one process, no Redis: the broker's ack is a stand-in that returns at once,
so what is timed is the session and the link alone (how they find the subscription an ack id belongs
to), not the script call (bench/stomp_session_cpu.py --case client-ack has the whole path).

Usage: python bench/ack_ids.py [--n 20000] [--rounds 5] [--subscriptions 1 500] [--checkout DIR ...]

Each round runs every checkout for every subscription count in a process of its own; the figure is
the median over the rounds of the CPU time per message (delivery + ACK), in microseconds. The measured
subscription is the last one subscribed (a walk over the subscriptions finds it last), and every other
subscription holds 10 unacknowledged messages.
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

ROOT = Path(__file__).resolve().parent.parent


def child(n: int, subscriptions: int) -> None:
    """Runs in the checkout's own process (its modules on the path): prints the CPU µs per message."""
    import django

    django.setup()
    from types import SimpleNamespace

    from broker_core.destinations import parse_destination
    from broker_core.messages import Delivery
    from broker_core.model import Consumer
    from gateway.stomp.frames import Frame
    from gateway.stomp.protocol import StompSession, Transport
    from gateway.ws.link import LinkSettings, Subscription

    class Dropped(Transport):
        text = False

        async def write(self, payload: bytes | str) -> None:
            pass

        def write_nowait(self, payload: bytes | str) -> bool:
            return True

        async def close(self) -> None:
            pass

    async def ack(consumer, message_id, *, mode=None, tx=None):
        return 1

    broker = SimpleNamespace(ack=ack)
    hub = SimpleNamespace(start=lambda: asyncio.sleep(0), channel="bench", forget=lambda cid: None)
    user = SimpleNamespace(is_authenticated=True, is_active=True, is_superuser=True, pk=1,
                           get_username=lambda: "bench")

    def delivery(message_id: str, destination: str) -> Delivery:
        return Delivery(message_id=message_id, destination=destination, consumer_id="c", body=b"x" * 100,
                        content_type=None, priority=4, persistent=False, timestamp=0, expiration=0,
                        correlation_id=None, reply_to=None, type=None, properties={}, group_id=None,
                        group_seq=0, connection_id=None, user_id=None, original_destination=None,
                        redelivery_count=0, group_first_for_consumer=False)

    async def main() -> float:
        session = StompSession(Dropped(), broker=broker, hub=hub, stream=True,
                               link_settings=LinkSettings(lease_ms=3_600_000))
        await session.start()
        session.unique_ack_ids = True  # (what CONNECT sets for 1.2)
        link = await session.open_link(user)
        session.version = session.parser.version = "1.2"
        subs = []
        for k in range(subscriptions):
            dest = parse_destination(f"queue://bench.{k}")
            consumer = Consumer(dest, f"c{k}")
            sub = Subscription(f"s{k}", [dest], "client-individual", consumers=[consumer],
                               options={"id": f"s{k}"})
            link.subscriptions[sub.key] = sub
            subs.append((sub, consumer))
        for sub, consumer in subs[:-1]:
            await session.deliver(sub, consumer, [delivery(f"ID:held-{sub.key}-{i}", "queue://x")
                                                  for i in range(10)])
        sub, consumer = subs[-1]
        deliveries = [delivery(f"ID:m-{i}", sub.destinations[0].uri) for i in range(n)]
        cpu = time.process_time()
        for one in deliveries:
            await session.deliver(sub, consumer, [one])
            await session.on_ack(Frame("ACK", [("id", one.message_id)], b""))
        spent = time.process_time() - cpu
        assert not sub.unacked
        return spent / n * 1e6

    print(f"{asyncio.run(main()):.2f}", flush=True)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--subscriptions", type=int, nargs="+", default=[1, 500])
    parser.add_argument("--checkout", action="append", help="a Signalbox checkout (repeat to compare)")
    args = parser.parse_args()
    checkouts = [Path(c).resolve() for c in (args.checkout or [str(ROOT)])]
    results: dict[tuple[Path, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="ack-ids-") as tmp:
        for round_ in range(args.rounds):
            for checkout in checkouts:
                for count in args.subscriptions:
                    env = dict(os.environ, DJANGO_SETTINGS_MODULE="signalbox.settings",
                               SIGNALBOX_DATA_DIR=tmp, PYTHONPATH=str(checkout))
                    out = subprocess.run([sys.executable, __file__, "--child", str(args.n), str(count)],
                                         cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
                    if out.returncode:
                        raise SystemExit(out.stderr[-3000:])
                    figure = float(out.stdout.split()[-1])
                    results.setdefault((checkout, count), []).append(figure)
                    print(f"round {round_ + 1} {checkout} {count} subscriptions: {figure:.1f} us per message "
                          f"(load {os.getloadavg()[0]:.1f})", flush=True)
    print("\nmedians over the rounds (CPU per message: delivery + ACK):")
    for (checkout, count), figures in results.items():
        print(f"  {checkout} {count} subscriptions: {statistics.median(figures):.1f} us")


if __name__ == "__main__":
    main()
