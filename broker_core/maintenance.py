"""Maintenance jobs that keep the broker healthy, as ActiveMQ's broker timers do (spec §6, §8): expiry
sweeps, slow-consumer aborts, and recovery (lapsed consumers, parked messages that came due, forwards a
crashed process left behind).

Each job works on one destination, does bounded work per call and may run on several workers at once:
it holds a lease (`<prefix>:lease:<job>`) while it runs, every change it makes is one atomic script, and a
worker that dies mid-job leaves nothing half-done. Its lease lapses and the next run carries on from the
state kept in Redis. `run_due` is the dispatcher: it reads every destination's policy and runs the jobs
that are due, so a changed period or strategy takes effect at its next call (Celery beat calls it every
second, signalbox/tasks.py). Job state for the console is in `<prefix>:maint`; see `job_status`.
"""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from . import topic_ops
from .broker import Broker
from .destinations import Destination, parse_destination
from .errors import UnknownDestination
from .operations import ConsumerRef, Eval, NoDestination, Op
from .policy import PolicyEntry
from .topics import Subscription

log = logging.getLogger(__name__)

JOBS = ("recover", "expire", "slow")
RECOVER_LEASE_MS = 10_000
EXPIRE_LEASE_MS = 30_000  # renewed after every page
SLOW_LEASE_MS = 10_000
SWEEP_PAGES_PER_RUN = 100  # a longer sweep goes on at the next run (the next tick), from its cursor
SWEEP_SECONDS_PER_RUN = 1.0
REAP_BATCH = 100
REAP_ROUNDS = 10
# A forward is only taken for left behind once it has waited this long: until then the process that
# queued it is presumed to be delivering it (a second delivery would be dropped, but costs a round trip).
FORWARD_GRACE_MS = 2_000
KEEP_MS = 7 * 86_400_000  # job state of a destination no worker maintains any more goes away
# Tombstones of aborted consumers (AbortNotice) per destination: the latest this many, for this long.
TOMBSTONES_MAX = 1_000
TOMBSTONE_MS = 86_400_000


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _dest(destination: str | Destination) -> Destination:
    # a registered topic may be a wildcard subscription's pseudo-topic (docs/broker_core.md)
    return destination if isinstance(destination, Destination) else parse_destination(destination,
                                                                                       allow_wildcards=True)


def _maint_key(broker: Broker, dest: Destination) -> str:
    return f"{broker.ops.prefix(dest)}:maint"


def _heartbeat_key(broker: Broker) -> str:
    return f"{broker.namespace}:maintenance"


def _eval(broker: Broker, dest: Destination, script: str, *args: Any) -> Op:
    return (yield Eval(script, (broker.ops.prefix(dest),), args))


def _record(broker: Broker, dest: Destination, fields: dict[str, Any], counters: dict[str, int] | None = None
            ) -> None:
    key = _maint_key(broker, dest)
    pipe = broker.redis.pipeline(transaction=False)
    if fields:
        pipe.hset(key, mapping=fields)
    for name, by in (counters or {}).items():
        if by:
            pipe.hincrby(key, name, by)
    pipe.pexpire(key, KEEP_MS)
    pipe.execute()


# -- leases -------------------------------------------------------------------------------------------


@dataclass
class Lease:
    """A job's lease on one destination, held by `token` until `expires` (the broker clock's ms)."""

    broker: Broker
    destination: Destination
    job: str
    token: str
    ttl_ms: int

    def renew(self) -> bool:
        """Extend the lease; False if it lapsed and another worker took the job over (then stop)."""
        return acquire_lease(self.broker, self.destination, self.job, self.ttl_ms, self.token) is not None

    def release(self) -> bool:
        return release_lease(self.broker, self.destination, self.job, self.token)


def acquire_lease(broker: Broker, destination: str | Destination, job: str, ttl_ms: int,
                  token: str | None = None) -> str | None:
    """Take (or, with the holder's token, renew) the lease of `job` on a destination; returns the token,
    or None while another holder's lease runs."""
    dest = _dest(destination)
    token = token or uuid.uuid4().hex
    now = broker.clock.now_ms()
    held = broker._run(_eval(broker, dest, "maintenance", now, "acquire", job, token, ttl_ms))
    return token if int(held) else None


def release_lease(broker: Broker, destination: str | Destination, job: str, token: str) -> bool:
    dest = _dest(destination)
    return bool(int(broker._run(_eval(broker, dest, "maintenance", broker.clock.now_ms(), "release", job,
                                      token))))


@contextmanager
def job_lease(broker: Broker, destination: str | Destination, job: str, ttl_ms: int
              ) -> Iterator[Lease | None]:
    """The job's lease for the `with` block, or None when another worker holds it."""
    dest = _dest(destination)
    token = acquire_lease(broker, dest, job, ttl_ms)
    if token is None:
        yield None
        return
    lease = Lease(broker, dest, job, token, ttl_ms)
    try:
        yield lease
    finally:
        lease.release()


# -- recovery: lapsed consumers, parked messages that came due, left-over forwards --------------------


@dataclass(frozen=True)
class Recovery:
    ran: bool  # False: nothing to do, or another worker is at it
    reaped: list[str] = field(default_factory=list)  # consumers closed because their lease lapsed
    forwarded: int = 0  # dead letters / moves a crashed process had left in the forwarding hash
    dispatched: int = 0  # messages dispatched because a parked message or a delayed start came due


def run_recovery(broker: Broker, destination: str | Destination) -> Recovery:
    """Close consumers whose lease lapsed (their messages return with the redelivery counter raised),
    finish returning what closed consumers still hold and releasing what ended subscriptions held (a
    process died between those chunks), complete forwards left behind, and run dispatch when a parked
    message or a delayed start came due. One cheap script call when there is nothing to do."""
    dest = _dest(destination)
    now = broker.clock.now_ms()
    token = uuid.uuid4().hex
    held, lapsed, forwards, due, owed = broker._run(_eval(broker, dest, "maintenance", now, "recover", token,
                                                          RECOVER_LEASE_MS, FORWARD_GRACE_MS))
    if not int(held):
        return Recovery(ran=False)
    lease = Lease(broker, dest, "recover", token, RECOVER_LEASE_MS)
    try:
        reaped: list[str] = []
        if int(lapsed):
            for _ in range(REAP_ROUNDS):
                batch = broker.reap_lapsed(dest, REAP_BATCH)
                reaped += batch
                if len(batch) < REAP_BATCH:
                    break
        if int(owed):  # a process died while returning (or releasing) a closed consumer's messages
            broker._run(broker.ops.return_owed(dest, now))
            if dest.is_topic and not isinstance(dest, Subscription):  # or fanning out a send (fanout.lua)
                broker._run(topic_ops.fan_out(broker.ops, dest, now))
        forwarded = 0
        if int(forwards):
            forwarded = broker.forward(dest)
            broker.redis.hdel(_maint_key(broker, dest), "recover:fwd_since")
        dispatched = 0
        if 0 < int(due) <= now:
            dispatched = broker.dispatch(dest).dispatched
        if reaped or forwarded or dispatched:
            _record(broker, dest, {"recover:last_work": now},
                    {"recover:reaped": len(reaped), "recover:forwarded": forwarded,
                     "recover:dispatched": dispatched})
        return Recovery(True, reaped, forwarded, dispatched)
    finally:
        lease.release()


# -- expiry sweeps (spec §6) --------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpirySweep:
    ran: bool  # False: sweeps are off (expireMessagesPeriod 0), not due yet, or another worker is at it
    pages: int = 0
    examined: int = 0
    expired: int = 0
    cycle_done: bool = False  # this run reached the end of the destination; the next sweep starts anew


def _sweep_due(state: list[Any], period: int, now: int) -> bool:
    started, running = state
    return running == b"1" or started is None or now >= int(started) + period


def run_expiry_sweep(broker: Broker, destination: str | Destination, *, period_ms: int | None = None,
                     max_pages: int | None = SWEEP_PAGES_PER_RUN, force: bool = False) -> ExpirySweep:
    """The expiry sweep, every expireMessagesPeriod: a sweep walks the whole destination in pages of
    maxExpirePageSize (each page one script call) and expires what has run out (dead-lettered per
    policy). One run does at most `max_pages` pages (None: to the end); an unfinished sweep goes on at the
    next run, whatever the period. `force` starts a sweep now even if none is due (by hand)."""
    dest = _dest(destination)
    period = broker.policies.resolve(dest).expire_messages_period if period_ms is None else period_ms
    if period <= 0 and not force:
        return ExpirySweep(ran=False)
    key = _maint_key(broker, dest)
    with job_lease(broker, dest, "expire", EXPIRE_LEASE_MS) as lease:
        if lease is None:
            return ExpirySweep(ran=False)
        now = broker.clock.now_ms()
        state = broker.redis.hmget(key, "expire:started", "expire:running")
        if not force and not _sweep_due(state, period, now):
            return ExpirySweep(ran=False)
        if state[1] != b"1":
            _record(broker, dest, {"expire:started": now, "expire:running": 1, "expire:examined": 0,
                                   "expire:expired": 0, "expire:pages": 0})
        pages = examined = expired = 0
        done = False
        deadline = time.monotonic() + SWEEP_SECONDS_PER_RUN
        while max_pages is None or pages < max_pages:
            page = broker.sweep_expired(dest)
            pages += 1
            examined += page.examined
            expired += page.expired
            done = page.done
            now = broker.clock.now_ms()
            fields: dict[str, Any] = {"expire:last_run": now}
            if done:
                fields.update({"expire:running": 0, "expire:last_done": now})
            _record(broker, dest, fields, {"expire:examined": page.examined, "expire:expired": page.expired,
                                           "expire:pages": 1})
            if done or not lease.renew() or (max_pages is not None and time.monotonic() > deadline):
                break
        if done:
            totals = broker.redis.hmget(key, "expire:examined", "expire:expired")
            _record(broker, dest, {"expire:last_examined": int(totals[0] or 0),
                                   "expire:last_expired": int(totals[1] or 0)})
        return ExpirySweep(True, pages, examined, expired, done)


# -- slow consumers (spec §8) -------------------------------------------------------------------------


@dataclass(frozen=True)
class SlowConsumerCheck:
    ran: bool  # False: no strategy, not due (checkPeriod), or another worker is at it
    tracked: int = 0  # consumers the strategy holds for slow after this run
    aborted: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AbortNotice:
    """Why a consumer was aborted, for the adapter that served it (REST 410, STOMP ERROR, JSON notice)."""

    consumer_id: str
    reason: str
    abort_connection: bool  # the strategy's abortConnection: drop the client's connection, not only it
    strategy: str  # abortSlowConsumer, abortSlowAckConsumer or operator
    at: int


def _abort_op(broker: Broker, dest: Destination, now: int, *args: Any) -> Op:
    try:
        reply = yield Eval("abort", (broker.ops.prefix(dest),), (now, 0, TOMBSTONES_MAX, TOMBSTONE_MS, *args))
    except NoDestination:
        return None
    yield from broker.ops._continue_dispatch(dest, now, int(reply[3]), int(reply[4]))
    if len(reply) > 5:  # consumers were aborted: their messages go back in chunks
        yield from broker.ops.return_owed(dest, now)
    return reply


def _flag(value: bool) -> str:
    return "1" if value else "0"


def run_slow_consumer_check(broker: Broker, destination: str | Destination,
                            entry: PolicyEntry | None = None) -> SlowConsumerCheck:
    """One run of the destination's slowConsumerStrategy when checkPeriod has passed since the last one:
    abortSlowConsumerStrategy (§8.2) or abortSlowAckConsumerStrategy (§8.3), with ActiveMQ's parameters.
    Aborted consumers are closed (messages redelivered, groups freed) and leave an `AbortNotice`."""
    dest = _dest(destination)
    entry = entry or broker.policies.resolve(dest)
    if entry.slow_consumer_strategy == "none":
        return SlowConsumerCheck(ran=False)
    with job_lease(broker, dest, "slow", SLOW_LEASE_MS) as lease:
        if lease is None:
            return SlowConsumerCheck(ran=False)
        reply = broker._run(_abort_op(
            broker, dest, broker.clock.now_ms(), "check", entry.slow_consumer_strategy, entry.check_period,
            entry.max_slow_duration, entry.max_slow_count, _flag(entry.abort_connection),
            entry.max_time_since_last_ack, _flag(entry.ignore_idle_consumers)))
    if reply is None or not int(reply[0]):
        return SlowConsumerCheck(ran=False, tracked=int(reply[1]) if reply else 0)
    aborted = [_text(x) for x in reply[5:]]
    if aborted:
        _record(broker, dest, {}, {"slow:aborted": len(aborted)})
        log.info("aborted slow consumers %s on %s", ", ".join(aborted), dest.uri)
    return SlowConsumerCheck(True, int(reply[1]), aborted)


def abort_consumer(broker: Broker, consumer: ConsumerRef, reason: str, *, abort_connection: bool = False
                   ) -> None:
    """Abort a consumer now (an operator's decision): closed as the strategies close it, with a
    tombstone carrying `reason`. Raises UnknownConsumer if it is not registered."""
    dest = broker._run(broker.ops.home(consumer))  # a topic consumer's subscription
    reply = broker._run(_abort_op(broker, dest, broker.clock.now_ms(), "abort", consumer.consumer_id, reason,
                                  _flag(abort_connection)))
    if reply is None:
        raise UnknownDestination(f"no destination {dest.uri}", destination=dest.uri)


def abort_notice(broker: Broker, destination: str | Destination, consumer_id: str) -> AbortNotice | None:
    """The tombstone of an aborted consumer (the latest TOMBSTONES_MAX per destination, each kept
    TOMBSTONE_MS), or None."""
    dest = _dest(destination)
    raw = broker.redis.hget(f"{broker.ops.prefix(dest)}:aborted", consumer_id)
    if raw is None:
        return None
    data = json.loads(raw)
    return AbortNotice(consumer_id, data["reason"], bool(data["abort_connection"]), data["strategy"],
                       int(data["at"]))


def abort_reason(broker: Broker, destination: str | Destination, consumer_id: str) -> str | None:
    """Why the consumer was aborted (the text for the client), or None if it was not aborted."""
    notice = abort_notice(broker, destination, consumer_id)
    return notice.reason if notice else None


# -- offline durable subscriptions (spec §7.4) ------------------------------------------------


def run_offline_durable_cleanup(broker: Broker, destination: str | Destination,
                                entry: PolicyEntry | None = None, *, force: bool = False) -> list[str]:
    """TopicRegion.doCleanup: every offlineDurableSubscriberTaskSchedule ms (when it and
    offlineDurableSubscriberTimeout are not -1), remove the durable subscriptions offline for the timeout
    or more, with their messages. Returns their keys. `force` runs it now whatever the schedule."""
    dest = _dest(destination)
    entry = entry or broker.policies.resolve(dest)
    timeout = entry.offline_durable_subscriber_timeout
    schedule = entry.offline_durable_subscriber_task_schedule
    if timeout < 0 or (schedule < 0 and not force):
        return []
    now = broker.clock.now_ms()
    last = broker.redis.hget(_maint_key(broker, dest), "offline:last_run")
    if not force and last is not None and now < int(last) + schedule:
        return []
    with job_lease(broker, dest, "offline", SLOW_LEASE_MS) as lease:
        if lease is None:
            return []
        removed = broker.expire_offline_durables(dest, timeout)
        _record(broker, dest, {"offline:last_run": now}, {"offline:removed": len(removed)})
    if removed:
        log.info("removed offline durable subscriptions %s of %s", ", ".join(removed), dest.uri)
    return removed


# -- the dispatcher ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TickReport:
    destinations: int
    reaped: list[str] = field(default_factory=list)
    forwarded: int = 0
    dispatched: int = 0
    sweeps: int = 0  # sweep runs (a long sweep takes several)
    expired: int = 0
    slow_checks: int = 0
    aborted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    duration_ms: int = 0
    offline_removed: list[str] = field(default_factory=list)  # "<topic uri>#<subscription key>"


def run_due(broker: Broker, destinations: Iterable[str] | None = None) -> TickReport:
    """Run every job that is due on every destination (or on `destinations`), reading the policies now:
    recovery always, the expiry sweep every expireMessagesPeriod, the slow-consumer check every
    checkPeriod. A failing destination is logged and reported; the others go on."""
    started = time.monotonic()
    policy_map = broker.policies.policy_map()
    idle: set[str] = set()
    if destinations is None:  # with the wildcard subscriptions' pseudo-topics, which are not registered,
        # and those whose pattern lost its last subscription: what waits there is delivered, then they go
        idle = set(broker._run(topic_ops.idle_pattern_topics(broker.ops)))
        uris = list(broker.destinations()) + broker._run(topic_ops.pattern_topics(broker.ops)) + sorted(idle)
    else:
        uris = list(destinations)
    # Several ticks running at once (several workers) spread over the destinations instead of meeting
    # at the same lease one after another.
    random.shuffle(uris)
    reaped: list[str] = []
    aborted: list[str] = []
    errors: list[str] = []
    offline_removed: list[str] = []
    forwarded = dispatched = sweeps = expired = slow_checks = 0
    for uri in uris:
        try:
            dest = _dest(uri)
            entry = policy_map.resolve(dest)
            targets = [dest]
            if dest.is_topic:  # the jobs run on each subscription; offline durables on the topic
                removed = run_offline_durable_cleanup(broker, dest, entry)
                offline_removed += [f"{uri}#{key}" for key in removed]
                # forwards wait on the topic itself (<topic>:fwd), so they are recovered there too:
                # a topic nobody subscribes to (VirtualTopic.>, a composite) has no subscription to do it.
                recovery = run_recovery(broker, dest)
                forwarded += recovery.forwarded
                targets = broker._run(topic_ops.for_each_subscription(broker.ops, dest))
            for dest in targets:
                recovery = run_recovery(broker, dest)
                reaped += [f"{uri}#{cid}" for cid in recovery.reaped]
                forwarded += recovery.forwarded
                dispatched += recovery.dispatched
                now = broker.clock.now_ms()
                period = entry.expire_messages_period
                if period > 0 and _sweep_due(broker.redis.hmget(_maint_key(broker, dest), "expire:started",
                                                                "expire:running"), period, now):
                    sweep = run_expiry_sweep(broker, dest, period_ms=period, max_pages=SWEEP_PAGES_PER_RUN)
                    sweeps += sweep.ran
                    expired += sweep.expired
                if entry.slow_consumer_strategy != "none":
                    last = broker.redis.hget(_maint_key(broker, dest), "slow:last_run")
                    if last is None or now >= int(last) + entry.check_period:
                        check = run_slow_consumer_check(broker, dest, entry)
                        slow_checks += check.ran
                        aborted += [f"{uri}#{cid}" for cid in check.aborted]
            if uri in idle:  # its forwards were delivered above (run_recovery): its keys go when none is left
                broker._run(topic_ops.drop_idle_pattern(broker.ops, _dest(uri), broker.clock.now_ms(),
                                                        (*JOBS, "offline")))
        except Exception as exc:  # one broken destination must not stop the maintenance of the others
            log.exception("maintenance of %s failed", uri)
            errors.append(f"{uri}: {type(exc).__name__}: {exc}")
    duration_ms = int((time.monotonic() - started) * 1000)
    broker.redis.hset(_heartbeat_key(broker), mapping={
        "last_tick": broker.clock.now_ms(), "duration_ms": duration_ms, "destinations": len(uris),
        "errors": len(errors),
    })
    return TickReport(len(uris), reaped, forwarded, dispatched, sweeps, expired, slow_checks, aborted, errors,
                      duration_ms, offline_removed)


# -- what the console shows ---------------------------------------------------------------------------


def job_status(broker: Broker, destination: str | Destination) -> dict[str, dict[str, Any]]:
    """Progress and last-run times of each job on a destination, for the console and the API:
    {"recover": {last_work, reaped, forwarded, dispatched}, "expire": {started, running, examined,
    expired, pages, last_run, last_done, last_examined, last_expired}, "slow": {last_run, config,
    aborted, tracked}}, each with `leased_until` while a worker holds the job (times in ms)."""
    dest = _dest(destination)
    prefix = broker.ops.prefix(dest)
    pipe = broker.redis.pipeline(transaction=False)
    pipe.hgetall(f"{prefix}:maint")
    pipe.hlen(f"{prefix}:slowcons")
    for job in JOBS:
        pipe.get(f"{prefix}:lease:{job}")
    raw, tracked, *leases = pipe.execute()
    out: dict[str, dict[str, Any]] = {job: {} for job in JOBS}
    for name, value in raw.items():
        job, _, attribute = _text(name).partition(":")
        text = _text(value)
        out.setdefault(job, {})[attribute] = int(text) if text.lstrip("-").isdigit() else text
    out["slow"]["tracked"] = int(tracked)
    for job, held in zip(JOBS, leases, strict=True):
        if held is not None:
            out[job]["leased_until"] = int(_text(held).rpartition("|")[2])
    return out


def last_tick(broker: Broker) -> dict[str, int]:
    """When the dispatcher last ran (ms), how long it took, how many destinations, how many failed;
    empty if it never ran. A stale `last_tick` means no worker or no beat is running."""
    return {_text(k): int(v) for k, v in broker.redis.hgetall(_heartbeat_key(broker)).items()}
