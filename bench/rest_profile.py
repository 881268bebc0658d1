"""Where the time of one REST request goes: CPU per request of the gateway, Redis and the client, the Redis
commands and round trips of one request, and the ASGI floor, for the four REST cases of
bench/versus_activemq.py (same client, same requests).

Usage: python bench/rest_profile.py [--n 2000] [--rounds 1] [--checkout DIR ...] [--py-spy PATH]

Starts `./signalbox.sh run`'s launcher (an installed Redis 7, AOF everysec) once per checkout (default this
one; give several to compare them, alternating), and bench/asgi_floor.py in its own uvicorn. Then, per case:
- CPU ms per request of the web process (uvicorn), of redis-server and of this client (/proc user +
  system time over the case's requests; `get` and `consume` include the untimed STOMP fill). CPU time moves
  far less than wall-clock rates on a shared machine;
- with --py-spy (a py-spy binary; pip install py-spy somewhere outside the project), a sampling profile of
  the web process's event loop during the case, grouped by component (shares of the samples: on a loaded
  machine a thread waiting for a core is sampled as busy, so only the shares mean something there);
- once, one request of each case under MONITOR on the private Redis: the commands it sent (round trips,
  script calls and the commands those scripts ran).
The floor: an empty 200 answer from the smallest ASGI app under the same uvicorn, same client and headers.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import versus_activemq as versus  # noqa: E402
from versus_clients import Http, Target  # noqa: E402

from signalbox.embedded_redis import free_port  # noqa: E402

CASES = {"post": versus.rest_post, "get": versus.rest_get, "produce": versus.native_produce,
         "consume": versus.native_consume}
# py-spy frames -> component, the innermost matching frame naming the request's sample
SOCKET, CORE = "Redis socket: write, read replies", "broker_core (ops, replies)"
COMPONENTS = [
    ("redis/", "redis-py (pub/sub wake-ups)"), ("prometheus_client", "request metrics"),
    ("gateway/metrics.py", "request metrics"), ("drivers/multiplexed.py", SOCKET),
    ("broker_core/resp.py", SOCKET), ("broker_core/", CORE), ("msgpack", CORE),
    ("gateway/credentials.py", "credential cache"), ("gateway/api/auth.py", "credential cache"),
    ("gateway/permissions.py", "permissions"),
    ("gateway/api/compat", "compat servlet (compat*.py)"),
    ("gateway/api/", "gateway API (asgi.py hot path, views, codec)"),
    ("gateway/", "gateway (runtime, other)"),
    ("django/", "Django"), ("rest_framework/", "DRF"), ("httptools_impl.py", "uvicorn HTTP protocol"),
    ("proxy_headers.py", "ASGI wrappers"), ("channels/", "ASGI wrappers"), ("asyncio/", "asyncio"),
]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pid_of(pattern: str) -> int:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=True)
    return int(found.stdout.split()[0])


def components(raw: Path, n: int, rate: int) -> list[tuple[str, float]]:
    """µs per request of each component on the event loop thread (py-spy's raw output)."""
    totals: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not any(f.startswith("Runner.run") for f in frames):
            continue  # another thread (heartbeat, executor)
        if frames[-1].startswith("Runner.run"):
            totals["uvloop (C: socket I/O, callbacks) and idle"] += int(count)
            continue
        for frame in reversed(frames):
            hit = next((label for key, label in COMPONENTS if key in frame), None)
            if hit:
                totals[hit] += int(count)
                break
        else:
            totals["other"] += int(count)
    return [(label, count / rate / n * 1e6) for label, count in totals.most_common()]


def monitored(target: Target, redis_port: int) -> dict[str, list[str]]:
    """The Redis commands of one request of each case (after a warm-up request), from MONITOR."""
    queue, other = versus.new_queue(), versus.new_queue()
    versus.fill(target, queue, 5)
    versus.fill(target, other, 5)
    compat, native = versus.compat_client(target), versus.native_client(target)
    path = f"/api/message/{queue}?type=queue&readTimeout=5000"
    compat.call("GET", path)
    compat.call("POST", path, versus.BODY)
    native.call("POST", f"/api/v1/queues/{queue}/messages", versus.BODY)
    _, data = native.call("POST", f"/api/v1/queues/{other}/consumers", b'{"lease_ms": 120000}',
                          "application/json")
    consumer = f"/api/v1/queues/{other}/consumers/{json.loads(data)['consumer_id']}"
    _, data = native.call("POST", f"{consumer}/receive?max_messages=1")
    held = [m["message_id"] for m in json.loads(data)["messages"]]
    monitor = socket.create_connection(("127.0.0.1", redis_port))
    monitor.sendall(b"MONITOR\r\n")
    time.sleep(0.2)
    monitor.recv(1 << 20)
    seen: dict[str, list[str]] = {}
    steps = {"get": lambda: compat.call("GET", path), "post": lambda: compat.call("POST", path, versus.BODY),
             "produce": lambda: native.call("POST", f"/api/v1/queues/{queue}/messages", versus.BODY),
             "consume": lambda: native.call("POST", f"{consumer}/ack?receive=1",
                                            json.dumps({"message_ids": held}).encode(), "application/json")}
    for name, step in steps.items():
        step()
        time.sleep(0.3)
        lines = monitor.recv(1 << 22).decode(errors="replace").splitlines()
        # the request's: commands naming its queues (and MULTI/EXEC around them), with what their scripts
        # ran; not the maintenance tick's visits or the rate sampler's writes, which name the queues too
        kept, keep = [], False
        for line in lines:
            if "[0 lua]" not in line:
                keep = (queue in line or other in line or '"MULTI"' in line or '"EXEC"' in line) \
                    and "_maintenance" not in line and "_rate_sample" not in line and ":rates" not in line
            if keep:
                if '"EXEC"' in line and kept and '"MULTI"' in kept[-1]:
                    kept.pop()  # an empty MULTI/EXEC: Celery's, not the request's
                else:
                    kept.append(line)
        seen[name] = kept
    monitor.close()
    for client in (compat, native):
        client.close()
    return seen


def describe(lines: list[str]) -> str:
    """Round trips (a MULTI/EXEC block is one), the gateway's commands, how many the scripts ran."""
    sent = [re.sub(r"^\+[\d.]+ \[[^\]]+\] ", "", line).split(" ", 1)[0].strip('"')
            for line in lines if "[0 lua]" not in line]
    trips, block = 0, False
    for command in sent:
        if command == "MULTI":
            block = True
        elif command == "EXEC":
            block = False
            trips += 1
        elif not block:
            trips += 1
    inner = sum("[0 lua]" in line for line in lines)
    return f"{trips} round trips ({' '.join(sent)}); {inner} commands run by scripts"


def floor(n: int) -> str:
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "bench.asgi_floor:app", "--host", "127.0.0.1",
               "--port", str(port), "--lifespan", "off", "--no-access-log"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        versus.wait_port(port, process, "the floor's uvicorn")
        client = Http(f"http://127.0.0.1:{port}", Http.basic("admin", "x"))
        out = []
        for method, body in (("POST", versus.BODY), ("GET", None)):
            before, mine = cpu_seconds(process.pid), sum(os.times()[:2])

            def step(_: int, method: str = method, body: bytes | None = body) -> None:
                client.call(method, "/api/message/x?type=queue", body)

            result = versus.timed_requests(n, step)
            server = (cpu_seconds(process.pid) - before) / n * 1000
            client_ms = (sum(os.times()[:2]) - mine) / n * 1000
            out.append(f"floor {method:4} {result['per s']:8.0f}/s p50 {result['p50 ms']:.3f} ms | "
                       f"CPU ms per request: server {server:.3f} client {client_ms:.3f}")
        client.close()
        return "\n".join(out)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)


def run_case(case: str, target: Target, web: int, redis: int, n: int, py_spy: str | None, raw: Path) -> None:
    spy = None
    if py_spy:
        command = [py_spy, "record", "-p", str(web), "-r", "1000", "-f", "raw", "-o", str(raw)]
        spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
    web0, redis0, mine0 = cpu_seconds(web), cpu_seconds(redis), sum(os.times()[:2])
    result = CASES[case](target, n)
    web1, redis1, mine1 = cpu_seconds(web), cpu_seconds(redis), sum(os.times()[:2])
    per = [(web1 - web0) / n * 1000, (redis1 - redis0) / n * 1000, (mine1 - mine0) / n * 1000]
    print(f"{case:8} {result['per s']:8.1f}/s p50 {result['p50 ms']:.3f} ms | CPU ms per request: "
          f"gateway {per[0]:.3f} redis {per[1]:.3f} client {per[2]:.3f}", flush=True)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
        shares = components(raw, n, 1000)
        total = sum(us for _, us in shares) or 1.0
        for label, us in shares[:14]:
            print(f"    {100 * us / total:5.1f} %  {label}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="requests per case")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--checkout", action="append", help="a Signalbox checkout (default: this one)")
    parser.add_argument("--cases", default="post,get,produce,consume")
    parser.add_argument("--py-spy", help="a py-spy binary: profile the web process during each case")
    args = parser.parse_args()
    running = versus.Running()
    folder = Path(tempfile.mkdtemp(prefix="rest-profile-"))
    try:
        targets = []
        for i, checkout in enumerate(args.checkout or [str(ROOT)]):
            root = Path(checkout).resolve()
            binary = versus.server_binary("redis")
            target = versus.start_signalbox(folder / str(i), binary, "everysec", running, root=root)
            port = target.http_url.rsplit(":", 1)[1]
            web = pid_of(f"uvicorn signalbox.asgi:application --host 127.0.0.1 --port {port}")
            redis_port = target.redis_port
            redis = pid_of(f"redis-server 127.0.0.1:{redis_port}")
            targets.append((root.name, target, web, redis, redis_port))
        for name, target, _, _, redis_port in targets:
            print(f"## one request of each case, {name} (MONITOR)")
            for case, lines in monitored(target, redis_port).items():
                print(f"{case:8} {describe(lines)}")
        print("## " + floor(args.n).replace("\n", "\n## "))
        for round_number in range(args.rounds):
            for name, target, web, redis, _ in targets:
                load = os.getloadavg()[0]
                print(f"## {name}, round {round_number + 1}, load average {load:.1f}", flush=True)
                for case in args.cases.split(","):
                    run_case(case, target, web, redis, args.n, args.py_spy,
                             folder / f"{name}-{case}-{round_number}.raw")
    finally:
        running.stop_all()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
