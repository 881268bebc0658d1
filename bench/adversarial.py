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
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker_core.broker import Broker  # noqa: E402
from broker_core.messages import Message  # noqa: E402
from broker_core.operations import ConsumerSpec  # noqa: E402
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


# --- sizes ---
# Each operation here is one call of the Python API over data far larger than one script call may touch:
# the API continues across bounded calls (purge, group reset, browse, the index) or splits the client's
# batch (send, ack), so the longest call stays the same whatever the size.

SIZES_QUEUE = "sizes"


def _fill(ctx: Context, count: int, dest: str = SIZES_QUEUE, **fields: object) -> None:
    """`count` small messages on `dest`, sent 100 to a call (fast to prepare, each call bounded)."""
    for start in range(0, count, 100):
        ctx.broker.send(dest, [Message(body="x", **fields)  # type: ignore[arg-type]
                               for _ in range(min(100, count - start))])


def _warm(operation: Callable[[str], object]) -> None:
    """Run the operation once on a small queue: the first call of a script loads it (SCRIPT LOAD of the
    EVAL form: tens of ms on Redis 6.2), which is not the cost of the operation."""
    operation("sizes.warm")


@case("sizes: purge of 100,000 (1,000 of them in flight)")
def purge_100k(ctx: Context) -> Calls:
    _fill(ctx, 100_000)
    _fill(ctx, 1, "sizes.warm")
    _warm(ctx.broker.purge)
    ctx.broker.add_consumer(SIZES_QUEUE, ConsumerSpec(prefetch=1000))  # dispatched, not received
    return ctx.measure(lambda: ctx.broker.purge(SIZES_QUEUE))


@case("sizes: batch send of 1,000 messages (1 KB, 10 properties)")
def send_1000(ctx: Context) -> Calls:
    batch = [Message(body="x" * 1000, properties={f"p{k}": i for k in range(10)}) for i in range(1000)]
    ctx.broker.add_consumer(SIZES_QUEUE, ConsumerSpec(prefetch=1000))  # each part dispatched as it comes
    ctx.broker.send(SIZES_QUEUE, "warm-up")
    return ctx.measure(lambda: ctx.broker.send(SIZES_QUEUE, batch))


@case("sizes: ack of 1,000 ids (10,000 waiting behind)")
def ack_1000(ctx: Context) -> Calls:
    _fill(ctx, 11_000)
    consumer = ctx.broker.add_consumer(SIZES_QUEUE, ConsumerSpec(prefetch=1000, ack_mode="client-individual"))
    ids = [d.message_id for d in ctx.broker.receive(consumer, 1000)]
    ctx.broker.ack(consumer, ids[:1])  # (loads the script)
    ids = ids[1:] + [d.message_id for d in ctx.broker.receive(consumer, 1)]
    return ctx.measure(lambda: ctx.broker.ack(consumer, ids))


@case("sizes: removeAllMessageGroups over 50,000 groups")
def groups_50k(ctx: Context) -> Calls:
    ctx.broker.policies.set_entry("queue", SIZES_QUEUE, {"messageGroupMapFactoryType": "simple"})
    ctx.broker.refresh_policies()
    consumers = [ctx.broker.add_consumer(SIZES_QUEUE, ConsumerSpec(prefetch=25_000)) for _ in range(2)]
    for start in range(0, 50_000, 100):
        ctx.broker.send(SIZES_QUEUE, [Message(body="x", group_id=f"g{n}") for n in range(start, start + 100)])
    assert ctx.broker.stats(SIZES_QUEUE).group_count == 50_000, "the groups were not all assigned"
    del consumers
    _warm(ctx.broker.remove_all_message_groups)
    return ctx.measure(lambda: ctx.broker.remove_all_message_groups(SIZES_QUEUE))


@case("sizes: message groups listed, 50,000 groups")
def group_list_50k(ctx: Context) -> Calls:
    ctx.broker.policies.set_entry("queue", SIZES_QUEUE, {"messageGroupMapFactoryType": "simple"})
    ctx.broker.refresh_policies()
    ctx.broker.add_consumer(SIZES_QUEUE, ConsumerSpec(prefetch=25_000))
    ctx.broker.add_consumer(SIZES_QUEUE, ConsumerSpec(prefetch=25_000))
    for start in range(0, 50_000, 100):
        ctx.broker.send(SIZES_QUEUE, [Message(body="x", group_id=f"g{n}") for n in range(start, start + 100)])
    _warm(ctx.broker.message_groups)
    return ctx.measure(lambda: ctx.broker.message_groups(SIZES_QUEUE))


@case("sizes: archive of a 100,000-event stream")
def archive_100k(ctx: Context) -> Calls:
    from analytics.archive import ArchiveLocation, archive_destination

    _fill(ctx, 100_000)
    folder = tempfile.mkdtemp()
    return ctx.measure(lambda: archive_destination(ctx.broker, SIZES_QUEUE, ArchiveLocation.parse(folder)))


@case("sizes: destination statistics index, 10,000 destinations")
def index_10k(ctx: Context) -> Calls:
    import asyncio

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "signalbox.settings")
    import django

    django.setup()
    from broker_core.broker import AsyncBroker
    from gateway.api import destination_index

    for n in range(10_000):
        ctx.broker.ensure_destination(f"q{n}")

    async def build() -> None:  # the index built (as by a stale read), then a page sorted by a statistic
        client = redis.asyncio.Redis(unix_socket_path=ctx.client.connection_pool.connection_kwargs["path"])
        try:
            broker = AsyncBroker(client, ctx.broker.namespace)
            await destination_index._build(broker)
            await destination_index.list_destinations(broker, None, None, "", "-pending", 50, 0)
        finally:
            await client.aclose()

    asyncio.run(build())  # (loads the scripts; and the index then has one before it, for the rates)
    return ctx.measure(lambda: asyncio.run(build()))


@case("sizes: browse with a selector over 100,000 non-matching")
def browse_100k(ctx: Context) -> Calls:
    _fill(ctx, 100_000, properties={"n": 1})
    ctx.broker.ensure_destination("sizes.warm")
    _warm(lambda q: ctx.broker.browse(q, selector="n = 2"))
    return ctx.measure(lambda: ctx.broker.browse(SIZES_QUEUE, selector="n = 2", limit=100))



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
