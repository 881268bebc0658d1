"""`manage.py signalbox_job`: a maintenance job run once by hand, on one destination or all; clear errors
for an unknown job or destination, which change nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from broker_core import maintenance
from broker_core.broker import Broker
from broker_core.messages import Message
from broker_core.model import ConsumerSpec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def broker(api_namespace, redis_client) -> Broker:
    return Broker(redis_client, api_namespace)


def run(*args: str) -> list[str]:
    out = StringIO()
    call_command("signalbox_job", *args, stdout=out)
    return out.getvalue().splitlines()


def test_list_describes_every_job(api_namespace):
    lines = run("--list")
    assert [line.split()[0] for line in lines] == ["recover", "expire", "slow", "tick"]
    assert all(len(line.split(None, 1)[1]) > 20 for line in lines)


def test_expire_sweeps_the_named_destination_now_whatever_its_period(broker):
    broker.policies.set_entry("queue", "orders", {"expireMessagesPeriod": 0})  # sweeps are off
    soon = broker.clock.now_ms() + 50
    broker.send("orders", [Message(body="old", expiration=soon), Message(body="fresh")])
    broker.send("billing", Message(body="old", expiration=soon))
    time.sleep(0.1)

    (line,) = run("expire", "--destination", "queue://orders")

    uri, job, result = line.split(" ", 2)
    assert (uri, job) == ("queue://orders", "expire:")
    assert json.loads(result) == {"ran": True, "pages": 1, "examined": 2, "expired": 1, "cycle_done": True}
    assert broker.stats("orders").queue_size == 1
    assert maintenance.job_status(broker, "billing")["expire"] == {}  # only the named destination


def test_recover_without_a_destination_runs_on_every_destination_and_reaps_lapsed_consumers(broker):
    broker.send("orders", Message(body="m"))
    broker.send("billing", Message(body="m"))
    lapsing = broker.add_consumer("orders", ConsumerSpec(lease_ms=1000, ack_mode="client-individual"))
    assert broker.receive(lapsing, 1)
    time.sleep(1.05)  # past the shortest lease

    lines = run("recover")

    results = {line.split(" ", 1)[0]: json.loads(line.split(" ", 2)[2]) for line in lines}
    assert set(results) == {"queue://billing", "queue://orders"}
    assert results["queue://orders"]["reaped"] == [lapsing.consumer_id]
    assert broker.stats("orders").pending == 1  # back in the queue for the next consumer


def test_unknown_job_is_refused_naming_the_jobs(broker):
    with pytest.raises(CommandError, match=r"unknown job 'sweep': the jobs are recover, expire, slow, tick"):
        run("sweep")


def test_unknown_or_invalid_destination_is_refused_and_changes_nothing(broker, api_namespace):
    broker.send("orders", Message(body="m"))
    with pytest.raises(CommandError, match=rf"no destination queue://nowhere in namespace '{api_namespace}'"):
        run("expire", "-d", "nowhere")
    with pytest.raises(CommandError, match=r"invalid destination 'queue://bad name'"):
        run("expire", "-d", "queue://bad name")
    assert broker.destinations() == ["queue://orders"]


def test_the_command_line_exits_non_zero_with_the_reason(api_namespace):
    env = {**os.environ, "SIGNALBOX_NAMESPACE": api_namespace}
    done = subprocess.run([sys.executable, "manage.py", "signalbox_job", "expire", "-d", "nowhere"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "CommandError: no destination queue://nowhere" in done.stderr
