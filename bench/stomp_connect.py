"""What a STOMP CONNECT costs the gateway: CONNECT -> CONNECTED -> DISCONNECT -> RECEIPT on a fresh
connection, the same login and passcode every time (a client reconnecting), against two Signalbox
checkouts side by side (before and after a change), alternating A B A B in one run.

Usage: python bench/stomp_connect.py --before /path/to/checkout [--after .] [--n 20] [--rounds 2]
           [--transports tcp,ws]

Starts `./signalbox.sh run`'s launcher of each checkout (bench/stomp_latency.py's Signalbox: its own Redis,
web server, STOMP TCP listener, the admin user with a random password under Django's default hasher,
PBKDF2-SHA256), then per round, checkout and transport: n connections one after another, each timed from
opening the socket to the DISCONNECT's RECEIPT, and the CPU the serving process spent (the STOMP listener
for tcp, the web server for ws; /proc). Prints the median and mean wall time per connection and the CPU
per connection. A connection's first login in a process (and the first after the credential cache's
30 s TTL) runs the hasher in both; the mean includes those.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from stomp_latency import Signalbox, cpu_seconds  # noqa: E402
from versus_activemq import server_binary  # noqa: E402
from versus_clients import Stomp  # noqa: E402


def connections(box: Signalbox, transport: str, n: int) -> tuple[list[float], float]:
    """n CONNECT ... RECEIPT round trips: (seconds each, CPU seconds of the serving process in all)."""
    pid = box.pids["stomp" if transport == "tcp" else "web"]
    cpu = cpu_seconds(pid)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        Stomp(box.target, transport).close()  # CONNECT, CONNECTED, DISCONNECT, RECEIPT
        times.append(time.perf_counter() - start)
    return times, cpu_seconds(pid) - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the checkout to compare against")
    parser.add_argument("--after", default=str(ROOT))
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--transports", default="tcp,ws")
    parser.add_argument("--server", default="redis", help="as bench/versus_activemq.py's --servers")
    args = parser.parse_args()
    transports = [t for t in args.transports.split(",") if t]
    with tempfile.TemporaryDirectory(prefix="stomp-connect-") as tmp:
        boxes: dict[str, Signalbox] = {}
        try:
            for name, checkout in (("before", args.before), ("after", args.after)):
                boxes[name] = Signalbox(Path(tmp) / name, server_binary(args.server), "everysec",
                                        Path(checkout))
            print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} cores")
            for round_ in range(1, args.rounds + 1):
                for name, box in boxes.items():
                    for transport in transports:
                        times, cpu = connections(box, transport, args.n)
                        print(f"round {round_} {name:6} {transport:3}: {args.n} connections, "
                              f"median {statistics.median(times) * 1e3:7.1f} ms, "
                              f"mean {statistics.fmean(times) * 1e3:7.1f} ms, "
                              f"CPU {cpu / args.n * 1e3:7.1f} ms per connection", flush=True)
            print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        finally:
            for box in boxes.values():
                box.stop()


if __name__ == "__main__":
    main()
