"""The physical floor of a request -> reply on this machine, measured with the benches' own client
(blocking sockets, 300-byte requests): what any broker's answer costs here at the least, and what a design
with a gateway process and a store process (Signalbox's) costs at the least before it does any work.

- `echo_round_trip(n, "blocking")`: one process hop, a blocking-socket echo (no event loop): the least any
  broker's request -> reply costs here (ActiveMQ's answer to a non-persistent SEND is one such hop, plus
  its work).
- `echo_round_trip(n, "asyncio" | "uvloop")`: the same through a Python event loop (the gateway's).
- `echo_round_trip(n, "relay", redis_port)`: a uvloop relay that, for each request, sends Redis a PING and
  answers when Redis has: two hops, client -> gateway -> store and back, with no work in either: the
  least a SEND -> RECEIPT (one store call) or a ping-pong costs in Signalbox's design.
- `round_trips(RedisLine(port), n)`: a Redis PING and an EVALSHA of `return 1` over a plain socket.
- `floors` measures the Redis PING and the relay over loopback TCP and over a unix socket, the way `run`'s
  processes reach the embedded server (signalbox/embedded_redis.py), and, on a machine of two CPUs or more,
  the blocking echo with the client and the server pinned to one CPU and to two: what a hand-off between
  processes costs when the one woken runs where the waker was, and when its CPU must be woken first (on
  a virtual machine whose idle CPUs halt, the second costs tens of microseconds: docs/benchmarks.md,
  "Session 34").

Usage: python bench/floor.py [--n 5000] [--server redis|valkey|PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from scratch_redis import scratch_redis  # noqa: E402


class RedisLine:
    """A plain socket to Redis speaking RESP: the client side costs as little as Python's can."""

    def __init__(self, where: int | str) -> None:
        """`where`: a loopback port, or a unix socket's path."""
        if isinstance(where, str):
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect(where)
        else:
            self.sock = socket.create_connection(("127.0.0.1", where))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")

    def call(self, *args: str) -> bytes:
        parts = [a.encode() for a in args]
        out = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
        self.sock.sendall(out)
        line = self.file.readline()
        if line[:1] == b"$" and line[1:3] != b"-1":
            line += self.file.read(int(line[1:]) + 2)
        elif line[:1] == b"*":
            raise RuntimeError("arrays not read here")
        return line

    def commandstats(self) -> dict[str, tuple[int, float]]:
        text = self.call("INFO", "commandstats").split(b"\r\n", 1)[1].decode()
        stats = {}
        for line in text.splitlines():
            if line.startswith("cmdstat_"):
                name, _, rest = line[8:].partition(":")
                fields = dict(part.split("=") for part in rest.split(","))
                stats[name] = (int(fields["calls"]), float(fields["usec"]))
        return stats


def round_trips(line: RedisLine, n: int) -> dict[str, float]:
    """p50 microseconds of a PING and of an EVALSHA of `return 1`."""
    sha = line.call("SCRIPT", "LOAD", "return 1").split(b"\r\n")[1].decode()
    out = {}
    for name, args in (("Redis PING", ("PING",)), ("Redis EVALSHA 'return 1'", ("EVALSHA", sha, "0"))):
        times = []
        for _ in range(n):
            t = time.perf_counter()
            line.call(*args)
            times.append(time.perf_counter() - t)
        out[name] = statistics.median(times) * 1e6
    return out


SERVER = """
import asyncio, socket, sys
def nodelay(writer):
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
async def echo(reader, writer):
    nodelay(writer)
    while data := await reader.read(65536):
        writer.write(data)
async def relay(reader, writer):
    nodelay(writer)
    if sys.argv[2].startswith("/"):  # a unix socket's path
        store_reader, store = await asyncio.open_unix_connection(sys.argv[2])
    else:
        store_reader, store = await asyncio.open_connection("127.0.0.1", int(sys.argv[2]))
        nodelay(store)
    while data := await reader.read(65536):
        store.write(b"*1\\r\\n$4\\r\\nPING\\r\\n")
        await store_reader.readline()
        writer.write(data)
async def main():
    server = await asyncio.start_server(relay if sys.argv[1] == "relay" else echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
def blocking():
    server = socket.create_server(("127.0.0.1", 0))
    print(server.getsockname()[1], flush=True)
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := conn.recv(65536):
        conn.sendall(data)
if sys.argv[1] in ("uvloop", "relay"):
    import uvloop; uvloop.run(main())
elif sys.argv[1] == "blocking":
    blocking()
else:
    asyncio.run(main())
"""


def echo_round_trip(n: int, kind: str, redis: int | str | None = None,
                    cpus: tuple[int, int] | None = None) -> float:
    """p50 microseconds of a 300-byte request -> reply through a server process of `kind` (module
    docstring); the relay reaches Redis at `redis`, a port or a unix socket's path. `cpus`: the CPU the
    client (this process, for the measurement) and the one the server are pinned to."""
    args = [kind] + ([str(redis)] if kind == "relay" else [])
    server = subprocess.Popen([sys.executable, "-c", SERVER, *args], stdout=subprocess.PIPE)
    mine = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, {cpus[0]})
        os.sched_setaffinity(server.pid, {cpus[1]})
    try:
        port = int(server.stdout.readline())
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = b"x" * 300
        times = []
        for _ in range(n):
            t = time.perf_counter()
            sock.sendall(payload)
            got = 0
            while got < len(payload):
                got += len(sock.recv(65536))
            times.append(time.perf_counter() - t)
        sock.close()
        return statistics.median(times) * 1e6
    finally:
        os.sched_setaffinity(0, mine)
        server.terminate()
        server.wait()


def floors(n: int, binary: str) -> dict[str, float]:
    """Every floor above, p50 microseconds, against a Redis of its own (`binary`, nothing persisted)."""
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "redis.sock")
    try:
        with scratch_redis(binary, unix_socket=path) as port:
            line, unix_line = RedisLine(port), RedisLine(path)
            round_trips(line, min(n, 1000))  # warm-up
            round_trips(unix_line, min(n, 1000))
            out = {"one hop, blocking-socket echo": echo_round_trip(n, "blocking"),
                   **({"one hop, blocking-socket echo, client and server on one CPU":
                       echo_round_trip(n, "blocking", cpus=(0, 0)),
                       "one hop, blocking-socket echo, client and server on two CPUs":
                       echo_round_trip(n, "blocking", cpus=(0, 1))} if (os.cpu_count() or 1) > 1 else {}),
                   "one hop, uvloop echo": echo_round_trip(n, "uvloop"),
                   "one hop, asyncio echo": echo_round_trip(n, "asyncio"),
                   **round_trips(line, n),
                   **{f"{name}, unix socket": value for name, value in round_trips(unix_line, n).items()},
                   "two hops, uvloop relay + Redis PING": echo_round_trip(n, "relay", port),
                   "two hops, uvloop relay + Redis PING, unix socket": echo_round_trip(n, "relay", path)}
            line.sock.close()
            unix_line.sock.close()
            return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--server", default="redis", help="as bench/versus_activemq.py's --servers")
    args = parser.parse_args()
    from versus_activemq import server_binary

    for name, value in floors(args.n, server_binary(args.server)).items():
        print(f"floor: {name}: p50 {value:.0f} us")


if __name__ == "__main__":
    main()
