"""The STOMP listener's instructions per message, counted by callgrind: the gateway's CPU per message in a
measure that does not move with the machine's load, so two checkouts compare exactly on a shared VM (where
`bench/stomp_latency.py`'s CPU figures moved by 2x from one run to the next).

Usage: python bench/stomp_instructions.py [--n 1000] [--cases tcp-pingpong,tcp-receipt-np]
           [--rounds 1] [--checkout DIR ...]

Per checkout: starts `./signalbox.sh run`'s launcher (bench/stomp_latency.py's `Signalbox`: an installed Redis
7, AOF everysec), then a second STOMP listener of the same checkout, on the same Redis and data folder,
under `valgrind --tool=callgrind --instr-atstart=no`, and runs each case against that one: 200 messages
of warm-up on the case's connections, then the counters are zeroed and switched on (`callgrind_control
-z`, `-i on`) for `--n` messages and read (`-d`). Printed: the listener's user-mode instructions per
message (the kernel's work for its system calls is not counted: `bench/stomp_latency.py --strace`
counts those calls). The listener's lease is 10 minutes (SIGNALBOX_WS_LEASE_MS), so its lease keeper,
which runs every third of a lease, does not run inside a case however slow valgrind makes it.

Cases: tcp-pingpong (a SEND on one connection, its MESSAGE on another, ack auto) and tcp-receipt-np (SEND
non-persistent with a receipt), the clients of bench/versus_activemq.py. A stream's figure depends on how
many frames each read and script call carries, which under valgrind's slowdown is not what it is at full
speed, so streams are not offered here. With several --checkout, each round runs them in turn.
Needs Debian's `valgrind` package.
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from stomp_latency import Signalbox  # noqa: E402
from versus_activemq import BODY, new_queue, server_binary  # noqa: E402
from versus_clients import Stomp, Target, encode  # noqa: E402

from signalbox.embedded_redis import free_port  # noqa: E402

WARM_UP = 200
CLIENT_TIMEOUT = 300  # seconds a client waits for a frame: a CONNECT's password check is slow under valgrind


class Counted:
    """A STOMP listener under callgrind, instrumentation off until `start`."""

    def __init__(self, checkout: Path, env: dict[str, str], folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        env = {**env, "SIGNALBOX_WS_LEASE_MS": "600000"}
        self.process = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={folder}/callgrind.out.%p", sys.executable, "-m", "django",
             "stomp_listener", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=checkout, env=env, stdout=open(folder / "listener.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 600
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"the listener under valgrind did not start: {folder / 'listener.log'}"
                                       ) from None
                time.sleep(2)

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.process.pid)], capture_output=True, timeout=600,
                       check=True)

    def start(self) -> None:
        self._control("-z")
        self._control("-i", "on")

    def stop(self) -> int:
        """The instructions counted since `start` (a dump, then instrumentation off)."""
        self._control("-d")
        self._control("-i", "off")
        dumps = sorted(glob.glob(f"{self.folder}/callgrind.out.{self.process.pid}*"), key=os.path.getmtime)
        with open(dumps[-1]) as dump:
            for line in dump:
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
        raise RuntimeError(f"no totals in {dumps[-1]}")

    def close(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)


def pingpong(target: Target, n: int, start: Callable[[], None], stop: Callable[[], None]) -> None:
    queue = "/queue/" + new_queue()
    receiver = Stomp(target, "tcp", timeout=CLIENT_TIMEOUT)
    sender = Stomp(target, "tcp", timeout=CLIENT_TIMEOUT)
    receiver.frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "auto", "receipt": "sub"})
    receiver.read_until("RECEIPT")
    frame = encode("SEND", {"destination": queue, "persistent": "false", "content-length": str(len(BODY))},
                   BODY)
    for i in range(WARM_UP + n):
        if i == WARM_UP:
            start()
        sender.send_bytes(frame)
        receiver.read_until("MESSAGE")
    stop()
    sender.close()
    receiver.close()


def receipt(target: Target, n: int, start: Callable[[], None], stop: Callable[[], None]) -> None:
    queue = "/queue/" + new_queue()
    conn = Stomp(target, "tcp", timeout=CLIENT_TIMEOUT)
    for i in range(WARM_UP + n):
        if i == WARM_UP:
            start()
        conn.frame("SEND", {"destination": queue, "persistent": "false", "receipt": str(i),
                            "content-length": str(len(BODY))}, BODY)
        conn.read_until("RECEIPT")
    stop()
    conn.close()


CASES = {"tcp-pingpong": pingpong, "tcp-receipt-np": receipt}


def measure(checkout: Path, cases: list[str], n: int) -> dict[str, float]:
    """Thousands of instructions per message, by case, of one checkout's listener."""
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="stomp-instructions-") as tmp:
        box = Signalbox(Path(tmp) / "signalbox", server_binary("redis"), "everysec", checkout)
        listener = None
        try:
            # the launcher's own listener's environment: the same Redis, data folder and settings
            environ = Path(f"/proc/{box.pids['stomp']}/environ").read_bytes().decode()
            env = dict(item.split("=", 1) for item in environ.split("\0") if "=" in item)
            folder = Path(tmp) / "callgrind"
            folder.mkdir()
            listener = Counted(checkout, env, folder)
            target = Target("Signalbox under callgrind", listener.port, box.target.login, box.target.passcode)
            counted: list[int] = []
            for case in cases:
                CASES[case](target, n, listener.start, lambda: counted.append(listener.stop()))
                out[case] = counted.pop() / n / 1000
        finally:
            if listener is not None:
                listener.close()
            box.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--checkout", action="append", help="a Signalbox checkout (repeat to compare)")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}: choose from {', '.join(CASES)}")
    checkouts = [Path(c).resolve() for c in (args.checkout or [str(ROOT)])]
    for round_ in range(args.rounds):
        for checkout in checkouts:
            for case, figure in measure(checkout, cases, args.n).items():
                print(f"round {round_ + 1} {checkout} {case}: {figure:.1f} k instructions per message "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
