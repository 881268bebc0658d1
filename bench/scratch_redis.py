"""A private Redis for a bench: a server of its own on a free loopback port, nothing persisted, stopped
when the bench is done."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from signalbox.embedded_redis import free_port  # noqa: E402


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
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield port
    finally:
        server.terminate()
        server.wait()
