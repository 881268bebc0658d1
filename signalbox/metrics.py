"""GET /metrics: the Prometheus text format, for a scrape every few seconds (docs/metrics.md).

Each scrape reads fresh state: the destinations' counters from broker_core (`AsyncBroker.summaries`, the
function the console's statistics index is built with), the maintenance tick as /healthz judges it, and
Redis's memory; a Collector made for the scrape turns them into metric families. What the process
itself records (requests, frames) comes from gateway.metrics.

Bounded work: at most SIGNALBOX_METRICS_MAX_DESTINATIONS destinations (10,000; the oldest first, as the
registry orders them) are read, PAGE queues per script call: a scrape of 10,000 queues is about 200
Redis calls of a millisecond or two each (docs/benchmarks.md). Those past the limit are counted, not
shown. A topic is read with its full statistics, not paged (docs/metrics.md says what that costs).
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from broker_core.broker import AsyncBroker
from broker_core.model import DestinationSummary
from gateway import runtime
from signalbox import health, node

PAGE = 50  # queues per summary_many call: the worst page (ten priority bands each) ~3 ms of Redis
MIN_TOKEN_LENGTH = 16
LABELS = ["destination"]

# (summary field, metric name, counter?, help). Counters only grow (a deleted and re-created destination
# starts again at 0, which Prometheus's rate() reads as a reset).
DESTINATION_METRICS = (
    ("queue_size", "signalbox_destination_queue_size", False,
     "Messages in the queue: pending plus in flight (ActiveMQ's QueueSize; 0 for a topic, as ActiveMQ)."),
    ("in_flight", "signalbox_destination_in_flight", False,
     "Messages dispatched to a consumer and not yet acknowledged."),
    ("consumer_count", "signalbox_destination_consumers", False,
     "Consumers (a topic: its subscriptions, durable ones offline included)."),
    ("enqueued", "signalbox_destination_enqueued", True, "Messages enqueued."),
    ("dequeued", "signalbox_destination_dequeued", True, "Messages acknowledged (ActiveMQ's DequeueCount)."),
    ("dispatched", "signalbox_destination_dispatched", True, "Messages dispatched to consumers."),
    ("expired", "signalbox_destination_expired", True, "Messages expired."),
    ("deadlettered", "signalbox_destination_dead_lettered", True,
     "Messages that left for a dead-letter queue (poison, past maximumRedeliveries, expired)."),
    ("memory_usage", "signalbox_destination_memory_bytes", False,
     "Bytes of messages the destination holds (what producer flow control counts)."),
)


@dataclass
class Snapshot:
    """What one scrape read."""

    now_ms: int
    redis_up: bool = False
    redis_error: str = ""
    redis_memory: dict[str, int] = field(default_factory=dict)
    redis: dict[str, Any] = field(default_factory=dict)  # node.redis_facts
    processes: dict[str, Any] = field(default_factory=dict)  # node.processes
    registered: int = 0  # destinations in the registry
    summaries: list[DestinationSummary] = field(default_factory=list)
    pages: int = 0
    limit: int = 0
    tick: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def max_destinations() -> int:
    return max(1, int(settings.SIGNALBOX_METRICS_MAX_DESTINATIONS))


async def gather(broker: AsyncBroker, limit: int | None = None, page: int = PAGE) -> Snapshot:
    """Read what a scrape shows, in bounded calls: Redis INFO, the registry's first `limit` names (one
    ZRANGE), their summaries `page` at a time, the maintenance tick."""
    started = time.perf_counter()
    limit = max_destinations() if limit is None else limit
    out = Snapshot(now_ms=broker.clock.now_ms(), limit=limit)
    timeout = settings.HEALTH_CHECK_TIMEOUT
    try:
        # what Redis says of itself and the processes' heartbeats: as the console's node page reads them
        out.redis, out.processes = await asyncio.wait_for(asyncio.gather(
            node.redis_facts(broker.redis), node.processes(broker.redis, broker.namespace)), timeout)
    except Exception as exc:  # an unreachable Redis is a figure (signalbox_redis_up 0), not a failed scrape
        out.redis_error = f"{type(exc).__name__}: {exc}"
        out.seconds = time.perf_counter() - started
        return out
    out.redis_up = True
    out.redis_memory = out.redis["memory"]
    # the tick as /healthz judges it, with its own client in a thread, while the summaries are read
    tick = asyncio.ensure_future(sync_to_async(health.check_maintenance, thread_sensitive=False)())
    try:
        pipe = broker.redis.pipeline(transaction=False)
        pipe.zcard(broker.ops.registry_key)
        pipe.zrange(broker.ops.registry_key, 0, limit - 1)
        registered, names = await pipe.execute()
        out.registered = int(registered)
        uris = [n.decode() if isinstance(n, bytes) else n for n in names]
        # one summary_many script call per `page` queues (a topic's summary: its full stats)
        out.summaries = [s for s in await broker.summaries(uris, page, oldest=True)
                         if s is not None]  # (None: deleted since the ZRANGE)
        out.pages = -(-len(uris) // page)
    except (redis.RedisError, OSError) as exc:  # Redis went away during the scrape
        out.redis_up, out.redis_error, out.summaries = False, f"{type(exc).__name__}: {exc}", []
    out.tick = await tick
    out.seconds = time.perf_counter() - started
    return out


class BrokerCollector(Collector):
    """The metric families of one Snapshot (made for each scrape, so every scrape shows fresh state)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        up = GaugeMetricFamily("signalbox_redis_up", "1 when this scrape reached Redis, else 0 (then no "
                               "destination or tick figures are shown).")
        up.add_metric([], 1 if s.redis_up else 0)
        yield up
        yield from self._scrape_figures()
        if not s.redis_up:
            return
        for key, name, text in (("used", "used", "Bytes Redis uses (INFO used_memory)."),
                                ("peak", "peak", "Most bytes Redis has used (INFO used_memory_peak)."),
                                ("max", "max", "Redis's maxmemory; 0 means no limit.")):
            yield GaugeMetricFamily(f"signalbox_redis_memory_{name}_bytes", text, value=s.redis_memory[key])
        yield from self._node()
        yield from self._tick()
        yield from self._destinations()

    def _scrape_figures(self) -> Iterator[Metric]:
        s = self.snapshot
        yield GaugeMetricFamily("signalbox_metrics_gather_seconds",
                                "Time this scrape spent reading Redis.", value=s.seconds)
        if not s.redis_up:
            return
        yield GaugeMetricFamily("signalbox_destinations", "Destinations in the broker's registry.",
                                value=s.registered)
        yield GaugeMetricFamily("signalbox_metrics_destinations_limit", "At most this many destinations are "
                                "shown per scrape (SIGNALBOX_METRICS_MAX_DESTINATIONS).", value=s.limit)
        yield GaugeMetricFamily("signalbox_metrics_destinations_omitted", "Destinations not shown because "
                                "of the limit (the newest ones).", value=max(0, s.registered - s.limit))
        yield GaugeMetricFamily("signalbox_metrics_pages", "Pages of destination summaries this scrape read "
                                "(one script call each for queues).", value=s.pages)

    def _node(self) -> Iterator[Metric]:
        facts, procs = self.snapshot.redis, self.snapshot.processes
        yield GaugeMetricFamily("signalbox_redis_connected_clients", "Clients connected to Redis.",
                                value=facts["clients"]["connected"])
        yield GaugeMetricFamily("signalbox_redis_ops_per_second", "Commands per second Redis processes "
                                "(INFO instantaneous_ops_per_sec).", value=facts["ops_per_second"])
        yield GaugeMetricFamily("signalbox_redis_aof_enabled", "1 when Redis writes its append-only file.",
                                value=1 if facts["aof"]["enabled"] else 0)
        yield GaugeMetricFamily("signalbox_redis_aof_last_write_ok",
                                "1 when Redis's last AOF write succeeded (else it refuses writes).",
                                value=1 if facts["aof"]["last_write_status"] in ("ok", "") else 0)
        running = GaugeMetricFamily("signalbox_processes_running",
                                    "Processes of each role with a current heartbeat (console node page).",
                                    labels=["role"])
        for role, count in procs["running"].items():
            running.add_metric([role], count)
        yield running

    def _tick(self) -> Iterator[Metric]:
        tick = self.snapshot.tick
        yield GaugeMetricFamily("signalbox_maintenance_tick_ok", "1 while the maintenance tick is alive, as "
                                "/healthz judges it (ran within SIGNALBOX_MAINTENANCE_STALE_SECONDS).",
                                value=1 if tick.get("status") == "ok" else 0)
        if "last_tick" not in tick:
            return  # never ran (or unreadable): no age to show; tick_ok says so
        yield GaugeMetricFamily("signalbox_maintenance_tick_age_seconds",
                                "Seconds since the maintenance tick last finished.",
                                value=tick["age_ms"] / 1000)
        yield GaugeMetricFamily("signalbox_maintenance_tick_duration_seconds", "How long the last tick took.",
                                value=tick.get("duration_ms", 0) / 1000)
        yield GaugeMetricFamily("signalbox_maintenance_tick_destinations", "Destinations the last tick "
                                "visited.", value=tick.get("destinations", 0))
        yield GaugeMetricFamily("signalbox_maintenance_tick_errors", "Destinations whose maintenance failed "
                                "in the last tick (logged by the worker).", value=tick.get("errors", 0))

    def _destinations(self) -> Iterator[Metric]:
        # 10,000 destinations are 100,000 samples: each label set is made once and shared by the
        # destination's samples (Metric.add_metric would build one per sample).
        s = self.snapshot
        rows = [({"destination": summary.destination}, summary) for summary in s.summaries]
        for attribute, name, counter, text in DESTINATION_METRICS:
            family = (CounterMetricFamily if counter else GaugeMetricFamily)(name, text, labels=LABELS)
            sample = f"{name}_total" if counter else name
            family.samples = [Sample(sample, labels, getattr(summary, attribute), None)
                              for labels, summary in rows]
            yield family
        name = "signalbox_destination_oldest_message_age_seconds"
        age = GaugeMetricFamily(
            name, "Age of the oldest message waiting for dispatch, by its timestamp (JMSTimestamp: the "
            "send's time unless the producer set one); 0 when none waits. Queues only.", labels=LABELS)
        now = s.now_ms
        age.samples = [Sample(name, labels, max(0, now - summary.oldest_timestamp) / 1000
                              if summary.oldest_timestamp is not None else 0, None)
                       for labels, summary in rows if labels["destination"].startswith("queue://")]
        yield age


class _Scrape:
    """The collectors of one scrape, in one exposition."""

    def __init__(self, *sources: Any) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        for source in self.sources:
            yield from source.collect()


def process_metrics() -> Any:
    """This process's own metrics, or every web process's summed (PROMETHEUS_MULTIPROC_DIR set)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return registry
    return REGISTRY


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the request carries the metrics token, else the answer (docs/metrics.md, Access)."""
    token = settings.SIGNALBOX_METRICS_TOKEN
    if not token:
        return _text(403, "metrics are off: set SIGNALBOX_METRICS_TOKEN to a secret of at least "
                          f"{MIN_TOKEN_LENGTH} characters and scrape with 'Authorization: Bearer <it>'")
    if len(token) < MIN_TOKEN_LENGTH:
        return _text(403, f"metrics are off: SIGNALBOX_METRICS_TOKEN has {len(token)} characters, it needs "
                          f"at least {MIN_TOKEN_LENGTH}")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        response = _text(401, "send the metrics token as 'Authorization: Bearer <SIGNALBOX_METRICS_TOKEN>'")
        response["WWW-Authenticate"] = 'Bearer realm="signalbox-metrics"'
        return response
    return None


def _text(status: int, text: str) -> HttpResponse:
    response = HttpResponse(text + "\n", status=status, content_type="text/plain; charset=utf-8")
    response["Cache-Control"] = "no-store"
    return response


async def metrics_view(request: HttpRequest) -> HttpResponse:
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    snapshot = await gather(runtime.async_broker())
    # Formatting 100,000 samples takes a while: off the event loop, so other requests go on.
    body = await asyncio.to_thread(generate_latest, _Scrape(process_metrics(), BrokerCollector(snapshot)))
    response = HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response
