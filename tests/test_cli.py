"""The `signalbox` command line (signalbox/cli/, docs/cli.md), run as a subprocess — the way a user runs
it — against a real gateway process (uvicorn) on the session's Redis. Every command, --json output,
errors and exit codes, the body from stdin and files, the config precedence, Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import signal
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from signalbox.embedded_redis import free_port, wait_for_port
from tests.helpers.gateway_server import ALICE_TOKEN, ROOT, own_gateway

CLI = [sys.executable, "-m", "signalbox.cli"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with own_gateway(tmp_path_factory.mktemp("cli-gateway"), "cli") as gateway:
        yield gateway


@pytest.fixture(scope="module")
def server(gateway):
    return f"http://127.0.0.1:{gateway.port}"


@pytest.fixture
def home(tmp_path) -> Path:
    """A HOME and XDG_CONFIG_HOME of the test's own, so no user's config file is read."""
    (tmp_path / "config").mkdir()
    return tmp_path


def cli_env(home: Path, url: str | None, token: str | None = ALICE_TOKEN, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / "config"), PYTHONPATH=str(ROOT))
    if url is not None:
        env["SIGNALBOX_URL"] = url
    if token is not None:
        env["SIGNALBOX_TOKEN"] = token
    env.update(extra)
    return env


def run(home: Path, url: str | None, *args: str, input: bytes | str | None = None,
        token: str | None = ALICE_TOKEN, **extra: str) -> subprocess.CompletedProcess[str]:
    data = input.encode() if isinstance(input, str) else input
    result = subprocess.run([*CLI, *args], cwd=ROOT, env=cli_env(home, url, token, **extra), input=data,
                            stdin=None if data is not None else subprocess.DEVNULL, capture_output=True,
                            timeout=120)
    return subprocess.CompletedProcess(result.args, result.returncode,
                                       result.stdout.decode(errors="replace"), result.stderr.decode())


@contextlib.contextmanager
def running(home: Path, url: str | None, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """The command as a running process (stdout and stderr piped), to signal or to read as it goes;
    killed at the end if it is still running."""
    process = subprocess.Popen([*CLI, *args], cwd=ROOT, env=cli_env(home, url), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        process.stdout.close()
        process.stderr.close()


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def as_json(result: subprocess.CompletedProcess[str]):
    return json.loads(ok(result))


def json_lines(result: subprocess.CompletedProcess[str]) -> list[dict]:
    return [json.loads(line) for line in ok(result).splitlines()]


def failed(result: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """The command failed with `code` and one line on stderr naming what went wrong."""
    assert result.returncode == code, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("signalbox: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def stats(home: Path, url: str, queue: str) -> dict:
    """A queue's statistics straight from the API (the `stat` command has tests of its own)."""
    answer = httpx.get(f"{url}/api/v1/queues/{queue}", headers={"Authorization": f"Token {ALICE_TOKEN}"},
                       timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def unique(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


# -- without a server ---------------------------------------------------------------------------------

def test_the_command_imports_neither_django_nor_the_broker():
    code = ("import json, sys, signalbox.cli; print(json.dumps(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('django', 'celery', 'broker_core', 'gateway', 'redis'))))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_the_console_script_names_the_command_group():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["project"]["scripts"] == {"signalbox": "signalbox.cli:app"}
    from signalbox.cli import app

    assert set(app.commands) == {"send", "receive", "consume", "browse", "stat", "purge", "delete", "move",
                                 "retry-dlq", "groups", "consumers", "scheduled", "remove", "token"}
    assert set(app.commands["groups"].commands) == {"list", "reset", "remove-all"}


def test_flags_override_the_environment_which_overrides_the_config_file(home):
    # Three unreachable addresses: the error names the one in force.
    file_port, env_port, flag_port = free_port(), free_port(), free_port()
    (home / "config" / "signalbox").mkdir()
    (home / "config" / "signalbox" / "cli.toml").write_text(f'url = "http://127.0.0.1:{file_port}"\n')
    failed(run(home, None, "stat"), 3, f"cannot reach Signalbox at http://127.0.0.1:{file_port}")
    failed(run(home, f"http://127.0.0.1:{env_port}", "stat"), 3, f"127.0.0.1:{env_port}")
    failed(run(home, f"http://127.0.0.1:{env_port}", "--url", f"http://127.0.0.1:{flag_port}", "stat"), 3,
           f"127.0.0.1:{flag_port}")
    other = home / "other.toml"
    other.write_text(f'url = "http://127.0.0.1:{flag_port}"\n')
    failed(run(home, None, "--config", str(other), "stat"), 3, f"127.0.0.1:{flag_port}")
    failed(run(home, None, "stat", SIGNALBOX_CONFIG=str(other)), 3, f"127.0.0.1:{flag_port}")


def test_config_and_usage_mistakes_exit_2(home):
    failed(run(home, None, "--config", str(home / "missing.toml"), "stat"), 2, "missing.toml does not exist")
    bad = home / "bad.toml"
    bad.write_text('url = "http://x"\ncolour = "red"\n')
    failed(run(home, None, "--config", str(bad), "stat"), 2, "unknown key 'colour'")
    bad.write_text("url = 3\n")
    failed(run(home, None, "--config", str(bad), "stat"), 2, "url has the wrong type")
    bad.write_text("url = [\n")
    failed(run(home, None, "--config", str(bad), "stat"), 2, "bad.toml")
    failed(run(home, "ftp://host", "stat"), 2, "must start with http:// or https://")
    failed(run(home, "http://127.0.0.1:1", "send", "mqtt://x", "body"), 2, "queue:// or topic://")
    # a composite is for send alone: elsewhere it is named as such, not as a server's internal hint
    for command in (["receive"], ["browse"], ["stat"], ["purge"], ["groups", "list"], ["consumers"]):
        failed(run(home, "http://127.0.0.1:1", *command, "a,topic://b"), 2, "'a,topic://b'",
               "a composite destination (A,B) is for send only")
    failed(run(home, "http://127.0.0.1:1", "move", "a,b", "c"), 2, "for send only")
    failed(run(home, "http://127.0.0.1:1", "send", "q", "-p", "novalue", "body"), 2, "NAME=VALUE")
    # a property given twice would keep only its last value, unsaid
    failed(run(home, "http://127.0.0.1:1", "send", "q", "-p", "n=1", "-p", "n:=2", "body"), 2,
           "property 'n' is given twice")
    # Python's JSON reader takes NaN and Infinity, and 1e400 overflows to infinity: none is a JSON number
    for value in ("NaN", "-Infinity", "1e400", '{"type": "double", "value": NaN}'):
        failed(run(home, "http://127.0.0.1:1", "send", "q", "-p", f"n:={value}", "body"), 2, "--property",
               "not a finite number")
    failed(run(home, "http://127.0.0.1:1", "send", "q", "--file", str(home / "nope"), ), 2, "--file")
    failed(run(home, "http://127.0.0.1:1", "send", "q", "body", "--file", "-"), 2, "not both")
    # no body and standard input is a terminal: nothing to wait for
    leader, follower = pty.openpty()
    try:
        result = subprocess.run([*CLI, "send", "q"], cwd=ROOT, env=cli_env(home, "http://127.0.0.1:1"),
                                stdin=follower, capture_output=True, text=True, timeout=60)
    finally:
        os.close(follower)
        os.close(leader)
    failed(result, 2, "no body: give it as an argument, with --file PATH, or on standard input")
    # click's own usage errors: exit 2, one line naming the option and where the help is
    failed(run(home, "http://127.0.0.1:1", "send", "q", "body", "--priority", "12"), 2,
           "'--priority': 12 is not in the range 0<=x<=9", "see 'signalbox send --help'")
    failed(run(home, "http://127.0.0.1:1", "send", "q", "body", "--ttl", "soon"), 2,
           "'soon' is not a duration")
    # the consumer's lease is 1 s to 1 h (the API's bounds): checked here, naming the option, like the others
    failed(run(home, "http://127.0.0.1:1", "receive", "q", "--lease", "2h"), 2,
           "'--lease': '2h' is not between 1s and 1h", "see 'signalbox receive --help'")
    failed(run(home, "http://127.0.0.1:1", "receive", "q", "--lease", "500"), 2,
           "'--lease': '500' is not between 1s and 1h")
    failed(run(home, "http://127.0.0.1:1", "frobnicate"), 2, "No such command 'frobnicate'")
    failed(run(home, "http://127.0.0.1:1", "stat", "--watch", "orders"), 2,
           "'orders' is not a number of seconds", "stat orders --watch")
    failed(run(home, "http://127.0.0.1:1", "stat", "--watch", "0.1"), 2, "0.2")
    failed(run(home, "http://127.0.0.1:1", "stat", "--times", "3"), 2, "give --watch too")
    # the list's filters do nothing with one destination: said, not ignored
    for option in (["--kind", "topic"], ["--search", "x"], ["--sort", "-queue_size"]):
        failed(run(home, "http://127.0.0.1:1", "stat", "orders", *option), 2, f"'{option[0]}'",
               "without DESTINATION")
    failed(run(home, "http://127.0.0.1:1", "receive"), 2, "Missing argument 'DESTINATION'")
    assert "Exit codes" in ok(run(home, None, "--help"))


def test_numbers_that_are_not_finite_or_too_big_are_usage_errors(home):
    """NaN, infinity and numbers past a float's range are refused by name (exit 2), wherever they are
    given, rather than ending in a traceback from the HTTP client, `time.sleep` or `int(float(...))`."""
    bad = home / "bad.toml"
    for value in ("nan", "inf"):
        failed(run(home, "http://127.0.0.1:1", "--timeout", value, "stat"), 2, "'--timeout'", value)
        failed(run(home, "http://127.0.0.1:1", "stat", SIGNALBOX_TIMEOUT=value), 2,
               "timeout from SIGNALBOX_TIMEOUT")
        bad.write_text(f"timeout = {value}\n")
        failed(run(home, "http://127.0.0.1:1", "--config", str(bad), "stat"), 2, "timeout from", "bad.toml")
        failed(run(home, "http://127.0.0.1:1", "receive", "q", "--wait", value), 2, "'--wait'", value)
        failed(run(home, "http://127.0.0.1:1", "stat", "--watch", value, "--times", "2"), 2, "'--watch'")
    huge = "9" * 400
    for option in ("--ttl", "--delay", "--period"):
        failed(run(home, "http://127.0.0.1:1", "send", "q", "x", option, f"{huge}d"), 2, f"'{option}'",
               "too long")
    failed(run(home, "http://127.0.0.1:1", "receive", "q", "--lease", f"{huge}s"), 2, "'--lease'",
           "not between 1s and 1h")
    # a time to live of half a millisecond would be sent as 0, which is "never expires"
    failed(run(home, "http://127.0.0.1:1", "send", "q", "x", "--ttl", "0.5"), 2, "'--ttl'", "1 ms")


def test_a_connection_flag_after_the_command_says_where_it_goes(home):
    """`signalbox send q x --token T` is a natural thing to type: the error says the flag goes before the
    command, rather than suggesting --cron or --times."""
    failed(run(home, "http://127.0.0.1:1", "send", "q", "x", "--token", "abc"), 2, "'--token'",
           "before the command", "signalbox --token ... send")
    line = failed(run(home, "http://127.0.0.1:1", "stat", "--timeout=3"), 2, "'--timeout'",
                  "signalbox --timeout ... stat")
    assert "--times" not in line
    failed(run(home, "http://127.0.0.1:1", "groups", "list", "q", "--url", "http://x"), 2,
           "signalbox --url ... groups list")


def test_an_empty_connection_flag_is_refused_by_name(home):
    """`--token "$TOKEN"` with TOKEN unset gives an empty flag, which overrides the environment and the
    file: it is named, rather than a 401 saying to give --token (or, for --url, a URL error)."""
    failed(run(home, "http://127.0.0.1:1", "--token", "", "stat"), 2, "--token is empty")
    failed(run(home, "http://127.0.0.1:1", "--url", " ", "stat"), 2, "--url is empty")
    failed(run(home, "http://127.0.0.1:1", "--config", "", "stat"), 2, "--config is empty")


def test_ctrl_c_in_any_command_is_one_line_and_130(home):
    """A command without an interrupt handler of its own (here `stat`, waiting for an answer that does not
    come: a socket that accepts and never answers) ends with the one line and 130, and no blank line
    before it when stderr is not a terminal."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listener:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        process = subprocess.Popen([*CLI, "stat"], cwd=ROOT, env=cli_env(home, url), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            listener.settimeout(60)
            connection, _ = listener.accept()
            with connection:
                # the command has sent its request and waits for the answer: a Ctrl-C that came before it
                # blocked in that wait would be seen only when the wait ends (CPython checks for signals
                # between steps, and a signal just before a blocking call is left pending: the test raced)
                connection.settimeout(30)
                request = b""
                while b"\r\n\r\n" not in request:
                    request += connection.recv(65536)
                time.sleep(0.3)
                process.send_signal(signal.SIGINT)
                out, err = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert (process.returncode, out, err) == (130, b"", b"signalbox: interrupted\n")


# -- against a real server ----------------------------------------------------------------------------

@pytest.mark.e2e
def test_round_trip_send_stat_browse_receive_purge(server, home):
    q = unique("cli.orders")
    sent = as_json(run(home, server, "send", q, "hello", "-p", "region=eu", "-p", "n:=3", "--priority", "7",
                       "--correlation-id", "c-1", "--type", "order", "--group", "g1", "--ttl", "1h",
                       "--json"))
    assert sent["statuses"] == ["ok"] and sent["destinations"] == [f"queue://{q}"]
    first = sent["message_ids"][0]
    assert ok(run(home, server, "send", q, input="from stdin")).startswith("sent ID:")
    many = as_json(run(home, server, "send", q, "x", "--count", "250", "--batch", "100", "--json"))
    assert len(set(many["message_ids"])) == 250 and set(many["statuses"]) == {"ok"}
    assert "sent 3 messages" in ok(run(home, server, "send", q, "y", "-n", "3"))

    before = as_json(run(home, server, "stat", q, "--json"))
    assert (before["queue_size"], before["enqueued"], before["dequeued"]) == (255, 255, 0)
    table = ok(run(home, server, "stat"))
    assert "Queue Size" in table and any(line.split()[:2] == [q, "255"] for line in table.splitlines())
    rows = as_json(run(home, server, "stat", "--search", q, "--json"))
    assert [(r["name"], r["queue_size"]) for r in rows] == [(q, 255)]

    browsed = as_json(run(home, server, "browse", q, "--json", "-n", "1000"))
    assert len(browsed) == 255 and browsed[0]["message_id"] == first  # priority 7 first
    assert browsed[0]["properties"] == {"region": "eu", "n": 3}
    top = browsed[0]
    assert (top["correlation_id"], top["type"], top["group_id"]) == ("c-1", "order", "g1")
    assert browsed[0]["expiration"] > browsed[0]["timestamp"] + 3_500_000
    assert browsed[1]["body"] == "from stdin"
    assert [m["message_id"] for m in as_json(run(home, server, "browse", q, "--selector", "region = 'eu'",
                                                 "--json"))] == [first]
    assert len(as_json(run(home, server, "browse", q, "-n", "120", "--json"))) == 120  # limit over pages
    assert first in ok(run(home, server, "browse", q, "-n", "5"))

    # receive: printed, acknowledged, counted; the consumer is closed on exit
    got = json_lines(run(home, server, "receive", q, "-n", "2", "--json"))
    assert [m["message_id"] for m in got] == [first, browsed[1]["message_id"]]
    after = as_json(run(home, server, "stat", q, "--json"))
    assert (after["queue_size"], after["dequeued"], after["in_flight"]) == (253, 2, 0)
    assert after["consumer_count"] == 0
    assert after["dispatched"] == 2  # a bounded receive pulls: nothing was dispatched that it did not print
    result = run(home, server, "consume", q, "-n", "3", "--ack", "client")
    assert ok(result) == "x\nx\nx\n" and "received 3 messages" in result.stderr
    result = run(home, server, "receive", q, "-n", "4", "--ack", "auto", "-v")
    lines = ok(result).splitlines()
    assert len(lines) == 8 and all(json.loads(h[2:])["message_id"] for h in lines[::2]) and lines[1] == "x"
    after = as_json(run(home, server, "stat", q, "--json"))
    assert (after["queue_size"], after["dequeued"], after["consumer_count"]) == (246, 9, 0)

    purged = as_json(run(home, server, "purge", q, "--json"))
    assert purged["removed"] == 246
    assert as_json(run(home, server, "stat", q, "--json"))["queue_size"] == 0
    assert "purged 0 messages" in ok(run(home, server, "purge", q))
    result = run(home, server, "receive", q, "--wait", "0.5")
    assert ok(result) == "" and "received 0 messages" in result.stderr


def test_delete_a_topic_with_its_durable_subscription_only_when_confirmed(gateway, server, home,
                                                                          redis_client):
    """`delete` is the API's DELETE (the console's and REST's one operation): a topic goes with its
    subscriptions, and the messages held for its offline durable subscription are counted in the answer.
    Without --yes and no terminal to ask on, nothing is deleted."""
    from broker_core.broker import Broker
    from broker_core.messages import Message
    from broker_core.model import ConsumerSpec

    t = f"topic://{unique('cli.prices')}"
    broker = Broker(redis_client, gateway.namespace)
    broker.close_consumer(broker.add_consumer(t, ConsumerSpec(client_id="ledger", subscription_name="eod")))
    broker.send(t, [Message(body=str(i)) for i in range(3)])
    failed(run(home, server, "delete", t), 2, "--yes")
    assert t in broker.destinations()
    assert ok(run(home, server, "delete", t, "--yes")).strip() == f"deleted {t}: 3 messages removed"
    assert t not in broker.destinations()
    failed(run(home, server, "delete", t, "--yes"), 1, "unknown_destination")
    q = unique("cli.gone")
    ok(run(home, server, "send", q, "x", "-n", "2"))
    assert as_json(run(home, server, "delete", q, "--yes", "--json")) == {"removed": 2}
    # bob may read and write queue://bob.>, not administer it: refused by the server
    bob = ok(run(home, server, "token", "-u", "bob", "--password-stdin", input="secret\n",
                 token=None)).strip()
    ok(run(home, server, "send", "bob.inbox", "hi", token=bob))
    failed(run(home, server, "delete", "bob.inbox", "--yes", token=bob), 1, "permission_denied")
    broker.close()


@pytest.mark.e2e
def test_bytes_from_a_file_arrive_unchanged(server, home):
    q = unique("cli.bytes")
    payload = bytes(range(256)) * 4
    (home / "blob").write_bytes(payload)
    ok(run(home, server, "send", q, "--file", str(home / "blob"), "--content-type",
           "application/octet-stream"))
    ok(run(home, server, "send", q, "--file", "-", input=b"\xff\xfe not text"))
    browsed = as_json(run(home, server, "browse", q, "--json"))
    assert [m["body"] for m in browsed] == [None, None]
    assert "<1024 bytes>" in ok(run(home, server, "browse", q))
    result = subprocess.run([*CLI, "receive", q, "-n", "2"], cwd=ROOT, env=cli_env(home, server),
                            stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert result.returncode == 0 and result.stdout == payload + b"\n" + b"\xff\xfe not text\n"


@pytest.mark.e2e
def test_a_body_argument_that_is_not_utf8_goes_as_bytes(server, home):
    """An argument is bytes (a shell passes what it was given): a body that is not UTF-8 goes as bytes, as
    it does from a file; anywhere else (a property, a destination) it is a usage error, not a traceback."""
    q = unique("cli.argbytes")

    def argv_run(*args: str | bytes) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*CLI, *args], cwd=ROOT, env=cli_env(home, server), stdin=subprocess.DEVNULL,
                                capture_output=True, timeout=60)
        return subprocess.CompletedProcess(result.args, result.returncode,
                                           result.stdout.decode(errors="replace"), result.stderr.decode())

    ok(argv_run("send", q, b"\xff\xfe not text"))
    assert [m["body"] for m in as_json(run(home, server, "browse", q, "--json"))] == [None]
    received = subprocess.run([*CLI, "receive", q], cwd=ROOT, env=cli_env(home, server),
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert (received.returncode, received.stdout) == (0, b"\xff\xfe not text\n")
    failed(argv_run("send", q, "x", "-p", b"p=\xff"), 2, "UTF-8")
    failed(argv_run("send", b"q\xff", "x"), 2, "UTF-8")
    failed(argv_run("stat", b"q\xff"), 2, "UTF-8")


@pytest.mark.e2e
def test_a_body_too_large_for_a_request_names_the_limit_and_its_setting(server, home):
    """12 MiB of bytes are 16 MiB of base64, past the server's request limit: the one line says the limit
    and the setting that raises it (not the name of a Django setting the operator cannot set)."""
    (home / "blob").write_bytes(os.urandom(12 * 1024 * 1024 + 1))
    failed(run(home, server, "send", unique("cli.huge"), "--file", str(home / "blob")), 1,
           "413 request_too_large", "16777216 bytes", "SIGNALBOX_MAX_REQUEST_BYTES")


def test_send_count_splits_a_batch_too_large_for_one_request(server, home):
    """60 copies of 400 KB are 24 MB in one request of the default batch (100), past the server's 16 MiB:
    each message fits, so the batch is split (a refused request stores nothing) rather than the send
    failing on a limit the one message is far from."""
    q = unique("cli.bigbatch")
    (home / "body").write_bytes(b"a" * 400_000)
    assert ok(run(home, server, "send", q, "--file", str(home / "body"), "--count", "60")) == (
        f"sent 60 messages to queue://{q}\n")
    assert stats(home, server, q)["enqueued"] == 60
    # one message over the limit is still refused, naming it
    (home / "body").write_bytes(os.urandom(12 * 1024 * 1024 + 1))
    failed(run(home, server, "send", q, "--file", str(home / "body"), "--count", "2"), 1, "413")
    assert stats(home, server, q)["enqueued"] == 60


def test_an_empty_standard_input_sends_nothing_unless_asked_for(server, home):
    """`producer | signalbox send q` when the producer failed, or a cron job with no input: an empty
    standard input read because no body was given is refused (exit 2, nothing sent); `--file -` and ''
    send an empty body on purpose."""
    q = unique("cli.empty")
    failed(run(home, server, "send", q, input=b""), 2, "standard input was empty", "--file -")
    ok(run(home, server, "send", q, "--file", "-", input=b""))
    ok(run(home, server, "send", q, ""))
    assert [m["body"] for m in as_json(run(home, server, "browse", q, "--json"))] == ["", ""]


@pytest.mark.e2e
def test_a_composite_send_reaches_every_part(server, home):
    a, b = unique("cli.comp"), unique("cli.comp")
    sent = as_json(run(home, server, "send", f"{a},{b}", "both", "--json"))
    assert sent["destinations"] == [f"queue://{a}", f"queue://{b}"]
    assert stats(home, server, a)["queue_size"] == stats(home, server, b)["queue_size"] == 1


@pytest.mark.e2e
def test_follow_until_ctrl_c_then_the_consumer_is_closed(server, home):
    q = unique("cli.follow")
    ok(run(home, server, "send", q, "m", "-n", "3"))
    with running(home, server, "receive", q, "--follow", "--json") as process:
        printed = [json.loads(process.stdout.readline()) for _ in range(3)]
        ok(run(home, server, "send", q, "late"))  # --follow keeps receiving
        printed.append(json.loads(process.stdout.readline()))
        assert printed[-1]["body"] == "late"
        deadline = time.monotonic() + 10
        while stats(home, server, q)["dequeued"] < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stats(home, server, q)["consumer_count"] == 1
        process.send_signal(signal.SIGINT)
        assert process.wait(20) == 130
        # with --json too, stderr says what it took (the JSON lines are on stdout alone)
        assert process.stderr.read().decode() == f"received 4 messages from queue://{q} (interrupted)\n"
    after = stats(home, server, q)
    # everything printed acknowledged, and the consumer closed at once (not left to its lease)
    assert (after["dequeued"], after["queue_size"], after["consumer_count"]) == (4, 0, 0)
    ok(run(home, server, "send", q, "after"))
    assert stats(home, server, q)["pending"] == 1


def test_an_interrupted_receive_and_send_say_how_far_they_got(server, home):
    q = unique("cli.summary")
    ok(run(home, server, "send", q, "m", "-n", "2"))
    with running(home, server, "receive", q, "--follow") as process:
        assert [process.stdout.readline(), process.stdout.readline()] == [b"m\n", b"m\n"]
        deadline = time.monotonic() + 10
        while stats(home, server, q)["dequeued"] < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        assert process.wait(20) == 130
        assert process.stderr.read().decode() == f"received 2 messages from queue://{q} (interrupted)\n"

    # a send interrupted between batches names how many were sent; the batch in flight may be stored too
    q = unique("cli.summary")
    line = long_send_stopped(home, server, q, signal.SIGINT)
    assert line.startswith("signalbox: interrupted after sending ") and line.endswith(" of 1000000\n"), line
    sent = int(line.split()[4])
    assert sent % 100 == 0 and sent <= stats(home, server, q)["enqueued"] <= sent + 100


def test_summaries_stay_on_one_line_when_piped(server, home):
    """Piped, a summary is one line however long: a send to a composite destination of two long names
    makes one of more than 250 columns (wider than a terminal), which must not wrap; stderr the same."""
    q = unique("cli.a.queue.name.long.enough.that.its.summary.line.would.not.fit.in.eighty.columns")
    other = unique("cli.and.another.queue.name.long.enough.that.the.two.names.together.make"
                   ".a.summary.line.of.more.than.two.hundred.and.fifty")
    summary = f"sent 2 messages to queue://{q}, queue://{other}"
    assert len(summary) > 250
    assert ok(run(home, server, "send", f"{q},{other}", "x", "-n", "2")) == summary + "\n"
    result = run(home, server, "receive", q, "-n", "2")
    assert ok(result) == "x\nx\n"
    assert result.stderr == f"received 2 messages from queue://{q}\n"


@pytest.mark.e2e
def test_table_rows_stay_on_one_line_when_piped(server, home):
    """Piped, a table row is one line however wide (grep, awk): a destination name of 190 characters (the
    limit is 200) and a property of 300 are not folded at any width."""
    q = unique("cli.wide." + "n" * 172)
    assert len(q) == 190
    ok(run(home, server, "send", q, "body", "-p", "p=" + "v" * 300))
    [row] = [line for line in ok(run(home, server, "stat", "--search", q)).splitlines()[1:]]
    assert row.split()[:2] == [q, "1"], row
    [row] = ok(run(home, server, "browse", q)).splitlines()[1:]
    assert "v" * 300 in row and row.split()[1] == "pending", row


@pytest.mark.e2e
def test_tables_show_names_and_bodies_as_they_are_not_as_markup(server, home):
    """Brackets are ordinary characters of destination names, bodies, properties, groups and selectors:
    a table shows them as they are (rich would read `[red]` as a style, and `[/x]` as a closing tag with
    nothing open, an exception)."""
    q = unique("cli.q[red]x")
    ok(run(home, server, "send", q, "[/x] and [bold]b[/bold]", "-p", "tag=[red]r", "--group", "[/g]"))
    listed = ok(run(home, server, "stat", "--search", q))
    assert any(line.split()[:2] == [q, "1"] for line in listed.splitlines()), listed
    assert f"queue://{q}" in ok(run(home, server, "stat", q))
    browsed = ok(run(home, server, "browse", q))
    assert "[/x] and [bold]b[/bold]" in browsed and '"tag": "[red]r"' in browsed and "[/g]" in browsed
    with httpx.Client(base_url=server, headers={"Authorization": f"Token {ALICE_TOKEN}"}, timeout=30) as http:
        consumer = http.post(f"/api/v1/queues/{q}/consumers", json={"selector": "tag <> '[/y]'"}).json()
        base = f"/api/v1/queues/{q}/consumers/{consumer['consumer_id']}"
        assert len(http.post(f"{base}/receive", params={"wait": 5}).json()["messages"]) == 1
        assert "tag <> '[/y]'" in ok(run(home, server, "consumers", q))
        assert "[/g]" in ok(run(home, server, "groups", "list", q))
        http.delete(base)


@pytest.mark.e2e
def test_a_text_body_is_printed_unchanged_when_piped(server, home):
    """What `receive` prints to a pipe or a file is the body: escape sequences (a coloured log line, say)
    included; the message is acknowledged once printed, so a changed copy would be all that is left."""
    q = unique("cli.escapes")
    body = "\x1b[31mred\x1b[0m \x07 é"
    ok(run(home, server, "send", q, body))
    result = subprocess.run([*CLI, "receive", q], cwd=ROOT, env=cli_env(home, server),
                            stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (body + "\n").encode()


def test_a_server_gone_during_follow_is_one_line(tmp_path, home):
    from tests.helpers.gateway_server import own_gateway

    with own_gateway(tmp_path / "gone", "cli-gone") as gateway:
        url = f"http://127.0.0.1:{gateway.port}"
        q = unique("cli.gone")
        ok(run(home, url, "send", q, "g"))
        with running(home, url, "receive", q, "--follow") as process:
            assert process.stdout.readline() == b"g\n"
            time.sleep(0.5)  # (its next long poll is waiting)
            gateway.kill()  # (kill -9: the long poll's connection is reset, the close refused)
            assert process.wait(60) == 3
            lines = process.stderr.read().decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"signalbox: cannot reach Signalbox at {url}"), lines
    assert "closing the consumer failed too" in lines[0] and "its lease returns" in lines[0], lines


@pytest.mark.e2e
def test_a_reader_slower_than_the_lease_loses_nothing(gateway, server, home, redis_client):
    """`receive q | slow-program`: printing blocks while the pipe is full, here for three leases, and the
    maintenance tick (every second in `run`) reaps lapsed leases meanwhile. The command keeps its
    consumer's lease alive, so the messages it is printing are not given to another consumer (printed
    twice) and its acknowledgement is not refused."""
    from broker_core import maintenance
    from broker_core.broker import Broker

    q = unique("cli.slow")
    body = "s" * 2000
    ok(run(home, server, "send", q, body, "--count", "200", "--batch", "200"))  # 400 KB: the pipe holds 64
    broker = Broker(redis_client, gateway.namespace)
    with running(home, server, "receive", q, "-n", "200", "--lease", "2s") as process:
        for _ in range(7):
            time.sleep(1)
            maintenance.run_recovery(broker, f"queue://{q}")
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err.decode()
    assert out.decode().splitlines() == [body] * 200
    after = stats(home, server, q)
    assert (after["queue_size"], after["dequeued"], after["consumer_count"]) == (0, 200, 0)
    broker.close()
    # the command's bounds of --lease are the API's (past them: a usage error, test_config_and_usage_...)
    for lease in ("1s", "1h"):
        ok(run(home, server, "receive", q, "--lease", lease, "--wait", "0"))


@pytest.mark.e2e
def test_follow_waits_for_a_broker_that_restarts(tmp_path, home):
    """`receive --follow` keeps receiving until Ctrl-C: Redis killed and started again (what `run` does
    after a crash) makes the gateway answer 503 broker_unavailable for a moment, which the command waits
    out (saying so once on stderr) instead of ending; it then receives what was sent meanwhile."""
    q = unique("cli.restart")
    with gateway_on_a_redis_that_restarts(tmp_path, "cli-restart") as (url, store):
        ok(run(home, url, "send", q, "before"))
        with running(home, url, "receive", q, "--follow") as process:
            assert process.stdout.readline() == b"before\n"
            time.sleep(0.5)  # (in its next long poll)
            store.process.kill()
            store.process.wait()
            time.sleep(2)  # a few of its calls answered 503
            store.start()  # the same port, data folder and AOF
            serves_again(home, url, q)
            assert process.stdout.readline() == b"after\n"
            deadline = time.monotonic() + 10
            while stats(home, url, q)["dequeued"] < 2 and time.monotonic() < deadline:
                time.sleep(0.1)  # (its ack of "after" is on its way)
            process.send_signal(signal.SIGINT)
            assert process.wait(20) == 130
            lines = process.stderr.read().decode().splitlines()
        assert len(lines) == 2 and "broker_unavailable" in lines[0] and "waiting" in lines[0], lines
        assert lines[1] == f"received 2 messages from queue://{q} (interrupted)", lines
        after = stats(home, url, q)
        assert (after["dequeued"], after["queue_size"], after["consumer_count"]) == (2, 0, 0)


def test_follow_started_while_the_broker_is_away_waits_for_it(tmp_path, home):
    """A `receive --follow` started (by a service manager, say) while Redis is restarting waits for it as a
    running one does, rather than ending with the 503 before it had a consumer."""
    q = unique("cli.startdown")
    with gateway_on_a_redis_that_restarts(tmp_path, "cli-startdown") as (url, store):
        ok(run(home, url, "send", q, "before"))
        store.process.kill()
        store.process.wait()
        with running(home, url, "receive", q, "--follow") as process:
            time.sleep(2)  # its consumer's creation answered 503 a few times
            assert process.poll() is None, process.stderr.read()
            store.start()
            assert process.stdout.readline() == b"before\n"
            deadline = time.monotonic() + 10
            while stats(home, url, q)["dequeued"] < 1 and time.monotonic() < deadline:
                time.sleep(0.1)  # (its ack is on its way)
            process.send_signal(signal.SIGINT)
            assert process.wait(20) == 130
            lines = process.stderr.read().decode().splitlines()
        assert len(lines) == 2 and "broker_unavailable" in lines[0] and "waiting" in lines[0], lines
        assert lines[1] == f"received 1 message from queue://{q} (interrupted)", lines


def test_follow_makes_a_new_consumer_when_its_own_is_gone(server, home):
    """A `receive --follow` whose consumer the server no longer has (its lease lapsed while the machine
    slept, an operator closed it) says so once and goes on with a new one, rather than ending: what the old
    one had not acknowledged went back to the queue, so it may be printed again."""
    q = unique("cli.regone")
    ok(run(home, server, "send", q, "first"))
    with running(home, server, "receive", q, "--follow") as process:
        assert process.stdout.readline() == b"first\n"
        deadline = time.monotonic() + 10
        while stats(home, server, q)["dequeued"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)  # (its ack is on its way)
        admin = {"Authorization": f"Token {ALICE_TOKEN}"}
        with httpx.Client(base_url=server, headers=admin, timeout=30) as http:
            gone = [c["consumer_id"] for c in http.get(f"/api/v1/queues/{q}/consumers").json()]
            assert len(gone) == 1, gone
            assert http.delete(f"/api/v1/queues/{q}/consumers/{gone[0]}").status_code == 204
        ok(run(home, server, "send", q, "second"))
        assert process.stdout.readline() == b"second\n"
        while stats(home, server, q)["dequeued"] < 2 and time.monotonic() < deadline + 10:
            time.sleep(0.1)
        assert process.poll() is None
        process.send_signal(signal.SIGINT)
        assert process.wait(20) == 130
        lines = process.stderr.read().decode().splitlines()
    assert len(lines) == 2, lines
    assert "unknown_consumer" in lines[0] and "a new consumer" in lines[0], lines
    assert lines[1] == f"received 2 messages from queue://{q} (interrupted)", lines


@contextlib.contextmanager
def gateway_on_a_redis_that_restarts(tmp_path: Path, name: str) -> Iterator[tuple[str, Any]]:
    """A gateway of its own on a Redis of its own (AOF always), which a test may kill and start again on
    the same port and data: the gateway's URL and the Redis."""
    from signalbox.embedded_redis import EmbeddedRedis
    from tests.helpers.gateway_server import prepare_database, start_gateway

    store = EmbeddedRedis(tmp_path / "redis", port=free_port(), appendfsync="always")
    store.start()
    namespace = f"t{uuid.uuid4().hex[:12]}"
    prepare_database(tmp_path / "gateway", namespace)
    gateway = start_gateway(tmp_path / "gateway", namespace, name=name, REDIS_URL=store.url)
    try:
        yield f"http://127.0.0.1:{gateway.port}", store
    finally:
        gateway.stop()
        store.stop()


def serves_again(home: Path, url: str, q: str) -> None:
    """Send "after" to `q` once the gateway serves again (within 30 s of its Redis coming back)."""
    deadline = time.monotonic() + 30
    while run(home, url, "send", q, "after").returncode != 0:
        assert time.monotonic() < deadline, "the gateway did not serve again"
        time.sleep(0.5)


@pytest.mark.e2e
def test_sigterm_closes_the_consumer_too(server, home):
    """SIGTERM (`timeout 60 signalbox receive ...`, a service stopped) ends a receive as Ctrl-C does, with
    143: the consumer closed and one line saying what it took."""
    q = unique("cli.term")
    ok(run(home, server, "send", q, "t"))
    with running(home, server, "receive", q, "--follow") as process:
        assert process.stdout.readline() == b"t\n"
        assert stats(home, server, q)["consumer_count"] == 1
        deadline = time.monotonic() + 10
        while stats(home, server, q)["dequeued"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 128 + signal.SIGTERM
        assert process.stderr.read().decode() == f"received 1 message from queue://{q} (terminated)\n"
    assert stats(home, server, q)["consumer_count"] == 0


@pytest.mark.e2e
def test_a_terminated_send_says_how_far_it_got(server, home):
    """`timeout 60 signalbox send q x --count 1000000`: SIGTERM ends a long send as Ctrl-C does, naming how
    many were sent (the batch in flight may be stored too), with 143."""
    q = unique("cli.termsend")
    line = long_send_stopped(home, server, q, signal.SIGTERM)
    assert line.startswith("signalbox: terminated after sending ") and line.endswith(" of 1000000\n"), line
    sent = int(line.split()[4])
    assert sent % 100 == 0 and sent <= stats(home, server, q)["enqueued"] <= sent + 100


def long_send_stopped(home: Path, server: str, q: str, sig: int) -> str:
    """`send q s --count 1000000` stopped by `sig` once its first batch made the queue: its stderr line
    (it exits 130 for SIGINT, 128 + the signal otherwise)."""
    with running(home, server, "send", q, "s", "--count", "1000000", "--batch", "100") as process:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and httpx.get(
                f"{server}/api/v1/queues/{q}", headers={"Authorization": f"Token {ALICE_TOKEN}"},
                timeout=30).status_code == 404:
            time.sleep(0.05)
        process.send_signal(sig)
        assert process.wait(20) == (130 if sig == signal.SIGINT else 128 + sig)
        return process.stderr.read().decode()


@pytest.mark.e2e
def test_a_progress_bar_on_a_terminal(server, home):
    q = unique("cli.progress")
    leader, follower = pty.openpty()
    process = subprocess.Popen([*CLI, "send", q, "p", "--count", "300", "--batch", "50"], cwd=ROOT,
                               env=cli_env(home, server, COLUMNS="100"), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: the process is done with it
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert process.wait(60) == 0
    assert b"sending" in seen and b"300/300" in seen
    assert process.stdout.read().decode().strip() == f"sent 300 messages to queue://{q}"
    process.stdout.close()
    assert stats(home, server, q)["queue_size"] == 300


@pytest.mark.e2e
def test_move_copy_and_retry_from_the_dead_letter_queue(server, home):
    src, dst = unique("cli.src"), unique("cli.dst")
    for kind in ("a", "b", "a", "b", "b"):
        ok(run(home, server, "send", src, kind, "-p", f"kind={kind}"))
    failed(run(home, server, "move", src, dst), 1, "unknown_destination", f"queue://{dst}")
    with httpx.Client(base_url=server, headers={"Authorization": f"Token {ALICE_TOKEN}"}, timeout=30) as http:
        assert http.put(f"/api/v1/queues/{dst}").status_code == 201  # the API moves to existing queues only
    assert "moved 2 messages" in ok(run(home, server, "move", src, dst, "--selector", "kind = 'a'"))
    assert {m["body"] for m in as_json(run(home, server, "browse", dst, "--json"))} == {"a"}
    one = as_json(run(home, server, "browse", src, "--json"))[0]["message_id"]
    # (--json names the destinations in full, as every command's output does: not as typed)
    assert as_json(run(home, server, "move", src, dst, "--message-id", one, "--json")) == {
        "count": 1, "source": f"queue://{src}", "target": f"queue://{dst}"}
    assert as_json(run(home, server, "move", src, dst, "--copy", "--json"))["count"] == 2
    assert (stats(home, server, src)["queue_size"], stats(home, server, dst)["queue_size"]) == (2, 5)
    assert as_json(run(home, server, "move", src, dst, "-n", "1", "--json"))["count"] == 1
    failed(run(home, server, "move", src, src), 1, "operation_refused")
    failed(run(home, server, "move", src, dst, "--message-id", "x", "--selector", "a = 1"), 2, "--message-id")
    # by id: a refused id after others were moved says how many were (they are not put back)
    ok(run(home, server, "send", src, "c"))
    first, second = [m["message_id"] for m in as_json(run(home, server, "browse", src, "--json"))]
    failed(run(home, server, "move", src, dst, "--message-id", first, "--message-id", "ID:nope",
               "--message-id", second), 1, "unknown_message", "ID:nope", "(after moving 1 of 3 messages)")
    assert [m["message_id"] for m in as_json(run(home, server, "browse", src, "--json"))] == [second]

    # a dead letter, made through the API (poison nack), goes back with retry-dlq
    poisoned = unique("cli.poison")
    ok(run(home, server, "send", poisoned, "bad"))
    with httpx.Client(base_url=server, headers={"Authorization": f"Token {ALICE_TOKEN}"}, timeout=30) as http:
        consumer = http.post(f"/api/v1/queues/{poisoned}/consumers", json={}).json()["consumer_id"]
        base = f"/api/v1/queues/{poisoned}/consumers/{consumer}"
        message = http.post(f"{base}/receive", params={"wait": 5}).json()["messages"][0]
        assert http.post(f"{base}/nack", json={"message_ids": [message["message_id"]], "poison": True}
                         ).json()["dead_lettered"] == 1
        http.delete(base)
        deadline = time.monotonic() + 20
        while not any(m["message_id"] == message["message_id"] for m in http.get(
                "/api/v1/queues/ActiveMQ.DLQ/messages", params={"limit": 1000}).json().get("messages", [])):
            assert time.monotonic() < deadline, "the dead letter never reached ActiveMQ.DLQ"
            time.sleep(0.2)
    failed(run(home, server, "retry-dlq", src), 1, "operation_refused")
    retried = as_json(run(home, server, "retry-dlq", "--message-id", message["message_id"], "--json"))
    assert retried == {"count": 1, "dlq": "queue://ActiveMQ.DLQ"}
    assert [m["body"] for m in as_json(run(home, server, "browse", poisoned, "--json"))] == ["bad"]
    assert "retried 0 messages" in ok(run(home, server, "retry-dlq", "queue://ActiveMQ.DLQ", "--selector",
                                          "JMSMessageID = 'nothing'"))


def scheduled(server: str, queue: str) -> list[dict]:
    answer = httpx.get(f"{server}/api/v1/queues/{queue}/scheduled",
                       headers={"Authorization": f"Token {ALICE_TOKEN}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["messages"]


@pytest.mark.e2e
def test_a_schedule_from_the_command_line(server, home):
    """--delay, --period and --repeat are ActiveMQ's AMQ_SCHEDULED_* (the job waits parked, not on the
    queue); a value the broker refuses is one line with exit code 1."""
    q = unique("cli.scheduled")
    sent = as_json(run(home, server, "send", q, "tick", "--delay", "1h", "--period", "10s", "--repeat", "3",
                       "--json"))
    (job,) = scheduled(server, q)
    assert job["message_id"] == sent["message_ids"][0]
    assert (job["period"], job["repeats_left"]) == (10_000, 3)
    assert job["due"] - job["timestamp"] >= 3_600_000 - 1_000
    assert stats(home, server, q)["queue_size"] == 0
    failed(run(home, server, "send", q, "x", "--repeat", "-1"), 2, "--repeat")
    nightly = as_json(run(home, server, "send", q, "nightly", "--cron", "0 3 * * *", "--json"))
    (job,) = [j for j in scheduled(server, q) if j["message_id"] == nightly["message_ids"][0]]
    assert job["cron"] == "0 3 * * *" and job["due"] % 86_400_000 == 3 * 3_600_000
    failed(run(home, server, "send", q, "x", "--cron", "0 25 * * *"), 1, "AMQ_SCHEDULED_CRON", "hour")
    assert len(scheduled(server, q)) == 2


@pytest.mark.e2e
def test_scheduled_jobs_are_listed_and_cancelled_from_the_command_line(server, home):
    """A delayed or cron message sent with `send` can be seen (`scheduled`) and cancelled (`remove`, which
    removes a stored message the same way) without leaving the command line."""
    q = unique("cli.jobs")
    def sent(*args: str) -> str:
        return as_json(run(home, server, "send", q, *args, "--json"))["message_ids"][0]

    later, nightly = sent("later", "--delay", "1h"), sent("nightly", "--cron", "0 3 * * *")
    stored = sent("now")
    jobs = as_json(run(home, server, "scheduled", q, "--json"))
    assert sorted(j["message_id"] for j in jobs) == sorted([later, nightly])
    table = ok(run(home, server, "scheduled", q))
    assert nightly in table and "0 3 * * *" in table, table
    assert any(f"in {n} s" in table for n in (3598, 3599, 3600)), table  # (the delayed one's due time)
    assert ok(run(home, server, "remove", q, nightly, stored)) == f"removed 2 messages from queue://{q}\n"
    assert [j["message_id"] for j in as_json(run(home, server, "scheduled", q, "--json"))] == [later]
    assert stats(home, server, q)["queue_size"] == 0
    failed(run(home, server, "remove", q, later, "ID:nothing"), 1, "unknown_message", "ID:nothing",
           "after removing 1 of 2 messages")
    assert "no scheduled messages" in ok(run(home, server, "scheduled", q))


@pytest.mark.e2e
def test_groups_and_consumers(server, home):
    q = unique("cli.groups")
    for group in ("g1", "g2", "g3"):
        ok(run(home, server, "send", q, group, "--group", group))
    with httpx.Client(base_url=server, headers={"Authorization": f"Token {ALICE_TOKEN}"}, timeout=30) as http:
        consumer = http.post(f"/api/v1/queues/{q}/consumers", json={"selector": "JMSXGroupID <> 'zz'"}).json()
        cid = consumer["consumer_id"]
        received = http.post(f"/api/v1/queues/{q}/consumers/{cid}/receive", params={"max_messages": 3})
        assert len(received.json()["messages"]) == 3
        rows = as_json(run(home, server, "consumers", q, "--json"))
        assert [(r["consumer_id"], r["in_flight"], r["selector"]) for r in rows] == [
            (cid, 3, "JMSXGroupID <> 'zz'")]
        assert cid in ok(run(home, server, "consumers", q))
        listed = as_json(run(home, server, "groups", "list", q, "--json"))
        assert sorted((g["group_id"], g["owner"]) for g in listed) == [("g1", cid), ("g2", cid), ("g3", cid)]
        assert "g2" in ok(run(home, server, "groups", "list", q))
        assert as_json(run(home, server, "groups", "reset", q, "g1", "--json")) == {"count": 1}
        failed(run(home, server, "groups", "reset", q, "g1"), 1, "unknown_group", "g1")
        assert "removed 2 message groups" in ok(run(home, server, "groups", "remove-all", q))
        assert as_json(run(home, server, "groups", "list", q, "--json")) == []
        assert "no message groups" in ok(run(home, server, "groups", "list", q))
        http.delete(f"/api/v1/queues/{q}/consumers/{cid}")
    assert "no consumers" in ok(run(home, server, "consumers", q))


@pytest.mark.e2e
def test_stat_pages_through_a_proxy_that_terminates_tls(gateway, server, home, tmp_path):
    """Behind a proxy that terminates TLS (socat here) the server sees plain HTTP, so the `next` link of
    each page of destinations says http://: the command asks its own URL for the next page (only the
    link's query is the server's), so every page comes and the token goes nowhere else."""
    import shutil

    if not (shutil.which("socat") and shutil.which("openssl")):
        pytest.skip("needs the socat and openssl commands")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    port = free_port()
    proxy = subprocess.Popen(["socat", f"OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,cert={cert},"
                              f"key={key},verify=0", f"TCP:127.0.0.1:{gateway.port}"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process=proxy)  # (socat)
        prefix = unique("cli.many")
        names = [f"{prefix}.{i:04d}" for i in range(1001)]  # more than a page (1000)
        answer = httpx.post(f"{server}/api/v1/messages", params={"destination": ",".join(names)},
                            json={"body": "m"}, headers={"Authorization": f"Token {ALICE_TOKEN}"}, timeout=60)
        assert answer.status_code == 201, answer.text
        rows = as_json(run(home, f"https://127.0.0.1:{port}", "stat", "--search", prefix, "--json",
                           SSL_CERT_FILE=str(cert)))
        assert sorted(r["name"] for r in rows) == names
    finally:
        proxy.kill()
        proxy.wait(10)


@pytest.mark.e2e
def test_stat_of_a_topic_lists_its_subscriptions_with_pending_and_consumers(server, home):
    """`activemq dstat` gives a topic's figures; an operator also needs who subscribes: each subscription,
    durable or not, active or offline, what waits for it and its consumer (GET /api/v1/topics/<t>)."""
    t = unique("cli.topic")
    with httpx.Client(base_url=server, headers={"Authorization": f"Token {ALICE_TOKEN}"}, timeout=30) as http:
        live = http.post(f"/api/v1/topics/{t}/consumers", json={"prefetch": 1}).json()["consumer_id"]
        named = {"client_id": "cli-test", "subscription_name": "audit"}
        durable = http.post(f"/api/v1/topics/{t}/consumers", json=named).json()["consumer_id"]
        assert http.delete(f"/api/v1/topics/{t}/consumers/{durable}").status_code == 204  # offline now
        for n in range(3):
            ok(run(home, server, "send", f"topic://{t}", f"m{n}"))
        assert len(http.post(f"/api/v1/topics/{t}/consumers/{live}/receive").json()["messages"]) == 1
        table = ok(run(home, server, "stat", f"topic://{t}"))
        assert "subscriptions" in table, table
        rows = [line.split() for line in table.split("subscriptions", 1)[1].splitlines()]
        # name, durable, active, pending, in flight, enqueued, dequeued, expired, DLQ, client id, consumer
        offline = next(r for r in rows if r[:1] == ["audit"])
        assert offline[:11] == ["audit", "yes", "no", "3", "0", "3", "0", "0", "0", "cli-test", "-"], table
        active = next(r for r in rows if live in r)
        assert active[:11] == ["-", "no", "yes", "2", "1", "3", "0", "0", "0", "-", live], table
        assert "durable_offline" in table and "no_subscription" in table
        detail = as_json(run(home, server, "stat", f"topic://{t}", "--json"))
        subs = {s.get("subscription_name") or s["consumer_id"]: s for s in detail["subscriptions"]}
        assert subs.keys() == {"audit", live}
        audit = subs["audit"]
        assert (audit["durable"], audit["active"], audit["pending"]) == (True, False, 3)
        assert (subs[live]["pending"], subs[live]["in_flight"]) == (2, 1)
        http.delete(f"/api/v1/topics/{t}/consumers/{live}")


def test_a_send_with_stdout_closed_sends_and_succeeds(server, home):
    """`signalbox send q x >&-` (stdout closed: Python has None there) sends and exits 0; its summary goes
    nowhere, not into a traceback after the message was stored (a script would send it again)."""
    q = unique("cli.closed")
    result = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *CLI, "send", q, "x"], cwd=ROOT,
                            env=cli_env(home, server), stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=120)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert stats(home, server, q)["queue_size"] == 1


def test_a_receive_with_stdout_closed_takes_nothing(server, home):
    """`signalbox receive q >&-`: there is nowhere to print, so no message is taken (and acknowledged
    into nothing): one line and exit 2, the message still on the queue."""
    q = unique("cli.closedout")
    ok(run(home, server, "send", q, "keep me"))
    result = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *CLI, "receive", q], cwd=ROOT,
                            env=cli_env(home, server), stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=120)
    failed(result, 2, "standard output is closed")
    assert (stats(home, server, q)["queue_size"], stats(home, server, q)["dequeued"]) == (1, 0)


def test_output_that_cannot_be_written_is_one_line_and_the_message_goes_back(server, home):
    """`receive q --json > out.jsonl` on a full disk (here /dev/full): one line and exit 1, not a
    traceback, and the message it could not write is not acknowledged: it is still on the queue."""
    q = unique("cli.full")
    ok(run(home, server, "send", q, "keep me"))

    def to_full(*args: str) -> subprocess.CompletedProcess[str]:
        with open("/dev/full", "wb") as full:
            return subprocess.run([*CLI, *args], cwd=ROOT, env=cli_env(home, server),
                                  stdin=subprocess.DEVNULL, stdout=full, stderr=subprocess.PIPE, text=True,
                                  timeout=120)

    failed(to_full("receive", q, "--json"), 1, "cannot write to standard output", "No space left")
    assert (stats(home, server, q)["queue_size"], stats(home, server, q)["dequeued"]) == (1, 0)
    failed(to_full("stat", q, "--json"), 1, "cannot write to standard output")
    failed(to_full("browse", q), 1, "cannot write to standard output")
    # a command that changed something says that it did: only its report is lost (a script taking the
    # error for a failed send would send again)
    failed(to_full("send", q, "again"), 1, "sent ID:", f"to queue://{q}, but cannot write to standard output")
    failed(to_full("send", q, "more", "--json"), 1, "sent ID:", "but cannot write")
    assert stats(home, server, q)["queue_size"] == 3
    failed(to_full("purge", q), 1, f"purged 3 messages from queue://{q}, but cannot write")


def test_commands_reading_standard_input_when_it_is_closed(server, home):
    """`signalbox send q <&-` (stdin closed: Python has None there) reads an empty input, as from
    /dev/null: one line and exit 2, not a traceback; `token` and `delete` the same."""

    def closed_stdin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", 'exec "$@" <&-', "sh", *CLI, *args], cwd=ROOT,
                              env=cli_env(home, server), capture_output=True, text=True, timeout=120)

    q = unique("cli.nostdin")
    failed(closed_stdin("send", q), 2, "standard input was empty")
    failed(closed_stdin("delete", q), 2, "give --yes")
    failed(closed_stdin("token", "-u", "alice", "--password-stdin"), 1, "password")
    failed(closed_stdin("token", "-u", "alice"), 2, "give --password-stdin")


def test_stat_of_a_queue_shows_no_topic_rows(server, home):
    """A queue has no subscriptions: its detail shows neither a topic's counters nor "no subscriptions"
    (the API's queue answer carries those keys, empty)."""
    q = unique("cli.plain")
    ok(run(home, server, "send", q, "m"))
    table = ok(run(home, server, "stat", q))
    assert "queue_size" in table and "consumer_count" in table, table
    for topic_only in ("subscription", "durable_active", "durable_offline"):
        assert topic_only not in table, table
    # a yes/no as the other tables show one, not Python's False
    assert ["paused", "no"] in [line.split() for line in table.splitlines()], table


@pytest.mark.e2e
def test_stat_watch(server, home):
    q = unique("cli.watch")
    ok(run(home, server, "send", q, "w"))
    refreshes = json_lines(run(home, server, "stat", "--search", q, "--watch", "0.2", "--times", "3",
                               "--json"))
    assert len(refreshes) == 3 and all([r["name"] for r in rows] == [q] for rows in refreshes)
    tables = ok(run(home, server, "stat", q, "--watch", "0.2", "--times", "2"))
    assert tables.count("queue_size") == 2
    with running(home, server, "stat", "--watch", "0.2") as process:
        assert b"Queue Size" in process.stdout.readline()
        process.send_signal(signal.SIGINT)  # Ctrl-C is how a watch ends
        assert process.wait(20) == 0


@pytest.mark.e2e
def test_stat_watch_waits_for_a_broker_that_restarts(tmp_path, home):
    """`stat --watch` is what an operator runs while something is wrong: Redis killed and started again
    (what `run` does after a crash) makes the gateway answer 503 broker_unavailable for a moment, which
    the watch waits out (saying so once on stderr) instead of ending; it then shows the figures again."""
    q = unique("cli.watched")
    with gateway_on_a_redis_that_restarts(tmp_path, "cli-watch") as (url, store):
        ok(run(home, url, "send", q, "before"))
        with running(home, url, "stat", q, "--watch", "0.2", "--json") as process:
            assert json.loads(process.stdout.readline())["queue_size"] == 1
            store.process.kill()
            store.process.wait()
            time.sleep(2)  # a few of its refreshes answered 503
            assert process.poll() is None, process.stderr.read()
            store.start()  # the same port, data folder and AOF
            serves_again(home, url, q)
            deadline = time.monotonic() + 10
            while json.loads(process.stdout.readline())["queue_size"] != 2:
                assert time.monotonic() < deadline, "the watch did not show the queue again"
            process.send_signal(signal.SIGINT)  # Ctrl-C is how a watch ends
            assert process.wait(20) == 0
            lines = process.stderr.read().decode().splitlines()
        assert len(lines) == 1 and "broker_unavailable" in lines[0] and "waiting" in lines[0], lines


@pytest.mark.e2e
def test_a_token_or_url_with_a_stray_line_end_works_and_a_malformed_token_is_refused(server, home):
    """A token or URL read from a file keeps its line end, a pasted one may have a space: they are still
    the token and the URL (neither has whitespace). A token that cannot be one (not printable ASCII) is a
    usage error naming where it came from, not 'cannot reach' (exit 3) or a traceback."""
    q = unique("cli.strays")
    ok(run(home, server, "send", q, "x"))
    (home / "config" / "signalbox").mkdir()
    (home / "config" / "signalbox" / "cli.toml").write_text(f'token = "{ALICE_TOKEN}\\n"\n')
    assert as_json(run(home, server + "\n", "stat", q, "--json", token=None))["queue_size"] == 1
    assert as_json(run(home, server, "stat", q, "--json", token=f" {ALICE_TOKEN}\r\n"))["queue_size"] == 1
    failed(run(home, server, "stat", q, token="t\u00f6ken"), 2, "token from SIGNALBOX_TOKEN")
    failed(run(home, server, "stat", q, token="two words"), 2, "token from SIGNALBOX_TOKEN")
    failed(run(home, server + "/\x07", "stat", q), 2, "url from SIGNALBOX_URL")
    failed(run(home, "http://host:port", "stat", q), 2, "url from SIGNALBOX_URL is not a URL", "port")


@pytest.mark.e2e
def test_api_errors_are_one_line_with_exit_code_1(server, home):
    failed(run(home, server, "stat", "cli.nosuch"), 1, "Unknown destination", "404", "queue://cli.nosuch")
    failed(run(home, server, "browse", "cli.nosuch"), 1, "unknown_destination")
    # (the server knows the columns: its refusal, given as a usage error naming the option the user typed)
    failed(run(home, server, "stat", "--sort", "colour"), 2, "'--sort': 'colour' is not a column",
           "queue_size", "see 'signalbox stat --help'")
    q = unique("cli.errors")
    ok(run(home, server, "send", q, "e"))
    failed(run(home, server, "browse", q, "--selector", "a = = 1"), 1, "Invalid selector", "invalid_selector")
    failed(run(home, server, "receive", q, "--selector", "("), 1, "invalid_selector")
    failed(run(home, server, "send", "bad name", "x"), 1, "invalid_destination", "whitespace")
    failed(run(home, server, "send", q, "x", "-p", "big:={\"type\": \"long\"}"), 1, "invalid_message",
           "properties.big")
    # a refused token is named by where it came from: a stale variable is not hunted for in the file
    failed(run(home, server, "stat", token="0" * 40), 1, "401", "Invalid token",
           "(the token from SIGNALBOX_TOKEN)")
    failed(run(home, server, "stat", token=None), 1, "401", "no token: give --token, SIGNALBOX_TOKEN")
    # a token from the config file; a flag overrides it
    (home / "config" / "signalbox").mkdir()
    (home / "config" / "signalbox" / "cli.toml").write_text(f'token = "{ALICE_TOKEN}"\n')
    assert stats(home, server, q)["queue_size"] == 1
    ok(run(home, server, "stat", q, token=None))
    failed(run(home, server, "--token", "0" * 40, "stat", q, token=None), 1, "401",
           "(the token from --token)")
    (home / "config" / "signalbox" / "cli.toml").write_text(f'token = "{"0" * 40}"\n')
    failed(run(home, server, "stat", q, token=None), 1, "401",
           f"(the token from {home / 'config' / 'signalbox' / 'cli.toml'})")
    # bob may read and write queue://bob.> only; he gets his token with his password
    bob = ok(run(home, server, "token", "-u", "bob", "--password-stdin", input="secret\n",
                 token=None)).strip()
    assert len(bob) == 40
    failed(run(home, server, "token", "-u", "bob", "--password-stdin", input="wrong\n", token=None), 1,
           "Unable to log in")
    ok(run(home, server, "send", "bob.inbox", "hi", token=bob))
    assert ok(run(home, server, "receive", "bob.inbox", token=bob)) == "hi\n"
    failed(run(home, server, "purge", "bob.inbox", token=bob), 1, "permission_denied")
    failed(run(home, server, "receive", q, token=bob), 1, "403")
    failed(run(home, server, "consumers", "bob.inbox", token=bob), 1, "403")
    assert stats(home, server, q)["consumer_count"] == 0


@pytest.mark.parametrize("special", ["orders/eu", "100%2F", "a#b", "café/ü", "x/purge"])
def test_names_with_url_characters_reach_their_own_queue(server, home, special):
    """A name holding `/`, `%`, `#` or non-ASCII letters is one path segment, percent-encoded whole
    (docs/api.md, "Names in URLs"): every command acts on that queue, never on `x` for `x/purge`."""
    q = f"{unique('cli.names')}.{special}"
    neighbour = q.split("/")[0] if "/" in special else None
    if neighbour:
        ok(run(home, server, "send", neighbour, "bystander"))
    target = f"queue://{unique('cli.names')}.to/{special}"
    with httpx.Client(base_url=server, headers={"Authorization": f"Token {ALICE_TOKEN}"}, timeout=30) as http:
        for name in (q, target.removeprefix("queue://")):
            assert http.put(f"/api/v1/queues/{quote(name, safe='')}").status_code == 201
    for body in ("one", "two", "three"):
        ok(run(home, server, "send", f"queue://{q}", body, "--group", f"g/{body}"))
    assert as_json(run(home, server, "stat", q, "--json"))["queue_size"] == 3
    browsed = as_json(run(home, server, "browse", q, "--json"))
    assert [m["body"] for m in browsed] == ["one", "two", "three"]
    assert [m["body"] for m in json_lines(run(home, server, "receive", q, "-n", "1", "--json"))] == ["one"]
    with httpx.Client(base_url=server, headers={"Authorization": f"Token {ALICE_TOKEN}"}, timeout=30) as http:
        created = http.post(f"/api/v1/queues/{quote(q, safe='')}/consumers", json={"prefetch": 1})
        consumer = created.json()["links"]
        assert len(http.post(consumer["receive"], params={"max_messages": 1}).json()["messages"]) == 1
        listed = as_json(run(home, server, "groups", "list", q, "--json"))
        assert [g["group_id"] for g in listed] == ["g/two"]
        assert as_json(run(home, server, "groups", "reset", q, "g/two", "--json")) == {"count": 1}
        assert len(as_json(run(home, server, "consumers", q, "--json"))) == 1
        assert http.delete(consumer["self"]).status_code == 204
    moved = as_json(run(home, server, "move", q, target, "--message-id", browsed[2]["message_id"], "--json"))
    assert moved["count"] == 1
    assert "moved 0 messages" in ok(run(home, server, "move", q, target, "--selector", "JMSType = 'none'"))
    assert f"purged 1 message from queue://{q}" in ok(run(home, server, "purge", q))
    assert [m["body"] for m in as_json(run(home, server, "browse", target, "--json"))] == ["three"]
    if neighbour:
        assert as_json(run(home, server, "stat", neighbour, "--json"))["queue_size"] == 1
