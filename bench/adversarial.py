"""The longest single Redis call under adversarial sizes and inputs, against the 20 ms bound.

Usage: python bench/adversarial.py [--only SUBSTRING] [--bound-ms 20]

Starts the embedded server `run` uses (SIGNALBOX_REDIS_SERVER, else the configured one) on a unix socket
with no persistence, and runs each case below in a namespace of its own. A case builds its data (which
may take many calls), then performs the operation under test while the server records every command in
its SLOWLOG (`slowlog-log-slower-than 0`). The longest entry recorded during the operation is the case's
figure: the server's own execution time of one call, which is what every other client waits behind.
Prints one row per case with the longest call, the number of calls the operation took, and whether it is
under the bound; exits 1 when any case is over it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker_core.broker import Broker  # noqa: E402
from signalbox.embedded_redis import ENCODING_SETTINGS, configured_executable  # noqa: E402

SLOWLOG_ENTRIES = 100_000


@dataclass
class Calls:
    """What the server recorded while a case's operation ran."""

    longest_ms: float
    longest_command: str
    count: int


class Context:
    """One case's view of the server: a fresh broker namespace and a way to time an operation."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.broker = Broker(client, f"adv{uuid.uuid4().hex[:8]}")

    def measure(self, operation: Callable[[], object]) -> Calls:
        """Run `operation` with the SLOWLOG emptied before it; the longest call it made."""
        self.client.slowlog_reset()
        operation()
        entries = self.client.slowlog_get(SLOWLOG_ENTRIES)
        # The SLOWLOG GET that reads the log is not in it yet; the RESET may be: leave it out.
        entries = [e for e in entries if not _command(e).upper().startswith("SLOWLOG")]
        if not entries:
            return Calls(0.0, "", 0)
        worst = max(entries, key=lambda e: e["duration"])
        return Calls(worst["duration"] / 1000.0, _command(worst)[:80], len(entries))


def _command(entry: dict) -> str:
    command = entry.get("command", b"")
    return command.decode(errors="replace") if isinstance(command, bytes) else str(command)


CASES: list[tuple[str, Callable[[Context], Calls]]] = []


def case(name: str) -> Callable[[Callable[[Context], Calls]], Callable[[Context], Calls]]:
    """Register a case: a function that prepares its data through ctx, then returns ctx.measure(op)."""

    def register(fn: Callable[[Context], Calls]) -> Callable[[Context], Calls]:
        CASES.append((name, fn))
        return fn

    return register


# Cases are added below, one section per area.

# --- metrics ---


@case("metrics: one scrape page (summary_many over 50 prioritized queues, 10 priority bands each)")
def metrics_page(ctx: Context) -> Calls:
    """The worst page GET /metrics reads: PAGE queues, each with messages waiting in all ten priority
    bands, so the oldest-message lookup visits every band of every queue."""
    import asyncio

    import redis.asyncio

    from broker_core.broker import AsyncBroker
    from broker_core.messages import Message
    from signalbox.metrics import PAGE

    ctx.broker.policies.set_entry("queue", "metrics.>", {"prioritizedMessages": True})
    names = [f"metrics.q{i:03d}" for i in range(PAGE)]
    for name in names:
        ctx.broker.send(name, [Message(body="x", priority=p) for p in range(10)])
    path = ctx.client.connection_pool.connection_kwargs["path"]
    loop = asyncio.new_event_loop()
    client = redis.asyncio.Redis(unix_socket_path=path)
    broker = AsyncBroker(client, ctx.broker.namespace)

    async def page() -> None:
        summaries = await broker.summaries(names, page=PAGE, oldest=True)
        assert all(s is not None and s.oldest_timestamp for s in summaries)

    # once before measuring: an AsyncBroker's first call loads the script library (FUNCTION LOAD)
    loop.run_until_complete(page())
    try:
        return ctx.measure(lambda: loop.run_until_complete(page()))
    finally:
        loop.run_until_complete(broker.aclose())
        loop.run_until_complete(client.aclose())
        loop.close()


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    """The embedded server on a unix socket, no persistence, every command recorded in the SLOWLOG."""
    folder = tempfile.mkdtemp()
    socket_file = os.path.join(folder, "redis.sock")
    server = subprocess.Popen([configured_executable(), "--port", "0", "--unixsocket", socket_file,
                               "--save", "", "--appendonly", "no", "--dir", folder,
                               "--slowlog-log-slower-than", "0", "--slowlog-max-len", str(SLOWLOG_ENTRIES),
                               *(arg for name, value in ENCODING_SETTINGS for arg in (f"--{name}", value))],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while not os.path.exists(socket_file):
        if server.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"could not start {configured_executable()}")
        time.sleep(0.05)
    return server, socket_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only cases whose name contains this text")
    parser.add_argument("--bound-ms", type=float, default=20.0)
    args = parser.parse_args()
    server, socket_file = start_server()
    failed = 0
    try:
        client = redis.Redis(unix_socket_path=socket_file)
        info = client.info("server")
        print(f"server: {configured_executable()} ({info.get('redis_version')}); "
              f"machine: {os.cpu_count()} CPUs; persistence off (the figure is execution time, not fsync)")
        print(f"{'case':<64} {'longest ms':>10} {'calls':>7}  verdict  longest call")
        for name, fn in CASES:
            if args.only not in name:
                continue
            calls = fn(Context(client))
            ok = calls.longest_ms < args.bound_ms
            failed += not ok
            print(f"{name:<64} {calls.longest_ms:>10.2f} {calls.count:>7}  {'ok' if ok else 'OVER':<7}  "
                  f"{calls.longest_command}", flush=True)
    finally:
        server.terminate()
        server.wait()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
