"""The gateway's CPU per STOMP message, measured in one process without the sockets to the clients: two
`StompSession`s (gateway/stomp/protocol.py) on a TCP-like transport that keeps what is written, a real
Redis, the process's real broker client, wake-up hub and link. What a message costs the gateway's Python
(the codec, the session, the link, broker_core's client side, the Redis connection), without the load
of the client processes and without the kernel's work for the client sockets.

Usage: python bench/stomp_session_cpu.py [--n 2000] [--rounds 5] [--subscriptions 500]
                                         [--case NAME ...] [--checkout DIR ...]

Cases: `pingpong` (one session subscribed with ack auto, the other sends; each SEND waits for its
MESSAGE), `receipt-np` (SEND with a receipt, non-persistent; each waits for its RECEIPT) and
`client-ack` (the receiving session holds --subscriptions client-individual subscriptions, one per
queue; each SEND to the first waits for its MESSAGE, then the STOMP 1.2 ACK of it for its RECEIPT:
what a delivery and an ack cost on a connection with many subscriptions). Per case
and round: the process's CPU per message (os.times, user + kernel: the gateway's own work, not the time
it waits for Redis; the kernel's part is mostly the writes to Redis) and the p50 from the SEND handed to
the session to its answer written. With several --checkout, each round runs every checkout in turn
(A B A B: a loaded machine's drift falls on all of them).
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
BODY = b"x" * 100
CASES = ("receipt-np", "pingpong", "client-ack")


def child(n: int, subscriptions: int, cases: list[str]) -> None:
    """Runs in the checkout's own process (its modules on the path): prints one line per case."""
    import django

    django.setup()
    from types import SimpleNamespace

    from gateway import runtime
    from gateway.stomp.protocol import StompSession, Transport

    class Kept(Transport):
        text = False

        def __init__(self) -> None:
            self.frames: list[bytes] = []
            self.arrived = asyncio.Event()

        def keep(self, payload: bytes | str) -> None:
            self.frames.append(payload if isinstance(payload, bytes) else payload.encode())
            self.arrived.set()

        async def write(self, payload: bytes | str) -> None:
            self.keep(payload)

        def write_nowait(self, payload: bytes | str) -> bool:  # (a checkout whose buffer takes it)
            self.keep(payload)
            return True

        async def close(self) -> None:
            pass

        async def next(self, command: bytes) -> None:
            while not any(f.startswith(command) for f in self.frames):
                self.arrived.clear()
                await self.arrived.wait()
            self.frames.clear()

        async def ack_id(self) -> str:
            """The ack header of the next MESSAGE."""
            while not any(f.startswith(b"MESSAGE") for f in self.frames):
                self.arrived.clear()
                await self.arrived.wait()
            head = b"".join(self.frames).split(b"\n\n", 1)[0]
            self.frames.clear()
            return next(line[4:] for line in head.decode().split("\n") if line.startswith("ack:"))

    user = SimpleNamespace(is_authenticated=True, is_active=True, is_superuser=True, pk=1,
                           get_username=lambda: "bench")

    async def session() -> tuple[StompSession, Kept]:
        transport = Kept()
        s = StompSession(transport, broker=runtime.async_broker(), hub=runtime.wakeups(), stream=True)
        await s.start()
        s.unique_ack_ids = True  # (what CONNECT sets for 1.2)
        await s.open_link(user)  # (CONNECT without the password check: its PBKDF2 is not per message)
        s.version = s.parser.version = "1.2"
        return s, transport

    def frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
        head = "".join(f"{k}:{v}\n" for k, v in headers.items())
        return f"{command}\n{head}\n".encode() + body + b"\x00"

    async def run_case(case: str, count: int) -> tuple[float, float]:
        queue = f"/queue/cpu.{case}.{os.getpid()}.{time.monotonic_ns()}"
        sender, out = await session()
        receiver = None
        if case in ("pingpong", "client-ack"):
            receiver, inbox = await session()
            ack = "auto" if case == "pingpong" else "client-individual"
            for k in range(1 if case == "pingpong" else subscriptions):
                last = k == subscriptions - 1 or case == "pingpong"  # (ActiveMQ's walk would find it last)
                where = queue if last else f"{queue}.{k}"
                subscribe = {"destination": where, "id": f"s{k}", "ack": ack, "receipt": "r"}
                await receiver.data_received(frame("SUBSCRIBE", subscribe))
                await inbox.next(b"RECEIPT")
            send = frame("SEND", {"destination": queue, "persistent": "false",
                                  "content-length": str(len(BODY))}, BODY)
            waits, answer = inbox, b"MESSAGE"
        else:
            send = frame("SEND", {"destination": queue, "persistent": "false", "receipt": "1",
                                  "content-length": str(len(BODY))}, BODY)
            waits, answer = out, b"RECEIPT"
        times = []
        cpu = os.times()
        for _ in range(count):
            start = time.perf_counter()
            await sender.data_received(send)
            if case == "client-ack":
                ack_id = await waits.ack_id()
                assert receiver is not None
                await receiver.data_received(frame("ACK", {"id": ack_id, "receipt": "a"}))
                await waits.next(b"RECEIPT")
            else:
                await waits.next(answer)
            times.append(time.perf_counter() - start)
        await asyncio.sleep(0.05)  # (the last auto ack)
        now = os.times()
        user, system = now.user - cpu.user, now.system - cpu.system
        for s in (sender, receiver):
            if s is not None:
                await s.shutdown("done")
        return user / count * 1e6, system / count * 1e6, statistics.median(times) * 1e6

    async def main() -> None:
        for case in cases:
            await run_case(case, min(300, n))  # warm-up (scripts loaded, caches filled)
            user, system, p50 = await run_case(case, n)
            print(f"{case} {user:.1f} {system:.1f} {p50:.1f}", flush=True)

    try:  # the STOMP listener's loop (gateway/management/commands/stomp_listener.py)
        import uvloop
    except ImportError:
        asyncio.run(main())
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(","))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--subscriptions", type=int, default=500, help="the client-ack case's subscriptions")
    parser.add_argument("--case", action="append", choices=CASES, help="the cases to run (default: all)")
    parser.add_argument("--checkout", action="append", help="a Signalbox checkout (repeat to compare)")
    args = parser.parse_args()
    checkouts = [Path(c).resolve() for c in (args.checkout or [str(ROOT)])]
    sys.path.insert(0, str(ROOT / "bench"))
    from scratch_redis import scratch_redis

    results: dict[tuple[Path, str], list[tuple[float, float, float]]] = {}
    with scratch_redis() as port, tempfile.TemporaryDirectory(prefix="stomp-cpu-") as tmp:
        for round_ in range(args.rounds):
            for n, checkout in enumerate(checkouts):
                data = Path(tmp) / f"data-{n}"
                env = dict(os.environ, DJANGO_SETTINGS_MODULE="signalbox.settings",
                           REDIS_URL=f"redis://127.0.0.1:{port}/0", SIGNALBOX_DATA_DIR=str(data),
                           SIGNALBOX_NAMESPACE=f"cpu{n}", PYTHONPATH=str(checkout))
                command = [sys.executable, __file__, "--child", str(args.n), str(args.subscriptions),
                           ",".join(args.case or CASES)]
                out = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True,
                                     timeout=600)
                if out.returncode:
                    raise SystemExit(out.stderr[-3000:])
                for line in out.stdout.splitlines():
                    case, *figures = line.split()
                    user, system, p50 = map(float, figures)
                    results.setdefault((checkout, case), []).append((user + system, system, p50))
                    print(f"round {round_ + 1} {checkout} {case}: CPU {user + system:.0f} us per message "
                          f"(kernel {system:.0f}), p50 {p50:.0f} us (load {os.getloadavg()[0]:.1f})",
                          flush=True)
    print("\nmedians over the rounds (CPU per message, of which kernel; p50):")
    for (checkout, case), rows in results.items():
        cpu, kernel, p50 = (statistics.median(r[i] for r in rows) for i in range(3))
        print(f"  {checkout} {case}: {cpu:.0f} us ({kernel:.0f} us), {p50:.0f} us")


if __name__ == "__main__":
    main()
