"""STOMP over TCP, Signalbox against ActiveMQ 5.17.2 (Debian's `activemq` package), side by side in one run.

Usage: python bench/versus_activemq.py [--n 10000] [--latency-n 2000] [--rounds 2]
                                       [--fsync everysec,always] [--only stream,receipt,pingpong]
                                       [--also /path/to/another/checkout]

--without-activemq leaves ActiveMQ out (ratios are then against this checkout's Signalbox).
--also runs another Signalbox checkout too (each fsync policy), labelled by its folder, alternating with the
others: a before/after of a change in one run (e.g. `--also /work/main`).

Starts both brokers on free loopback ports, each with its defaults for durability: ActiveMQ with KahaDB
(journal disk syncs on, as shipped) in a temporary folder, Signalbox with `./signalbox.sh run`'s launcher
(its embedded server with AOF, `appendfsync` from --fsync; each policy is a broker of its own in the table),
then runs the same raw-socket STOMP 1.2 client against each, alternating A B A B ... for --rounds rounds,
and prints every figure, the median per broker and the ratio Signalbox / ActiveMQ (> 1 is Signalbox
ahead; for latencies the ratio is ActiveMQ's over Signalbox's, so > 1 is still Signalbox ahead).

Cases, each on a fresh queue, 256-byte bodies:
- stream persistent / non-persistent: a consumer process (ack auto, prefetch 1000) subscribes; the producer
  sends N SENDs without receipts; e2e msgs/s = N / (first SEND -> last MESSAGE).
- receipt persistent / non-persistent: --latency-n SENDs one at a time, each waiting for its RECEIPT;
  rate and p50 of SEND -> RECEIPT.
- ping-pong: --latency-n messages one at a time, SEND on one connection -> MESSAGE on another; rate, p50.

Needs Debian's activemq package (`apt-get install activemq`) and Java 17.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from signalbox.embedded_redis import configured_executable, free_port  # noqa: E402

BODY = b"x" * 256
ACTIVEMQ_HOME = Path("/usr/share/activemq")
ACTIVEMQ_XML = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans
    http://www.springframework.org/schema/beans/spring-beans.xsd
    http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <!-- bench/versus_activemq.py: the shipped defaults (KahaDB, journal disk syncs on), loopback only -->
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="bench" useJmx="false"
          dataDirectory="{data}" schedulerSupport="false">
    <persistenceAdapter><kahaDB directory="{data}/kahadb"/></persistenceAdapter>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:{port}"/>
    </transportConnectors>
  </broker>
</beans>
"""


# -- a minimal STOMP 1.2 client over a raw socket ------------------------------------------------------

class Stomp:
    def __init__(self, port: int, login: str, passcode: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.frame("CONNECT", {"accept-version": "1.2", "host": "localhost", "login": login,
                               "passcode": passcode, "heart-beat": "0,0"})
        command, headers, _ = self.read()
        if command != "CONNECTED":
            raise RuntimeError(f"CONNECT refused: {command} {headers}")

    @staticmethod
    def encode(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
        head = "".join(f"{k}:{v}\n" for k, v in headers.items())
        return f"{command}\n{head}\n".encode() + body + b"\x00"

    def frame(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.sock.sendall(self.encode(command, headers, body))

    def read(self) -> tuple[str, dict[str, str], bytes]:
        while True:
            self.buf = self.buf.lstrip(b"\r\n")
            end = self.buf.find(b"\n\n")
            if end >= 0:
                lines = self.buf[:end].decode().split("\n")
                headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
                start = end + 2
                length = int(headers["content-length"]) if "content-length" in headers else None
                stop = start + length if length is not None else self.buf.find(b"\x00", start)
                if stop >= 0 and len(self.buf) > stop:
                    body, self.buf = self.buf[start:stop], self.buf[stop + 1:]
                    return lines[0], headers, body
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed")
            self.buf += data

    def close(self) -> None:
        try:
            self.frame("DISCONNECT", {"receipt": "bye"})
            self.read()
        except OSError:
            pass
        self.sock.close()


@dataclass
class Broker:
    name: str
    port: int
    login: str
    passcode: str


def _consume(broker: Broker, queue: str, n: int, ready: mp.Event, done: mp.Queue) -> None:
    conn = Stomp(broker.port, broker.login, broker.passcode)
    conn.frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "auto",
                             "activemq.prefetchSize": "1000", "receipt": "sub"})
    conn.read()
    ready.set()
    for _ in range(n):
        conn.read()
    done.put(time.perf_counter())
    conn.close()


def stream(broker: Broker, n: int, persistent: bool) -> dict[str, float]:
    queue = f"/queue/bench.{uuid.uuid4().hex[:8]}"
    ready, done = mp.Event(), mp.Queue()
    consumer = mp.Process(target=_consume, args=(broker, queue, n, ready, done))
    consumer.start()
    ready.wait(60)
    producer = Stomp(broker.port, broker.login, broker.passcode)
    headers = {"destination": queue, "persistent": "true" if persistent else "false",
               "content-length": str(len(BODY))}
    frame = Stomp.encode("SEND", headers, BODY)
    start = time.perf_counter()
    for i in range(0, n, 100):
        producer.sock.sendall(frame * min(100, n - i))
    end = done.get(timeout=300)
    consumer.join(30)
    producer.close()
    return {"msgs/s": n / (end - start)}


def receipts(broker: Broker, n: int, persistent: bool) -> dict[str, float]:
    queue = f"/queue/bench.{uuid.uuid4().hex[:8]}"
    conn = Stomp(broker.port, broker.login, broker.passcode)
    latencies = []
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        conn.frame("SEND", {"destination": queue, "persistent": "true" if persistent else "false",
                            "receipt": str(i), "content-length": str(len(BODY))}, BODY)
        command, _, _ = conn.read()
        assert command == "RECEIPT", command
        latencies.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    conn.close()
    return {"per s": n / elapsed, "p50 ms": statistics.median(latencies) * 1000}


def pingpong(broker: Broker, n: int) -> dict[str, float]:
    queue = f"/queue/bench.{uuid.uuid4().hex[:8]}"
    receiver = Stomp(broker.port, broker.login, broker.passcode)
    receiver.frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "auto", "receipt": "sub"})
    receiver.read()
    sender = Stomp(broker.port, broker.login, broker.passcode)
    frame = Stomp.encode("SEND", {"destination": queue, "persistent": "false",
                                  "content-length": str(len(BODY))}, BODY)
    latencies = []
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        sender.sock.sendall(frame)
        command, _, _ = receiver.read()
        assert command == "MESSAGE", command
        latencies.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    sender.close()
    receiver.close()
    return {"per s": n / elapsed, "p50 ms": statistics.median(latencies) * 1000}


# -- the brokers ---------------------------------------------------------------------------------------

def wait_port(port: int, process: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{what} exited with {process.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"{what} did not listen on {port} within {timeout:.0f} s")


def start_activemq(folder: Path) -> tuple[subprocess.Popen, Broker]:
    if not (ACTIVEMQ_HOME / "bin" / "activemq.jar").exists():
        sys.exit("needs Debian's activemq package: apt-get install activemq")
    port = free_port()
    conf, data = folder / "conf", folder / "data"
    conf.mkdir(parents=True)
    data.mkdir()
    (conf / "activemq.xml").write_text(ACTIVEMQ_XML.format(data=data, port=port))
    shutil.copy("/etc/activemq/instances-available/main/log4j2.properties", conf)
    process = subprocess.Popen(
        ["java", "-Xms512M", "-Xmx512M", f"-Dactivemq.home={ACTIVEMQ_HOME}", f"-Dactivemq.base={folder}",
         f"-Dactivemq.conf={conf}", f"-Dactivemq.data={data}", f"-Djava.io.tmpdir={data}",
         "-jar", str(ACTIVEMQ_HOME / "bin" / "activemq.jar"), "start", f"xbean:file:{conf / 'activemq.xml'}"],
        stdout=open(folder / "out.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)  # noqa: SIM115
    wait_port(port, process, "ActiveMQ")
    return process, Broker("ActiveMQ 5.17.2 (KahaDB, disk syncs on)", port, "admin", "admin")


def start_signalbox(folder: Path, fsync: str, root: Path = ROOT) -> tuple[subprocess.Popen, Broker]:
    folder.mkdir(parents=True)
    port, stomp = free_port(), free_port()
    password = secrets.token_urlsafe(12)
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(SIGNALBOX_DATA_DIR=str(folder), SIGNALBOX_PORT=str(port), SIGNALBOX_STOMP_PORT=str(stomp),
               SIGNALBOX_REDIS_PORT=str(free_port()), SIGNALBOX_ADMIN_PASSWORD=password,
               SIGNALBOX_REDIS_APPENDFSYNC=fsync, SIGNALBOX_CELERY_QUEUE=f"bench-{uuid.uuid4().hex[:6]}")
    process = subprocess.Popen([sys.executable, "-m", "signalbox.launcher", "run"], cwd=root, env=env,
                               stdout=open(folder / "run.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                               start_new_session=True)
    wait_port(stomp, process, "Signalbox")
    server = Path(configured_executable()).name  # redis-server (an installed Redis 7) or valkey-server
    label = "" if root == ROOT else f" {root.name}"
    return process, Broker(f"Signalbox{label} ({server}, AOF {fsync})", stomp, "admin", password)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT if "signalbox" in " ".join(process.args) else signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


CASES = {
    "stream": [("stream persistent, msgs/s", lambda b, a: stream(b, a.n, True)),
               ("stream non-persistent, msgs/s", lambda b, a: stream(b, a.n, False))],
    "receipt": [("SEND->RECEIPT persistent", lambda b, a: receipts(b, a.latency_n, True)),
                ("SEND->RECEIPT non-persistent", lambda b, a: receipts(b, a.latency_n, False))],
    "pingpong": [("ping-pong", lambda b, a: pingpong(b, a.latency_n))],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--latency-n", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fsync", default="everysec,always")
    parser.add_argument("--only", default="stream,receipt,pingpong")
    parser.add_argument("--also", default="", help="another Signalbox checkout to run beside this one")
    parser.add_argument("--without-activemq", action="store_true",
                        help="Signalbox only (with --also: before/after, ratios against this checkout)")
    args = parser.parse_args()
    cases = [case for group in args.only.split(",") for case in CASES[group]]
    work = Path(tempfile.mkdtemp(prefix="versus-activemq-"))
    processes: list[subprocess.Popen] = []
    results: dict[tuple[str, str], dict[str, list[float]]] = {}
    try:
        brokers = []
        if not args.without_activemq:
            amq_process, amq = start_activemq(work / "activemq")
            processes.append(amq_process)
            brokers.append(amq)
        roots = [ROOT] + ([Path(args.also).resolve()] if args.also else [])
        for fsync in args.fsync.split(","):
            for n, root in enumerate(roots):
                process, broker = start_signalbox(work / f"signalbox-{fsync}-{n}", fsync, root)
                processes.append(process)
                brokers.append(broker)
        print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}; "
              f"{args.n} messages per stream, {args.latency_n} per latency case, {args.rounds} rounds; "
              "client: raw-socket STOMP 1.2 over loopback TCP")
        for label, run in [("warm-up", None)] + [(f"round {r + 1}", r) for r in range(args.rounds)]:
            for name, case in cases:
                for broker in brokers:
                    figures = case(broker, argparse.Namespace(n=min(args.n, 2000) if run is None else args.n,
                                                              latency_n=min(args.latency_n, 300)
                                                              if run is None else args.latency_n))
                    if run is None:
                        continue
                    for key, value in figures.items():
                        results.setdefault((name, key), {}).setdefault(broker.name, []).append(value)
                    print(f"{label}: {name:<32} {broker.name:<40} "
                          + ", ".join(f"{k} {v:,.2f}" for k, v in figures.items()), flush=True)
        print()
        print(f"{'case':<44} " + " ".join(f"{b.name[:38]:>40}" for b in brokers)
              + f"   ratio(s) vs {brokers[0].name.split(' (')[0]}")
        for (name, key), per_broker in results.items():
            medians = [statistics.median(per_broker[b.name]) for b in brokers]
            ratios = []
            for value in medians[1:]:
                ratio = medians[0] / value if key.endswith("ms") else value / medians[0]
                ratios.append(f"{ratio:.2f}x")
            print(f"{name + ' ' + key:<44} " + " ".join(f"{m:>40,.2f}" for m in medians)
                  + "   " + " ".join(ratios))
    finally:
        for process in processes:
            stop(process)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
