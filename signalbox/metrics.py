"""GET /metrics: the Prometheus text format, for a scrape every few seconds (docs/metrics.md).

Each scrape reads fresh state: the destinations' counters from broker_core (`AsyncBroker.summaries`, the
function the console's statistics index is built with: `summary_many` for queues, `topic_summary_many`
for topics), the maintenance tick as /healthz judges it, and Redis's memory; a Collector made for the
scrape turns them into metric families. What the process itself records (requests, frames) comes from
gateway.metrics.

Bounded work: at most SIGNALBOX_METRICS_MAX_DESTINATIONS destinations (20,000; the oldest first, as the
registry orders them) are read, PAGE per script call (a topic with many subscriptions: more calls of
bounded work), CONCURRENCY calls at a time. Those past the limit are counted, not shown.

The exposition is prometheus_client's (`generate_latest`), but for the sample lines of the
per-destination families: 20,000 destinations are 200,000 samples, and generate_latest spends ~4.5 us on
each (escaping and validating the same label and name again per sample), most of a second. Those lines
are written by `destination_lines`, which escapes each destination's label once; a test checks that its
output is byte for byte generate_latest's for the same families, names that need escaping included.
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
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from broker_core.broker import AsyncBroker
from broker_core.model import DestinationSummary
from gateway import runtime
from gateway.api.destination_index import parse_destination  # (cached: ~30 us a name otherwise)
from signalbox import maintenance_check, node
from signalbox.settings import metrics_off

PAGE = 50  # queues per summary_many call: the worst page (ten priority bands each) ~3 ms of Redis
# Pages asked at once, pipelined on one connection: the gateway decodes one page's reply while Redis runs
# the next call (each call is as small as alone; other clients wait behind at most a few of them).
CONCURRENCY = 4
NAMES_PAGE = 5_000  # registry names per ZRANGE (a few hundred microseconds of Redis each)

# (summary field, metric name, counter?, help). Counters only grow (a deleted and re-created destination
# starts again at 0, which Prometheus's rate() reads as a reset).
DESTINATION_METRICS = (
    ("queue_size", "signalbox_destination_queue_size", False,
     "Messages in the queue: pending plus in flight (ActiveMQ's QueueSize; 0 for a topic, as ActiveMQ)."),
    ("pending", "signalbox_destination_pending", False,
     "Messages waiting for dispatch: a queue's not in flight; a topic's, summed over its subscriptions "
     "(an offline durable subscription's backlog included)."),
    ("in_flight", "signalbox_destination_in_flight", False,
     "Messages dispatched to a consumer and not yet acknowledged."),
    ("consumer_count", "signalbox_destination_consumers", False,
     "Consumers (a queue: its open STOMP browsers too; a topic: its subscriptions, durable ones offline "
     "included), as ActiveMQ's ConsumerCount."),
    ("enqueued", "signalbox_destination_enqueued", True, "Messages enqueued."),
    ("dequeued", "signalbox_destination_dequeued", True,
     "Messages that left the destination: acknowledged, and also expired, dead-lettered, purged, moved or "
     "removed (ActiveMQ's DequeueCount)."),
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
    summaries: list[DestinationSummary] = field(default_factory=list)  # those shown per destination
    temporary: list[DestinationSummary] = field(default_factory=list)  # read, summed (`split_temporary`)
    pages: int = 0
    limit: int = 0
    tick: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def max_destinations() -> int:
    return max(1, int(settings.SIGNALBOX_METRICS_MAX_DESTINATIONS))


async def gather(broker: AsyncBroker, client: Any, limit: int | None = None, page: int = PAGE) -> Snapshot:
    """Read what a scrape shows, in bounded calls: Redis INFO and the processes' heartbeats (signalbox.node,
    with the redis-py `client`: the server and the deployment, not broker state), the registry's first
    `limit` names (ZCARD, then ZRANGEs of NAMES_PAGE, in one MULTI/EXEC), their summaries `page` at a time,
    the maintenance tick."""
    started = time.perf_counter()
    limit = max_destinations() if limit is None else limit
    out = Snapshot(now_ms=broker.clock.now_ms(), limit=limit)
    timeout = settings.HEALTH_CHECK_TIMEOUT
    try:
        # what Redis says of itself and the processes' heartbeats: as the console's node page reads them
        out.redis, out.processes = await asyncio.wait_for(asyncio.gather(
            node.redis_facts(client), node.processes(client, broker.namespace)), timeout)
    except Exception as exc:  # an unreachable Redis is a figure (signalbox_redis_up 0), not a failed scrape
        out.redis_error = f"{type(exc).__name__}: {exc}"
        out.seconds = time.perf_counter() - started
        return out
    out.redis_up = True
    out.redis_memory = out.redis["memory"]
    # the tick as /healthz judges it, with its own client in a thread, while the summaries are read
    tick = asyncio.ensure_future(sync_to_async(maintenance_check.check_maintenance, thread_sensitive=False)())
    try:
        out.registered = await broker.destination_count()
        # the first `limit` names, NAMES_PAGE per ZRANGE, in one round trip
        names = await broker.destination_names(min(limit, out.registered), NAMES_PAGE)
        uris = [parse_destination(n) for n in names]
        # one summary_many script call per `page` queues; a page's topics: topic_summary_many calls
        read = [s for s in await broker.summaries(uris, page, oldest=True, concurrency=CONCURRENCY)
                if s is not None]  # (None: deleted since the ZRANGE)
        out.summaries, out.temporary = split_temporary(read, {u.uri for u in uris if u.is_temporary})
        out.pages = -(-len(uris) // page)
    except (redis.RedisError, OSError) as exc:  # Redis went away during the scrape
        out.redis_up, out.redis_error = False, f"{type(exc).__name__}: {exc}"
        out.summaries, out.temporary = [], []
    out.tick = await tick
    out.seconds = time.perf_counter() - started
    return out


def split_temporary(summaries: list[DestinationSummary], temporary: set[str]
                    ) -> tuple[list[DestinationSummary], list[DestinationSummary]]:
    """(those shown per destination, the temporary ones). A temporary destination is named after its STOMP
    connection (`ID:<connection id>:<n>`) and lives as long as it: as a label value it would start new
    series with every connection (a request/reply client reconnecting all day), which Prometheus keeps
    long after; so they are summed instead (signalbox_temporary_destinations and _messages)."""
    shown = [s for s in summaries if s.destination not in temporary]
    return shown, [s for s in summaries if s.destination in temporary]


class BrokerCollector(Collector):
    """The metric families of one Snapshot (made for each scrape, so every scrape shows fresh state).
    With `destinations=False`, all but the per-destination families (`destination_families` has them)."""

    def __init__(self, snapshot: Snapshot, destinations: bool = True) -> None:
        self.snapshot = snapshot
        self.with_destinations = destinations

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
        if self.with_destinations:
            yield from self.destination_families()

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
        yield GaugeMetricFamily("signalbox_metrics_oldest_unknown", "Queues shown without an oldest message "
                                "age: the messages at the head of their pending set were too large to read "
                                "in a bounded call (1 MiB of messages per page).",
                                value=sum(1 for summary in s.summaries if summary.oldest_unknown))
        yield GaugeMetricFamily("signalbox_temporary_destinations", "Temporary destinations (a STOMP "
                                "connection's, ID:<connection id>:<n>) among those read: summed here, not "
                                "shown per destination, as their names change with every connection.",
                                value=len(s.temporary))
        yield GaugeMetricFamily("signalbox_temporary_destination_messages", "Messages the temporary "
                                "destinations hold (a queue's pending and in flight; a topic's, over its "
                                "subscriptions).", value=sum(t.pending + t.in_flight for t in s.temporary))
        yield GaugeMetricFamily("signalbox_metrics_pages", "Pages of destination summaries this scrape read "
                                f"({PAGE} destinations each: one script call for its queues, one or more "
                                "for its topics).", value=s.pages)

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

    def destination_families(self) -> Iterator[DestinationFamily]:
        s = self.snapshot
        if not s.redis_up:
            return
        labels = [{"destination": summary.destination} for summary in s.summaries]  # shared by families
        for attribute, name, counter, text in DESTINATION_METRICS:
            yield DestinationFamily(name, text, "counter" if counter else "gauge", labels,
                                    [getattr(summary, attribute) for summary in s.summaries])
        now = s.now_ms
        # (a queue whose oldest message was too large to read in a bounded call has no sample: unknown,
        # counted by signalbox_metrics_oldest_unknown)
        queues = [i for i, summary in enumerate(s.summaries)
                  if summary.destination.startswith("queue://") and not summary.oldest_unknown]
        oldest = [s.summaries[i].oldest_timestamp for i in queues]
        yield DestinationFamily(
            "signalbox_destination_oldest_message_age_seconds", "Age of the oldest message waiting for "
            "dispatch, by its timestamp (JMSTimestamp: the send's time unless the producer set one; when it "
            "is 0, none given, or later than the message's arrival, from the arrival); 0 when none waits. "
            "Queues only; none for a queue in signalbox_metrics_oldest_unknown.", "gauge",
            [labels[i] for i in queues],
            [max(0, now - ts) / 1000 if ts is not None else 0 for ts in oldest])


class DestinationFamily(Metric):
    """A gauge or counter with one sample per destination, kept as columns: the destinations' label sets
    (one list, shared by the families of a scrape) and the values. `samples` builds prometheus_client's
    Sample tuples (for generate_latest and its parser); `destination_lines` writes the columns."""

    def __init__(self, name: str, documentation: str, typ: str, labels: list[dict[str, str]],
                 values: list[float]) -> None:
        super().__init__(name, documentation, typ)
        self.labels, self.values = labels, values
        self.sample_name = f"{name}_total" if typ == "counter" else name

    @property  # type: ignore[override]
    def samples(self) -> list[Sample]:
        return [Sample(self.sample_name, labels, value, None)
                for labels, value in zip(self.labels, self.values, strict=True)]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:  # (Metric.__init__ sets an empty list)
        if value:
            raise TypeError("a DestinationFamily's samples are its labels and values")


def _label_text(labels: dict[str, str]) -> str:
    """A sample's label set as generate_latest writes it (the text format's escapes: backslash, newline,
    double quote)."""
    if not labels:
        return ""
    pairs = ",".join('{}="{}"'.format(k, v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"'))
                     for k, v in sorted(labels.items()))
    return "{" + pairs + "}"


def destination_lines(families: Iterator[DestinationFamily]) -> bytes:
    """The exposition of `families`, byte for byte what generate_latest writes for them, ~10 times
    faster: each family's HELP and TYPE lines are generate_latest's own (of the family without samples);
    each label set is escaped once for all families, each distinct value formatted once."""
    out: list[str] = []
    texts: dict[int, str] = {}  # id of a label set (alive while the families are) -> its text
    values: dict[float, str] = {}
    for family in families:
        out.append(generate_latest(_Fixed(Metric(family.name, family.documentation, family.type))).decode())
        prefix = family.sample_name
        for labels, value in zip(family.labels, family.values, strict=True):
            text = texts.get(id(labels))
            if text is None:
                text = texts[id(labels)] = _label_text(labels)
            formatted = values.get(value)
            if formatted is None:
                formatted = values[value] = floatToGoString(value)
            out.append(f"{prefix}{text} {formatted}\n")
    return "".join(out).encode()


class _Fixed:
    """A collector of given families."""

    def __init__(self, *families: Metric) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def exposition(snapshot: Snapshot, *process: Any) -> bytes:
    """The scrape's text: the process's metrics and the broker-wide figures by generate_latest, then the
    per-destination families by destination_lines."""
    head = generate_latest(_Scrape(*process, BrokerCollector(snapshot, destinations=False)))
    return head + destination_lines(BrokerCollector(snapshot).destination_families())


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
    off = metrics_off(token)
    if off is not None:
        return _text(403, off)
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


# A scraper GETs; any other method is 405 (not the CSRF check's 403 page: a token, not a cookie, protects it).
@csrf_exempt
@require_safe
async def metrics_view(request: HttpRequest) -> HttpResponse:
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    snapshot = await gather(runtime.async_broker(), runtime.async_redis())
    # Formatting 200,000 samples takes ~0.1 s: off the event loop, so other requests go on.
    body = await asyncio.to_thread(exposition, snapshot, process_metrics())
    response = HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response
