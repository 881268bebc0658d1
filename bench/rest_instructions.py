"""Instructions per REST request in the gateway's own code, counted by callgrind: a measure of the web
process's Python work that does not move with the load of a shared machine, so two checkouts compare
exactly where CPU seconds per request (bench/rest_profile.py) vary 1.5-2x from round to round.

Usage: python bench/rest_instructions.py [--n 300] [--checkout DIR ...]

Per checkout (default this one): `./signalbox.sh run`'s launcher (an installed Redis 7, AOF everysec) gives
the Redis, the database, the admin and its token; then the ASGI application (`signalbox.asgi.application`,
the same stack uvicorn serves: request metrics, static files, the gateway's handler) runs in a child
process under `valgrind --tool=callgrind`, driven in-process with the four REST cases of
bench/versus_activemq.py (same paths, bodies and credentials: a servlet POST and a GET with the consumer
kept in the session, HTTP Basic; a native raw-body produce and a consume+ack, `Authorization: Token`).
Not counted: uvicorn's HTTP protocol and the client (the same for both checkouts), Redis. Counted: everything
from the ASGI call to the last response message, the event loop's work and the Redis socket calls included.
Each case is warmed up (credentials checked, the session made, the consumer created), then the counters are
zeroed (`callgrind_control -z`), n requests run and the counters read (`callgrind_control -d`). Needs
Debian's `valgrind` package. Python under callgrind is ~50x slower: start-up takes a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ("post", "get", "produce", "consume")
BODY = b"x" * 256


# -- the child: the ASGI app under callgrind ----------------------------------------------------------------

def child(root: Path) -> None:
    sys.path.insert(0, str(root))
    os.chdir(root)
    from broker_core.messages import Message
    from gateway import runtime
    from signalbox.asgi import application

    basic = b"Basic " + base64.b64encode(f"admin:{os.environ['BENCH_PASSWORD']}".encode())
    token = f"Token {os.environ['BENCH_TOKEN']}".encode()

    async def call(method: str, path: str, body: bytes = b"", auth: bytes = basic,
                   content_type: bytes | None = None, cookie: bytes | None = None) -> dict:
        path, _, query = path.partition("?")
        headers = [(b"host", b"127.0.0.1"), (b"user-agent", b"bench"), (b"accept-encoding", b"identity"),
                   (b"authorization", auth), (b"content-length", str(len(body)).encode())]
        if content_type:
            headers.append((b"content-type", content_type))
        if cookie:
            headers.append((b"cookie", cookie))
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query.encode(),
                 "root_path": "", "headers": headers, "client": ("127.0.0.1", 50000),
                 "server": ("127.0.0.1", 8000)}
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        out: dict = {"body": b""}

        async def receive() -> dict:
            if messages:
                return messages.pop()
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                out["status"], out["headers"] = message["status"], message["headers"]
            else:
                out["body"] += message.get("body", b"")

        await application(scope, receive, send)
        return out

    def expect(answer: dict, status: int) -> dict:
        if answer["status"] != status:
            raise RuntimeError(f"status {answer['status']}, expected {status}: {answer['body'][:300]!r}")
        return answer

    async def main() -> None:
        n = int(os.environ["BENCH_N"])
        broker = runtime.async_broker()
        for queue in ("bench.get", "bench.consume"):
            for start in range(0, n + 10, 500):
                await broker.send(f"queue://{queue}", [Message(body=BODY.decode())
                                                       for _ in range(min(500, n + 10 - start))])
        servlet = "/api/message/bench.get?type=queue&readTimeout=5000"
        first = expect(await call("GET", servlet), 200)  # makes the session (Django's path)
        cookie = next(v for k, v in first["headers"] if k.lower() == b"set-cookie").split(b";")[0]
        consumer, held = "", []

        async def post() -> None:
            expect(await call("POST", "/api/message/bench.post?type=queue", BODY), 200)

        async def get() -> None:
            if expect(await call("GET", servlet, cookie=cookie), 200)["body"] != BODY:
                raise RuntimeError("GET: not the body sent")

        async def produce() -> None:
            expect(await call("POST", "/api/v1/queues/bench.produce/messages", BODY, token), 201)

        async def consume() -> None:
            nonlocal consumer, held
            if not consumer:  # made in the case's warm-up: its lease runs from then (Python is slow here)
                made = expect(await call("POST", "/api/v1/queues/bench.consume/consumers",
                                         b'{"lease_ms": 600000}', token, b"application/json"), 201)
                consumer = f"/api/v1/queues/bench.consume/consumers/{json.loads(made['body'])['consumer_id']}"
                received = expect(await call("POST", f"{consumer}/receive?max_messages=1&wait=5", b"", token),
                                  200)
                held = [m["message_id"] for m in json.loads(received["body"])["messages"]]
            answer = expect(await call("POST", f"{consumer}/ack?receive=1&wait=5",
                                       json.dumps({"message_ids": held}).encode(), token,
                                       b"application/json"), 200)
            held = [m["message_id"] for m in json.loads(answer["body"])["messages"]]

        steps = {"post": post, "get": get, "produce": produce, "consume": consume}
        print("ready", flush=True)
        # `warm CASE`: credentials verified and remembered, caches filled; `run CASE`: the n counted requests
        # (the parent zeroes the counters in between)
        while line := sys.stdin.readline().split():
            for _ in range(3 if line[0] == "warm" else n):
                await steps[line[1]]()
            print("done", flush=True)

    asyncio.run(main())


# -- the parent ---------------------------------------------------------------------------------------------


def measure(root: Path, folder: Path, n: int, running: object) -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "bench"))
    import versus_activemq as versus
    from redis_instructions import instructions  # callgrind's counters since the last zeroing

    target = versus.start_signalbox(folder, versus.server_binary("redis"), "everysec", running, root=root)
    env = dict(os.environ, SIGNALBOX_DATA_DIR=str(folder), REDIS_URL=f"redis://127.0.0.1:{target.redis_port}/0",
               DJANGO_SETTINGS_MODULE="signalbox.settings", BENCH_N=str(n), BENCH_PASSWORD=target.passcode,
               BENCH_TOKEN=target.rest_native,
               # Python runs ~50x slower here: remembered credentials must outlive a case (the default 30 s
               # would put a password check, a million PBKDF2 rounds, into the counted requests)
               SIGNALBOX_AUTH_CACHE_SECONDS="86400")
    out_prefix = str(folder / "callgrind.out")
    log = folder / "child.log"  # the child's stderr (valgrind's and Python's)
    process = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_prefix}.%p", sys.executable,
         str(Path(__file__).resolve()), "--child", str(root)],
        cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    try:
        if process.stdout.readline().strip() != "ready":
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the child under callgrind failed to start (exit {process.wait()}):\n{tail}")
        out = {}
        for case in CASES:
            for command in ("warm", "run"):
                if command == "run":
                    subprocess.run(["callgrind_control", "-z", str(process.pid)], check=True,
                                   capture_output=True)
                process.stdin.write(f"{command} {case}\n")
                process.stdin.flush()
                if process.stdout.readline().strip() != "done":
                    tail = log.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{case} failed in the child (exit {process.wait()}):\n{tail}")
            out[case] = instructions(process.pid, out_prefix) / n
        return out
    finally:
        process.stdin.close()
        process.wait(120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=300, help="requests per case")
    parser.add_argument("--checkout", action="append", help="a Signalbox checkout (default: this one)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child))
        return
    sys.path.insert(0, str(ROOT / "bench"))
    import versus_activemq as versus

    running = versus.Running()
    folder = Path(tempfile.mkdtemp(prefix="rest-instructions-"))
    results = {}
    try:
        for i, checkout in enumerate(args.checkout or [str(ROOT)]):
            root = Path(checkout).resolve()
            results[root.name] = measure(root, folder / str(i), args.n, running)
            print(f"{root.name}: " + ", ".join(f"{case} {count / 1e6:.3f} M" for case, count
                                                in results[root.name].items()), flush=True)
    finally:
        running.stop_all()
        shutil.rmtree(folder, ignore_errors=True)
    names = list(results)
    print(f"\ninstructions per request (millions), {args.n} requests a case")
    print(f"{'case':10}" + "".join(f"{name:>14}" for name in names)
          + ("".join(f"{names[0] + ' / ' + name:>24}" for name in names[1:])))
    for case in CASES:
        print(f"{case:10}" + "".join(f"{results[name][case] / 1e6:14.3f}" for name in names)
              + "".join(f"{results[names[0]][case] / results[name][case]:23.2f}x" for name in names[1:]))


if __name__ == "__main__":
    main()
