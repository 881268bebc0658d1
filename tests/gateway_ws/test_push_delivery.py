"""One hop from SEND to MESSAGE (docs/broker_core.md "The delivery path"), watched with Redis's MONITOR on
the live gateway processes: the send's own script call delivers the message (no `receive` call), through
the send's reply when producer and consumer share a process, through pub/sub when they do not; and a
gateway killed with SIGKILL after the script pushed a message and before it wrote it loses nothing."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pytest

from broker_core.scripts.library import script
from tests.gateway_ws.conftest import TWO_GATEWAYS_LEASE_MS
from tests.helpers.stomp_client import Client

pytestmark = pytest.mark.e2e


class Monitor:
    """Redis's MONITOR in a thread: every command any client (or a script) runs, until `stop`."""

    def __init__(self, redis_client) -> None:
        self.client = redis_client
        self.commands: list[dict] = []
        self.marker = f"monitor-end-{uuid.uuid4().hex}"
        self._monitor = redis_client.monitor().__enter__()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            command = self._monitor.next_command()
            if self.marker in command["command"]:
                return
            self.commands.append(command)

    def stop(self) -> list[dict]:
        self.client.echo(self.marker)
        self._thread.join(5)
        self._monitor.__exit__(None, None, None)
        return self.commands


def calls_of(commands: list[dict], name: str, key_part: str) -> list[str]:
    """The top-level calls of script `name` (FCALL or EVALSHA) naming a key that contains `key_part`."""
    s = script(name)
    heads = (f"FCALL {s.function} ", f"EVALSHA {s.sha} ")
    return [c["command"] for c in commands
            if c["command"].startswith(heads) and key_part in c["command"] and c["client_type"] != "lua"]


def wait_armed(redis_client, namespace: str, queue: str, timeout: float = 5) -> None:
    """Until the queue's consumer has been armed for pushes by its gateway's first receive_after."""
    deadline = time.monotonic() + timeout
    pattern = f"{namespace}:{{q:{queue}}}:c:*"
    while time.monotonic() < deadline:
        for key in redis_client.scan_iter(match=pattern):
            if key.count(b":") == pattern.count(":") and int(redis_client.hget(key, "push") or 0) > 0:
                return
        time.sleep(0.02)
    raise AssertionError(f"no consumer of {queue} armed for pushes within {timeout} s")


def test_a_send_to_a_consumer_of_the_same_process_is_delivered_by_the_send_call_alone(
        stomp_listener, redis_client, gateway_data):
    namespace = gateway_data[1]
    name = f"push.{uuid.uuid4().hex[:8]}"
    consumer = Client(stomp_listener.port, tcp=True).connect()
    producer = Client(stomp_listener.port, tcp=True).connect()
    try:
        consumer.receipt(consumer.conn.subscribe, f"/queue/{name}", id="s", ack="auto")
        wait_armed(redis_client, namespace, name)
        # (a first send: in the EVAL form the process's first call of a script loads it and calls again)
        producer.conn.send(f"/queue/{name}", "warm-up", headers={"persistent": "false"})
        consumer.messages(1)
        wait_armed(redis_client, namespace, name)
        monitor = Monitor(redis_client)
        producer.conn.send(f"/queue/{name}", "one hop", headers={"persistent": "false"})
        (message,) = consumer.messages(1)
        commands = monitor.stop()
        assert message.body == b"one hop"
        key = f"{{q:{name}}}"
        assert len(calls_of(commands, "send", key)) == 1
        assert calls_of(commands, "receive", key) == []  # delivered by the send's own call
        # the local short-cut: the delivery came back in the send's reply, not through pub/sub
        assert not [c for c in commands if c["command"].startswith("PUBLISH") and ":wake:" in c["command"]]
        # ack mode auto: acknowledged once written (the queue is empty of it afterwards)
        deadline = time.monotonic() + 5
        while int(redis_client.hget(f"{namespace}:{key}:meta", "dequeued") or 0) < 2:
            assert time.monotonic() < deadline, "the pushed message was never acknowledged"
            time.sleep(0.02)
    finally:
        producer.close()
        consumer.close()


def test_a_send_to_a_consumer_of_another_process_is_published_with_the_message_itself(
        stomp_listener, gateway, redis_client, gateway_data):
    namespace = gateway_data[1]
    name = f"push.{uuid.uuid4().hex[:8]}"
    consumer, producer = Client(stomp_listener.port, tcp=True).connect(), Client(gateway.port).connect()
    try:
        consumer.receipt(consumer.conn.subscribe, f"/queue/{name}", id="s", ack="client-individual")
        wait_armed(redis_client, namespace, name)
        monitor = Monitor(redis_client)
        for i in range(3):
            producer.conn.send(f"/queue/{name}", f"m{i}")
        received = consumer.messages(3)
        commands = monitor.stop()
        assert [m.body for m in received] == [b"m0", b"m1", b"m2"]
        key = f"{{q:{name}}}"
        assert calls_of(commands, "receive", key) == []
        published = [c for c in commands if c["command"].startswith("PUBLISH") and ":wake:" in c["command"]]
        assert published and all(c["client_type"] == "lua" for c in published)
        for m in received:  # client-individual: each acked by the client as before
            consumer.conn.ack(m.headers["message-id"], m.headers["subscription"])
    finally:
        producer.close()
        consumer.close()


def test_a_gateway_killed_between_the_push_and_the_socket_write_loses_nothing(
        two_gateways, redis_client, gateway_data):
    namespace = gateway_data[1]
    doomed, survivor = two_gateways
    name = f"push.{uuid.uuid4().hex[:8]}"
    held = Client(doomed.port).connect()
    other = Client(survivor.port).connect()
    try:
        held.receipt(held.conn.subscribe, f"/queue/{name}", id="s", ack="auto")
        wait_armed(redis_client, namespace, name)
        os.kill(doomed.process.pid, signal.SIGSTOP)  # it can take nothing from its sockets now
        other.conn.send(f"/queue/{name}", "caught", headers={"persistent": "true"})
        # the send's script pushed it: in flight with the stopped gateway's consumer, nothing pending
        key = f"{namespace}:{{q:{name}}}"
        deadline = time.monotonic() + 5
        while redis_client.hlen(f"{key}:inflight") < 1:
            assert time.monotonic() < deadline, "the message was never dispatched"
            time.sleep(0.02)
        assert redis_client.zcard(f"{key}:pending") == 0
        assert held.silent(0.3)
        doomed.kill()  # SIGKILL while stopped: the push is never written
        other.receipt(other.conn.subscribe, f"/queue/{name}", id="s", ack="client-individual")
        (again,) = other.messages(1, timeout=2 * TWO_GATEWAYS_LEASE_MS / 1000 + 3)
        assert again.body == b"caught" and again.headers["redelivered"] == "true"
    finally:
        other.close()
        held.close()
