"""Run the README's `run` command as a subprocess and watch it: health, descendants, shutdown."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from signalbox.embedded_redis import free_port

METRICS_TOKEN = "launcher-test-metrics-token"  # /metrics of the runs the tests start
ROOT = Path(__file__).resolve().parents[2]

# Variables of the test session that must not leak into a launcher under test.
_SESSION_ONLY = ("REDIS_URL", "DATABASE_URL", "SIGNALBOX_DATA_DIR", "SIGNALBOX_CELERY_QUEUE")


def launcher_env(**overrides: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _SESSION_ONLY}
    # signalbox.sh would create .venv on first use; point it at the virtualenv running the tests.
    env["SIGNALBOX_VENV"] = sys.prefix
    # Each launcher's STOMP listener on a port of its own (61613 may be another broker's, or another test's).
    env["SIGNALBOX_STOMP_PORT"] = str(free_port())
    env["SIGNALBOX_STOMP_WS_PORT"] = str(free_port())
    env["SIGNALBOX_METRICS_TOKEN"] = METRICS_TOKEN
    env.update(overrides)
    return env


def run_command() -> list[str]:
    """The README's run command (`./signalbox.sh run`); it execs the launcher, so the PID stays put."""
    if sys.prefix == sys.base_prefix:  # not in a virtualenv: signalbox.sh must not adopt the system Python
        return [sys.executable, "-m", "signalbox.launcher", "run"]
    return [str(ROOT / "signalbox.sh"), "run"]


@dataclass
class RunningLauncher:
    """`python -m signalbox.launcher run` in its own process group, output in `log_path`."""

    process: subprocess.Popen[bytes]
    log_path: Path
    port: int
    stomp_port: int = 0
    descendants: list[psutil.Process] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"{self.base_url}/healthz", timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def wait_healthy(self, timeout: float = 90) -> dict:
        """Poll /healthz until Redis, database and Celery are all ok; return that report."""
        deadline = time.monotonic() + timeout
        last: object = "no answer yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"launcher exited with {self.process.returncode}:\n{self.output()}")
            try:
                status, body = self.health()
            except (OSError, ValueError) as exc:
                last = exc
            else:
                last = body
                if status == 200:
                    return body
            time.sleep(0.5)
        raise AssertionError(f"/healthz never became healthy (last: {last}):\n{self.output()}")

    def collect_descendants(self) -> list[psutil.Process]:
        self.descendants = psutil.Process(self.process.pid).children(recursive=True)
        return self.descendants

    def ctrl_c(self, timeout: float = 60) -> int:
        """What a terminal does on Ctrl-C: SIGINT to the whole foreground process group."""
        os.killpg(self.process.pid, signal.SIGINT)
        return self.process.wait(timeout)

    def kill(self) -> None:
        """Clean-up after a failed test: nothing of this run may outlive it."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for proc in self.descendants:
            with contextlib.suppress(psutil.Error):
                proc.kill()


def start_launcher(data_dir: Path, port: int, env: dict[str, str], log_path: Path,
                   args: Sequence[str] = ()) -> RunningLauncher:
    log = open(log_path, "wb")  # noqa: SIM115 - the child keeps writing after this returns
    process = subprocess.Popen(
        [*run_command(), "--data-dir", str(data_dir), "--port", str(port), *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, like a job started from a shell
    )
    log.close()
    return RunningLauncher(process, log_path, port, int(env.get("SIGNALBOX_STOMP_PORT") or 0))


def run_launcher_to_completion(
    args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*run_command(), *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
