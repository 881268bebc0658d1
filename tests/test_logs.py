"""What `run` logs (signalbox/logs.py): start-up facts, each child's start and exit, errors and ticks that
matter, one line per record, in text or one JSON object per line; nothing per second at INFO.

The two runs are real launchers with their real children (tests/helpers/processes.py); the tick's lines
come from the real task function on the session's Redis, caught with caplog.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from broker_core.broker import Broker
from broker_core.clock import FakeClock, SystemClock
from broker_core.model import ConsumerSpec
from signalbox import logs, tasks
from signalbox.embedded_redis import free_port
from tests.helpers.processes import launcher_env, run_launcher_to_completion, start_launcher

CHILDREN = ("celery worker", "celery beat", "web server", "STOMP listener")
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
                       r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) \[[^]]+\] \S+: ")


# --- the configuration ---


def test_chatty_loggers_speak_at_debug_only_and_a_bad_setting_names_itself():
    at_info = logs.config("INFO", "text")
    assert at_info["root"]["level"] == "INFO"
    for name in logs.CHATTY:
        assert at_info["loggers"][name]["level"] == "WARNING"
    assert logs.config("ERROR", "text")["loggers"]["celery.beat"]["level"] == "ERROR"
    for name in logs.PER_REQUEST:  # a refused request's WARNING ("Not Found: /x") at DEBUG only
        assert at_info["loggers"][name]["level"] == "ERROR"
    assert at_info["formatters"]["signalbox"] == {"()": "signalbox.logs.OneLine", "fmt": logs.TEXT_FORMAT}
    at_debug = logs.config("debug", "json")
    assert at_debug["root"]["level"] == "DEBUG" and at_debug["loggers"]["uvicorn.access"]["level"] == "DEBUG"
    assert at_debug["loggers"]["django.request"]["level"] == "DEBUG"
    assert at_debug["formatters"]["signalbox"] == {"()": "signalbox.logs.json_formatter"}
    with pytest.raises(logs.LogSettingError, match=r"SIGNALBOX_LOG_LEVEL='loud' is not a log level"):
        logs.config("loud", "text")
    with pytest.raises(logs.LogSettingError, match=r"SIGNALBOX_LOG_FORMAT='xml' is not a log format"):
        logs.config("INFO", "xml")


def test_a_websocket_connection_s_lines_show_at_debug_only(capsys):
    """uvicorn writes three INFO lines per WebSocket connection through uvicorn.error (its accept, the
    websockets library's open and close); at INFO they are dropped, the logger's other lines stay."""
    uvicorn_error = logging.getLogger("uvicorn.error")
    try:
        for level, shown in (("INFO", False), ("DEBUG", True)):
            logs.configure(level, "text")
            uvicorn_error.info('%s - "WebSocket %s" [accepted]', "127.0.0.1:5", "/stomp")
            uvicorn_error.info("connection open")
            uvicorn_error.info("connection closed")
            uvicorn_error.info("Started server process [%d]", 7)
            uvicorn_error.warning("connection closed")
            out = capsys.readouterr().out
            assert ("[accepted]" in out, "connection open" in out) == (shown, shown), out
            assert "Started server process [7]" in out and "WARNING" in out
    finally:
        logs.configure("INFO", "text")


def test_a_json_record_carries_time_level_process_logger_message_and_extras(monkeypatch):
    monkeypatch.setenv("SIGNALBOX_PROCESS", "celery worker")
    record = logging.LogRecord("signalbox.tasks", logging.WARNING, __file__, 1, "slow %s", ("tick",), None)
    record.tick = {"destinations": 3}
    logs.ProcessName().filter(record)
    line = logs.json_formatter().format(record)
    fields = json.loads(line)
    assert "\n" not in line
    assert {key: fields[key] for key in ("level", "process", "logger", "message", "tick")} == {
        "level": "WARNING", "process": "celery worker", "logger": "signalbox.tasks", "message": "slow tick",
        "tick": {"destinations": 3}}
    assert list(fields)[0] == "time"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", fields["time"])


def test_a_text_record_is_one_line_even_with_a_traceback():
    try:
        raise ValueError("first\nsecond")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed:\n%s", ("detail",),
                                   sys.exc_info())
    logs.ProcessName().filter(record)
    line = logs.OneLine(logs.TEXT_FORMAT).format(record)
    assert "\n" not in line and TEXT_LINE.match(line), line
    assert "failed:\\ndetail\\nTraceback (most recent call last):\\n" in line
    assert line.endswith("ValueError: first\\nsecond")


def test_a_bad_log_level_option_is_one_clear_line(tmp_path: Path):
    result = run_launcher_to_completion(["--data-dir", str(tmp_path), "--log-level", "chatty"],
                                        launcher_env())
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "signalbox: error: --log-level='chatty' is not a log level; use one of DEBUG, INFO, WARNING, ERROR, "
        "CRITICAL"]


def test_a_bad_option_of_run_is_one_clear_line(tmp_path: Path):
    """argparse's own refusals (a value of the wrong type, an unknown option) end `run` as every other
    mistake does: one line naming the option, not its usage block as well."""
    result = run_launcher_to_completion(["--data-dir", str(tmp_path), "--port", "eighty"], launcher_env())
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "signalbox: error: argument --port: invalid int value: 'eighty' (see 'signalbox run --help')"]
    result = run_launcher_to_completion(["--data-dir", str(tmp_path), "--colour"], launcher_env())
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "signalbox: error: unrecognized arguments: --colour (see 'signalbox run --help')"]


def test_a_bad_option_in_json_is_one_json_record_on_stderr(tmp_path: Path):
    for args in (["--log-format", "json", "--port", "eighty"], ["--port=eighty", "--log-format=json"]):
        result = run_launcher_to_completion(["--data-dir", str(tmp_path), *args], launcher_env())
        assert result.returncode == 2
        [line] = result.stderr.strip().splitlines()
        record = json.loads(line)
        assert (record["level"], record["logger"]) == ("ERROR", "signalbox.launcher")
        assert record["message"].startswith("argument --port: invalid int value: 'eighty'"), record


def test_a_configuration_mistake_in_json_is_one_json_record_on_stderr(tmp_path: Path):
    result = run_launcher_to_completion(["--data-dir", str(tmp_path), "--log-format", "json"],
                                        launcher_env(SIGNALBOX_REDIS_APPENDFSYNC="sometimes"))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    record = json.loads(line)
    assert (record["level"], record["process"], record["logger"]) == (
        "ERROR", "launcher", "signalbox.launcher")
    assert record["message"].startswith("SIGNALBOX_REDIS_APPENDFSYNC='sometimes' is not a Redis fsync policy")


# --- the maintenance tick: the real task function on the session's Redis ---


def tick_records(caplog: pytest.LogCaptureFixture, namespace: str) -> list[logging.LogRecord]:
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="signalbox.tasks"):
        tasks.tick(namespace)
    return [r for r in caplog.records if r.name == "signalbox.tasks"]


def test_an_idle_tick_is_debug_only_and_a_tick_that_did_work_is_one_info_line(
        caplog, redis_client, namespace, settings):
    broker = Broker(redis_client, namespace)
    broker.ensure_destination("orders")
    [idle] = tick_records(caplog, namespace)
    assert idle.levelno == logging.DEBUG and "nothing due" in idle.getMessage()

    # A consumer whose 1 s lease lapsed 4 s ago (it was added on a clock 5 s behind): the tick reaps it.
    behind = Broker(redis_client, namespace, FakeClock(SystemClock().now_ms() - 5_000))
    behind.add_consumer("orders", ConsumerSpec(prefetch=1, lease_ms=1_000), consumer_id="gone")
    [worked] = tick_records(caplog, namespace)
    assert worked.levelno == logging.INFO, worked.getMessage()
    assert "reaped 1" in worked.getMessage() and worked.tick["reaped"] == ["queue://orders#gone"]


def test_a_slow_tick_is_a_warning(caplog, redis_client, namespace, settings):
    Broker(redis_client, namespace).ensure_destination("orders")
    settings.SIGNALBOX_MAINTENANCE_SLOW_SECONDS = 0.000001
    [slow] = tick_records(caplog, namespace)
    assert slow.levelno == logging.WARNING
    assert "over SIGNALBOX_MAINTENANCE_SLOW_SECONDS=1e-06" in slow.getMessage()


def test_a_failing_tick_is_an_error(caplog, redis_client, namespace, settings):
    broker = Broker(redis_client, namespace)
    broker.ensure_destination("orders")
    # A key of the wrong type where the destination's maintenance bookkeeping lives: its script fails.
    redis_client.delete(f"{broker.ops.prefix(broker_dest('orders'))}:maint")
    redis_client.set(f"{broker.ops.prefix(broker_dest('orders'))}:maint", "not a hash")
    records = tick_records(caplog, namespace)
    errors = [r for r in records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in records]
    assert "1 destination(s) failed: queue://orders: " in errors[0].getMessage()
    assert errors[0].tick["errors"]


def broker_dest(name: str):
    from broker_core.destinations import parse_destination

    return parse_destination(name)


# --- whole runs ---


def wait_for_output(launcher, pattern: str, timeout: float = 30) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(pattern, launcher.output(), re.MULTILINE)
        if match:
            return match
        time.sleep(0.1)
    raise AssertionError(f"no line matching {pattern!r}:\n{launcher.output()}")


def direct_child(launcher, marker: str):
    import psutil

    for proc in psutil.Process(launcher.process.pid).children():
        if marker in " ".join(proc.cmdline()):
            return proc
    raise AssertionError(f"no child {marker!r}:\n{launcher.output()}")


def start_at_info(tmp_path: Path):
    """`run` with the log level and format a user gets (none set), restarting a child after 0.5 s."""
    env = launcher_env(SIGNALBOX_REDIS_PORT=str(free_port()), SIGNALBOX_RESTART_DELAY="0.5")
    env.pop("SIGNALBOX_LOG_LEVEL", None)
    env.pop("SIGNALBOX_LOG_FORMAT", None)
    return start_launcher(tmp_path / "data", free_port(), env, tmp_path / "launcher.log")


@pytest.mark.e2e
def test_a_run_at_info_says_what_matters_and_nothing_every_second(tmp_path: Path):
    launcher = start_at_info(tmp_path)
    try:
        launcher.wait_healthy()
        # a client's mistakes: answered, not logged at INFO (Django's "Not Found: ..." is a WARNING)
        assert httpx.get(f"{launcher.base_url}/api/v1/queues/no.such.queue", timeout=30).status_code == 401
        assert httpx.get(f"{launcher.base_url}/no/such/page", timeout=30).status_code == 404
        from websockets.sync.client import connect  # a WebSocket opened and closed: no line at INFO

        with connect(launcher.base_url.replace("http://", "ws://") + "/ws/ping", open_timeout=30):
            pass
        time.sleep(10)  # ten maintenance ticks, none of them with work to do
        beat = direct_child(launcher, "celery -A signalbox --quiet beat")
        beat.send_signal(signal.SIGKILL)
        wait_for_output(launcher, r"WARNING \[launcher\] signalbox.launcher: celery beat exited unexpectedly "
                                  r"\(killed by SIGKILL\); restarting it in 0.5 s")
        wait_for_output(launcher, r"celery beat started \(pid \d+\)\n(.*\n)*"
                                  r".*celery beat started \(pid \d+\)")
        assert launcher.ctrl_c() == 0, launcher.output()
    finally:
        launcher.kill()
    output = launcher.output()
    lines = output.splitlines()
    for fact in ("embedded Redis at", "database ready", "created admin user 'admin' with password:",
                 "destination policies:", "running at http://127.0.0.1:", "STOMP listening on"):
        assert fact in output, fact
    for name in CHILDREN:
        assert re.search(rf"INFO \[launcher\] signalbox.launcher: {name} started \(pid \d+\)$", output, re.M)
        assert re.search(rf"INFO \[launcher\] signalbox.launcher: {name} exited \(", output, re.M), name
    assert "signalbox.launcher: Redis exited (exit status 0)" in output
    # a child that ends by the SIGTERM of an orderly stop (uvicorn raises it again once it has shut down)
    # stopped as asked: not "killed", which reads as forced
    assert "killed by SIGTERM" not in output
    # No banner, no per-second lines, no per-task lines, no Celery superuser warning.
    for noise in ("-------------- ", "[tasks]", "celery beat v", "Sending due task", "maintenance tick",
                  "succeeded in", "received", "superuser privileges", "SecurityWarning", "Traceback",
                  "[accepted]", "connection open", "connection closed"):
        assert noise not in output, noise
    if os.geteuid() == 0:
        assert len([line for line in lines if "running as root" in line]) == 1
    assert "Not Found" not in output and "Unauthorized" not in output
    # Every line is a record in the one format, the worker's own "Warm shutdown" print too.
    strays = [line for line in lines if not TEXT_LINE.match(line)]
    assert strays == [], strays
    assert re.search(r"INFO \[celery worker\] signalbox.output: worker: Warm shutdown \(MainProcess\)$",
                     output, re.M)
    assert len(lines) < 45, output  # ~15 s of running, two restarts


@pytest.mark.e2e
def test_a_run_in_json_writes_one_object_per_line_for_every_process(tmp_path: Path):
    env = launcher_env(SIGNALBOX_REDIS_PORT=str(free_port()), SIGNALBOX_RESTART_DELAY="0.5",
                       SIGNALBOX_LOG_FORMAT="text")  # the option wins over the environment
    launcher = start_launcher(tmp_path / "data", free_port(), env, tmp_path / "launcher.log",
                              args=["--log-format", "json"])
    try:
        launcher.wait_healthy()
        web = direct_child(launcher, "uvicorn signalbox.asgi:application")
        web.send_signal(signal.SIGKILL)
        wait_for_output(launcher, r'"message": "web server exited unexpectedly \(killed by SIGKILL\)')
        launcher.wait_healthy()
        assert launcher.ctrl_c() == 0, launcher.output()
    finally:
        launcher.kill()
    records = []
    for line in launcher.output().splitlines():
        record = json.loads(line)  # every line, the children's included
        assert isinstance(record, dict)
        assert {"time", "level", "process", "logger", "message"} <= record.keys(), record
        records.append(record)
    # beat has nothing to say at INFO (its per-second "Sending due task" is DEBUG); the others do
    assert {r["process"] for r in records} >= {"launcher", "web server", "celery worker", "STOMP listener"}
    [restart] = [r for r in records if "exited unexpectedly" in r["message"]]
    assert (restart["level"], restart["process"], restart["logger"]) == (
        "WARNING", "launcher", "signalbox.launcher")
    assert (restart["child"], restart["exit"], restart["restart_in"]) == (
        "web server", "killed by SIGKILL", 0.5)
    started = [r for r in records if r["message"].startswith("web server started")]
    assert len(started) == 2 and all(isinstance(r["pid"], int) for r in started)
    assert [r["process"] for r in records if r["logger"] == "uvicorn.error"
            and r["message"].startswith("Started server process")] == ["web server", "web server"]
    # Celery's print at shutdown, relayed as a record of the worker.
    assert {"process": "celery worker", "logger": "signalbox.output",
            "message": "worker: Warm shutdown (MainProcess)"}.items() <= next(
        r for r in records if "Warm shutdown" in r["message"]).items()
    assert not [r for r in records if r["logger"] in ("celery.beat", "celery.app.trace", "signalbox.tasks")]


@pytest.mark.e2e
def test_a_redis_restart_is_told_without_tracebacks(tmp_path: Path):
    """Redis killed and restarted by the launcher: the worker says it lost the connection and got it back,
    as one line each, not a Celery bootstep's traceback at ERROR nor a deprecation notice."""
    from signalbox.embedded_redis import configured_executable

    launcher = start_at_info(tmp_path)
    try:
        launcher.wait_healthy()
        before = len(launcher.output())
        direct_child(launcher, Path(configured_executable()).name).send_signal(signal.SIGKILL)
        wait_for_output(launcher, r"signalbox.launcher: Redis exited unexpectedly \(killed by SIGKILL\)")
        wait_for_output(launcher, r"signalbox.launcher: Redis exited unexpectedly (.*\n)*"
                                  r".*\[celery worker\] celery.worker.consumer.connection: Connected to ")
        launcher.wait_healthy()
        assert launcher.ctrl_c() == 0, launcher.output()
    finally:
        launcher.kill()
    after = launcher.output()[before:]
    for noise in ("Traceback", "Gossip", "DeprecationWarning"):
        assert noise not in after, after


def test_the_stomp_listener_says_why_it_stops(tmp_path: Path, namespace: str):
    """SIGTERM (the launcher's Ctrl-C, or an operator's kill of its pid) ends the listener cleanly, with exit
    status 0: without a line of its own, the launcher's "STOMP listener exited unexpectedly (exit status
    0)" would be all the log had to say about it."""
    from tests.helpers.gateway_server import prepare_database, spawn_stomp_listener, wait_listening

    prepare_database(tmp_path, namespace)
    listener = wait_listening(spawn_stomp_listener(tmp_path, namespace, SIGNALBOX_LOG_LEVEL="INFO",
                                                   SIGNALBOX_PROCESS="STOMP listener"))
    listener.process.send_signal(signal.SIGTERM)
    assert listener.process.wait(30) == 0
    output = listener.output()
    assert re.search(r"INFO \[STOMP listener\] \S+: STOMP listener stopping on SIGTERM", output), output
    assert "Traceback" not in output, output


def test_a_connection_s_empty_temporary_queue_is_not_an_info_line(tmp_path: Path, namespace: str):
    """A request/reply client makes a temporary queue per connection: its deletion when the connection ends
    is a line per connection, DEBUG like the other per-connection lines; deleting messages with it (replies
    nobody will read) stays an INFO line, naming how many."""
    import socket

    from tests.helpers.gateway_server import prepare_database, spawn_stomp_listener, wait_listening

    prepare_database(tmp_path, namespace)
    listener = wait_listening(spawn_stomp_listener(tmp_path, namespace, SIGNALBOX_LOG_LEVEL="INFO",
                                                   SIGNALBOX_PROCESS="STOMP listener"))
    try:
        for n, frame in enumerate((b"SUBSCRIBE\nid:1\ndestination:/temp-queue/replies\nreceipt:r\n\n\x00",
                                   b"SEND\ndestination:/temp-queue/replies\nreceipt:r\n\nlost\x00")):
            with socket.create_connection(("127.0.0.1", listener.port), timeout=10) as client:
                client.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\nlogin:alice\npasscode:secret"
                               b"\n\n\x00")
                assert client.recv(4096).startswith(b"CONNECTED")
                client.sendall(frame)
                assert b"RECEIPT" in client.recv(4096)
                client.sendall(b"DISCONNECT\nreceipt:bye\n\n\x00")
                assert b"RECEIPT" in client.recv(4096)
            deadline = time.monotonic() + 10
            while listener.output().count("deleted with") < n and time.monotonic() < deadline:
                time.sleep(0.1)
        time.sleep(0.5)
    finally:
        listener.stop()
    lines = [line for line in listener.output().splitlines() if "temporary destination" in line]
    assert len(lines) == 1, lines
    assert re.search(r"INFO \[STOMP listener\] \S+: temporary destination queue://ID:\S+ deleted with 1 "
                     r"message", lines[0]), lines
