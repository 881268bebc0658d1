"""Maintenance jobs that keep the broker healthy, as ActiveMQ's broker timers do (spec §6, §8): expiry
sweeps, slow-consumer aborts, and recovery (lapsed consumers, parked messages that came due, forwards a
crashed process left behind, destinations' deletions it stopped half-way).

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

import redis

from . import rates
from .broker import Broker
from .config.entry import PolicyEntry
from .destinations import Destination, parse_destination
from .effects import Eval, NoDestination, Op, single
from .errors import UnknownDestination
from .keys import Home
from .model import ConsumerRef
from .resp import reply_text as _text
from .scripts import calls

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
# The tick reads the maintenance index (<ns>:due) this many entries per call, and stops after TICK_SECONDS:
# what is still due then is the next tick's (health turns stale only after 15 s without a finished tick).
TICK_CHUNK = 200
TICK_SECONDS = 5.0
PERIODIC_SLICE_SECONDS = 0.2  # periodic visits between two looks at the work with a deadline
RETRY_MS = 1_000  # an entry whose visit failed is looked at again this much later
# A deletion recorded this long ago is taken for one whose driver died, and finished by the tick
# (finish_deletions): until then its driver is presumed to be finishing it (a topic's 10,000
# subscriptions go in 200 calls, about a second). At most DELETIONS_PER_TICK of them a tick, none started
# after DELETION_SECONDS_PER_TICK (each in bounded calls); the rest are the next tick's.
DELETION_GRACE_MS = 5_000
DELETIONS_PER_TICK = 10
DELETION_SECONDS_PER_TICK = 2.0
# (Re)building the index walks the registry this many destinations per tick (SCAN's COUNT hint).
REINDEX_CHUNK = 500
INDEX_VERSION = "1"  # bumped when what the index holds changes: every deployment rebuilds it once


def _dest(destination: str | Destination | Home) -> Destination:
    # a registered topic may be a wildcard subscription's pseudo-topic (docs/broker_core.md)
    return destination if isinstance(destination, Destination) else parse_destination(destination,
                                                                                       allow_wildcards=True)


def _home(destination: str | Destination | Home) -> Home:
    """What a job runs on: a destination's own keys, or one subscription of a topic (a Home as given)."""
    return destination if isinstance(destination, Home) else Home(_dest(destination))


def _maint_key(broker: Broker, dest: Home) -> str:
    return f"{broker.ops.home_prefix(dest)}:maint"


def _heartbeat_key(broker: Broker) -> str:
    return f"{broker.namespace}:maintenance"


RECENT_ERRORS = 10  # the failures of recent ticks kept for the node page (`recent_errors`)


def errors_key(namespace: str) -> str:
    """A list of the last RECENT_ERRORS maintenance failures, newest first: "<ms> <what>: <error>"."""
    return f"{namespace}:maintenance:errors"


def _record(broker: Broker, dest: Home, fields: dict[str, Any], counters: dict[str, int] | None = None
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
    destination: Home
    job: str
    token: str
    ttl_ms: int

    def renew(self) -> bool:
        """Extend the lease; False if it lapsed and another worker took the job over (then stop)."""
        return acquire_lease(self.broker, self.destination, self.job, self.ttl_ms, self.token) is not None

    def release(self) -> bool:
        return release_lease(self.broker, self.destination, self.job, self.token)


def acquire_lease(broker: Broker, destination: str | Destination | Home, job: str, ttl_ms: int,
                  token: str | None = None) -> str | None:
    """Take (or, with the holder's token, renew) the lease of `job` on a destination; returns the token,
    or None while another holder's lease runs."""
    dest = _home(destination)
    token = token or uuid.uuid4().hex
    now = broker.clock.now_ms()
    held = broker._run(single(calls.Maintenance.acquire(broker.ops.home_prefix(dest), now, job, token,
                                                       ttl_ms)))
    return token if calls.Maintenance.parse_held(held) else None


def release_lease(broker: Broker, destination: str | Destination | Home, job: str, token: str) -> bool:
    dest = _home(destination)
    call = calls.Maintenance.release(broker.ops.home_prefix(dest), broker.clock.now_ms(), job, token)
    return calls.Maintenance.parse_held(broker._run(single(call)))


@contextmanager
def job_lease(broker: Broker, destination: str | Destination | Home, job: str, ttl_ms: int
              ) -> Iterator[Lease | None]:
    """The job's lease for the `with` block, or None when another worker holds it."""
    dest = _home(destination)
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


def run_recovery(broker: Broker, destination: str | Destination | Home) -> Recovery:
    """Close consumers whose lease lapsed (their messages return with the redelivery counter raised),
    finish returning what closed consumers still hold and releasing what ended subscriptions held (a
    process died between those chunks), a send's fan-out and a new retroactive durable subscription's
    catch-up left unfinished, complete forwards left behind, and run dispatch when a parked
    message or a delayed start came due. One cheap script call when there is nothing to do."""
    dest = _home(destination)
    now = broker.clock.now_ms()
    token = uuid.uuid4().hex
    probe = calls.Maintenance.parse_recover(broker._run(single(calls.Maintenance.recover(
        broker.ops.home_prefix(dest), now, token, RECOVER_LEASE_MS, FORWARD_GRACE_MS))))
    if not probe.held:
        return Recovery(ran=False)
    return _recover(broker, dest, now, token, probe.lapsed, probe.forwards, probe.due, probe.owed)


def _recover(broker: Broker, dest: Home, now: int, token: str, lapsed: int, forwards: int, due: int,
             owed: int) -> Recovery:
    """The recovery work the probe found, under the 'recover' lease it took (`token`), released at the end."""
    lease = Lease(broker, dest, "recover", token, RECOVER_LEASE_MS)
    try:
        reaped: list[str] = []
        if lapsed:
            for _ in range(REAP_ROUNDS):
                batch = broker.reap_lapsed(dest, REAP_BATCH)
                reaped += batch
                if len(batch) < REAP_BATCH:
                    break
        if owed:  # a process died while returning (or releasing) a closed consumer's messages
            broker._run(broker.ops.return_owed(dest, now))
            if dest.fans_out:  # or fanning out a send (fanout.lua)
                broker._run(broker.ops.fan_out(dest.destination, now))
            elif dest.key:  # or catching a new retroactive durable subscription up (topic.lua catch_up)
                broker._run(broker.ops.catch_up(dest, now))
        forwarded = 0
        if forwards:
            forwarded = broker.forward(dest.destination)  # (a subscription's forwards wait on its topic)
            broker.redis.hdel(_maint_key(broker, dest), "recover:fwd_since")
        dispatched = 0
        if 0 < due <= now:
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


def run_expiry_sweep(broker: Broker, destination: str | Destination | Home, *, period_ms: int | None = None,
                     max_pages: int | None = SWEEP_PAGES_PER_RUN, force: bool = False) -> ExpirySweep:
    """The expiry sweep, every expireMessagesPeriod: a sweep walks the whole destination in pages of
    maxExpirePageSize (each page one script call) and expires what has run out (dead-lettered per
    policy). One run does at most `max_pages` pages (None: to the end); an unfinished sweep goes on at the
    next run, whatever the period. `force` starts a sweep now even if none is due (by hand)."""
    dest = _home(destination)
    period = (broker.policies.resolve(dest.destination).expire_messages_period if period_ms is None
              else period_ms)
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


def _abort_op(broker: Broker, dest: Home, now: int, call: Eval) -> Op:
    """Run through the router (`broker.ops.run`): finishing the pass may deliver forwards."""
    try:
        aborted = calls.Abort.parse((yield call))
    except NoDestination:
        return None
    yield from broker.ops.continue_dispatch(dest, now, aborted.tail.flags, aborted.tail.hold_until)
    if aborted.aborted:  # consumers were aborted: their messages go back in chunks
        yield from broker.ops.return_owed(dest, now)
    return aborted


def run_slow_consumer_check(broker: Broker, destination: str | Destination | Home,
                            entry: PolicyEntry | None = None) -> SlowConsumerCheck:
    """One run of the destination's slowConsumerStrategy when checkPeriod has passed since the last one:
    abortSlowConsumerStrategy (§8.2) or abortSlowAckConsumerStrategy (§8.3), with ActiveMQ's parameters.
    Aborted consumers are closed (messages redelivered, groups freed) and leave an `AbortNotice`."""
    dest = _home(destination)
    entry = entry or broker.policies.resolve(dest.destination)
    if entry.slow_consumer_strategy == "none":
        return SlowConsumerCheck(ran=False)
    with job_lease(broker, dest, "slow", SLOW_LEASE_MS) as lease:
        if lease is None:
            return SlowConsumerCheck(ran=False)
        now = broker.clock.now_ms()
        result = broker._run(broker.ops.run(_abort_op(broker, dest, now, calls.Abort.check(
            broker.ops.home_prefix(dest), now, TOMBSTONES_MAX, TOMBSTONE_MS, entry.slow_consumer_strategy,
            entry.check_period, entry.max_slow_duration, entry.max_slow_count, entry.abort_connection,
            entry.max_time_since_last_ack, entry.ignore_idle_consumers))))
    if result is None or not result.ran:
        return SlowConsumerCheck(ran=False, tracked=result.tracked if result else 0)
    aborted = list(result.aborted)
    if aborted:
        _record(broker, dest, {}, {"slow:aborted": len(aborted)})
        log.info("aborted slow consumers %s on %s", ", ".join(aborted), dest.uri)
    return SlowConsumerCheck(True, result.tracked, aborted)


def abort_consumer(broker: Broker, consumer: ConsumerRef, reason: str, *, abort_connection: bool = False
                   ) -> None:
    """Abort a consumer now (an operator's decision): closed as the strategies close it, with a
    tombstone carrying `reason`. Raises UnknownConsumer if it is not registered."""
    dest = broker._run(broker.ops.home(consumer))  # a topic consumer's subscription
    now = broker.clock.now_ms()
    result = broker._run(broker.ops.run(_abort_op(broker, dest, now, calls.Abort.abort(
        broker.ops.home_prefix(dest), now, TOMBSTONES_MAX, TOMBSTONE_MS, consumer.consumer_id, reason,
        abort_connection))))
    if result is None:
        raise UnknownDestination(f"no destination {dest.uri}", destination=dest.uri)


def abort_notice(broker: Broker, destination: str | Destination | Home,
                 consumer_id: str) -> AbortNotice | None:
    """The tombstone of an aborted consumer (the latest TOMBSTONES_MAX per destination, each kept
    TOMBSTONE_MS), or None."""
    dest = _home(destination)
    raw = broker.redis.hget(f"{broker.ops.home_prefix(dest)}:aborted", consumer_id)
    if raw is None:
        return None
    data = json.loads(raw)
    return AbortNotice(consumer_id, data["reason"], bool(data["abort_connection"]), data["strategy"],
                       int(data["at"]))


def abort_reason(broker: Broker, destination: str | Destination | Home, consumer_id: str) -> str | None:
    """Why the consumer was aborted (the text for the client), or None if it was not aborted."""
    notice = abort_notice(broker, destination, consumer_id)
    return notice.reason if notice else None


# -- offline durable subscriptions (spec §7.4) ------------------------------------------------


def run_offline_durable_cleanup(broker: Broker, destination: str | Destination | Home,
                                entry: PolicyEntry | None = None, *, force: bool = False) -> list[str]:
    """TopicRegion.doCleanup: every offlineDurableSubscriberTaskSchedule ms (when it and
    offlineDurableSubscriberTimeout are not -1), remove the durable subscriptions offline for the timeout
    or more, with their messages. Returns their keys. `force` runs it now whatever the schedule."""
    dest = _home(destination)
    entry = entry or broker.policies.resolve(dest.destination)
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
        removed = broker.expire_offline_durables(dest.destination, timeout)
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
    indexed: int = 0  # entries in the maintenance index after the tick
    still_due: int = 0  # of them, due before the tick started and left for the next (over TICK_SECONDS)
    sampled: int = 0  # destinations whose counters the rate history sampled (broker_core/rates.py)
    deletions_finished: list[str] = field(default_factory=list)  # their uris (finish_deletions)


@dataclass
class _Tally:
    reaped: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    offline_removed: list[str] = field(default_factory=list)
    forwarded: int = 0
    dispatched: int = 0
    sweeps: int = 0
    expired: int = 0
    slow_checks: int = 0
    visited: int = 0


def _due_key(broker: Broker) -> str:
    return f"{broker.namespace}:due"


def _periods(entry: PolicyEntry, topic_level: bool) -> tuple[int, int, int]:
    """(expiry sweep period, slow-consumer check period, offline-durable cleanup schedule) of an index
    entry; 0 / -1 = the job does not run there. Sweeps and checks run on queues and subscriptions, the
    cleanup on a topic itself."""
    if topic_level:
        timeout = entry.offline_durable_subscriber_timeout
        schedule = entry.offline_durable_subscriber_task_schedule
        return 0, -1, schedule if timeout >= 0 and schedule >= 0 else -1
    slow = entry.check_period if entry.slow_consumer_strategy != "none" else -1
    return max(entry.expire_messages_period, 0), slow, -1


def _visit(broker: Broker, dest: Home, entry: PolicyEntry, tally: _Tally) -> None:
    """Run what is due on one queue, topic (forwards waiting there, offline durables) or subscription, then
    set its index entry to when something is next due there. One script call when nothing is due."""
    topic_level = dest.fans_out
    sweep, slow, offline = _periods(entry, topic_level)
    if not dest.key and dest.destination.is_temporary:
        _end_orphaned_temporary(broker, dest.destination)  # (the visit below then drops its index entries)
    now = broker.clock.now_ms()
    token = uuid.uuid4().hex
    visit = calls.Maintenance.parse_visit(broker._run(single(calls.Maintenance.visit(
        broker.ops.home_prefix(dest), now, token, RECOVER_LEASE_MS, FORWARD_GRACE_MS, sweep, slow, offline,
        KEEP_MS))))
    probe, sweep_due, slow_due, offline_due = visit.probe, visit.sweep_due, visit.slow_due, visit.offline_due
    tally.visited += 1
    uri = dest.uri
    try:
        if probe.held:
            recovery = _recover(broker, dest, now, token, probe.lapsed, probe.forwards, probe.due, probe.owed)
            tally.reaped += [f"{uri}#{cid}" for cid in recovery.reaped]
            tally.forwarded += recovery.forwarded
            tally.dispatched += recovery.dispatched
        if offline_due:
            removed = run_offline_durable_cleanup(broker, dest, entry)
            tally.offline_removed += [f"{uri}#{key}" for key in removed]
        if sweep_due == 2:  # a sweep of nothing, recorded by the visit itself
            tally.sweeps += 1
        elif sweep_due:
            result = run_expiry_sweep(broker, dest, period_ms=sweep, max_pages=SWEEP_PAGES_PER_RUN)
            tally.sweeps += result.ran
            tally.expired += result.expired
        if slow_due:
            check = run_slow_consumer_check(broker, dest, entry)
            tally.slow_checks += check.ran
            tally.aborted += [f"{uri}#{cid}" for cid in check.aborted]
    finally:
        if not visit.scheduled:
            broker._run(single(calls.Maintenance.schedule(broker.ops.home_prefix(dest), broker.clock.now_ms(),
                                                         FORWARD_GRACE_MS, sweep, slow, offline)))


def finish_deletions(broker: Broker) -> list[str]:
    """Finish the deletions whose driver died between two of their calls (a process killed mid-way), which
    would otherwise leave their destination listed and half-drained: up to DELETIONS_PER_TICK recorded at
    least DELETION_GRACE_MS ago, each as its driver would have (Router.finish_deletions), in bounded calls.
    Returns their uris."""
    finished: list[str] = []
    until = time.monotonic() + DELETION_SECONDS_PER_TICK
    while len(finished) < DELETIONS_PER_TICK and time.monotonic() < until:
        now = broker.clock.now_ms()  # (one at a time: the oldest left, its record's time read afresh)
        done = broker._run(broker.ops.finish_deletions(now, now - DELETION_GRACE_MS, 1))
        if not done:
            break
        log.info("the deletion of %s, stopped half-way, finished", done[0])
        finished += done
    return finished


def _end_orphaned_temporary(broker: Broker, dest: Destination) -> None:
    """A temporary destination whose connection is gone (its gateway process died, so its lease in the
    connection registry lapsed; or a send re-created it after its connection deleted it) is deleted with
    its messages, counted as its connection's end counts them (Broker.delete_temp_destination)."""
    owner = dest.temporary_owner
    if owner is not None and not broker.connection_live(owner):
        removed = broker.delete_temp_destination(dest)
        log.info("temporary destination %s deleted with %d messages: its connection %s ended", dest.uri,
                 removed, owner)


def _member_dest(broker: Broker, member: str) -> Home:
    """The queue, topic or subscription an index entry (its key prefix) names."""
    rest = member[len(broker.namespace) + 2:]  # past "<ns>:{"
    tag, _, tail = rest.partition("}")
    kind, _, name = tag.partition(":")
    dest = _dest(f"{'queue' if kind == 'q' else 'topic'}://{name}")
    if tail.startswith(":s:"):
        return Home(dest, tail[3:])
    return Home(dest)


def _reindex_step(broker: Broker, now: int) -> None:
    """Bring every destination's and subscription's periodic index entry forward to now, one chunk of the
    registry per tick, when the index was built for another policy map (a changed period applies at once)
    or by an older Signalbox (or never: an existing deployment's first tick)."""
    key = _due_key(broker)
    version = f"{INDEX_VERSION}:{_text(broker.redis.get(f'{broker.namespace}:policies:version') or b'0')}"
    built, walking, mode, cursor = broker.redis.hmget(f"{key}:state", "built", "walking", "mode", "cursor")
    if built is not None and _text(built) == version:
        return
    if walking is not None and _text(walking) == version:  # a walk under way goes on
        mode, cursor = _text(mode or b"lt"), int(cursor or 0)
    elif built is None and walking is None and not broker.redis.zcard(f"{broker.namespace}:destinations"):
        broker.redis.hset(f"{key}:state", mapping={"built": version})  # a new deployment: nothing to walk
        return
    else:
        # A changed map (or index version) moves every periodic entry to now; a first build (an older
        # deployment) adds only the missing ones, destinations created since this code runs having theirs
        # already. One entry is enough: the visit sets both from what it finds.
        mode, cursor = ("nx" if built is None and walking is None else "lt"), 0
    cursor, uris = broker.redis.zscan(f"{broker.namespace}:destinations", cursor, count=REINDEX_CHUNK)
    uris = [_text(u) for u, _ in uris]
    if cursor == 0:  # (the last chunk) the wildcard subscriptions' pseudo-topics, which are not registered
        uris += broker._run(broker.ops.pattern_topics())
    pipe = broker.redis.pipeline(transaction=False)
    for uri in uris:
        dest = _dest(uri)
        targets = [Home(dest)]
        if dest.is_topic:
            targets += broker._run(broker.ops.for_each_subscription(dest))
        pipe.zadd(f"{key}:periodic", {broker.ops.home_prefix(t): now for t in targets}, **{mode: True})
    state = {"walking": version, "mode": mode, "cursor": cursor}
    if cursor == 0:
        state["built"] = version
    pipe.hset(f"{key}:state", mapping=state)
    pipe.execute()


def _guarded(tally: _Tally, what: str, run: Any) -> bool:
    try:
        run()
        return True
    except (redis.ConnectionError, redis.TimeoutError) as exc:  # Redis away (restarting): one line, no trace
        log.warning("maintenance of %s skipped: Redis unavailable (%s)", what, exc)
        tally.errors.append(f"{what}: Redis unavailable: {exc}")
        return False
    except Exception as exc:  # one broken destination must not stop the maintenance of the others
        log.exception("maintenance of %s failed", what)
        tally.errors.append(f"{what}: {type(exc).__name__}: {exc}")
        return False


def _visit_due(broker: Broker, key: str, tally: _Tally, visit: Any, seconds: float | None = None) -> int:
    """Visit one chunk of the entries of index `key` that are due now, or those of them that fit in
    `seconds` (the others stay due); how many were visited."""
    until = None if seconds is None else time.monotonic() + seconds
    now = broker.clock.now_ms()
    members = [_text(m) for m in broker.redis.zrangebyscore(key, "-inf", now, 0, TICK_CHUNK)]
    # several ticks at once (several workers) spread over the entries instead of meeting at one lease
    random.shuffle(members)
    for done, member in enumerate(members):
        if until is not None and done and time.monotonic() > until:
            return done
        try:
            dest = _member_dest(broker, member)
            label = dest.label
        except Exception:  # (not one of ours: an entry written by hand) nothing to visit
            broker.redis.zrem(key, member)
            continue
        if not _guarded(tally, label, lambda dest=dest: visit(dest)):
            pipe = broker.redis.pipeline(transaction=False)
            for index in (_due_key(broker), f"{_due_key(broker)}:periodic"):
                pipe.zadd(index, {member: broker.clock.now_ms() + RETRY_MS}, xx=True, gt=True)
            pipe.execute()
    return len(members)


def run_due(broker: Broker, destinations: Iterable[str] | None = None) -> TickReport:
    """Run every job that is due, reading the policies now: recovery (lapsed consumers, parked messages
    come due, forwards left behind), the expiry sweep every expireMessagesPeriod, the slow-consumer check
    every checkPeriod, the offline-durable cleanup every offlineDurableSubscriberTaskSchedule.

    What is due is read from the maintenance index (key prefix -> when it is next due): `<ns>:due` for work
    with a deadline (leases, parked messages, delayed starts, forwards), `<ns>:due:periodic` for the
    periodic jobs; TICK_CHUNK entries per call, for at most TICK_SECONDS, the rest being the next tick's.
    So a tick costs what is due, not what exists. Before them, deletions whose driver died half-way are
    finished (`finish_deletions`). With `destinations`, those destinations and all their subscriptions are
    visited whatever the index says (and no deletion is finished). A failing destination is logged and
    reported; the others go on."""
    started = time.monotonic()
    policy_map = broker.policies.policy_map()
    tally = _Tally()
    now = broker.clock.now_ms()
    deletions: list[str] = []

    def visit(dest: Home) -> None:
        _visit(broker, dest, policy_map.resolve(dest.destination), tally)

    if destinations is not None:
        uris = list(destinations)
        random.shuffle(uris)
        for uri in uris:
            def visit_all(uri: str = uri) -> None:
                dest = _dest(uri)
                targets = [Home(dest)]
                if dest.is_topic:
                    targets += broker._run(broker.ops.for_each_subscription(dest))
                for target in targets:
                    visit(target)
            _guarded(tally, uri, visit_all)
        count = len(uris)
    else:
        key = _due_key(broker)
        _reindex_step(broker, now)
        _guarded(tally, "unfinished deletions", lambda: deletions.extend(finish_deletions(broker)))
        # The pseudo-topics of patterns that lost their last subscription (a handful): what waits there is
        # delivered by their visit, then their keys go.
        for uri in broker._run(broker.ops.idle_pattern_topics()):
            def visit_idle(uri: str = uri) -> None:
                dest = _dest(uri)
                for target in [Home(dest), *broker._run(broker.ops.for_each_subscription(dest))]:
                    visit(target)
                broker._run(broker.ops.drop_idle_pattern(dest, broker.clock.now_ms(), (*JOBS, "offline")))
            _guarded(tally, uri, visit_idle)
        deadline = started + TICK_SECONDS
        urgent, periodic = key, f"{key}:periodic"
        while time.monotonic() < deadline:
            # Work with a deadline first (leases, parked messages, forwards), all of it, then periodic jobs
            # for up to PERIODIC_SLICE_SECONDS, then again: so a lease that lapses during a long run of
            # sweeps waits for one slice. A visit moves its entries past `now`, so each read finds entries
            # not seen yet.
            while time.monotonic() < deadline and _visit_due(broker, urgent, tally, visit):
                pass
            if not _visit_due(broker, periodic, tally, visit, PERIODIC_SLICE_SECONDS):
                break
        count = tally.visited
    # the rate history's share of the tick (bounded: rates.TICK_SECONDS, one pass per 5 s)
    sampled: list[int] = []
    if destinations is None:
        _guarded(tally, "rate history", lambda: sampled.append(rates.sample_due(broker)))
    duration_ms = int((time.monotonic() - started) * 1000)
    pipe = broker.redis.pipeline(transaction=False)
    pipe.hset(_heartbeat_key(broker), mapping={
        "last_tick": broker.clock.now_ms(), "duration_ms": duration_ms, "destinations": count,
        "errors": len(tally.errors),
    })
    for index in (_due_key(broker), f"{_due_key(broker)}:periodic"):
        pipe.zcard(index)
        pipe.zcount(index, "-inf", now)
    if tally.errors:  # the worker logged each with its traceback; the node page shows the latest texts
        tick_ms = broker.clock.now_ms()
        texts = [f"{tick_ms} {e[:500]}" for e in tally.errors[-RECENT_ERRORS:]]
        pipe.lpush(errors_key(broker.namespace), *texts)
        pipe.ltrim(errors_key(broker.namespace), 0, RECENT_ERRORS - 1)
    _, *rest = pipe.execute()
    indexed, still_due, periodic_indexed, periodic_due = rest[:4]
    indexed, still_due = indexed + periodic_indexed, still_due + periodic_due
    broker.redis.hset(_heartbeat_key(broker), mapping={"indexed": indexed, "still_due": still_due})
    return TickReport(count, tally.reaped, tally.forwarded, tally.dispatched, tally.sweeps, tally.expired,
                      tally.slow_checks, tally.aborted, tally.errors, duration_ms, tally.offline_removed,
                      indexed, still_due, sum(sampled), deletions)


# -- what the console shows ---------------------------------------------------------------------------


def job_status(broker: Broker, destination: str | Destination | Home) -> dict[str, dict[str, Any]]:
    """Progress and last-run times of each job on a destination, for the console and the API:
    {"recover": {last_work, reaped, forwarded, dispatched}, "expire": {started, running, examined,
    expired, pages, last_run, last_done, last_examined, last_expired}, "slow": {last_run, config,
    aborted, tracked}}, each with `leased_until` while a worker holds the job (times in ms)."""
    dest = _home(destination)
    prefix = broker.ops.home_prefix(dest)
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


def recent_errors(raw: list[Any]) -> list[dict[str, Any]]:
    """The entries of `errors_key` (LRANGE) as {"ts": ms, "error": text}, newest first."""
    out = []
    for entry in raw:
        ts, _, text = _text(entry).partition(" ")
        out.append({"ts": int(ts) if ts.isdigit() else 0, "error": text})
    return out


def last_tick(broker: Broker) -> dict[str, int]:
    """When the dispatcher last ran (ms), how long it took, how many destinations, how many failed;
    empty if it never ran. A stale `last_tick` means no worker or no beat is running."""
    return {_text(k): int(v) for k, v in broker.redis.hgetall(_heartbeat_key(broker)).items()}
