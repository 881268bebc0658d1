"""A private Redis for a bench: a server of its own on a free loopback port, nothing persisted, stopped
when the bench is done; and a bench's child run with another checkout's code (before/after in one run)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from signalbox.embedded_redis import free_port, wait_for_port  # noqa: E402


@contextlib.contextmanager
def scratch_redis(binary: str | None = None, unix_socket: str | None = None) -> Iterator[int]:
    """Start `binary` (default: `redis-server` on PATH), also on `unix_socket` if given, and yield its port
    once it accepts connections."""
    port = free_port()
    server = subprocess.Popen([binary or shutil.which("redis-server") or "redis-server", "--port", str(port),
                               "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                               *(["--unixsocket", unix_socket] if unix_socket else [])],
                              stdout=subprocess.DEVNULL)
    try:
        wait_for_port(port, process=server, interval=0.05)
        yield port
    finally:
        server.terminate()
        server.wait()


def run_in_checkout(script: str, checkout: Path, *args: str, timeout: float = 600) -> list[str]:
    """Run `script --child ARGS...` in a process of its own with `checkout`'s modules first on the path;
    the lines it printed. A failing child ends the bench with the end of its stderr."""
    out = subprocess.run([sys.executable, script, "--child", *args], cwd=checkout,
                         env=dict(os.environ, PYTHONPATH=str(checkout)), capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return out.stdout.splitlines()
