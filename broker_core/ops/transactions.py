"""Transactions over sends and acks: a transaction buffers its sends and acks in Redis (key
<ns>:tx:<id>); commit applies them all or none in one MULTI/EXEC (`commit`), rollback returns the acked
messages with their redelivery counter raised.

A transaction spans queues and topics, yet this module is a sibling of ops/queues.py and ops/topics.py in
the layers and calls neither: an ack or a release works on the consumer's home whatever its kind
(ops/homes.py), and the commit builds its scripts' calls itself (scripts/calls.py). Only finishing a
topic after the commit is the topic's own work (its subscriptions' passes, its fan-outs), and that one
step is yielded as a `Settle` effect for the router, which knows both kinds, as `Forward` and `Create`
are: simpler than moving the topic's fan-out below the kinds, where it would not belong.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgpack

from ..destinations import Destination, require_concrete
from ..effects import Command, Eval, Op, Settle
from ..errors import NotInFlight, TransactionError, TransactionTooLarge, UnknownConsumer
from ..keys import Home, tx_key
from ..messages import Message
from ..model import Consumer, ConsumerRef, TransactionLimits
from ..scripts import calls
from ..scripts.calls import FORWARDS_WAITING, PASS_HAS_MORE
from ..topics import is_durable_key, pack_for_topic
from . import flow, homes, virtual
from .context import Context


def begin(ops: Context, ttl_ms: int) -> Op:
    """A new transaction, open for `ttl_ms` unless renewed (`renew`): its owner's lease, so a process
    that dies with it open holds nothing for longer. One MULTI/EXEC: a caller cancelled between two
    commands left a transaction that never expired."""
    tx = f"tx-{uuid.uuid4().hex[:16]}"
    key = tx_key(ops.namespace, tx)
    yield [("RPUSH", key, Tally().pack()), ("PEXPIRE", key, ttl_ms)]
    return tx


def renew(ops: Context, txs: list[str], ttl_ms: int) -> Op:
    """Keep open transactions open `ttl_ms` longer (their owner renews them with its consumers' leases).
    Returns those that are gone (expired: their owner missed its renewals; or ended)."""
    if not txs:
        return []
    replies = yield [("PEXPIRE", tx_key(ops.namespace, tx), ttl_ms) for tx in txs]
    return [tx for tx, reply in zip(txs, replies, strict=True) if reply != 1]


# The longest a transaction's reservation of space can outlive it: none while its key is read (see `send`).
RESERVATION_MOST_MS = 24 * 3_600_000

# Records: the tally first, ["begin", messages, body bytes, [destinations and consumers]] (`Tally`), then
# ["send", kind, name, message id, packed message] and ["ack", kind, name, consumer id, ack mode, [ids]],
# with the subscription's key after the ids for an ack whose messages a durable subscription holds for the
# transaction should its consumer close (`ack`).


@dataclass(frozen=True)
class Tally:
    """What a transaction holds, as its limits count it (TransactionLimits): its first record."""

    size: int = 0
    body_bytes: int = 0
    places: frozenset[str] = frozenset()  # the destinations sent to (uri) and consumers acked for (id)

    def pack(self) -> bytes:
        return msgpack.packb(["begin", self.size, self.body_bytes, sorted(self.places)])

    @classmethod
    def unpack(cls, raw: bytes) -> Tally:
        _, *held = msgpack.unpackb(raw, raw=False)
        if not held:  # (a transaction begun before its tally was kept: counted from here)
            return cls()
        return cls(held[0], held[1], frozenset(held[2]))

    def adding(self, limits: TransactionLimits, tx: str, size: int, body_bytes: int,
               places: Iterable[str]) -> Tally:
        """This tally with `size` messages, `body_bytes` of bodies and `places` more; TransactionTooLarge
        past a limit. The one check of every adapter's transactions."""
        grown = Tally(self.size + size, self.body_bytes + body_bytes, self.places.union(places))
        for held, limit, setting, what in (
                (grown.size, limits.size, "SIGNALBOX_MAX_TRANSACTION_SIZE", "messages sent and acknowledged"),
                (grown.body_bytes, limits.body_bytes, "SIGNALBOX_MAX_TRANSACTION_BYTES",
                 "bytes of message bodies"),
                (len(grown.places), limits.destinations, "SIGNALBOX_MAX_TRANSACTION_DESTINATIONS",
                 "destinations and consumers")):
            if held > limit:
                raise TransactionTooLarge(
                    f"transaction {tx} would hold {held} {what}; the limit is {limit} ({setting}): nothing "
                    "was added; commit it and go on in another", transaction=tx, setting=setting,
                    limit=limit, held=held, what=what)
        return grown


def _tally(ops: Context, tx: str) -> Op:
    """The transaction's tally as stored (for `_record`) and read; TransactionError if it is not open."""
    raw = yield Command(("LINDEX", tx_key(ops.namespace, tx), 0))
    if raw is None:
        raise TransactionError(f"no open transaction {tx}", transaction=tx)
    return raw, Tally.unpack(raw)


def check(ops: Context, tx: str, size: int, body_bytes: int, places: Iterable[str]) -> Op:
    """Whether `size` messages, `body_bytes` of bodies and `places` more would fit in the open transaction:
    TransactionTooLarge if not; nothing changes either way. For a caller that adds in several calls
    what must fit whole (a composite send's parts; an adapter holding acks it adds at commit)."""
    _, tally = yield from _tally(ops, tx)
    tally.adding(ops.transaction_limits, tx, size, body_bytes, places)


def _tx_records(ops: Context, tx: str) -> Op:
    yield from _tally(ops, tx)
    raw = yield Command(("LRANGE", tx_key(ops.namespace, tx), 1, -1))
    return [msgpack.unpackb(r, raw=False) for r in raw]


def send(ops: Context, tx: str, dest: Destination, messages: Iterable[Message], now: int) -> Op:
    require_concrete(dest, "send to")
    messages = list(messages)
    added = (len(messages), sum(message.body_size for message in messages), (dest.uri,))
    raw, tally = yield from _tally(ops, tx)
    tally.adding(ops.transaction_limits, tx, *added)  # refused before it reserves space or stores anything
    yield from ops.ensure(dest, now)  # so the commit's MULTI never meets a new one
    if dest.is_topic:  # recorded with the ActiveMQ.Retain decision (topics.pack_for_topic)
        records = [pack_for_topic(message, now) for message in messages]
        packed = [(message_id, blob) for message_id, blob, _, _ in records]
    else:
        packed = [message.pack(now) for message in messages]
    # a transacted send waits for space (or fails) when it is sent; its commit is not refused.
    # the space it needs is reserved for the transaction until its commit or rollback, or until its key
    # is gone (it expired: its owner stopped renewing it; flow.lua flow.reserved), so open transactions
    # together cannot commit past a limit (§9.2), topics included.
    probe = f"probe:{tx}:{RESERVATION_MOST_MS}"
    yield from flow.send_when_space(ops, dest, now, calls.Send, 0, probe, packed)
    if dest.is_topic:
        sends = [["send", dest.kind, dest.name, message_id, blob, retain, copy]
                 for message_id, blob, retain, copy in records]
    else:
        sends = [["send", dest.kind, dest.name, message_id, blob] for message_id, blob in packed]
    yield from _record(ops, tx, raw, tally, added, sends)
    return [record[3] for record in sends]


# How often `_record` reads a tally again that another caller changed meanwhile before it gives up.
RECORD_TRIES = 10


def _record(ops: Context, tx: str, raw: bytes, tally: Tally, added: tuple[int, int, Iterable[str]],
            records: list[list[Any]]) -> Op:
    """Add records to an open transaction with its tally grown by `added`, checked against its limits
    again if another caller added to it since it was read (`raw`, `tally`: tx_record.lua adds only to the
    tally it was given). Never makes the key again: the transaction may have ended since it was read
    (rolled back by its owner's close, or expired) while its send waited for room, and a key made again
    would have no lifetime, kept forever with its reservation. Refused here (ended, or past a limit by
    another caller's adds meanwhile), what the send reserved or the ack marked delivered stays until the
    transaction ends, as it would have had it been added."""
    key = tx_key(ops.namespace, tx)
    packed = [msgpack.packb(r) for r in records]
    for _ in range(RECORD_TRIES):
        grown = tally.adding(ops.transaction_limits, tx, *added)
        done = yield calls.TxRecord.call(key, raw, grown.pack(), packed)
        if done == 1:
            return
        if done == -1:
            break
        raw, tally = yield from _tally(ops, tx)
    else:
        raise TransactionError(f"transaction {tx}: not added, its tally changed {RECORD_TRIES} times while "
                               "this was added (other callers adding to it)", transaction=tx)
    raise TransactionError(f"no open transaction {tx} (it ended while this was added)", transaction=tx)


def ack(ops: Context, tx: str, consumer: ConsumerRef, message_ids: list[str], mode: str, now: int,
        mark_delivered: bool = True) -> Op:
    """A transacted ack is a DELIVERED ack now (the window grows) and a real ack on commit. Counted as the
    ids it names (a cumulative ack's covered messages are read at commit, bounded by its window).
    `mark_delivered=False`: the caller marked them delivered already, when its client acknowledged them (an
    adapter that records its transaction's acks at commit, gateway/ws/link.py); marked again, the window
    would grow twice and the commit's acks shrink it once: one message more past the prefetch for each
    transaction committed."""
    added = (len(message_ids), 0, (consumer.consumer_id,))
    raw, tally = yield from _tally(ops, tx)
    tally.adding(ops.transaction_limits, tx, *added)  # refused before any message is marked delivered
    # an individual ack of a queue consumer or a durable subscription's also marks its messages as the
    # transaction's: should the consumer close before the transaction ends, they are held for it (the
    # commit consumes them, a rollback or the transaction's lapse returns them), as ActiveMQ's Queue keeps
    # a transacted ack's message, and its durable subscription's store holds the ack in the transaction
    # (Topic.acknowledge, the transaction store), applied at the commit whatever became of the subscriber.
    # A non-durable subscription's messages end with it (no mark). (An adapter that marked them delivered
    # itself records its acks just before its commit, its subscriptions open: no mark.)
    dest = consumer.destination
    record = ["ack", dest.kind, dest.name, consumer.consumer_id, mode, message_ids]
    if mark_delivered:
        home = (yield from ops.home(consumer)) if dest.is_topic else Home(dest)
        held = mode == "individual" and (not dest.is_topic or is_durable_key(home.key))
        yield from homes.ack(ops, consumer, message_ids,
                             f"tx:{tx_key(ops.namespace, tx)}" if held else "delivered", now, home=home)
        if held and dest.is_topic:  # where they are held: the consumer's subscription, found by it no more
            record.append(home.key)
    # (the transaction gone meanwhile: its messages stay delivered, in flight until its consumer ends)
    yield from _record(ops, tx, raw, tally, added, [record])


def commit(ops: Context, tx: str, now: int) -> Op:
    """Every step (send, ack, reservation's end) applies, or none does. Redis does not undo a MULTI/EXEC
    half of whose commands failed, so the commit's one MULTI/EXEC first checks every step (each ack's
    messages still in flight with its consumer, each send's destination still there and its messages
    within its limits: the scripts' own checks, `check`), then applies them, and each of its calls is a
    step of the commit (calls.step_of): once one is refused no later one runs, and the last
    (commit_end.lua) ends the transaction only if none was. MULTI/EXEC is isolated: nothing else runs
    between the checks and the steps. Each call is as bounded as any (an ack's ids and a send's messages
    in parts, each destination's sends and each consumer's individual acks together: `_steps`; a
    cumulative ack over more than CUMULATIVE_MOST messages, read just before, as individual acks of
    ACK_PART: if its window changed meanwhile, the check refuses it); the whole is
    bounded by the transaction's limits (TransactionLimits, checked as it was filled) and its consumers'
    windows.
    Refused: TransactionError naming the step and its reason; nothing applied, the transaction open as
    it was, to commit again or roll back."""
    key = tx_key(ops.namespace, tx)
    records = yield from _tx_records(ops, tx)
    checks: list[Eval] = []
    steps: list[Eval] = []
    names: list[str] = []  # what each check checks, for the refusal
    touched: dict[str, Home] = {}
    for op, dest, rest in _steps(records):
        home = Home(dest)
        touched[home.label] = home
        if op == "send":
            origin = yield from virtual.origin(ops, dest, "commit")
            script = calls.TopicSend if dest.is_topic else calls.Send
            checks.append(script.check(ops.prefix(dest), now, rest))  # (bodies left out: its step's)
            steps.append(script.call(ops.prefix(dest), now, 0, origin, rest))
            names.append(f"the send to {dest.uri} of {_listed([r[0] for r in rest])}")
        else:
            consumer_id, mode, message_ids, held_in = rest
            if dest.is_topic and held_in:
                # the durable subscription that holds the messages for this transaction should their
                # consumer close (`ack`), whatever became of the consumer since (its id may be another
                # subscription's now); removed since, its messages went with it: nothing to acknowledge
                # (and one re-created under its name holds none of them: ack.lua skips them)
                if not (yield Command(("HEXISTS", f"{ops.prefix(dest)}:subs", held_in))):
                    continue
                home = Home(dest, held_in)
                touched[home.label] = home
            elif dest.is_topic:  # the ack goes to the consumer's subscription
                try:
                    home = yield from ops.subscription_home(dest, consumer_id, None)
                except UnknownConsumer:
                    # closed: a non-durable subscription's messages went away with it, those of a durable
                    # one's ack that marked none (cumulative, or marked by its adapter) back to it
                    continue
                touched[home.label] = home
            prefix = ops.home_prefix(home)
            name = f"the {mode} ack by consumer {consumer_id} of {dest.uri} of {_listed(message_ids)}"
            parts = [(mode, message_ids)]
            if mode == "cumulative":  # over more than one call takes: its messages individually, in parts
                covered = yield from homes.covered_when_over(ops, home, consumer_id, message_ids[0])
                if covered is not None:
                    parts = [("individual", covered[i:i + homes.ACK_PART])
                             for i in range(0, len(covered), homes.ACK_PART)]
            for part_mode, ids in parts:
                checks.append(calls.Ack.check(prefix, now, consumer_id, part_mode, ids))
                steps.append(calls.Ack.commit(prefix, now, consumer_id, part_mode, ids))
                names.append(name)
    # the reservations end in the same atomic step as the committed messages start counting
    releases = [calls.FlowRelease.call(ops.prefix(d), now, tx) for d in _sent_to(records)]
    replies = yield [*(calls.step_of(call, key) for call in (*checks, *steps, *releases)),
                     calls.CommitEnd.call(key)]  # one MULTI/EXEC
    if isinstance(replies[-1], Exception):
        raise _refusal(tx, replies, names)
    for home in touched.values():  # each script ran one chunk: finish the passes and forwards
        if home.fans_out:  # a topic: its outbox, its subscriptions' passes, a send's unfinished fan-out
            yield Settle(home.destination, now)
            continue
        yield from ops.continue_dispatch(home, now, PASS_HAS_MORE | FORWARDS_WAITING, 0)


def _refusal(tx: str, replies: list[Any], names: list[str]) -> TransactionError:
    """The error of a commit that was not applied: the first step refused, and why (its script's
    error reply: which message, which limit)."""
    end = replies[-1]
    failed = next((n for n, reply in enumerate(replies[:-1]) if isinstance(reply, Exception)), None)
    if failed is None or not str(end).startswith("NOT_COMMITTED"):  # (no open transaction: expired)
        return TransactionError(f"transaction {tx} not committed: {end}", transaction=tx)
    if failed >= len(names):  # a step refused after every check passed: none of them should be
        return TransactionError(f"transaction {tx} partly committed: step {failed - len(names) + 1} of "
                                f"{len(replies) - 1 - len(names)} was refused after the steps before it "
                                f"applied: {replies[failed]}", transaction=tx, applied=True)
    reason = str(replies[failed])
    if reason.startswith("NO_DESTINATION"):  # (its text names the destination's keys, not its uri)
        reason = "NO_DESTINATION it no longer exists (deleted since the send)"
    return TransactionError(
        f"transaction {tx} not committed, nothing was applied: {names[failed]} was refused ({reason}); "
        "the transaction is still open, to commit again or roll back",
        transaction=tx, refused=names[failed], reason=reason, applied=False)


def _listed(message_ids: list[str]) -> str:
    """Message ids for an error: the first three, and how many more."""
    shown = ", ".join(message_ids[:3])
    more = f" and {len(message_ids) - 3} more" if len(message_ids) > 3 else ""
    return f"message{'s' if len(message_ids) > 1 else ''} {shown}{more}"


def rollback(ops: Context, tx: str, now: int, redeliver: bool = True) -> Op:
    """Drop the sends (their reserved space given back) and give back what the acks took: their messages
    go back for redelivery, counter raised. `redeliver=False` (a client that keeps what it was given:
    STOMP's ABORT, as ActiveMQ's broker rolls back an ack without taking the message from its live
    consumer): those still in flight with their consumer stay delivered to it, the window their acks
    opened closing again. Either way those held for the transaction (their consumer closed since) go
    back. One consumer's acks go back together, ACK_PART ids a call, whatever their records' order."""
    records = yield from _tx_records(ops, tx)
    yield Command(("DEL", tx_key(ops.namespace, tx)))
    for dest in _sent_to(records):  # give back the space its sends reserved
        yield calls.FlowRelease.call(ops.prefix(dest), now, tx)
    acked: dict[ConsumerRef, list[str]] = {}
    for record in records:
        if record[0] == "ack":  # (one held in a durable subscription: found there, its consumer gone)
            consumer = (Consumer(Destination(record[1], record[2]), record[3], subscription=record[6])
                        if len(record) > 6 else ConsumerRef(Destination(record[1], record[2]), record[3]))
            acked.setdefault(consumer, []).extend(record[5])
    for consumer, message_ids in acked.items():
        yield from _give_back(ops, consumer, list(dict.fromkeys(message_ids)), now,
                              tx_key(ops.namespace, tx), not redeliver)


def _give_back(ops: Context, consumer: ConsumerRef, message_ids: list[str], now: int, key: str,
               keep: bool) -> Op:
    """A rolled back ack's messages back for redelivery (`keep`: left delivered, release.lua), ACK_PART
    a call, those held for the transaction (`key`; their consumer closed since) too. release.lua refuses
    a call one of whose messages is not in flight: one that left meanwhile (an operator removed or moved
    it, a commit refused for that) does not keep the others, which go back one by one."""
    for i in range(0, len(message_ids), homes.ACK_PART):
        part = message_ids[i:i + homes.ACK_PART]
        try:
            yield from homes.release(ops, consumer, part, now, key, keep)
        except UnknownConsumer:  # the consumer closed and none of this part is held: they went back already
            continue  # (a later part may hold some: release.lua gives back a part's held ones whatever else)
        except NotInFlight:
            for message_id in part if len(part) > 1 else ():
                with contextlib.suppress(NotInFlight, UnknownConsumer):
                    yield from homes.release(ops, consumer, [message_id], now, key, keep)


def _steps(records: list[Any]) -> list[tuple[str, Destination, Any]]:
    """The records as the commit's script calls: ("send", destination, messages) of up to flow.SEND_PART
    messages and SEND_PART_BYTES, as any batch, and ("ack", destination, [consumer, mode, at most ACK_PART
    ids, the durable subscription that holds them for the transaction or None]). A destination's sends go
    together, and so do one consumer's individual acks (a STOMP client's ACK frames), wherever they stand in
    the transaction, each group in its own order, at the place of its first record; any other ack is a step of
    its own, in place. Inside the commit's one MULTI/EXEC nothing sees the order of steps on different
    destinations; on one, a dispatch after an ack may now find more of the transaction's sends pending, as in
    ActiveMQ, whose commit makes every send visible before it dispatches. And the MULTI/EXEC holds Redis for
    everyone: taken in record order, a transaction alternating between two queues made a call per message (500
    sends held Redis 44-140 ms, 500 acks of two consumers in turn 38-98 ms, by SLOWLOG), where a call of 100
    costs little more than one of one."""
    groups: dict[Any, tuple[str, Destination, Any]] = {}  # by destination, or consumer: in first-record order
    for n, (op, kind, name, *rest) in enumerate(records):
        dest = Destination(kind, name)
        if op == "send":
            message = rest if dest.is_topic else (rest[0], rest[1])
            groups.setdefault(("send", dest), ("send", dest, []))[2].append(message)
            continue
        consumer_id, mode, message_ids, *held_in = rest
        key = ("ack", dest, consumer_id) if mode == "individual" else n
        group = groups.setdefault(key, ("ack", dest, [consumer_id, mode, [], None]))[2]
        group[2].extend(message_ids)
        group[3] = group[3] or (held_in[0] if held_in else None)
    steps: list[tuple[str, Destination, Any]] = []
    for op, dest, items in groups.values():
        if op == "ack":
            consumer_id, mode, message_ids, held_in = items
            steps += [(op, dest, [consumer_id, mode, message_ids[i:i + homes.ACK_PART], held_in])
                      for i in range(0, len(message_ids), homes.ACK_PART)]
            continue
        size = 0
        for message in items:  # (a topic's record: id, blob, retain, copy; a queue's: id, blob)
            last = steps[-1] if steps else None
            if (last is not None and last[0] == "send" and last[1] == dest and len(last[2]) < flow.SEND_PART
                    and size + len(message[1]) <= flow.SEND_PART_BYTES):
                last[2].append(message)
                size += len(message[1])
            else:
                steps.append(("send", dest, [message]))
                size = len(message[1])
    return steps


def _sent_to(records: list[Any]) -> list[Destination]:
    """the destinations a transaction's send records name (each holds a reservation)."""
    return list(dict.fromkeys(Destination(r[1], r[2]) for r in records if r[0] == "send"))
