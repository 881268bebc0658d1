"""Every broker operation, written once as a generator that yields Redis calls (sans I/O).

An operation yields `Eval` (run a Lua script) or `Command` (a plain Redis command) or `Policy` (resolve
a destination's policy), receives the reply, and finally returns its result. `broker.Broker` drives
these generators with a blocking redis client and `broker.AsyncBroker` with an asyncio one, so the
sync and async APIs share one implementation. Errors raised by Redis are thrown back into the
generator, which is how a destination gets created on first use (NO_DESTINATION -> write its policy,
retry).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import msgpack

from . import advisory, flow, virtual
from .config.entry import PolicyEntry
from .destinations import Destination, parse_destination, require_concrete
from .effects import Command, Eval, NoDestination, Op, Policy
from .errors import (
    BrokerError,
    InvalidConsumer,
    InvalidDestination,
    NotInFlight,
    OperationRefused,
    TransactionError,
    UnknownConsumer,
    UnknownDestination,
    UnknownMessage,
)
from .messages import Message, dead_letter_copy, failure_cause
from .model import (
    AckRequest,
    Consumer,
    ConsumerRef,
    ConsumerSpec,
    ConsumerStats,
    DestinationStats,
    DispatchResult,
    GroupInfo,
    SentId,
    SweepResult,
)
from .replies import bound_stats, forward_stats, memory_stats
from .resp import reply_text as _str
from .scripts import calls
from .scripts.calls import FORWARDS_WAITING, PASS_HAS_MORE, Closing, Sent
from .selector import parse_selector
from .topics import Subscription, pack_for_topic, wildcard_copy

# No ':' so that a consumer's key names never collide with another consumer's (…:c:<id>:inflight).
_CONSUMER_ID = re.compile(r"[A-Za-z0-9._@-]{1,128}")
MAX_RECEIVE = 1_000
REMOVE_PAGE = 200  # messages remove_matching removes per call (by id, after a browse page finds them)
BROWSE_EXAMINE = 400  # messages a browse call looks at, matching or not (100,000 unmatched: 250 calls)
TRANSFER_EXAMINE = 500  # messages a move/copy call looks at
PURGE_EXAMINE = 500  # messages a purge call looks at
# A batch sent in one call of the API goes to Redis in parts of at most this many messages and bytes (one
# message at least): every part's limits are checked first, then the parts are stored in order, each atomic.
SEND_PART = 100
SEND_PART_BYTES = 1 << 20
DESTINATIONS_PAGE = 500  # registry entries per ZSCAN
GROUPS_PAGE = 200  # message groups per group_list call
ACK_PART = 100  # ids per ack call: a larger individual ack is checked whole, then applied in parts
CUMULATIVE_MOST = 1_000  # messages one cumulative ack call takes (scripts/lua/ack.lua says the same)
MAX_DISPATCH_CHUNKS = 1_000  # per operation; each chunk is its own bounded script call
# In-flight messages a closed (or reaped, aborted) consumer returns per script call, and messages an ended
# topic subscription held released per call; the rest follow in further calls (return_owed). A message
# costs about 10 µs of Redis CPU: 200 keep a call at 2-6 ms, well under the 20 ms bound
# (docs/benchmarks.md, "Closing and reaping").
RETURN_CHUNK = 200
TRANSFERS = ("move", "copy", "retry")  # forwards that keep the message as it is (not dead letters)
# forwards that publish a copy made for the target: a virtual destination's, an advisory, a wildcard
# subscription's (scripts/lua/includes/wildcard.lua). With TRANSFERS, every forward that is not a dead letter:
# only a dead letter's target is marked a dead-letter queue (meta dlq=1, which retry requires).
COPIES = ("virtual", "advisory", "wildcard")



class Operations:
    """Builds the operation generators for one key namespace."""

    def __init__(self, namespace: str = "sb", return_chunk: int = RETURN_CHUNK) -> None:
        self.namespace = namespace
        self.return_chunk = return_chunk  # messages returned (or released) per call
        self.registry_key = f"{namespace}:destinations"
        self.virtual = virtual.VirtualCache()  # this process's copy of the routing configuration
        # Deliveries pushed to consumers of this process (outbox.lua push_*): the wake-up channel its
        # consumers give as `notify`; a send names it, and the pushes to it come back in the send's reply
        # and go to `local_push` instead of through Redis pub/sub (gateway/runtime.py sets both).
        self.local_channel: str | None = None
        self.local_push: Callable[[bytes], None] | None = None

    def prefix(self, dest: Destination) -> str:
        if isinstance(dest, Subscription):  # a subscription's keys, inside the topic's hash tag
            return f"{self.namespace}:{{{dest.tag}}}:s:{dest.key}"
        return f"{self.namespace}:{{{dest.tag}}}"

    def home(self, consumer: ConsumerRef) -> Op:
        """Where a consumer's messages are: its queue, or its topic subscription."""
        dest = consumer.destination
        if not dest.is_topic or isinstance(dest, Subscription):
            return dest
        return (yield from topic_ops.home(self, dest, consumer.consumer_id,
                                          getattr(consumer, "subscription", None)))

    def events_key(self, dest: Destination) -> str:
        """The lifecycle event stream every script appends to (read by the console's live view)."""
        return f"{self.prefix(dest)}:events"

    # -- plumbing -------------------------------------------------------------------------------------

    def _eval(self, dest: Destination, now: int, call: Eval) -> Op:
        """Run a script call (scripts/calls.py) on `dest`; on first use of the destination write its policy
        and run it again."""
        for _ in range(2):
            try:
                return (yield call)
            except NoDestination:
                base = dest.topic if isinstance(dest, Subscription) else dest
                yield from self.init_destination(base, now)
        raise UnknownDestination(f"destination {dest.uri} could not be created")

    def _write_policy(self, dest: Destination) -> Op:
        entry: PolicyEntry = yield Policy(dest)
        policy = entry.to_redis_hash()
        target = entry.dead_letter_destination_for(dest)
        policy["deadLetterTarget"] = target.uri if target else ""  # "" = the discarding strategy
        # destinationPerDurableSubscriber: a durable subscription's own DLQ, '' when it does not apply
        per_subscriber = entry.dead_letter_per_subscriber(dest)
        policy["deadLetterDurablePrefix"], policy["deadLetterDurableSuffix"] = per_subscriber or ("", "")
        key = f"{self.prefix(dest)}:policy"
        yield Command(("HSET", key, *[x for kv in policy.items() for x in kv]))
        yield Command(("HDEL", key, "_packed"))  # the scripts' packed copy of it

    def init_destination(self, dest: Destination, now: int) -> Op:
        """Create a destination (idempotent): its resolved policy, its name, its registry entry."""
        yield from self._write_policy(dest)
        prefix = self.prefix(dest)
        yield Command(("HSETNX", f"{prefix}:meta", "uri", dest.uri))
        yield Command(("HSETNX", f"{prefix}:meta", "created", now))
        # into the maintenance index (broker_core/maintenance.py), due now: its first visit schedules it
        yield Command(("ZADD", f"{self.namespace}:due:periodic", "NX", now, prefix))
        if dest.is_wildcard:
            # a wildcard subscription's pseudo-topic is no destination: not listed, no advisory; maintenance
            # and policy refreshes find it in <ns>:wildcards (topic_ops.pattern_topics)
            return
        created = yield Command(("ZADD", self.registry_key, "NX", now, dest.uri))
        yield from virtual.on_created(self, dest)  # a virtual topic's consumer queue joins
        if created:  # ActiveMQ.Advisory.Queue / .Topic (advisory.py)
            yield from advisory.destination_changed(self, dest, now, added=True)

    def refresh_policies(self, now: int) -> Op:
        """Rewrite every destination's policy hash after the policy map changed at run time."""
        for uri in (yield from self.destinations()) + (yield from topic_ops.pattern_topics(self)):
            dest = parse_destination(uri, allow_wildcards=True)  # wildcard subscriptions' pseudo-topics too
            yield from self._write_policy(dest)
            yield Command(("HSET", f"{self.prefix(dest)}:meta", "dirty", "1"))

    def _continue_dispatch(self, dest: Destination, now: int, flags: int, hold: int) -> Op:
        """Finish what a script started: deliver its forwards (flag 2) and keep running chunks while the
        pass has more to examine (flag 1); each call is bounded."""
        dispatched = 0
        chunks = 0
        while flags and chunks < MAX_DISPATCH_CHUNKS:
            if flags & FORWARDS_WAITING:
                yield from self.forward(dest, now)
            if not flags & PASS_HAS_MORE:
                break
            call = calls.Dispatch.call(self.prefix(dest), now)
            tail = calls.Dispatch.parse((yield from self._eval(dest, now, call)))
            dispatched += tail.dispatched
            flags, hold = tail.flags, tail.hold_until
            chunks += 1
        return DispatchResult(dispatched, hold)

    def forward(self, dest: Destination, now: int, limit: int = 1_000) -> Op:
        """Deliver the messages a script set aside for other destinations (dead letters, moves, virtual
        destination copies, advisories), each delivery and the removal of its entry in one MULTI/EXEC,
        so a crash can neither lose nor duplicate one. Safe to repeat."""
        source_policy: dict[str, str] | None = None
        done = 0
        if isinstance(dest, Subscription):  # forwards wait on the topic
            dest = dest.topic
        key = f"{self.prefix(dest)}:fwd"
        while done < limit:
            # read a batch whole and deliver it in the order it was recorded (a record's 5th
            # element, if any), so a composite's targets get a producer's messages in order.
            entries: dict[Any, Any] = {}
            cursor: Any = 0
            while True:
                cursor, found = yield Command(("HSCAN", key, cursor, "COUNT", 100))  # redis-py: a dict
                entries.update(found)
                if int(cursor) == 0 or len(entries) >= limit:
                    break
            if not entries:
                return done
            records = sorted(((raw_id, *msgpack.unpackb(packed, raw=True))
                              for raw_id, packed in entries.items()), key=lambda r: r[5] if len(r) > 5 else 0)
            ensured: set[Destination] = set()
            for raw_id, target_uri, cause, argument, blob, *extra in records:
                message_id = _str(raw_id).partition("|")[0]  # copies are '<id>|<target>'
                if source_policy is None:
                    raw = yield Command(("HGETALL", f"{self.prefix(dest)}:policy"))  # a dict from redis-py
                    source_policy = {_str(k): _str(v) for k, v in raw.items() if k != b"_packed"}
                kind = _str(cause)
                try:
                    # (a wildcard's pseudo-topic is allowed)
                    target = parse_destination(_str(target_uri), allow_wildcards=True)
                except InvalidDestination:
                    # a durable subscription's own dead-letter queue (destinationPerDurableSubscriber) whose
                    # client id or subscription name makes no valid name: the topic's DLQ takes it instead
                    if kind in TRANSFERS or kind in COPIES or not source_policy.get(
                            "deadLetterTarget"):
                        raise
                    target = parse_destination(source_policy["deadLetterTarget"])
                if kind in TRANSFERS:
                    copy = blob  # moved, copied or retried as it is
                elif kind == "virtual":  # a virtual destination's copy (virtual.py)
                    copy = virtual.forward_copy(blob, _str(argument))
                elif kind == "advisory":  # an advisory message about an event (advisory.py)
                    copy = advisory.build(message_id, argument, blob, now)
                elif kind == "wildcard":  # a wildcard subscription's copy (scripts/lua/includes/wildcard.lua)
                    copy = wildcard_copy(blob, _str(argument))
                else:
                    text = failure_cause(kind, _str(argument), source_policy)
                    copy = dead_letter_copy(blob, dest.uri, text, now,
                                            int(source_policy.get("deadLetterExpiration", "0")))
                    if dest.is_wildcard:  # the dead-letter queue of the topic it was published to
                        target = yield from topic_ops.wildcard_dead_letter_target(self, dest, copy, target)
                if target not in ensured:  # the MULTI below must not meet a target without a policy
                    yield from self.ensure_destination(target, now)
                    ensured.add(target)
                # the target's own virtual destinations apply (ActiveMQ re-routes a copy too); a
                # wildcard's pseudo-topic is no destination of its own and has none
                origin = "forward"
                if not target.is_wildcard:
                    origin = yield from virtual.origin(self, target, "forward")
                # a virtual copy still on its way counts against its target ('memfwd', virtual.lua)
                charge = int(extra[1]) if kind == "virtual" and len(extra) > 1 else 0
                sending = calls.TopicSend if target.is_topic else calls.Send  # a topic: its subscriptions
                record = (message_id, copy, "", "") if target.is_topic else (message_id, copy)
                send = sending.call(self.prefix(target), now, 0, origin, [record])
                # the target's send and the record's removal are one MULTI/EXEC, so a crash can
                # neither lose the copy nor deliver it twice (not even after the target's audit moved on).
                done_call = calls.ForwardDone.done(self.prefix(dest), now, raw_id,
                                                   f"{self.prefix(target)}:meta", charge)
                reply, _ = yield [send, done_call]
                if isinstance(reply, Exception):
                    if _str(str(reply)).startswith("NO_DESTINATION"):  # deleted since: put the record back
                        yield Command(("HSET", key, raw_id, entries[raw_id]))
                        if charge:
                            yield Command(("HINCRBY", f"{self.prefix(target)}:meta", "memfwd", charge))
                        ensured.discard(target)
                        return done
                    # a copy its target refuses for good (e.g. a repeating message's delivery moved or
                    # copied to a topic, which refuses schedules: TOPIC_REPEAT) is counted
                    # (forward_refused) and logged, not retried for ever: forwarding goes on.
                    yield calls.ForwardDone.refused(self.prefix(dest), now, raw_id, target.uri,
                                                    str(reply)[:200])
                else:
                    sent = sending.parse(reply)
                    assert isinstance(sent, Sent)  # (a forward is never refused for space: flow.py)
                    if target.is_topic:
                        yield from topic_ops.finish_send(self, target, now, sent.tail)
                    else:
                        yield from self._continue_dispatch(target, now, sent.tail.flags, sent.tail.hold_until)
                if kind not in TRANSFERS and kind not in COPIES:
                    yield Command(("HSETNX", f"{self.prefix(target)}:meta", "dlq", "1"))
                done += 1
        return done

    # -- producing ------------------------------------------------------------------------------------

    def send(self, dest: Destination, messages: Iterable[Message], now: int,
             also: tuple[Destination, ...] = ()) -> Op:
        """Enqueue messages in order; returns their ids. A bad message or a limit refuses the whole batch.
        `also`: the other parts of a client-side composite (`A,B,topic://C`), sent copies."""
        require_concrete(dest, "send to")
        if dest.is_topic:
            return (yield from topic_ops.send(self, dest, messages, now, also))  # also
        return (yield from self.send_packed(dest, [message.pack(now) for message in messages], now, also))

    def send_packed(self, dest: Destination, packed: list[tuple[str, bytes]], now: int,
                    also: tuple[Destination, ...] = ()) -> Op:
        """`send` to a queue of messages packed already (Message.pack: id, bytes). A limit the script
        checks (size, properties) refuses all of them before anything is stored."""
        origin = yield from virtual.origin(self, dest, "producer", also)

        def finish(sent: Sent) -> Op:
            tail = sent.tail
            if tail.pushed and self.local_push is not None:  # pushed to this process's consumers
                for payload in tail.pushed:
                    self.local_push(payload)
            if tail.flags:  # (nothing to finish, the usual case)
                yield from self._continue_dispatch(dest, now, tail.flags, tail.hold_until)
            return sent.statuses

        return (yield from self.send_parts(dest, now, calls.Send, origin, packed, finish))

    def send_parts(self, dest: Destination, now: int, sending: type[calls.Send] | type[calls.TopicSend],
                   origin: Any, records: list[tuple], finish: Callable[[Sent], Op]) -> Op:
        """Run a send script (calls.Send, calls.TopicSend) over messages (`records`: each one's arguments, id
        and packed message first) in parts of SEND_PART messages and SEND_PART_BYTES, so no call grows with
        the batch. Every part's size and property limits are checked before the first part is stored (a
        refusal changes nothing); the parts then go in order, each atomic, each waiting for space as its
        own send (flow.py). A part refused after others were stored (a memory limit that fails the send)
        raises with `details["sent"]`, how many messages went before it: their ids are stored, so sending
        the same batch again (the same message ids) stores only the rest. `finish(sent)` completes a
        part's call and returns its statuses. Returns a SentId per message."""
        parts, part, size = [], [], 0
        for record in records:
            if part and (len(part) == SEND_PART or size + len(record[1]) > SEND_PART_BYTES):
                parts.append(part)
                part, size = [], 0
            part.append(record)
            size += len(record[1])
        parts.append(part)
        if len(parts) > 1:
            for part in parts:
                yield from self._eval(dest, now, sending.call(self.prefix(dest), now, 0, "check", part))
        statuses: list[str] = []
        # the send names this process's wake-up channel: its own consumers' pushes come back in the reply
        budget = f"0~{self.local_channel}" if sending is calls.Send and self.local_channel else 0
        for part in parts:
            try:
                sent = yield from flow.send_when_space(self, dest, now, sending, budget, origin, part)
            except BrokerError as exc:
                if statuses:
                    exc.message = (f"{exc.message} (after {len(statuses)} of the batch's {len(records)} "
                                   "messages were sent: send it again with the same message ids to send "
                                   "the rest)")
                    exc.args = (exc.message,)
                    exc.details["sent"] = len(statuses)
                raise
            statuses += yield from finish(sent)
        return [SentId(r[0], status) for r, status in zip(records, statuses, strict=True)]

    # -- consuming ------------------------------------------------------------------------------------

    def add_consumer(self, dest: Destination, spec: ConsumerSpec, now: int, consumer_id: str | None) -> Op:
        spec.validate()
        selector = None
        if spec.selector and spec.selector.strip():
            selector = parse_selector(spec.selector, convert_string_expressions=spec.stomp_selector)
        cid = consumer_id or f"c-{uuid.uuid4().hex[:12]}"
        if not _CONSUMER_ID.fullmatch(cid):
            raise InvalidConsumer(
                f"consumer id {cid!r} must be 1-128 characters of letters, digits and . _ - @",
                field="consumer_id")
        definition = {
            "priority": spec.priority,
            "exclusive": spec.exclusive,
            "selector": selector.compiled if selector else None,
            "selector_text": spec.selector if selector else None,
            "nolocal": spec.no_local,
            "conn": spec.connection_id,
            "client": spec.client_id,
            "ack": spec.ack_mode,
            "notify": spec.notify,
            "lease": spec.lease_ms,
        }
        packed = msgpack.packb({k: v for k, v in definition.items() if v is not None})
        if dest.is_topic:
            return (yield from topic_ops.subscribe(self, dest, spec, now, cid, packed,
                                                   selector.compiled if selector else None))
        if spec.subscription_name is not None or spec.retroactive:
            raise InvalidConsumer("durable subscriptions and retroactive consumers are for topics only",
                                  field="subscription_name")
        require_concrete(dest, "subscribe to")  # wildcard queues: not supported
        requested = -1 if spec.prefetch is None else spec.prefetch
        call = calls.ConsumerAdd.call(self.prefix(dest), now, cid, packed, spec.lease_ms, requested)
        added = calls.ConsumerAdd.parse((yield from self._eval(dest, now, call)))
        if isinstance(added, Closing):  # the id of a closed consumer whose messages are still going back
            yield from self.return_owed(dest, now)
            added = calls.ConsumerAdd.parse((yield from self._eval(dest, now, call)))
        assert not isinstance(added, Closing)  # (return_owed returned everything)
        result = yield from self._continue_dispatch(dest, now, added.tail.flags, added.tail.hold_until)
        return Consumer(dest, cid, spec.ack_mode, prefetch=added.prefetch, hold_until=result.hold_until)

    def receive(self, consumer: ConsumerRef, max_messages: int, now: int, lease_ms: int) -> Op:
        if not 1 <= max_messages <= MAX_RECEIVE:
            raise InvalidConsumer(f"max_messages must be 1-{MAX_RECEIVE}, got {max_messages}",
                                  field="max_messages")
        dest = (yield from self.home(consumer)) if consumer.destination.is_topic else consumer.destination
        call = calls.Receive.call(self.prefix(dest), now, consumer.consumer_id, max_messages, lease_ms)
        reply = yield from self._eval(dest, now, call)
        got = calls.Receive.parse(reply, consumer.destination.uri, consumer.consumer_id)
        if got.tail.flags:
            yield from self._continue_dispatch(dest, now, got.tail.flags, got.tail.hold_until)
        return got.deliveries

    def receive_after(self, consumer: ConsumerRef, after: int, max_messages: int, push: int, now: int,
                      lease_ms: int) -> Op:
        """`receive` for an adapter taking pushed deliveries: what was handed over after dispatch sequence
        `after` (pushed, lost or still on its way) first, then the outbox; when that leaves the outbox empty,
        up to `push` messages are pushed to the consumer from then on. Returns (deliveries, the dispatch
        sequence of the last one handed over: the next call's `after`)."""
        if not 1 <= max_messages <= MAX_RECEIVE:
            raise InvalidConsumer(f"max_messages must be 1-{MAX_RECEIVE}, got {max_messages}",
                                  field="max_messages")
        dest = (yield from self.home(consumer)) if consumer.destination.is_topic else consumer.destination
        call = calls.Receive.after(self.prefix(dest), now, consumer.consumer_id, max_messages, lease_ms,
                                   after, push)
        reply = yield from self._eval(dest, now, call)
        got = calls.Receive.parse_after(reply, consumer.destination.uri, consumer.consumer_id)
        if got.tail.flags:
            yield from self._continue_dispatch(dest, now, got.tail.flags, got.tail.hold_until)
        return got.deliveries, got.last

    def cancel_pull(self, consumer: ConsumerRef, now: int) -> Op:
        dest = yield from self.home(consumer)
        yield from self._eval(dest, now, calls.CancelPull.call(self.prefix(dest), now, consumer.consumer_id))

    def ack(self, consumer: ConsumerRef, message_ids: list[str], mode: str, now: int,
            receive: int = 0) -> Op:
        """mode: 'individual', 'cumulative' or 'delivered' (see scripts/lua/ack.lua). Returns how many were
        acknowledged and, when `receive` > 0, up to that many next messages for the consumer."""
        if not message_ids:
            raise NotInFlight("no message id given to acknowledge")
        # (a queue consumer's home is its queue: no generator for that, the usual case)
        dest = (yield from self.home(consumer)) if consumer.destination.is_topic else consumer.destination
        return (yield from self.ack_many(dest, [(consumer, message_ids, mode, receive)], now))[0]

    def ack_many(self, dest: Destination, requests: list[AckRequest], now: int) -> Op:
        """`ack` of several consumers of `dest` (its home: a queue, or one subscription), each named once
        and with message ids, in one script call: all are checked before any is applied. Returns (acked,
        next messages) per request, in order. One consumer's ack of more than ACK_PART ids is checked
        whole, then applied in parts (ack_in_parts)."""
        if len(requests) == 1 and len(requests[0][1]) > ACK_PART and requests[0][2] != "cumulative":
            return [(yield from self.ack_in_parts(dest, requests[0], now))]
        call = calls.Ack.call(self.prefix(dest), now, [(consumer.consumer_id, mode, receive, message_ids)
                                                       for consumer, message_ids, mode, receive in requests])
        early = [0] * len(requests)  # acknowledged before the call (_ack_oldest)
        try:
            reply = yield from self._eval(dest, now, call)
        except Exception as exc:  # noqa: BLE001 - only the one below is handled
            if not str(exc).startswith("ACK_TOO_LARGE"):
                raise
            # a cumulative ack over more than CUMULATIVE_MOST messages, refused before any change
            for n, (consumer, message_ids, mode, _) in enumerate(requests):
                if mode == "cumulative":
                    early[n] = yield from self._ack_oldest(dest, consumer, message_ids[0], now)
            reply = yield from self._eval(dest, now, call)
        acked = calls.Ack.parse(reply, [(consumer.destination.uri, consumer.consumer_id)
                                        for consumer, *_ in requests])
        if acked.tail.flags:  # (nothing to finish, the usual case)
            yield from self._continue_dispatch(dest, now, acked.tail.flags, acked.tail.hold_until)
        return [(before + count, deliveries)
                for (count, deliveries), before in zip(acked.results, early, strict=True)]

    def _ack_oldest(self, dest: Destination, consumer: ConsumerRef, message_id: str, now: int) -> Op:
        """A cumulative ack over more than CUMULATIVE_MOST messages (which ack.lua refuses, as more than a
        bounded call) is made a bounded one: the consumer's oldest messages up to `message_id` are
        acknowledged individually, ACK_PART a call, until CUMULATIVE_MOST are left for the cumulative ack's
        own call. Returns how many that acknowledged. (A cumulative ack acknowledges each of them; a crash
        half-way leaves the rest in flight, as a client's own acks would.)"""
        window = f"{self.prefix(dest)}:c:{consumer.consumer_id}:inflight"  # (K_CINF, includes/base.lua)
        seq = yield Command(("ZSCORE", window, message_id))
        acked = 0
        while seq is not None and (yield Command(("ZCOUNT", window, "-inf", repr(seq)))) > CUMULATIVE_MOST:
            oldest = [_str(i) for i in (yield Command(("ZRANGE", window, 0, ACK_PART - 1)))]
            ((count, _),) = yield from self.ack_many(dest, [(consumer, oldest, "individual", 0)], now)
            acked += count
        return acked

    def ack_in_parts(self, dest: Destination, request: AckRequest, now: int) -> Op:
        """An individual (or delivered) ack of many ids: every id is checked in flight with the consumer
        (ack.lua's 'check', ACK_PART ids a call) before any is acknowledged, so a wrong id refuses the
        whole ack; then ACK_PART ids a call, the next messages handed over with the last part. A part
        refused after others were applied (a message that left meanwhile: the lease lapsed, an operator
        removed it) raises with `details["acked"]`."""
        consumer, message_ids, mode, receive = request
        ids = list(dict.fromkeys(message_ids))  # an id named twice is acknowledged once
        parts = [ids[i:i + ACK_PART] for i in range(0, len(ids), ACK_PART)]
        for part in parts:
            yield from self._eval(dest, now, calls.Ack.check(self.prefix(dest), now, consumer.consumer_id,
                                                             mode, part))
        acked = 0
        for n, part in enumerate(parts):
            last = n == len(parts) - 1
            try:
                ((count, deliveries),) = yield from self.ack_many(
                    dest, [(consumer, part, mode, receive if last else 0)], now)
            except BrokerError as exc:
                if acked:
                    exc.message = (f"{exc.message} (after {acked} of the {len(ids)} messages were "
                                   "acknowledged)")
                    exc.args = (exc.message,)
                    exc.details["acked"] = acked
                raise
            acked += count
        return acked, deliveries

    def nack(self, consumer: ConsumerRef, message_ids: list[str], poison: bool, now: int,
             jitter: float) -> Op:
        """Negative acknowledgement (scripts/lua/nack.lua): redelivery after the policy's delay, or the
        dead-letter queue (poison, or past maximumRedeliveries). Returns (dead-lettered, redelivered)."""
        if not message_ids:
            raise NotInFlight("no message id given to acknowledge negatively")
        dest = yield from self.home(consumer)
        nacked = calls.Nack.parse((yield from self._eval(dest, now, calls.Nack.call(
            self.prefix(dest), now, consumer.consumer_id, poison, jitter, message_ids))))
        yield from self._continue_dispatch(dest, now, nacked.tail.flags, nacked.tail.hold_until)
        return nacked.dead_lettered, nacked.redelivered

    def sweep_expired(self, dest: Destination, now: int) -> Op:
        """One page of the expiry sweep (scripts/lua/sweep.lua); call again until `done`."""
        if dest.is_topic and not isinstance(dest, Subscription):
            return (yield from topic_ops.sweep_expired(self, dest, now))
        swept = calls.Sweep.parse((yield from self._eval(dest, now, calls.Sweep.call(self.prefix(dest),
                                                                                     now))))
        yield from self._continue_dispatch(dest, now, swept.tail.flags, swept.tail.hold_until)
        return SweepResult(examined=swept.examined, expired=swept.expired, done=swept.done)

    def release(self, consumer: ConsumerRef, message_ids: list[str], now: int) -> Op:
        dest = yield from self.home(consumer)
        released = calls.Release.parse((yield from self._eval(dest, now, calls.Release.call(
            self.prefix(dest), now, consumer.consumer_id, message_ids))))
        yield from self._continue_dispatch(dest, now, released.tail.flags, released.tail.hold_until)
        return released.count

    def close_consumer(self, consumer: ConsumerRef, now: int, reason: str, written: int | None = None) -> Op:
        """The consumer leaves dispatch in the first call; its messages go back `return_chunk` per call.
        `written`: the dispatch sequence of the last message the adapter wrote, when it knows that what was
        pushed after it never reached the client (those go back as not received)."""
        dest = yield from self.home(consumer)
        closed = calls.ConsumerClose.parse((yield from self._eval(dest, now, calls.ConsumerClose.call(
            self.prefix(dest), now, consumer.consumer_id, reason, self.return_chunk, written))))
        result = yield from self._continue_dispatch(dest, now, closed.tail.flags, closed.tail.hold_until)
        if not closed.owed:
            return result
        rest = yield from self.return_owed(dest, now)
        return DispatchResult(result.dispatched + rest.dispatched, rest.hold_until)

    def return_owed(self, dest: Destination, now: int) -> Op:
        """Return what closed consumers of `dest` (a queue, or one subscription) still hold, and release
        what ended subscriptions of its topic held, `return_chunk` messages per script call, each followed
        by its dispatch, until nothing is owed. Safe to run from several processes at once: each call takes
        messages no other call has."""
        dispatched, hold = 0, 0
        while True:
            returned = calls.ReturnOwed.parse(
                (yield calls.ReturnOwed.call(self.prefix(dest), now, max(1, self.return_chunk))))
            tail = returned.tail
            result = yield from self._continue_dispatch(dest, now, tail.flags, tail.hold_until)
            dispatched += tail.dispatched + result.dispatched
            hold = result.hold_until or tail.hold_until
            if not returned.owed:
                return DispatchResult(dispatched, hold)

    def renew(self, dest: Destination, consumer_ids: list[str], lease_ms: int, now: int) -> Op:
        """Renew leases; returns the ids that are no longer registered (closed or reaped)."""
        if dest.is_topic and not isinstance(dest, Subscription):
            return (yield from topic_ops.renew(self, dest, consumer_ids, lease_ms, now))
        return calls.Renew.parse((yield calls.Renew.call(self.prefix(dest), now, lease_ms, consumer_ids)))

    def reap(self, dest: Destination, now: int, limit: int) -> Op:
        """Close consumers whose lease lapsed; returns their ids."""
        if dest.is_topic and not isinstance(dest, Subscription):
            return (yield from topic_ops.reap(self, dest, now, limit))
        reaped = calls.Reap.parse((yield calls.Reap.call(self.prefix(dest), now, limit, self.return_chunk)))
        yield from self._continue_dispatch(dest, now, reaped.tail.flags, reaped.tail.hold_until)
        if reaped.owed:
            yield from self.return_owed(dest, now)
        return reaped.closed

    def dispatch(self, dest: Destination, now: int) -> Op:
        if dest.is_topic and not isinstance(dest, Subscription):
            return (yield from topic_ops.dispatch(self, dest, now))
        tail = calls.Dispatch.parse((yield calls.Dispatch.call(self.prefix(dest), now)))
        rest = yield from self._continue_dispatch(dest, now, tail.flags, tail.hold_until)
        return DispatchResult(tail.dispatched + rest.dispatched, rest.hold_until or tail.hold_until)

    # -- administration -------------------------------------------------------------------------------

    def pause(self, dest: Destination, paused: bool, now: int) -> Op:
        tail = calls.Pause.parse((yield from self._eval(dest, now, calls.Pause.call(self.prefix(dest), now,
                                                                                    paused))))
        yield from self._continue_dispatch(dest, now, tail.flags, tail.hold_until)

    def remove_message_groups(self, dest: Destination, group_id: str | None, now: int) -> Op:
        """removeMessageGroup(group_id), or removeAllMessageGroups() when group_id is None."""
        reset = calls.GroupReset.parse((yield from self._eval(dest, now, calls.GroupReset.call(
            self.prefix(dest), now, group_id))))
        yield from self._continue_dispatch(dest, now, reset.tail.flags, reset.tail.hold_until)
        return reset.count

    def message_groups(self, dest: Destination, now: int) -> Op:
        """Every message group (a page of GROUPS_PAGE a call, message_groups_page)."""
        cursor: str | None = None
        groups: list[GroupInfo] = []
        while True:
            page = yield from self.message_groups_page(dest, now, cursor, GROUPS_PAGE)
            groups += page.groups
            cursor = page.next_cursor
            if cursor is None:
                return groups

    def message_groups_page(self, dest: Destination, now: int, cursor: str | None, limit: int) -> Op:
        """About `limit` message groups (Redis's HSCAN decides: a few more or fewer) and the cursor of the
        next page (None at the end). A group assigned or removed meanwhile may be listed or not; none
        present throughout is missed."""
        if not 1 <= limit <= MAX_RECEIVE:
            raise InvalidConsumer(f"limit must be 1-{MAX_RECEIVE}, got {limit}", field="limit")
        if cursor is not None and not (cursor.isascii() and cursor.isdigit() and int(cursor) < 2**64):
            raise InvalidConsumer(f"cursor {cursor!r} is not one this listing gave", field="cursor")
        return calls.GroupList.parse((yield calls.GroupList.call(self.prefix(dest), now, cursor or "0",
                                                                 limit)))

    def group_counts(self, dest: Destination, now: int, pending_limit: int, in_flight_limit: int) -> Op:
        """Pending (among the first `pending_limit`) and in-flight messages per group (the console)."""
        return calls.GroupCounts.parse((yield calls.GroupCounts.call(self.prefix(dest), now, pending_limit,
                                                                     in_flight_limit)))

    def summary(self, dest: Destination, now: int, oldest: bool = False) -> Op:
        """The main counters only (console index); None when the destination does not exist."""
        (found,) = calls.SummaryMany.parse((yield calls.SummaryMany.call((self.prefix(dest),), now, oldest)),
                                           (dest.uri,))
        return found

    def stats(self, dest: Destination, now: int) -> Op:
        if dest.is_topic and not isinstance(dest, Subscription):
            return (yield from topic_ops.stats(self, dest, now))
        read = calls.Stats.parse((yield calls.Stats.call(self.prefix(dest), now)))
        meta = read.meta
        if "uri" not in meta:
            raise UnknownDestination(f"no destination {dest.uri}", destination=dest.uri)
        owner = meta.get("owner") or None
        consumers = []
        for one in read.consumers:
            cid = one.consumer_id
            definition = msgpack.unpackb(one.definition, raw=False) if one.definition else {}
            counters = one.counters
            lease = one.lease
            consumers.append(ConsumerStats(
                consumer_id=cid,
                client_id=definition.get("client"),
                connection_id=definition.get("conn"),
                selector=definition.get("selector_text"),
                priority=int(definition.get("priority", 0)),
                exclusive=bool(definition.get("exclusive", False)),
                ack_mode=definition.get("ack", "client"),
                prefetch=int(counters.get("prefetch", 0)),
                prefetch_extension=int(counters.get("ext", 0)),
                in_flight=int(counters.get("n", 0)),
                undelivered=one.undelivered,
                dispatched=int(counters.get("dispatched", 0)),
                acked=int(counters.get("acked", 0)),
                groups=int(counters.get("groups", 0)),
                lease_expires=int(float(lease)) if lease else None,
                added=int(counters.get("added", 0)),
                last_ack=int(counters["last_ack"]) if "last_ack" in counters else None,
                slow_since=int(counters["slow_since"]) if "slow_since" in counters else None,
                is_exclusive_owner=cid == owner,
            ))
        pending, in_flight = read.pending, read.in_flight

        def count(name: str) -> int:
            return int(meta.get(name, 0))

        return DestinationStats(
            destination=dest.uri, queue_size=pending + in_flight, pending=pending, in_flight=in_flight,
            enqueued=count("enqueued"), dequeued=count("dequeued"), dispatched=count("dispatched"),
            expired=count("expired"), expired_on_arrival=count("expired_on_arrival"),
            deadlettered=count("deadlettered"), discarded=count("discarded"), parked=read.parked,
            forwarding=read.forwarding, purged=count("purged"), moved=count("moved"),
            cancelled=count("cancelled"),
            duplicates=count("duplicates"), skipped=count("skipped"),
            last_pass_skipped=count("last_pass_skipped"), consumer_count=len(consumers),
            group_count=read.groups, paused=meta.get("paused") == "1", exclusive_owner=owner,
            consumers=consumers, **memory_stats(meta, read.memory_limit, read.broker_memory_limit),
            **forward_stats(meta), selector_errors=count("selector_errors"),
            **bound_stats(meta, read.events, read.audit_size),
        )

    def destinations(self) -> Op:
        """Every destination's URI, in creation order (the registry's), read DESTINATIONS_PAGE at a time
        (ZSCAN, which may repeat a name: kept once), so no call reads 10,000 destinations."""
        found: dict[str, float] = {}
        cursor = 0
        while True:
            cursor, page = yield Command(("ZSCAN", self.registry_key, cursor, "COUNT", DESTINATIONS_PAGE))
            found.update((_str(uri), score) for uri, score in page)  # redis-py: (member, score) pairs
            if int(cursor) == 0:
                return sorted(found, key=lambda uri: (found[uri], uri))

    # -- the operator's message operations (spec §14.3) --------------------------------------------------

    def browse(self, dest: Destination, selector: str | None, cursor: str | None, limit: int, now: int) -> Op:
        """One page of messages, never changing state: pending in dispatch order, then parked, then in
        flight. Returns BrowsePage; pass its next_cursor to continue (None when done)."""
        if not 1 <= limit <= MAX_RECEIVE:
            raise InvalidConsumer(f"limit must be 1-{MAX_RECEIVE}, got {limit}", field="limit")
        compiled = parse_selector(selector).compiled if selector and selector.strip() else ""
        return calls.Browse.parse((yield calls.Browse.call(self.prefix(dest), now, cursor or "", limit,
                                                           BROWSE_EXAMINE, compiled)), dest.uri)

    def get_message(self, dest: Destination, message_id: str, now: int) -> Op:
        found = calls.MessageGet.parse((yield calls.MessageGet.call(self.prefix(dest), now, message_id)),
                                       dest.uri, message_id)
        if found is None:
            raise UnknownMessage(f"no message {message_id} on {dest.uri}", message_id=message_id)
        return found

    def parked_times(self, dest: Destination, message_ids: list[str]) -> Op:
        """When each parked message (scheduled, delayed, waiting for a redelivery delay) is due, and a
        repeating job's period and repeats left: id -> {"due", "period", "repeats_left"} (None where
        not parked / not repeating). Two reads of at most len(message_ids) fields (callers page them)."""
        if not message_ids:
            return {}
        prefix = self.prefix(dest)
        scores = yield Command(("ZMSCORE", f"{prefix}:parked", *message_ids))
        jobs = yield Command(("HMGET", f"{prefix}:sched", *message_ids))
        out: dict[str, dict[str, int | None]] = {}
        for message_id, score, job in zip(message_ids, scores, jobs, strict=True):
            # a job: [packed message, period, repeats left, fired, routing plan] (lifecycle.lua)
            period, left = (msgpack.unpackb(job, raw=True)[1:3] if job else (None, None))
            out[message_id] = {"due": int(float(score)) if score is not None else None,
                               "period": period, "repeats_left": left}
        return out

    def remove(self, dest: Destination, message_ids: list[str], now: int) -> Op:
        """Remove messages by id (in flight too, as ActiveMQ's removeMessage); returns how many."""
        _refuse_on_topic(dest, "remove messages from")
        call = calls.Remove.call(self.prefix(dest), now, message_ids)
        removed = calls.Remove.parse((yield from self._eval(dest, now, call)))
        yield from self._continue_dispatch(dest, now, removed.tail.flags, removed.tail.hold_until)
        return removed.removed

    def remove_matching(self, dest: Destination, selector: str | None, limit: int | None, now: int,
                        progress: Callable[[int, int], None] | None = None) -> Op:
        """Remove every message a selector matches, wherever it is (pending, parked, in flight: as
        removeMessage and ActiveMQ's removeMatchingMessages), walking the queue once with browse's
        cursor and removing each page by id: every call bounded (BROWSE_EXAMINE examined, at most
        REMOVE_PAGE removed). At most `limit`, or what the queue held at the start, so a producer
        sending matching messages cannot keep it going. `progress(removed, total)` after each page."""
        _refuse_on_topic(dest, "remove messages from")
        stats = yield from self.stats(dest, now)
        total = stats.queue_size + stats.parked
        cap = min(limit, total) if limit is not None else total
        removed, cursor = 0, None
        while removed < cap:
            page = yield from self.browse(dest, selector, cursor, min(REMOVE_PAGE, cap - removed), now)
            ids = [b.message.message_id for b in page.messages]
            if ids:
                removed += yield from self.remove(dest, ids, now)
            if progress:
                progress(removed, cap)
            cursor = page.next_cursor
            if not cursor:
                break
        return removed

    def purge(self, dest: Destination, now: int, progress: Callable[[int, int], None] | None = None) -> Op:
        """Remove every message there when the purge starts (broker sequence up to the mark the first call
        takes; later sends stay), wherever it is, in calls of at most PURGE_EXAMINE examined messages
        (scripts/lua/purge.lua): producers and consumers go on between them. `progress(removed, total)` is
        told after each call (total: what the queue held at the start). Interrupted, run it again."""
        stats = yield from self.stats(dest, now)
        total = stats.queue_size + stats.parked
        removed, mark, cursor = 0, "", ""
        while True:
            purged = calls.Purge.parse((yield from self._eval(dest, now, calls.Purge.call(
                self.prefix(dest), now, mark, cursor, PURGE_EXAMINE))))
            yield from self._continue_dispatch(dest, now, purged.tail.flags, purged.tail.hold_until)
            removed += purged.count
            cursor, mark = purged.cursor, purged.mark
            if progress:
                progress(removed, total)
            if not cursor:
                return removed

    def transfer(self, dest: Destination, mode: str, target: Destination | None, message_ids: list[str],
                 selector: str | None, limit: int | None, now: int) -> Op:
        """Move, copy or retry (to each message's original destination) messages by id or all pending
        messages a selector matches, in bounded calls. Returns how many."""
        _refuse_on_topic(dest, f"{mode} messages of")
        if target is not None:
            if target == dest:
                raise OperationRefused(f"cannot {mode} messages of {dest.uri} to itself", target=target.uri)
            known = yield Command(("ZSCORE", self.registry_key, target.uri))
            if known is None:
                raise UnknownDestination(f"no destination {target.uri} to {mode} messages to",
                                         destination=target.uri)
        compiled = parse_selector(selector).compiled if selector and selector.strip() else ""
        remaining = limit if limit is not None else 2**62
        taken, cursor = 0, ""
        while remaining > 0:
            moved = calls.Move.parse((yield from self._eval(dest, now, calls.Move.call(
                self.prefix(dest), now, mode, target.uri if target else "", cursor, TRANSFER_EXAMINE,
                min(remaining, TRANSFER_EXAMINE), compiled, message_ids))))
            yield from self._continue_dispatch(dest, now, moved.tail.flags, moved.tail.hold_until)
            taken += moved.count
            remaining -= moved.count
            cursor = moved.cursor
            if message_ids or not cursor:
                break
        return taken

    def delete_destination(self, dest: Destination, now: int) -> Op:
        """Delete a destination and everything in it; returns how many messages it held."""
        if dest.is_topic:  # its subscriptions first, then the keys below
            stored = yield from topic_ops.delete(self, dest, now)
            yield calls.DestinationDelete.call(self.prefix(dest), now)
            if (yield Command(("ZREM", self.registry_key, dest.uri))):
                yield from advisory.destination_changed(self, dest, now, added=False)
            return stored
        count = calls.DestinationDelete.parse((yield calls.DestinationDelete.call(self.prefix(dest), now)))
        removed = yield Command(("ZREM", self.registry_key, dest.uri))
        yield from virtual.on_deleted(self, dest)
        if removed:
            yield from advisory.destination_changed(self, dest, now, added=False)
        return count

    # -- transactions ---------------------------------------------------------------------------------
    # A transaction buffers sends and acks in Redis (key <ns>:tx:<id>); commit applies them in one
    # MULTI/EXEC, rollback returns the acked messages with their redelivery counter raised.

    def tx_key(self, tx: str) -> str:
        return f"{self.namespace}:tx:{tx}"

    def tx_begin(self, ttl_ms: int) -> Op:
        tx = f"tx-{uuid.uuid4().hex[:16]}"
        yield Command(("RPUSH", self.tx_key(tx), msgpack.packb(["begin"])))
        yield Command(("PEXPIRE", self.tx_key(tx), ttl_ms))
        return tx

    # Records: ["send", kind, name, message id, packed message] and
    # ["ack", kind, name, consumer id, ack mode, [message ids]].

    def _tx_open(self, tx: str) -> Op:
        if not (yield Command(("EXISTS", self.tx_key(tx)))):
            raise TransactionError(f"no open transaction {tx}", transaction=tx)

    def _tx_records(self, tx: str) -> Op:
        yield from self._tx_open(tx)
        raw = yield Command(("LRANGE", self.tx_key(tx), 1, -1))
        return [msgpack.unpackb(r, raw=False) for r in raw]

    def tx_send(self, tx: str, dest: Destination, messages: Iterable[Message], now: int) -> Op:
        require_concrete(dest, "send to")
        yield from self._tx_open(tx)
        yield from self.ensure_destination(dest, now)  # so the commit's MULTI never meets a new one
        if dest.is_topic:  # recorded with the ActiveMQ.Retain decision (topics.pack_for_topic)
            records = [pack_for_topic(message, now) for message in messages]
            packed = [(message_id, blob) for message_id, blob, _, _ in records]
        else:
            packed = [message.pack(now) for message in messages]
        # a transacted send waits for space (or fails) when it is sent; its commit is not refused.
        # the space it needs is reserved for the transaction until its commit or rollback (or its
        # end of life), so open transactions together cannot commit past a limit (§9.2), topics included.
        ttl = yield Command(("PTTL", self.tx_key(tx)))
        probe = f"probe:{tx}:{max(int(ttl), 1)}"
        yield from flow.send_when_space(self, dest, now, calls.Send, 0, probe, packed)
        ids = []
        if dest.is_topic:
            for message_id, blob, retain, copy in records:
                ids.append(message_id)
                yield Command(("RPUSH", self.tx_key(tx),
                               msgpack.packb(["send", dest.kind, dest.name, message_id, blob, retain, copy])))
            return ids
        for message_id, blob in packed:
            ids.append(message_id)
            yield Command(("RPUSH", self.tx_key(tx),
                           msgpack.packb(["send", dest.kind, dest.name, message_id, blob])))
        return ids

    def tx_ack(self, tx: str, consumer: ConsumerRef, message_ids: list[str], mode: str, now: int) -> Op:
        """A transacted ack is a DELIVERED ack now (the window grows) and a real ack on commit."""
        yield from self._tx_open(tx)
        yield from self.ack(consumer, message_ids, "delivered", now)
        dest = consumer.destination
        yield Command(("RPUSH", self.tx_key(tx), msgpack.packb(
            ["ack", dest.kind, dest.name, consumer.consumer_id, mode, message_ids])))

    def tx_commit(self, tx: str, now: int) -> Op:
        records = yield from self._tx_records(tx)
        batch: list[Eval] = []
        touched: dict[str, Destination] = {}
        for op, kind, name, *rest in records:
            dest = Destination(kind, name)
            touched[dest.uri] = dest
            if op == "send" and dest.is_topic:
                origin = yield from virtual.origin(self, dest, "commit")
                batch.append(calls.TopicSend.call(self.prefix(dest), now, 0, origin, [rest]))
            elif op == "send":
                message_id, blob = rest
                origin = yield from virtual.origin(self, dest, "commit")
                batch.append(calls.Send.call(self.prefix(dest), now, 0, origin, [(message_id, blob)]))
            else:
                consumer_id, mode, message_ids = rest
                if dest.is_topic:  # the ack goes to the consumer's subscription
                    try:
                        dest = yield from topic_ops.home(self, dest, consumer_id, None)
                    except UnknownConsumer:
                        continue  # closed: its messages went back (durable) or away (non-durable) already
                    touched[f"{dest.uri}#{dest.key}"] = dest
                batch.append(calls.Ack.call(self.prefix(dest), now, [(consumer_id, mode, 0, message_ids)]))
        # the reservations end in the same atomic step as the committed messages start counting
        batch += [calls.FlowRelease.call(self.prefix(d), now, tx) for d in _sent_to(records)]
        yield Command(("DEL", self.tx_key(tx)))
        replies = yield batch  # one MULTI/EXEC
        errors = [r for r in replies if isinstance(r, Exception)]
        for dest in touched.values():  # each script ran one chunk: finish the passes and forwards
            if dest.is_topic and not isinstance(dest, Subscription):
                yield from self.forward(dest, now)
                yield from self.dispatch(dest, now)
                yield from topic_ops.fan_out(self, dest, now)  # (a send's fan-out left unfinished)
                continue
            yield from self._continue_dispatch(dest, now, PASS_HAS_MORE | FORWARDS_WAITING, 0)
        if errors:
            raise TransactionError(f"transaction {tx} committed with errors: {errors[0]}", transaction=tx)

    def tx_rollback(self, tx: str, now: int) -> Op:
        records = yield from self._tx_records(tx)
        yield Command(("DEL", self.tx_key(tx)))
        for dest in _sent_to(records):  # give back the space its sends reserved
            yield calls.FlowRelease.call(self.prefix(dest), now, tx)
        for record in records:
            if record[0] == "ack":
                consumer = ConsumerRef(Destination(record[1], record[2]), record[3])
                try:
                    yield from self.release(consumer, record[5], now)
                except (UnknownConsumer, NotInFlight):  # the consumer closed; its messages went back already
                    continue

    def ensure_destination(self, dest: Destination, now: int) -> Op:
        exists = yield Command(("EXISTS", f"{self.prefix(dest)}:policy"))
        if not exists:
            yield from self.init_destination(dest, now)


def _sent_to(records: list[Any]) -> list[Destination]:
    """the destinations a transaction's send records name (each holds a reservation)."""
    return list(dict.fromkeys(Destination(r[1], r[2]) for r in records if r[0] == "send"))


def _refuse_on_topic(dest: Destination, what: str) -> None:
    """a topic stores each message once for all its subscriptions (topics.py), so taking one out
    by id would pull it from under every subscriber; ActiveMQ's TopicView has no removeMessage/move."""
    if dest.is_topic and not isinstance(dest, Subscription):
        raise OperationRefused(f"cannot {what} a topic ({dest.uri}): a topic's messages belong to its "
                               "subscriptions; ActiveMQ's TopicView has no such operation",
                               destination=dest.uri)


from . import topic_ops  # noqa: E402  topic_ops builds on this module's names
