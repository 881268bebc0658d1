"""Where the time of one STOMP message goes: ping-pong and SEND->RECEIPT against one Signalbox, with the
physical floor beside them and, optionally, a sampling profile of the gateway process.

Usage: python bench/stomp_latency.py [--n 2000] [--cases tcp-pingpong,tcp-receipt,...] [--fsync everysec]
           [--py-spy /path/to/py-spy [--native]] [--profile-dir DIR]

Starts `./signalbox.sh run`'s launcher on free loopback ports with an installed Redis 7 (AOF, --fsync), then:
- the floor: a Redis PING and an EVALSHA of `return 1` over that server's unix socket, the way the
  gateway reaches it (one round trip each), and a TCP echo served by a Python asyncio server in a
  process of its own (the least one request -> reply through an event loop costs here; on asyncio's
  loop and on uvloop), and by a blocking socket loop (no event loop), all with the client the cases use
  (blocking sockets);
- per case: the p50 and the rate, the Redis commands it ran per message and Redis's own time per call
  (INFO commandstats, reset before the case), and the CPU the gateway process and Redis spent per message
  (from /proc);
- with --py-spy, a flame graph (SVG) and the raw samples of the gateway process during each case, in
  --profile-dir; its top functions by own time are printed.
Cases: tcp-pingpong, tcp-receipt, tcp-receipt-np, ws-pingpong, ws-receipt, ws-receipt-np (the web
server's /stomp), wsport-pingpong, wsport-receipt, wsport-receipt-np (the STOMP listener's WebSocket
port), tcp-stream, tcp-stream-np (the same clients as bench/versus_activemq.py; receipt and stream cases
persistent, -np non-persistent), tcp-txack (a persistent SEND, its MESSAGE to a client-individual
consumer, which then sends BEGIN, ACK in that transaction, COMMIT with a receipt: timed from the SEND to
the RECEIPT). A stream case sends its messages 100 frames per write, without receipts, to a consumer (auto
ack, prefetch 1000) reading them in a thread: its "p50" is the mean time per message, first SEND to last
MESSAGE.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from floor import RedisLine, echo_round_trip, round_trips  # noqa: E402
from versus_activemq import BODY, expect, new_queue, server_binary, stop_process, wait_port  # noqa: E402
from versus_clients import Http, Stomp, Target, encode  # noqa: E402

from signalbox.embedded_redis import free_port  # noqa: E402

CASES = ("tcp-pingpong", "tcp-receipt", "tcp-receipt-np", "ws-pingpong", "ws-receipt", "ws-receipt-np",
         "wsport-pingpong", "wsport-receipt", "wsport-receipt-np", "tcp-stream-np", "tcp-stream", "tcp-txack")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    user, system = cpu_split(pid)
    return user + system


def cpu_split(pid: int) -> tuple[float, float]:
    """Seconds of CPU in user mode (Python, Lua) and in the kernel (system calls: the loopback TCP stack)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS  # utime, stime


def descendants(root: int) -> dict[str, int]:
    """The launcher's children (each in a process group of its own) by role: redis, stomp (the TCP
    listener), web (uvicorn)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
    found: dict[str, int] = {}
    for pid in parents:
        ancestor = parents.get(pid)
        while ancestor not in (None, 0, 1, root):
            ancestor = parents.get(ancestor)
        if ancestor != root:
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        for role, mark in (("redis", "redis-server"), ("stomp", "stomp_listener"), ("web", "uvicorn")):
            if mark in cmdline:
                found[role] = pid
    return found


class Signalbox:
    def __init__(self, folder: Path, binary: str, fsync: str, root: Path = ROOT) -> None:
        folder.mkdir(parents=True)
        port, stomp, ws_port, self.redis_port = free_port(), free_port(), free_port(), free_port()
        self.redis_socket = str(folder / "redis.sock")  # (signalbox/embedded_redis.py: run's children use it)
        password = secrets.token_urlsafe(12)
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
        env.update(SIGNALBOX_DATA_DIR=str(folder), SIGNALBOX_PORT=str(port), SIGNALBOX_STOMP_PORT=str(stomp),
                   SIGNALBOX_STOMP_WS_PORT=str(ws_port), SIGNALBOX_REDIS_PORT=str(self.redis_port),
                   SIGNALBOX_ADMIN_PASSWORD=password,
                   SIGNALBOX_REDIS_APPENDFSYNC=fsync, SIGNALBOX_REDIS_SERVER=binary,
                   SIGNALBOX_CELERY_QUEUE=f"bench-{uuid.uuid4().hex[:6]}")
        self.process = subprocess.Popen([sys.executable, "-m", "signalbox.launcher", "run"], cwd=root,
                                        env=env, stdout=open(folder / "run.log", "wb"),  # noqa: SIM115
                                        stderr=subprocess.STDOUT, start_new_session=True)
        wait_port(stomp, self.process, "Signalbox's STOMP listener")
        wait_port(port, self.process, "Signalbox's web server")
        client = Http(f"http://127.0.0.1:{port}", "")
        login = json.dumps({"username": "admin", "password": password}).encode()
        status, data = client.call("POST", "/api/v1/auth/token", login, "application/json")
        client.close()
        expect(status, 200, data, "Signalbox POST /api/v1/auth/token")
        self.target = Target("Signalbox", stomp, "admin", password, ws_url=f"ws://127.0.0.1:{port}/stomp",
                             http_url=f"http://127.0.0.1:{port}", signalbox=True,
                             ws_port_url=f"ws://127.0.0.1:{ws_port}/stomp")
        self.pids = descendants(self.process.pid)

    def stop(self) -> None:
        stop_process(self.process, signal.SIGINT)


def run_case(target: Target, case: str, n: int, start: Callable[[], None] = lambda: None,
             stop: Callable[[], None] = lambda: None) -> dict[str, float]:
    """The case's messages, timed one by one. `start` is called once the connections stand (CONNECT,
    SUBSCRIBE) and `stop` after the last message, before they close: what they measure is the messages
    alone (a CONNECT checks the password, PBKDF2: about a third of a second of the gateway's CPU, which
    spread over 2000 messages looked like 150-300 us of each one)."""
    transport, kind = case.split("-", 1)
    queue = "/queue/" + new_queue()
    latencies = []
    if kind.startswith("stream"):
        return stream_case(target, transport, queue, kind, n, start, stop)
    if kind == "pingpong":
        receiver = Stomp(target, transport)
        receiver.frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "auto", "receipt": "sub"})
        receiver.read_until("RECEIPT")
        sender = Stomp(target, transport)
        frame = encode("SEND", {"destination": queue, "persistent": "false",
                                "content-length": str(len(BODY))}, BODY)
        start()
        for _ in range(n):
            t = time.perf_counter()
            sender.send_bytes(frame)
            receiver.read_until("MESSAGE")
            latencies.append(time.perf_counter() - t)
        stop()
        sender.close()
        receiver.close()
    elif kind == "txack":
        # a consumer acknowledging each message in a transaction of its own: BEGIN, ACK, COMMIT
        receiver = Stomp(target, transport)
        receiver.frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "client-individual",
                                     "receipt": "sub"})
        receiver.read_until("RECEIPT")
        sender = Stomp(target, transport)
        frame = encode("SEND", {"destination": queue, "persistent": "true",
                                "content-length": str(len(BODY))}, BODY)
        start()
        for i in range(n):
            t = time.perf_counter()
            sender.send_bytes(frame)
            ack = receiver.read_until("MESSAGE")[1]["ack"]
            receiver.frame("BEGIN", {"transaction": f"t{i}"})
            receiver.frame("ACK", {"id": ack, "transaction": f"t{i}"})
            receiver.frame("COMMIT", {"transaction": f"t{i}", "receipt": f"c{i}"})
            receiver.read_until("RECEIPT")
            latencies.append(time.perf_counter() - t)
        stop()
        sender.close()
        receiver.close()
    else:
        conn = Stomp(target, transport)
        persistent = "false" if kind.endswith("-np") else "true"
        start()
        for i in range(n):
            t = time.perf_counter()
            conn.frame("SEND", {"destination": queue, "persistent": persistent, "receipt": str(i),
                                "content-length": str(len(BODY))}, BODY)
            conn.read_until("RECEIPT")
            latencies.append(time.perf_counter() - t)
        stop()
        conn.close()
    return {"p50 us": statistics.median(latencies) * 1e6, "mean us": statistics.fmean(latencies) * 1e6}


def stream_case(target: Target, transport: str, queue: str, kind: str, n: int, start: Callable[[], None],
                stop: Callable[[], None]) -> dict[str, float]:
    """bench/versus_activemq.py's stream, its consumer in a thread of this process."""
    receiver = Stomp(target, transport)
    receiver.frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "auto",
                                 "activemq.prefetchSize": "1000", "receipt": "sub"})
    receiver.read_until("RECEIPT")
    done: list[float] = []

    def consume() -> None:
        for _ in range(n):
            receiver.read_until("MESSAGE")
        done.append(time.perf_counter())

    reader = threading.Thread(target=consume)
    sender = Stomp(target, transport)
    frame = encode("SEND", {"destination": queue, "persistent": "false" if kind.endswith("-np") else "true",
                            "content-length": str(len(BODY))}, BODY)
    start()
    reader.start()
    began = time.perf_counter()
    for i in range(0, n, 100):
        sender.send_bytes(frame * min(100, n - i))
    reader.join()
    stop()
    sender.close()
    receiver.close()
    per_message = (done[0] - began) / n * 1e6
    return {"p50 us": per_message, "mean us": per_message}


class Meter:
    """What a case measures, from its first message to its last: the gateway's and Redis's CPU, Redis's
    command statistics, and (when asked) py-spy's samples or strace's counts of the gateway process."""

    def __init__(self, gateway: int, redis: int, line: RedisLine, py_spy: str | None, strace: bool,
                 profile_dir: str, case: str, native: bool = False) -> None:
        self.gateway, self.redis, self.line = gateway, redis, line
        self.py_spy, self.strace, self.native = py_spy, strace, native
        self.raw = Path(profile_dir) / f"{case}.txt"
        self.summary = Path(profile_dir) / f"{case}.strace"
        self.spy: subprocess.Popen[bytes] | None = None
        self.tracer: subprocess.Popen[bytes] | None = None
        self.before: tuple[tuple[float, float], ...] = ()
        self.after: tuple[tuple[float, float], ...] = ()
        self.stats: dict[str, tuple[int, float]] = {}

    def start(self) -> None:
        if self.py_spy:
            self.raw.parent.mkdir(parents=True, exist_ok=True)
            self.spy = subprocess.Popen([self.py_spy, "record", "--pid", str(self.gateway), "--rate", "400",
                                         "--format", "raw", "--output", str(self.raw),
                                         # (py-spy reads native frames only from a stopped process)
                                         *(["--native"] if self.native else ["--nonblocking"])],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
        if self.strace:
            self.summary.parent.mkdir(parents=True, exist_ok=True)
            self.tracer = subprocess.Popen(["strace", "-c", "-w", "-f", "-o", str(self.summary),
                                            "-p", str(self.gateway)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
        self.line.call("CONFIG", "RESETSTAT")
        self.before = cpu_split(self.gateway), cpu_split(self.redis)

    def stop(self) -> None:
        self.after = cpu_split(self.gateway), cpu_split(self.redis)
        self.stats = self.line.commandstats()
        for process in (self.spy, self.tracer):
            if process is not None:
                process.send_signal(signal.SIGINT)
                process.wait(30)


def top_functions(raw: Path, limit: int = 25) -> list[tuple[str, float]]:
    """Own-time shares from py-spy's raw (collapsed) output: the leaf frame of each stack."""
    leaves: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        leaf = stack.rsplit(";", 1)[-1]
        leaves[leaf] += int(count)
        total += int(count)
    return [(name, count / total * 100) for name, count in leaves.most_common(limit)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--fsync", default="everysec")
    parser.add_argument("--server", default="redis", help="as bench/versus_activemq.py's --servers")
    parser.add_argument("--py-spy", help="a py-spy binary: profile the gateway process during each case")
    parser.add_argument("--profile-dir", default="/tmp/stomp-profile")
    parser.add_argument("--native", action="store_true",
                        help="with --py-spy, sample C frames too (the event loop's, the interpreter's; "
                             "py-spy stops the process for each sample, so the case's figures are slower)")
    parser.add_argument("--strace", action="store_true",
                        help="count the gateway process's system calls during each case (strace -c -w: time "
                             "in each call, wall clock; strace slows the process, the counts are the point)")
    parser.add_argument("--checkout", default=str(ROOT), help="the Signalbox checkout to run")
    parser.add_argument("--pin", type=int, metavar="CPU",
                        help="pin Redis and the gateway processes (every thread) to this CPU, the client "
                             "left free: their hand-offs then wake no other CPU (docs/benchmarks.md, "
                             "\"Session 34\")")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    with tempfile.TemporaryDirectory(prefix="stomp-latency-") as tmp:
        box = Signalbox(Path(tmp) / "signalbox", server_binary(args.server), args.fsync, Path(args.checkout))
        if args.pin is not None:
            for pid in box.pids.values():
                for thread in os.listdir(f"/proc/{pid}/task"):
                    os.sched_setaffinity(int(thread), {args.pin})
        try:
            print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
                  f"{os.cpu_count()} cores; processes {box.pids}"
                  + (f", pinned to CPU {args.pin}" if args.pin is not None else ""))
            line = RedisLine(box.redis_socket)
            round_trips(line, 2000)  # warm-up
            floor = round_trips(line, 5000)
            floor["asyncio echo (default loop), p50"] = echo_round_trip(5000, "asyncio")
            floor["asyncio echo (uvloop), p50"] = echo_round_trip(5000, "uvloop")
            floor["blocking-socket echo (no event loop), p50"] = echo_round_trip(5000, "blocking")
            floor["uvloop relay + Redis PING (two hops), p50"] = echo_round_trip(5000, "relay",
                                                                                 box.redis_socket)
            for name, value in floor.items():
                print(f"floor: {name}: {value:.0f} us")
            for case in cases:
                run_case(box.target, case, min(200, args.n))  # warm-up
                gateway = box.pids["web" if case.startswith("ws-") else "stomp"]
                meter = Meter(gateway, box.pids["redis"], line, args.py_spy, args.strace, args.profile_dir,
                              case, args.native)
                result = run_case(box.target, case, args.n, meter.start, meter.stop)
                if meter.tracer is not None:
                    print(meter.summary.read_text())
                split = [(user - user0, system - system0) for (user0, system0), (user, system)
                         in zip(meter.before, meter.after, strict=True)]
                cpu_gateway = sum(split[0]) / args.n * 1e6
                cpu_redis = sum(split[1]) / args.n * 1e6
                stats = meter.stats
                print(f"{case}: p50 {result['p50 us']:.0f} us, mean {result['mean us']:.0f} us; "
                      f"CPU per message (10 ms ticks, coarse): gateway {cpu_gateway:.0f} us, "
                      f"Redis {cpu_redis:.0f} us (user/kernel: gateway {split[0][0] / args.n * 1e6:.0f}/"
                      f"{split[0][1] / args.n * 1e6:.0f}, Redis {split[1][0] / args.n * 1e6:.0f}/"
                      f"{split[1][1] / args.n * 1e6:.0f} us)")
                for name, (calls, usec) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
                    if name in ("config|resetstat", "info"):
                        continue
                    print(f"    redis {name}: {calls / args.n:.2f} calls per message, {usec / calls:.1f} us "
                          "per call inside Redis")
                if meter.spy is not None and meter.raw.exists():
                    for name, share in top_functions(meter.raw):
                        print(f"    {share:5.1f} %  {name}")
        finally:
            box.stop()


if __name__ == "__main__":
    main()
