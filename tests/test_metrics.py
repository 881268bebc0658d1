"""GET /metrics (docs/metrics.md): scraped from a real gateway process (uvicorn + the project's ASGI app)
over HTTP, parsed with prometheus_client's own parser, checked against state made through broker_core on
the session's real Redis; the access rules; the scrape's bounded Redis work at a few thousand
destinations."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from broker_core.broker import AsyncBroker, Broker
from broker_core.messages import Message
from broker_core.model import ConsumerSpec

TOKEN = "m" * 24


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.helpers.gateway_server import prepare_database, start_gateway

    data_dir = tmp_path_factory.mktemp("metrics")
    namespace = f"t{uuid.uuid4().hex[:12]}"
    prepare_database(data_dir, namespace)
    gateway = start_gateway(data_dir, namespace, SIGNALBOX_METRICS_TOKEN=TOKEN)
    gateway.namespace = namespace
    yield gateway
    gateway.stop()
    assert "Traceback" not in gateway.output(), gateway.output()


@pytest.fixture
def broker(server, redis_client):
    b = Broker(redis_client, server.namespace)
    yield b
    b.close()


def scrape(server, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.get(f"http://127.0.0.1:{server.port}/metrics", headers=headers, timeout=30)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of an exposition, parsed by prometheus_client."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def families(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def of(parsed: dict, metric: str, **labels: str) -> float:
    return parsed[(metric, tuple(sorted(labels.items())))]


def test_refused_without_the_token(server):
    missing = scrape(server, None)
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert "SIGNALBOX_METRICS_TOKEN" in missing.text
    wrong = scrape(server, TOKEN + "x")
    assert wrong.status_code == 401
    # an API token (alice is a superuser) is not the metrics token
    from tests.helpers.gateway_server import ALICE_TOKEN

    assert scrape(server, ALICE_TOKEN).status_code == 401
    assert scrape(server).status_code == 200


@pytest.mark.e2e
def test_a_token_setting_with_a_line_end_still_answers(tmp_path):
    """SIGNALBOX_METRICS_TOKEN filled from a file (a Kubernetes secret, `echo $token > file`) keeps the line
    end; Prometheus trims its credentials_file. Whitespace around the setting is no part of the token."""
    from tests.helpers.gateway_server import prepare_database, running_gateway

    namespace = f"t{uuid.uuid4().hex[:12]}"
    prepare_database(tmp_path, namespace)
    with running_gateway(tmp_path, namespace, "metrics-token",
                         SIGNALBOX_METRICS_TOKEN=f" {TOKEN}\n") as gateway:
        assert scrape(gateway).status_code == 200
        assert scrape(gateway, TOKEN + "x").status_code == 401


@pytest.mark.parametrize("token", ["", "short"])
def test_metrics_are_off_until_a_token_is_set(token, settings):
    """No token setting (or one too short to be a secret): 403 saying how to turn metrics on."""
    from django.test import Client

    from signalbox.settings import metrics_off

    settings.SIGNALBOX_METRICS_TOKEN = token
    response = Client().get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 403
    assert response.content.decode() == metrics_off(token) + "\n"
    assert ("it needs at least 16" if token else "set SIGNALBOX_METRICS_TOKEN") in response.content.decode()


def test_the_launcher_says_at_start_whether_metrics_answer(caplog):
    """`run` says it once, with the endpoint's own words: a too-short token is a WARNING."""
    import logging

    from django.test import override_settings

    from signalbox.launcher import Launcher

    caplog.set_level(logging.INFO, logger="signalbox.launcher")
    for token, level, words in (("", "INFO", "metrics are off: set SIGNALBOX_METRICS_TOKEN"),
                                ("short", "WARNING", "has 5 characters, it needs at least 16"),
                                ("s" * 16, "INFO", "metrics at http://h:1/metrics")):
        caplog.clear()
        with override_settings(SIGNALBOX_METRICS_TOKEN=token):
            Launcher.report_metrics(None, "h:1")  # type: ignore[arg-type]  (it reads no launcher state)
        [record] = caplog.records
        assert (record.levelname, words in record.getMessage()) == (level, True), record.getMessage()


def test_metrics_answer_get_only(server):
    answer = httpx.post(f"http://127.0.0.1:{server.port}/metrics",
                        headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert answer.status_code == 405


def test_destination_figures_match_the_broker(server, broker):
    queue = f"q{uuid.uuid4().hex[:8]}"
    old = f"old{uuid.uuid4().hex[:8]}"
    ids = broker.send(queue, [Message(body=f"m{i}") for i in range(7)])
    consumer = broker.add_consumer(queue, ConsumerSpec(prefetch=5, ack_mode="client-individual"))
    delivered = broker.receive(consumer, max_messages=5)
    assert [d.message_id for d in delivered] == ids[:5]
    broker.ack(consumer, [d.message_id for d in delivered[:3]])
    broker.nack(consumer, delivered[3].message_id, poison=True)  # to the DLQ
    now = broker.clock.now_ms()
    broker.send(old, [Message(body="a", timestamp=now - 90_000), Message(body="b", timestamp=now - 30_000)])

    response = scrape(server)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    parsed = samples(response.text)
    types = families(response.text)
    stats = broker.stats(queue)
    q = {"destination": f"queue://{queue}"}
    assert of(parsed, "signalbox_destination_queue_size", **q) == 3 == stats.queue_size
    # the acks made room: the consumer (prefetch 5) now holds the other 3
    assert stats.pending == 0
    assert of(parsed, "signalbox_destination_in_flight", **q) == 3 == stats.in_flight
    assert of(parsed, "signalbox_destination_consumers", **q) == 1
    assert of(parsed, "signalbox_destination_enqueued_total", **q) == 7
    assert of(parsed, "signalbox_destination_dispatched_total", **q) == stats.dispatched >= 5
    assert of(parsed, "signalbox_destination_dequeued_total", **q) == stats.dequeued >= 3
    assert of(parsed, "signalbox_destination_dead_lettered_total", **q) == 1
    assert of(parsed, "signalbox_destination_expired_total", **q) == 0
    assert of(parsed, "signalbox_destination_memory_bytes", **q) == stats.memory_usage > 0
    assert of(parsed, "signalbox_destination_enqueued_total", destination="queue://ActiveMQ.DLQ") >= 1
    for name in ("enqueued", "dequeued", "dispatched", "expired", "dead_lettered"):
        assert types[f"signalbox_destination_{name}"] == "counter"
    assert types["signalbox_destination_queue_size"] == "gauge"
    # the oldest waiting message is the one stamped 90 s ago; a queue with none waiting shows 0
    age = of(parsed, "signalbox_destination_oldest_message_age_seconds", destination=f"queue://{old}")
    assert 90 <= age < 120
    broker.close_consumer(consumer)
    drained = broker.add_consumer(old, ConsumerSpec(prefetch=10, ack_mode="client-individual"))
    broker.ack(drained, [d.message_id for d in broker.receive(drained, max_messages=10)])
    again = samples(scrape(server).text)
    assert of(again, "signalbox_destination_oldest_message_age_seconds", destination=f"queue://{old}") == 0
    assert of(again, "signalbox_destination_queue_size", destination=f"queue://{old}") == 0
    assert of(again, "signalbox_redis_up") == 1
    assert of(again, "signalbox_redis_memory_used_bytes") > 0


def test_dequeued_counts_every_way_out_and_says_so(server, broker):
    """ActiveMQ's DequeueCount, which signalbox_destination_dequeued_total is, counts every message that
    left: a purge of a million messages is a million dequeues. Its HELP and the dashboard's panel say so,
    rather than calling it acknowledgements (where a purge would read as a burst of consumption)."""
    from pathlib import Path

    queue = f"deq{uuid.uuid4().hex[:8]}"
    broker.send(queue, [Message(body=f"m{i}") for i in range(4)])
    consumer = broker.add_consumer(queue, ConsumerSpec(prefetch=0, ack_mode="client-individual"))
    broker.ack(consumer, [d.message_id for d in broker.receive(consumer, max_messages=1)])
    broker.close_consumer(consumer)
    broker.purge(queue)
    text = scrape(server).text
    parsed = samples(text)
    q = {"destination": f"queue://{queue}"}
    assert of(parsed, "signalbox_destination_dequeued_total", **q) == 4 == broker.stats(queue).dequeued
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "signalbox_destination_dequeued"]
    assert "acknowledged" in family.documentation and "purged" in family.documentation, family.documentation
    dashboard = json.loads((Path(__file__).parents[1] / "docs" / "grafana-dashboard.json").read_text())
    [title] = [panel["title"] for panel in dashboard["panels"]
               if "signalbox_destination_dequeued_total" in json.dumps(panel.get("targets", []))]
    assert title.startswith("Dequeued"), title


def test_topic_figures_with_a_durable_subscription_backlog(server, broker):
    """A topic's figures add up its subscriptions (topic_summary_many): an offline durable subscription's
    backlog is its pending, which the scrape shows as the queue size's counterpart is 0 (ActiveMQ's
    QueueSize of a topic); a name that needs escaping in the text format comes through the parser whole."""
    topic = f'prices"{uuid.uuid4().hex[:6]}\\eu'  # a double quote and a backslash: escaped in the text
    uri = f"topic://{topic}"
    ledger = broker.add_consumer(uri, ConsumerSpec(client_id="billing", subscription_name="ledger"))
    broker.close_consumer(ledger)  # offline: it keeps what is sent from now on
    live = broker.add_consumer(uri, ConsumerSpec(prefetch=2, ack_mode="client-individual"))
    broker.send(uri, [Message(body=str(i)) for i in range(40)])
    got = broker.receive(live, 2)
    broker.ack(live, got[0].message_id)
    stats = broker.stats(uri)
    assert next(s for s in stats.subscriptions if s.durable).pending == 40

    parsed = samples(scrape(server).text)
    t = {"destination": uri}
    assert of(parsed, "signalbox_destination_queue_size", **t) == 0 == stats.queue_size
    assert of(parsed, "signalbox_destination_consumers", **t) == 2
    # its subscriptions' backlog: the durable one's 40 and the live one's 37 (the ack made room for a third
    # in its window of 2). The console's Pending column of a topic is pending + in flight, from the same
    # AsyncBroker.summaries.
    assert of(parsed, "signalbox_destination_in_flight", **t) == stats.in_flight == 2
    assert of(parsed, "signalbox_destination_pending", **t) == stats.pending == 40 + 37
    assert of(parsed, "signalbox_destination_enqueued_total", **t) == 40 == stats.enqueued
    assert of(parsed, "signalbox_destination_dispatched_total", **t) == stats.dispatched == 3
    assert of(parsed, "signalbox_destination_dequeued_total", **t) == stats.dequeued == 1
    assert of(parsed, "signalbox_destination_memory_bytes", **t) == stats.memory_usage > 0
    assert ("signalbox_destination_oldest_message_age_seconds", (("destination", uri),)) not in parsed
    broker.close_consumer(live)


def test_the_fast_writer_is_generate_latest_byte_for_byte():
    """exposition() writes the per-destination lines itself (signalbox/metrics.py says why): for the same
    snapshot it is exactly prometheus_client's generate_latest, label values needing escapes included."""
    from prometheus_client import generate_latest

    from broker_core.model import DestinationSummary
    from signalbox.metrics import BrokerCollector, Snapshot, exposition

    names = ["queue://plain", 'queue://qu"ote', "queue://back\\slash", "topic://üñí.çødé", "queue://nl\nx",
             "topic://big"]
    rows = [DestinationSummary(n, i * 1_000_003, i, 2, 3, 4, 5, 6 + i, 7, 8, 9, 10, False, 12_345_678_901 * i,
                               None if i % 2 else 90_000 - i) for i, n in enumerate(names)]
    snapshot = Snapshot(now_ms=100_000, redis_up=True, redis_memory={"used": 1, "peak": 2, "max": 0},
                        registered=len(names), summaries=rows, limit=10, tick={"status": "ok", "age_ms": 5},
                        redis={"clients": {"connected": 3}, "ops_per_second": 7,
                               "aof": {"enabled": True, "last_write_status": "ok"}},
                        processes={"running": {"web": 1, "worker": 0}})
    text = exposition(snapshot)
    assert text == generate_latest(BrokerCollector(snapshot))
    parsed = samples(text.decode())
    assert of(parsed, "signalbox_destination_enqueued_total", destination='queue://qu"ote') == 7
    assert of(parsed, "signalbox_destination_memory_bytes", destination="topic://big") == 12_345_678_901 * 5
    age = of(parsed, "signalbox_destination_oldest_message_age_seconds", destination="queue://nl\nx")
    assert age == 10.004


def test_oldest_age_with_priority_bands(server, broker):
    """With prioritizedMessages the head of the queue is the highest priority; the oldest message may wait
    in a lower band."""
    queue = f"prio{uuid.uuid4().hex[:8]}"
    broker.policies.set_entry("queue", queue, {"prioritizedMessages": True})
    now = broker.clock.now_ms()
    broker.send(queue, [Message(body="low", priority=1, timestamp=now - 200_000),
                        Message(body="high", priority=9, timestamp=now - 5_000)])
    parsed = samples(scrape(server).text)
    age = of(parsed, "signalbox_destination_oldest_message_age_seconds", destination=f"queue://{queue}")
    assert 200 <= age < 230


def test_oldest_age_of_a_message_too_large_to_read_is_unknown_not_a_stall(server, broker):
    """The timestamp is inside the message: a page reads at most 1 MiB of them (summary_many.lua
    OLDEST_BYTES). A queue headed by a larger message shows no age (unknown), counted, and its other
    figures as usual. (Such a message is over the default maxMessageSize: its queue's policy raises it.)"""
    queue = f"huge{uuid.uuid4().hex[:8]}"
    broker.policies.set_entry("queue", queue, {"maxMessageSize": 2 * 1024 * 1024})
    broker.refresh_policies()
    broker.send(queue, [Message(body="x" * (1536 * 1024)), Message(body="small")])
    parsed = samples(scrape(server).text)
    q = {"destination": f"queue://{queue}"}
    assert ("signalbox_destination_oldest_message_age_seconds", (("destination", q["destination"]),)) \
        not in parsed
    assert of(parsed, "signalbox_metrics_oldest_unknown") >= 1
    assert of(parsed, "signalbox_destination_queue_size", **q) == 2


def test_maintenance_tick_figures(server, broker):
    """The tick as /healthz judges it: before any tick, not ok and no age; after one, its figures."""
    from broker_core import maintenance

    if not maintenance.last_tick(broker):  # (another test of this module may have run one)
        parsed = samples(scrape(server).text)
        assert of(parsed, "signalbox_maintenance_tick_ok") == 0
        assert not any(name == "signalbox_maintenance_tick_age_seconds" for name, _ in parsed)
    report = maintenance.run_due(broker)
    parsed = samples(scrape(server).text)
    assert of(parsed, "signalbox_maintenance_tick_ok") == 1
    assert 0 <= of(parsed, "signalbox_maintenance_tick_age_seconds") < 15
    assert of(parsed, "signalbox_maintenance_tick_destinations") == report.destinations
    assert of(parsed, "signalbox_maintenance_tick_errors") == len(report.errors) == 0


def test_the_dashboard_uses_only_exposed_metrics(server, broker):
    """docs/grafana-dashboard.json: valid JSON, and every signalbox_ metric it queries is in a scrape."""
    import re
    from pathlib import Path

    from broker_core import maintenance

    maintenance.run_due(broker)  # so the tick's figures are there
    broker.send(f"dash{uuid.uuid4().hex[:6]}", Message(body="x"))
    dashboard = json.loads((Path(__file__).parents[1] / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    used = {name for e in exprs for name in re.findall(r"\bsignalbox_[a-z_]+", e)}
    assert len(used) >= 15
    # what an operator looks at first when something is wrong: a role with no process running (the worker,
    # the STOMP listener), and Redis refusing writes after a failed append-only-file write
    assert {"signalbox_processes_running", "signalbox_redis_aof_last_write_ok"} <= used, used
    scrape(server)  # (a histogram's _bucket samples appear once a request was timed: this one, run alone)
    text = scrape(server).text
    parsed = list(text_string_to_metric_families(text))
    # (a labelled counter no process has counted yet has its family but no sample)
    exposed = {s.name for f in parsed for s in f.samples} | {
        f.name + ("_total" if f.type == "counter" else "") for f in parsed}
    assert used <= exposed, used - exposed
    documented = (Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
    for family in parsed:
        if family.name.startswith("signalbox_"):
            assert f"`{family.name}" in documented, family.name


# Grafana units a panel may give a per-second rate (docs/grafana-dashboard.json uses the first two)
PER_SECOND_UNITS = {"ops", "reqps", "cps"}
_SELECTOR = r"\b(signalbox_[a-z_]+|scrape_duration_seconds)\b(?:\{([^}]*)\})?"


def _expected_unit(expr: str) -> str:
    """The unit a query's values have, from Prometheus's naming rules: a rate is per second, a quantile of
    a _seconds histogram and a _seconds gauge are seconds, a _bytes gauge bytes, anything else a count."""
    import re

    if expr.startswith("histogram_quantile("):
        return "s"
    if re.search(r"\b(rate|irate)\(", expr):
        return "per second"
    [unit] = {"s" if name.endswith("_seconds") else "bytes" if name.endswith("_bytes") else "short"
              for name in (m.group(1) for m in re.finditer(_SELECTOR, expr))}  # (a sum: of one unit)
    return unit


def test_the_dashboard_queries_labels_the_scrape_has_rates_counters_and_shows_their_units(server, broker):
    """Each query of docs/grafana-dashboard.json against a real scrape: the labels it selects, groups by
    or names in its legend are labels of its metrics (`job` is Prometheus's own); rate() is over counters
    (or a histogram's cumulative series) only; each series is drawn in its metric's unit (a panel mixing
    seconds and counts gives the counts their own unit by an override)."""
    import re
    from pathlib import Path

    from websockets.sync.client import connect

    from broker_core import maintenance

    maintenance.run_due(broker)
    broker.send(f"units{uuid.uuid4().hex[:6]}", Message(body="x"))
    with connect(f"ws://127.0.0.1:{server.port}/ws/v1") as ws:  # a frame counted: its labels in the scrape
        ws.send(json.dumps({"type": "teleport", "id": 1}))
        ws.recv(5)
    scrape(server)
    parsed = list(text_string_to_metric_families(scrape(server).text))
    labels: dict[str, set[str]] = {}
    for family in parsed:
        for s in family.samples:
            labels.setdefault(s.name, set()).update(s.labels)
    counters = {s.name for f in parsed if f.type in ("counter", "histogram") for s in f.samples
                if not s.name.endswith("_created")}
    dashboard = json.loads((Path(__file__).parents[1] / "docs" / "grafana-dashboard.json").read_text())
    wrong = []
    for panel in dashboard["panels"]:
        config = panel.get("fieldConfig", {})
        for target in panel.get("targets", []):
            expr, where = target["expr"], f"{panel['title']!r} {target['refId']}"
            names = [m.group(1) for m in re.finditer(_SELECTOR, expr) if m.group(1).startswith("signalbox_")]
            have = set.intersection(*(labels.get(n, set()) for n in names)) if names else set()
            asked = {lab for m in re.finditer(_SELECTOR, expr)
                     for lab in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", m.group(2) or "")}
            asked |= {lab.strip() for group in re.findall(r"\bby \(([^)]*)\)", expr)
                      for lab in group.split(",")}
            asked |= set(re.findall(r"\{\{(\w+)\}\}", target.get("legendFormat", "")))
            if names and asked - have - {"job"}:
                wrong.append(f"{where}: labels {sorted(asked - have - {'job'})} not on {names}")
            for inner in re.findall(r"\b(?:rate|irate|increase)\((\w+)", expr):
                if inner not in counters:
                    wrong.append(f"{where}: rate() of {inner}, not a counter")
            overridden = [p["value"] for o in config.get("overrides", [])
                          if o["matcher"] == {"id": "byFrameRefID", "options": target["refId"]}
                          for p in o["properties"] if p["id"] == "unit"]
            unit = overridden[0] if overridden else config.get("defaults", {}).get("unit")
            expected = _expected_unit(expr)
            if not (unit in PER_SECOND_UNITS if expected == "per second" else unit == expected):
                wrong.append(f"{where}: drawn in {unit!r}, its values are {expected!r}")
    for variable in dashboard["templating"]["list"]:  # label_values(<metric>{...}, <label>)
        if variable["type"] == "query" and variable["name"] != "job":
            metric, label = re.fullmatch(r"label_values\((\w+)(?:\{[^}]*\})?, (\w+)\)",
                                         variable["query"]["query"]).groups()
            if label not in labels.get(metric, set()):
                wrong.append(f"variable {variable['name']}: no label {label} on {metric}")
    assert wrong == [], "\n".join(wrong)


def test_the_dashboard_shows_the_job_it_is_set_to():
    """docs/grafana-dashboard.json has a Job selector (two deployments scraped by one Prometheus are two
    jobs): every series a panel or the Destination list reads is of the chosen job, not of all of them
    (where two deployments' queue://orders would be summed into one line)."""
    import re
    from pathlib import Path

    dashboard = json.loads((Path(__file__).parents[1] / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"]
              if v["type"] == "query" and v["name"] != "job"]
    selectors = [(e, m) for e in exprs for m in re.finditer(r"\b(signalbox_[a-z_]+|scrape_duration_seconds)"
                                                            r"(\{[^}]*\})?", e)]
    assert len(selectors) >= 25
    unfiltered = [e for e, m in selectors if 'job=~"$job"' not in (m.group(2) or "")]
    assert unfiltered == [], unfiltered


def test_requests_and_frames_are_counted_by_route_and_command(server, broker):
    from websockets.sync.client import connect

    from tests.helpers.gateway_server import ALICE_TOKEN

    queue = f"h{uuid.uuid4().hex[:8]}"
    before = samples(scrape(server).text)
    api = {"Authorization": f"Token {ALICE_TOKEN}"}
    base = f"http://127.0.0.1:{server.port}"
    with httpx.Client(base_url=base, headers=api, timeout=10) as client:
        for _ in range(3):  # the first through Django, the next on the hot path (token now cached)
            assert client.post(f"/api/v1/queues/{queue}/messages", json={"body": "x"}).status_code == 201
        assert client.get("/no/such/page").status_code == 404
        assert client.get(f"/api/v1/queues/{queue}").status_code == 200
    with connect(f"ws://127.0.0.1:{server.port}/ws/v1") as ws:
        ws.send(json.dumps({"type": "connect", "login": "alice", "passcode": "secret", "id": 1}))
        assert json.loads(ws.recv(5))["type"] == "ok"
        ws.send(json.dumps({"type": "send", "destination": queue, "message": {"body": "j"}, "id": 2}))
        assert json.loads(ws.recv(5))["type"] == "ok"
        ws.send(json.dumps({"type": "teleport", "id": 3}))
        assert json.loads(ws.recv(5))["code"] == "unknown_type"
    with connect(f"ws://127.0.0.1:{server.port}/stomp", subprotocols=["v12.stomp"]) as ws:
        ws.send("CONNECT\naccept-version:1.2\nhost:localhost\nlogin:alice\npasscode:secret\n\n\x00")
        assert ws.recv(5).startswith("CONNECTED")
        ws.send(f"SEND\ndestination:/queue/{queue}\nreceipt:r1\n\nhello\x00")
        assert ws.recv(5).startswith("RECEIPT")
        ws.send("SUBSCRIBE\nid:0\n\n\x00")  # no destination: refused with an ERROR
        assert ws.recv(5).startswith("ERROR")
    after = samples(scrape(server).text)
    assert broker.stats(queue).enqueued == 5

    def delta(metric: str, **labels: str) -> float:
        key = (metric, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert delta("signalbox_http_requests_total", route="api-messages", method="POST", status="201") == 3
    assert delta("signalbox_http_requests_total", route="unmatched", method="GET", status="404") == 1
    assert delta("signalbox_http_requests_total", route="api-destination", method="GET", status="200") == 1
    assert delta("signalbox_http_request_duration_seconds_count", route="api-messages", method="POST") == 3
    assert delta("signalbox_http_request_duration_seconds_bucket", route="api-messages", method="POST",
                 le="+Inf") == 3
    # the scrape before this one is counted too
    assert delta("signalbox_http_requests_total", route="metrics", method="GET", status="200") == 1
    assert delta("signalbox_ws_frames_total", protocol="json", command="connect", outcome="ok") == 1
    assert delta("signalbox_ws_frames_total", protocol="json", command="send", outcome="ok") == 1
    assert delta("signalbox_ws_frames_total", protocol="json", command="unknown", outcome="error") == 1
    assert delta("signalbox_ws_frames_total", protocol="stomp", command="CONNECT", outcome="ok") == 1
    assert delta("signalbox_ws_frames_total", protocol="stomp", command="SEND", outcome="ok") == 1
    assert delta("signalbox_ws_frames_total", protocol="stomp", command="SUBSCRIBE", outcome="error") == 1



class _Monitor:
    """The commands clients send to Redis (MONITOR; what scripts run inside is not counted), until
    `stop()`, which sends a marker and waits for it."""

    def __init__(self, url: str) -> None:
        import threading

        self.url, self.marker = url, f"end-{uuid.uuid4().hex}"
        self.commands: list[list[str]] = []
        self.client = redis.Redis.from_url(url)
        self.monitor = self.client.monitor().__enter__()
        self.thread = threading.Thread(target=self._listen, daemon=True)
        self.thread.start()

    def _listen(self) -> None:
        for entry in self.monitor.listen():
            if self.marker in entry["command"]:
                return
            if entry.get("client_type") != "lua":
                words = entry["command"].split(" ", 4)
                self.commands.append([words[0].upper(), *words[1:4]])

    def stop(self) -> list[list[str]]:
        redis.Redis.from_url(self.url).echo(self.marker)
        self.thread.join(10)
        self.monitor.__exit__()
        self.client.close()
        return self.commands


@pytest.mark.e2e
def test_scrape_of_thousands_of_destinations_is_a_few_bounded_calls(server, broker, redis_url):
    from signalbox.metrics import PAGE

    prefix = f"bulk{uuid.uuid4().hex[:6]}"
    for i in range(2000):
        broker.send(f"{prefix}.{i}", Message(body="x"))
    for i in range(1000):  # topics with an offline durable subscription holding a message
        uri = f"topic://{prefix}.t{i}"
        spec = ConsumerSpec(client_id=f"{prefix}{i}", subscription_name="s")
        broker.close_consumer(broker.add_consumer(uri, spec))
        broker.send(uri, Message(body="t"))
    scrape(server)  # warm: the script is loaded, the process's imports done
    started = time.perf_counter()
    scrape(server)
    elapsed = time.perf_counter() - started
    def registry() -> list[str]:
        return [n.decode() for n in broker.redis.zrange(broker.ops.registry_key, 0, -1)]

    for _attempt in range(3):  # (another process may add or drop a destination meanwhile: scrape again)
        before = registry()
        monitor = _Monitor(redis_url)  # (MONITOR slows Redis down: not during the timed scrape)
        response = scrape(server)
        commands = monitor.stop()
        names = registry()
        if names == before:
            break
    parsed = samples(response.text)
    registered = int(of(parsed, "signalbox_destinations"))
    assert registered >= 3000
    pages = math.ceil(registered / PAGE)
    assert of(parsed, "signalbox_metrics_pages") == pages
    assert of(parsed, "signalbox_destination_enqueued_total", destination=f"queue://{prefix}.1999") == 1
    assert of(parsed, "signalbox_destination_pending", destination=f"topic://{prefix}.t999") == 1
    # the pages as the scrape cut the registry: one summary_many call per page with queues, one
    # topic_summary_many per page with topics (a subscription each: within one call's budget), each over
    # at most PAGE destinations (FCALL, or EVALSHA on a server without functions), and a fixed few others
    # whatever the count: five INFO sections and CONFIG GET appendfsync, ZREVRANGE of the processes'
    # heartbeats and one HGETALL per process (here the gateway's own), ZCARD and ZRANGE of the registry,
    # the tick's HGETALL and its new connection's set-up (HELLO, CLIENT SETINFO). (Each call's duration is
    # measured by bench/metrics_scrape.py and bench/adversarial.py: SLOWLOG on a shared test machine says
    # more about the machine.) The gateway's heartbeat may write meanwhile: not the scrape's.
    commands = [c for c in commands if not (c[0] in ("HSET", "EXPIRE", "ZADD", "ZREMRANGEBYSCORE",
                                                     "ZREMRANGEBYRANK") and ":node:process" in c[1])]
    chunks = [names[i:i + PAGE] for i in range(0, len(names), PAGE)]
    # (a queue headed by a message too large for a page's oldest lookup is asked again alone: the one
    # test_oldest_age_of_a_message_too_large_to_read... left, if it ran first)
    scripts = [c for c in commands if c[0] in ("EVALSHA", "FCALL") and not (
        c[2] == "1" and "{q:huge" in c[3].strip('"'))]
    queue_calls = [c for c in scripts if c[1].endswith("_summary_many") and "topic" not in c[1]]
    topic_calls = [c for c in scripts if c[1].endswith("_topic_summary_many")]
    if commands[0][0] == "FCALL":  # (by EVALSHA the script is a hash: told apart by count only)
        assert len(queue_calls) == sum(any(n.startswith("queue://") for n in c) for c in chunks)
        assert len(topic_calls) == sum(any(n.startswith("topic://") for n in c) for c in chunks)
    assert len(scripts) == sum(any(n.startswith("queue://") for n in c) + any(n.startswith("topic://")
                                                                          for n in c) for c in chunks), \
        [c[:4] for c in scripts if c[2] == "1"]  # (calls about one destination: which queue was asked alone)
    assert all(int(c[2]) <= PAGE for c in scripts)
    others = [c for c in commands if c[0] not in ("EVALSHA", "FCALL")]
    assert len(others) <= 18, others
    # (20,000 take well under 1 s on an idle machine: bench/metrics_scrape.py, docs/benchmarks.md; the
    # bound here leaves room for a machine busy with other work, and still catches a scrape gone linear
    # in Redis round trips or worse)
    assert elapsed < 2.0, f"scrape of {registered} destinations took {elapsed:.2f}s"


def test_gather_pages_and_limit(redis_url, namespace):
    """broker_core's summaries in pages of `page`; past the limit destinations are counted, not read."""
    from signalbox.metrics import BrokerCollector, gather

    sync = Broker(redis.Redis.from_url(redis_url), namespace)
    for i in range(30):
        sync.send(f"limit.{i:02d}", Message(body="x" * (i + 1)))
    sync.close()

    async def run():
        client = redis.asyncio.Redis.from_url(redis_url)
        broker = AsyncBroker(client, namespace)
        try:
            return await gather(broker, client, limit=10, page=4)
        finally:
            await broker.aclose()
            await client.aclose()

    snapshot = asyncio.run(run())
    assert snapshot.redis_up and snapshot.registered == 30 and snapshot.pages == 3
    assert [s.destination for s in snapshot.summaries] == [f"queue://limit.{i:02d}" for i in range(10)]
    from prometheus_client import generate_latest

    parsed = samples(generate_latest(BrokerCollector(snapshot)).decode())
    assert of(parsed, "signalbox_metrics_destinations_omitted") == 20
    assert of(parsed, "signalbox_metrics_destinations_limit") == 10
    assert ("signalbox_destination_queue_size", (("destination", "queue://limit.10"),)) not in parsed


def test_unreachable_redis_is_a_figure_not_a_failure():
    from prometheus_client import generate_latest

    from signalbox.embedded_redis import free_port
    from signalbox.metrics import BrokerCollector, gather

    async def run():
        client = redis.asyncio.Redis.from_url(f"redis://127.0.0.1:{free_port()}", socket_connect_timeout=0.5)
        try:
            return await gather(AsyncBroker(client, "nowhere"), client)
        finally:
            await client.aclose()

    snapshot = asyncio.run(run())
    assert not snapshot.redis_up and "ConnectionError" in snapshot.redis_error
    parsed = samples(generate_latest(BrokerCollector(snapshot)).decode())
    assert of(parsed, "signalbox_redis_up") == 0
    assert not any(name.startswith("signalbox_destination_") for name, _ in parsed)


@pytest.mark.e2e
def test_several_web_processes_are_summed_with_a_multiprocess_folder(tmp_path, namespace):
    """uvicorn --workers 2 with PROMETHEUS_MULTIPROC_DIR: whichever process answers the scrape, the
    request counters are the sum over both processes."""
    import subprocess
    import sys

    from signalbox.embedded_redis import free_port
    from tests.helpers.gateway_server import ROOT, GatewayServer, server_env, wait_listening

    folder = tmp_path / "prometheus"
    folder.mkdir()
    port = free_port()
    log_path = tmp_path / "uvicorn.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "signalbox.asgi:application", "--host", "127.0.0.1", "--port",
             str(port), "--workers", "2", "--lifespan", "off", "--log-level", "warning", "--no-access-log"],
            cwd=ROOT, env=server_env(tmp_path, namespace, SIGNALBOX_METRICS_TOKEN=TOKEN,
                                     PROMETHEUS_MULTIPROC_DIR=str(folder)),
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    server = wait_listening(GatewayServer(process, port, log_path))
    try:
        deadline = time.monotonic() + 30
        while len({p.name.rsplit("_", 1)[-1] for p in folder.glob("counter_*.db")}) < 2:
            # new connections until both processes have answered one (the kernel picks the process)
            assert time.monotonic() < deadline, "one process never answered"
            httpx.get(f"http://127.0.0.1:{port}/no/such/page", timeout=10)
        before = samples(scrape(server).text)
        for _ in range(20):
            assert httpx.get(f"http://127.0.0.1:{port}/no/such/page", timeout=10).status_code == 404
        for _ in range(4):  # any process's answer has the same sum
            after = samples(scrape(server).text)
            labels = {"method": "GET", "route": "unmatched", "status": "404"}
            assert of(after, "signalbox_http_requests_total", **labels) - of(
                before, "signalbox_http_requests_total", **labels) == 20
            assert of(after, "signalbox_redis_up") == 1
    finally:
        server.stop()
    assert "Traceback" not in server.output(), server.output()


@pytest.mark.e2e
def test_a_clean_disconnect_over_tcp_is_counted_ok(tmp_path):
    """A STOMP client's DISCONNECT over TCP (with a receipt or not) is its clean end, counted `ok`: the
    socket's close that it causes must not count it as refused."""
    import socket

    from tests.helpers.gateway_server import own_gateway_and_listener

    folder = tmp_path / "prometheus"
    folder.mkdir()
    with own_gateway_and_listener(tmp_path, "disconnect", SIGNALBOX_METRICS_TOKEN=TOKEN,
                                  PROMETHEUS_MULTIPROC_DIR=str(folder)) as parts:
        for receipt in ("receipt:bye\n", ""):
            with socket.create_connection(("127.0.0.1", parts["listener"].port), timeout=10) as sock:
                sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\nlogin:alice\npasscode:secret\n\n\x00")
                assert sock.recv(4096).startswith(b"CONNECTED")
                sock.sendall(f"DISCONNECT\n{receipt}\n\x00".encode())
                received = b""
                while chunk := sock.recv(4096):  # until the listener closes the socket
                    received += chunk
                assert received == (b"RECEIPT\nreceipt-id:bye\n\n\x00" if receipt else b"")
        text = scrape(parts["gateway"]).text
    parsed = samples(text)
    assert of(parsed, "signalbox_ws_frames_total", protocol="stomp", command="CONNECT", outcome="ok") == 2
    help_text = {f.name: f.documentation for f in text_string_to_metric_families(text)}["signalbox_ws_frames"]
    assert "STOMP frames (over WebSocket and TCP)" in help_text, help_text
    refused = ("signalbox_ws_frames_total",
               (("command", "DISCONNECT"), ("outcome", "error"), ("protocol", "stomp")))
    assert refused not in parsed
    assert of(parsed, "signalbox_ws_frames_total", protocol="stomp", command="DISCONNECT", outcome="ok") == 2


def test_help_texts_say_what_is_counted_and_what_is_not(server):
    """A login the process's credential cache answers (the same login and passcode within
    SIGNALBOX_AUTH_CACHE_SECONDS) runs no password check and is not counted: the HELP says so, so that a
    dashboard does not read the counter as every login. A queue's consumers count its STOMP browsers."""
    from websockets.sync.client import connect

    def login() -> None:
        with connect(f"ws://127.0.0.1:{server.port}/ws/v1") as ws:
            ws.send(json.dumps({"type": "connect", "login": "carol", "passcode": "secret", "id": 1}))
            assert json.loads(ws.recv(5))["type"] == "ok"

    login()
    before = samples(scrape(server).text)
    login()  # from the cache
    text = scrape(server).text
    key = ("signalbox_password_logins_total", (("outcome", "ok"),))
    assert samples(text)[key] == before[key]
    docs = {f.name: f.documentation for f in text_string_to_metric_families(text)}
    assert "credential cache" in docs["signalbox_password_logins"], docs["signalbox_password_logins"]
    assert "browsers" in docs["signalbox_destination_consumers"], docs["signalbox_destination_consumers"]


def test_temporary_destinations_are_summed_not_a_series_per_connection(server, broker):
    """A temporary destination is named after its STOMP connection (`ID:<connection id>:<n>`) and lives as
    long as it: as a `destination` label it would make new series for every connection (a request/reply
    client reconnecting all day), which Prometheus keeps. They are counted, with the messages they hold."""
    from websockets.sync.client import connect

    def temporary() -> list[str]:
        return [dict(labels)["destination"] for (name, labels) in samples(scrape(server).text)
                if name == "signalbox_destination_queue_size" and "ID:" in dict(labels)["destination"]]

    with connect(f"ws://127.0.0.1:{server.port}/stomp", subprotocols=["v12.stomp"]) as ws:
        ws.send("CONNECT\naccept-version:1.2\nhost:localhost\nlogin:alice\npasscode:secret\n\n\x00")
        assert ws.recv(5).startswith("CONNECTED")
        for n, name in enumerate(("replies", "other")):
            ws.send(f"SEND\ndestination:/temp-queue/{name}\nreceipt:r{n}\n\nhello\x00")
            assert ws.recv(5).startswith("RECEIPT")
        parsed = samples(scrape(server).text)
        assert temporary() == []
        assert of(parsed, "signalbox_temporary_destinations") >= 2
        assert of(parsed, "signalbox_temporary_destination_messages") >= 2
    deadline = time.monotonic() + 10  # the connection's end deletes them
    left = lambda: of(samples(scrape(server).text), "signalbox_temporary_destinations")  # noqa: E731
    while time.monotonic() < deadline and left():
        time.sleep(0.1)
    parsed = samples(scrape(server).text)
    assert (of(parsed, "signalbox_temporary_destinations"),
            of(parsed, "signalbox_temporary_destination_messages")) == (0, 0)


def test_every_metric_docs_metrics_md_lists_is_in_a_scrape(server, broker):
    """The reverse of the dashboard test's check: each signalbox_ name in docs/metrics.md's tables is a
    family of a real scrape (once a frame, a login, a request and a tick were counted)."""
    import re
    from pathlib import Path

    from websockets.sync.client import connect

    from broker_core import maintenance

    maintenance.run_due(broker)
    now = broker.clock.now_ms()
    broker.send(f"doc{uuid.uuid4().hex[:6]}", Message(body="x", timestamp=now - 1000))
    with connect(f"ws://127.0.0.1:{server.port}/ws/v1") as ws:
        ws.send(json.dumps({"type": "connect", "login": "alice", "passcode": "secret", "id": 1}))
        ws.recv(5)
    scrape(server)
    parsed = list(text_string_to_metric_families(scrape(server).text))
    exposed = {f.name for f in parsed} | {s.name for f in parsed for s in f.samples}
    documented = (Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
    listed = {name for line in documented.splitlines() if line.startswith("| `")
              for name in re.findall(r"`(signalbox_[a-z_]+)`", line.split("|")[1])}
    assert len(listed) >= 30, listed
    assert listed - exposed == set(), listed - exposed


def test_oldest_age_of_a_message_without_a_timestamp_is_its_time_on_the_broker(server, broker):
    """JMSTimestamp 0 is JMS's "no timestamp" (a producer with setDisableMessageTimestamp, a STOMP SEND
    with `timestamp:0`): read as a time it made a queue's oldest message 56 years old, an alert on
    `> 300` firing for ever. Such a message's age is counted from when it reached the queue."""
    queue = f"nots{uuid.uuid4().hex[:8]}"
    broker.send(queue, [Message(body="unstamped", timestamp=0)])
    time.sleep(1.2)
    age = of(samples(scrape(server).text), "signalbox_destination_oldest_message_age_seconds",
             destination=f"queue://{queue}")
    assert 1 <= age < 30, age


def test_oldest_age_of_a_message_stamped_ahead_of_the_broker_counts_from_its_arrival(server, broker):
    """A producer whose clock runs ahead stamps its messages in the broker's future: read as they are, a
    queue stuck on such a message showed an age of 0 (none waiting) until the broker's clock caught up."""
    queue = f"ahead{uuid.uuid4().hex[:8]}"
    broker.send(queue, [Message(body="from the future", timestamp=broker.clock.now_ms() + 600_000)])
    time.sleep(1.2)
    age = of(samples(scrape(server).text), "signalbox_destination_oldest_message_age_seconds",
             destination=f"queue://{queue}")
    assert 1 <= age < 30, age
