"""What a flood of wrong passwords costs everyone else: STOMP CONNECTs with a wrong password from many
threads, against one Signalbox per checkout, alternated in one run.

Usage: python bench/login_flood.py --checkout BEFORE --checkout AFTER [--rounds 2] [--attackers 8]
           [--sources 0,1,64]

Per checkout and per number of attacking client addresses (`--sources`: each attacker connects from one of
that many loopback addresses, 127.0.x.y, so 1 is one client and 64 a spread; 0 is no flood at all), with
`--attackers` threads each repeating CONNECT with another wrong password (a guessing attack; each on a
new connection, as the server closes it after the ERROR), it prints:
- a legitimate login's time: a CONNECT with the right password from 127.0.0.1, 5 in turn while the flood
  runs (the credential cache is off in this run, SIGNALBOX_AUTH_CACHE_SECONDS=0, so each checks the
  password as a first login does);
- an established connection's SEND->RECEIPT p50 (persistent, 300 messages) during the flood;
- the attackers' attempts per second, and how many were refused unchecked (gateway/logins.py).
The server is `./signalbox.sh run`'s launcher with an installed Redis 7 (AOF everysec) and the project's
password hasher (PBKDF2, Django's default iterations).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from stomp_latency import Signalbox  # noqa: E402
from versus_activemq import BODY, new_queue, server_binary  # noqa: E402
from versus_clients import Stomp, Target, encode  # noqa: E402

LEGIT_LOGINS = 5


def connect_once(target: Target, passcode: str, source: str) -> tuple[float, str]:
    """One CONNECT on a new connection from `source`: (seconds to the answer, its first line and message)."""
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", target.stomp_port), timeout=120,
                                  source_address=(source, 0)) as sock:
        sock.sendall(encode("CONNECT", {"accept-version": "1.2", "host": "x", "login": target.login,
                                        "passcode": passcode}))
        data = b""
        while b"\x00" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head = data.split(b"\n\n", 1)[0].decode(errors="replace").split("\n")
    message = next((line[8:] for line in head if line.startswith("message:")), "")
    return time.perf_counter() - start, f"{head[0]} {message}".strip()


def flood(target: Target, attackers: int, sources: int, seconds_before: float) -> dict[str, float]:
    stop = threading.Event()
    attempts: list[str] = []

    def attack(n: int) -> None:
        k = n
        while not stop.is_set():
            address = f"127.0.{1 + k % sources // 250}.{1 + k % sources % 250}"
            k += attackers
            try:
                attempts.append(connect_once(target, f"guess-{k}", address)[1])
            except OSError:
                attempts.append("connection failed")

    threads = [threading.Thread(target=attack, args=(n,), daemon=True)
               for n in range(attackers if sources else 0)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(seconds_before)
    legit = [connect_once(target, target.passcode, "127.0.0.1") for _ in range(LEGIT_LOGINS)]
    conn = Stomp(target, "tcp")
    queue = "/queue/" + new_queue()
    receipts = []
    for i in range(300):
        t = time.perf_counter()
        conn.frame("SEND", {"destination": queue, "persistent": "true", "receipt": str(i),
                            "content-length": str(len(BODY))}, BODY)
        conn.read_until("RECEIPT")
        receipts.append(time.perf_counter() - t)
    conn.close()
    stop.set()
    elapsed = time.monotonic() - started
    for thread in threads:
        thread.join(130)
    refused = sum(1 for a in attempts if "Too many" in a)
    elapsed = max(elapsed, 1e-9)
    return {"legit login p50 s": statistics.median(t for t, _ in legit),
            "legit login max s": max(t for t, _ in legit),
            "legit logins accepted": sum(1 for _, a in legit if a.startswith("CONNECTED")),
            "receipt p50 ms": statistics.median(receipts) * 1e3,
            "attempts per s": len(attempts) / elapsed,
            "refused unchecked": refused, "attempts": len(attempts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", action="append", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--attackers", type=int, default=8)
    parser.add_argument("--sources", default="0,1,64", help="0: no flood (the figures of a quiet server)")
    parser.add_argument("--seconds-before", type=float, default=3.0, help="flood this long before measuring")
    args = parser.parse_args()
    os.environ["SIGNALBOX_AUTH_CACHE_SECONDS"] = "0"  # every login checks its password (see above)
    print(f"{os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{args.attackers} attacking threads")
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="login-flood-") as tmp:
        for round_no in range(args.rounds):
            order = args.checkout if round_no % 2 == 0 else list(reversed(args.checkout))
            for checkout in order:
                box = Signalbox(Path(tmp) / f"{round_no}-{Path(checkout).name}-{time.monotonic_ns()}",
                                server_binary("redis"), "everysec", Path(checkout))
                try:
                    for sources in (int(s) for s in args.sources.split(",")):
                        result = flood(box.target, args.attackers, sources, args.seconds_before)
                        results.setdefault((checkout, sources), []).append(result)
                        print(f"round {round_no + 1} {checkout} sources {sources}: "
                              + ", ".join(f"{k} {v:.3g}" for k, v in result.items()), flush=True)
                finally:
                    box.stop()
    print("\nmedians over the rounds")
    print("| checkout | attacking addresses | legit login p50 s | legit login max s | legit accepted | "
          "SEND->RECEIPT p50 ms | attempts/s | refused unchecked |")
    print("|---|---|---|---|---|---|---|---|")
    for (checkout, sources), runs in results.items():
        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)
        print(f"| {checkout} | {sources} | {med('legit login p50 s'):.2f} | {med('legit login max s'):.2f} | "
              f"{med('legit logins accepted'):.0f}/{LEGIT_LOGINS} | {med('receipt p50 ms'):.2f} | "
              f"{med('attempts per s'):.1f} | {med('refused unchecked'):.0f} of {med('attempts'):.0f} |")


if __name__ == "__main__":
    main()
