"""End to end against the live ASGI server (uvicorn): a producer and two consumer processes over HTTP
with message groups and a selector; one consumer is killed mid-stream holding unacknowledged messages.
Every matching message is acknowledged exactly once, the dead consumer's groups move to the survivor.
Then schemathesis fuzzes the whole API against its OpenAPI schema: no 5xx, and no status code, content
type, body or header that the schema does not document."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.helpers.gateway_server import ALICE_TOKEN, ROOT, own_gateway

pytestmark = pytest.mark.e2e

GROUPS = [f"g{i}" for i in range(8)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with own_gateway(tmp_path_factory.mktemp("http-gateway"), "http") as gateway:
        yield gateway


def url(server) -> str:
    return f"http://127.0.0.1:{server.port}"


def consumer_process(server, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.gateway_api.http_consumer", "--url", url(server),
         "--token", ALICE_TOKEN, "--queue", "e2e.orders", "--selector", "kind = 'order'",
         "--log", str(log), *extra],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)


def events(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_two_consumers_one_killed_every_message_acked_exactly_once(server, tmp_path):
    headers = {"Authorization": f"Token {ALICE_TOKEN}"}
    doomed_log, survivor_log, stop = tmp_path / "doomed.log", tmp_path / "survivor.log", tmp_path / "stop"
    doomed = consumer_process(server, doomed_log, "--hold-after", "6", "--lease-ms", "2000")
    wait_for(lambda: events(doomed_log), 20, "the first consumer to register")
    survivor = consumer_process(server, survivor_log, "--lease-ms", "30000", "--stop-file", str(stop))
    order_ids: list[str] = []
    noise = 0
    try:
        with httpx.Client(base_url=url(server), headers=headers, timeout=30) as http:
            for batch in range(12):  # the producer: 120 messages in order, 8 groups, some noise
                messages = []
                for i in range(10):
                    n = batch * 10 + i
                    kind = "noise" if n % 7 == 0 else "order"
                    noise += kind == "noise"
                    messages.append({"body": f"m{n}", "group_id": GROUPS[n % len(GROUPS)],
                                     "properties": {"kind": kind, "n": n}})
                sent = http.post("/api/v1/queues/e2e.orders/messages", json={"messages": messages})
                assert sent.status_code == 201, sent.text
                order_ids += [mid for mid, m in zip(sent.json()["message_ids"], messages, strict=True)
                              if m["properties"]["kind"] == "order"]
                time.sleep(0.05)

            wait_for(lambda: ["holding"] in events(doomed_log), 30, "the doomed consumer to hold messages")
            held = {e[1] for e in events(doomed_log) if e[0] == "recv"} - {
                e[1] for e in events(doomed_log) if e[0] == "ack"}
            doomed_groups = {e[2] for e in events(doomed_log) if e[0] == "recv"}
            assert held, "the doomed consumer holds unacknowledged messages when it dies"
            doomed.send_signal(signal.SIGKILL)  # no ack, no close: only its lease can free the messages
            doomed.wait(10)

            def all_acked() -> bool:
                acks = [e[1] for log in (doomed_log, survivor_log) for e in events(log) if e[0] == "ack"]
                return set(acks) >= set(order_ids)

            wait_for(all_acked, 60, "every matching message to be acknowledged")
            stop.touch()
            survivor.wait(30)

            acks = Counter(e[1] for log in (doomed_log, survivor_log) for e in events(log) if e[0] == "ack")
            assert set(acks) == set(order_ids) and max(acks.values()) == 1  # exactly once
            redelivered = {e[1] for e in events(survivor_log) if e[0] == "recv" and e[3] == "1"}
            assert held <= redelivered  # the survivor got the dead consumer's messages, flagged redelivered
            survivor_first = {e[2] for e in events(survivor_log) if e[0] == "recv" and e[4] == "1"}
            assert doomed_groups <= survivor_first  # each of the dead consumer's groups moved, first flagged

            detail = http.get("/api/v1/queues/e2e.orders").json()
            assert detail["queue_size"] == noise  # the selector left the noise alone
            assert detail["consumer_count"] == 0 and detail["in_flight"] == 0
            # closing freed the groups
            assert http.get("/api/v1/queues/e2e.orders/groups").json()["groups"] == []
    finally:
        for process in (doomed, survivor):
            if process.poll() is None:
                process.kill()
                process.wait(10)


def test_schemathesis_finds_no_server_error_and_no_conformance_failure(server, tmp_path):
    headers = {"Authorization": f"Token {ALICE_TOKEN}"}
    with httpx.Client(base_url=url(server), headers=headers, timeout=30) as http:
        http.post("/api/v1/queues/fuzz/messages", json={"messages": [{"body": "x", "group_id": "g"}] * 3})
    result = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", f"{url(server)}/api/schema/?format=json",
         "--header", f"Authorization: Token {ALICE_TOKEN}",
         # conformance, not only crashes: every status, content type, body and header the API answers must
         # be the schema's (gateway/api/schema.py completes each operation's problems)
         "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                     "response_schema_conformance,response_headers_conformance",
         "--phases", "examples,coverage,fuzzing", "--max-examples", "10",
         # one worker: CPython 3.11's ast module is not safe to use from two threads at once, and
         # hypothesis parses lambdas with it ("AST constructor recursion depth mismatch")
         "--workers", "1",
         "--max-time", "90", "--exclude-path-regex", "/receive$|/api/message",
         "--seed", "1", "--no-color", "--report-dir", str(tmp_path)],
        # schemathesis writes its own files (.schemathesis/) into its working folder: not the repo
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:] + "\n--- server log ---\n" + server.output()[-4000:]
