"""The router: every operation's entry point, the only module that knows queues, topics and forwarding.

It sends each call to the module for its kind of destination (ops/queues.py for a queue, ops/topics.py
for a topic, ops/homes.py for what works on any home: a queue or one subscription; ops/admin.py,
ops/transactions.py) and runs the operation through `run`, which does what the layers below may not: for
a `Forward` effect it delivers the outbox (ops/forward.py), for a `Create` effect it creates the
destination (ops/admin.py), for a `Settle` effect it finishes a topic's sends (ops/topics.py: a
transaction's commit, beside the topic operations, may not call them), inline, with `yield from`, and
passes every other effect to the driver (drivers/loop.py). So a lower module never calls an upper one, nor
a sibling; each writes records and yields.

The facade (broker.py) calls these entry points only. `Router` is also the `Context` the modules below
are handed (one object per broker: the namespace, the per-process caches).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from ..destinations import Destination, parse_destination, require_concrete
from ..effects import Command, Create, Forward, Op, Settle
from ..errors import OperationRefused, UnknownDestination
from ..keys import Home, temp_tally_key
from ..messages import Message
from ..model import AckRequest, ConsumerRef, ConsumerSpec
from . import admin, advisory, forward, homes, queues, topics, transactions, virtual
from .context import Context


class Router(Context):
    """The operations of one key namespace, as generators of effects for the driver."""

    def run(self, op: Op) -> Op:
        """Run `op`, doing its `Forward`, `Create` and `Settle` effects here (each an operation of its own,
        run the same way) and handing every other effect to the driver; errors go back into `op` where it
        yielded, as a call made there would raise them."""
        try:
            request = next(op)
            while True:
                kind = type(request)
                try:
                    if kind is Forward:
                        reply = yield from self.run(forward.forward(self, request.destination, request.now,
                                                                    request.limit))
                    elif kind is Create:
                        reply = yield from self.run(admin.init_destination(self, request.destination,
                                                                           request.now))
                    elif kind is Settle:
                        reply = yield from self.run(topics.settle(self, request.destination, request.now))
                    else:
                        reply = yield request
                except Exception as exc:  # noqa: BLE001 - handed to the operation, which decides
                    request = op.throw(exc)
                else:
                    request = op.send(reply)
        except StopIteration as stop:
            return stop.value
        finally:
            op.close()  # closed from outside (a cancelled call): the operation's own cleanup runs now

    # -- producing -----------------------------------------------------------------------------------

    def send(self, dest: Destination, messages: Iterable[Message], now: int,
             also: tuple[Destination, ...] = (), kind: str = "producer") -> Op:
        """Enqueue messages in order; returns their ids. A bad message or a limit refuses the whole batch.
        `also`: the other parts of a client-side composite (`A,B,topic://C`), sent copies. `kind`
        "exempt": the broker's own send, without producer flow control (queues.send_packed)."""
        require_concrete(dest, "send to")
        if dest.is_topic:
            return (yield from self.run(topics.send(self, dest, messages, now, also, kind)))
        packed = [message.pack(now) for message in messages]
        return (yield from self.run(queues.send_packed(self, dest, packed, now, also, kind)))

    def send_packed(self, dest: Destination, packed: list[tuple[str, bytes]], now: int,
                    also: tuple[Destination, ...] = ()) -> Op:
        """`send` to a queue of messages packed already (Message.pack: id, bytes)."""
        return self.run(queues.send_packed(self, dest, packed, now, also))

    def send_composite(self, parts: list[Destination], messages: list[Message], now: int,
                       tx: str | None = None) -> Op:
        """A client-side composite send (spec §10.1). The first queue part (else the first topic) takes the
        send, and in the same atomic step records copies for the other parts, so a crash cannot leave some
        parts without it. Each part's message has the composite as its original destination."""
        uri = getattr(parts, "uri", "")  # destinations.CompositeParts: the composite's own name
        if uri:
            messages = [replace(m, original_destination=uri) for m in messages]
        if tx:  # each part a send of its own, checked whole first: refused, no part is added
            body_bytes = sum(m.body_size for m in messages)
            yield from transactions.check(self, tx, len(messages) * len(parts), body_bytes * len(parts),
                                          [p.uri for p in parts])
            ids: list[str] = []
            for part in parts:
                ids = yield from self.tx_send(tx, part, messages, now)
            return ids
        entry = next((p for p in parts if p.is_queue), parts[0])
        return (yield from self.send(entry, messages, now, tuple(p for p in parts if p != entry)))

    # -- consuming -----------------------------------------------------------------------------------

    def add_consumer(self, dest: Destination, spec: ConsumerSpec, now: int, consumer_id: str | None) -> Op:
        if dest.is_temporary:
            if spec.subscription_name is not None:  # ActiveMQ's TempTopicRegion's text
                raise OperationRefused("A durable subscription cannot be created for a temporary topic.",
                                       destination=dest.uri)
            _refuse_others_temp(dest, spec.connection_id)
        cid, packed, selector = homes.consumer_definition(spec, consumer_id)
        return self.run(topics.subscribe(self, dest, spec, now, cid, packed, selector) if dest.is_topic else
                        queues.add_consumer(self, dest, spec, now, cid, packed))

    def receive(self, consumer: ConsumerRef, max_messages: int, now: int, lease_ms: int) -> Op:
        return self.run(homes.receive(self, consumer, max_messages, now, lease_ms))

    def receive_after(self, consumer: ConsumerRef, after: int, max_messages: int, push: int, now: int,
                      lease_ms: int) -> Op:
        return self.run(homes.receive_after(self, consumer, after, max_messages, push, now,
                                            lease_ms))

    def receive_turn(self, consumer: ConsumerRef, now: int, turn_ms: int) -> Op:
        return self.run(queues.receive_turn(self, consumer, now, turn_ms))

    def cancel_pull(self, consumer: ConsumerRef, now: int) -> Op:
        return self.run(homes.cancel_pull(self, consumer, now))

    def ack(self, consumer: ConsumerRef, message_ids: list[str], mode: str, now: int,
            receive: int = 0) -> Op:
        return self.run(homes.ack(self, consumer, message_ids, mode, now, receive))

    def ack_many(self, dest: Destination, requests: list[AckRequest], now: int) -> Op:
        """`ack` of several consumers of one queue in one script call (drivers/coalesce.py)."""
        return self.run(homes.ack_many(self, Home(dest), requests, now))

    def nack(self, consumer: ConsumerRef, message_ids: list[str], poison: bool, now: int,
             jitter: float) -> Op:
        return self.run(homes.nack(self, consumer, message_ids, poison, now, jitter))

    def release(self, consumer: ConsumerRef, message_ids: list[str], now: int) -> Op:
        return self.run(homes.release(self, consumer, message_ids, now))

    def close_consumer(self, consumer: ConsumerRef, now: int, reason: str,
                       written: int | None = None) -> Op:
        return self.run(homes.close_consumer(self, consumer, now, reason, written))

    # -- on a home: a queue, a topic (all its subscriptions), or one subscription ---------------------------

    def sweep_expired(self, home: Home, now: int) -> Op:
        """One page of the expiry sweep; call again until `done`."""
        return self.run(topics.sweep_expired(self, home.destination, now) if home.fans_out else
                        homes.sweep_expired(self, home, now))

    def renew(self, home: Home, consumer_ids: list[str], lease_ms: int, now: int) -> Op:
        """Renew leases; returns the ids that are no longer registered (closed or reaped)."""
        if home.fans_out:
            return self.run(topics.renew(self, home.destination, consumer_ids, lease_ms, now))
        return self.run(homes.renew(self, home, consumer_ids, lease_ms, now))

    def reap(self, home: Home, now: int, limit: int) -> Op:
        """Close consumers whose lease lapsed; returns their ids."""
        return self.run(topics.reap(self, home.destination, now, limit) if home.fans_out else
                        homes.reap(self, home, now, limit))

    def dispatch(self, home: Home, now: int) -> Op:
        return self.run(topics.dispatch(self, home.destination, now) if home.fans_out else
                        homes.dispatch(self, home, now))

    def return_owed(self, home: Home, now: int) -> Op:
        """What closed consumers still hold goes back, `return_chunk` per call (homes.return_owed)."""
        return self.run(homes.return_owed(self, home, now))

    def catch_up(self, sub: Home, now: int) -> Op:
        """Go on with a new retroactive durable subscription's catch-up (topics.catch_up)."""
        return self.run(topics.catch_up(self, sub, now))

    def fan_out(self, topic: Destination, now: int) -> Op:
        """Go on with the topic's unfinished fan-outs (topics.fan_out)."""
        return self.run(topics.fan_out(self, topic, now))

    def forward(self, dest: Destination, now: int, limit: int = 1_000) -> Op:
        """Deliver what waits in the destination's outbox (forwards a crashed process left behind)."""
        return self.run(forward.forward(self, dest, now, limit))

    # -- administration ------------------------------------------------------------------------------

    def pause(self, dest: Destination, paused: bool, now: int) -> Op:
        return self.run(queues.pause(self, dest, paused, now))

    def remove_message_groups(self, dest: Destination, group_id: str | None, now: int) -> Op:
        return self.run(queues.remove_message_groups(self, dest, group_id, now))

    def message_groups(self, dest: Destination, now: int) -> Op:
        return self.run(queues.message_groups(self, dest, now))

    def message_groups_page(self, dest: Destination, now: int, cursor: str | None, limit: int) -> Op:
        return self.run(queues.message_groups_page(self, dest, now, cursor, limit))

    def group_counts(self, dest: Destination, now: int, pending_limit: int, in_flight_limit: int) -> Op:
        return self.run(queues.group_counts(self, dest, now, pending_limit, in_flight_limit))

    def summary(self, dest: Destination, now: int, oldest: bool = False) -> Op:
        return self.run(queues.summary(self, dest, now, oldest))

    def summaries(self, topics_: list[Destination], now: int, budget: int = topics.SUMMARY_BUDGET) -> Op:
        """Topics' summaries, in calls of at most `budget` units of work (topics.summaries)."""
        return self.run(topics.summaries(self, topics_, now, budget))

    def stats(self, dest: Destination, now: int) -> Op:
        return self.run(topics.stats(self, dest, now) if dest.is_topic else
                        homes.stats(self, Home(dest), now))

    def subscriptions(self, topic: Destination, now: int) -> Op:
        return self.run(topics.subscriptions(self, topic, now))

    def for_each_subscription(self, topic: Destination) -> Op:
        """The homes of a topic's subscriptions."""
        return self.run(topics.for_each_subscription(self, topic))

    def unsubscribe(self, topic: Destination, client_id: str, subscription_name: str, now: int) -> Op:
        return self.run(topics.unsubscribe(self, topic, client_id, subscription_name, now))

    def expire_offline_durables(self, topic: Destination, timeout_ms: int | None, now: int) -> Op:
        return self.run(topics.expire_offline_durables(self, topic, timeout_ms, now))

    def pattern_topics(self) -> Op:
        return self.run(admin.pattern_topics(self))

    def idle_pattern_topics(self) -> Op:
        return self.run(topics.idle_pattern_topics(self))

    def drop_idle_pattern(self, dest: Destination, now: int, jobs: tuple[str, ...]) -> Op:
        return self.run(topics.drop_idle_pattern(self, dest, now, jobs))

    def destinations(self) -> Op:
        return self.run(admin.destinations(self))

    def ensure_destination(self, dest: Destination, now: int) -> Op:
        return self.run(self.ensure(dest, now))

    def refresh_policies(self, now: int) -> Op:
        return self.run(admin.refresh_policies(self, now))

    def delete_destination(self, dest: Destination, now: int) -> Op:
        """Delete a destination and everything in it; returns how many messages it held (a topic's: what
        its subscriptions held, each one's counted, and its scheduled messages: topics.delete)."""
        removed, held = yield from self._delete(dest, now)
        return removed if dest.is_topic else held

    def delete_temporary(self, dest: Destination, now: int) -> Op:
        """Delete a temporary destination whose connection ended with its messages, each counted in
        `temp_tally_key` in the step that removes it (docs/broker_core.md "Temporary destinations"); returns
        how many messages it held. Bounded calls: a queue is purged first (PURGE_EXAMINE messages a call),
        so its deletion finds little left; a temporary topic has no durable subscription (refused), and its
        connection's own subscriptions ended before this."""
        if not (yield Command(("EXISTS", f"{self.prefix(dest)}:meta"))):
            return 0  # gone already: nothing to record, nothing to count
        removed, held = yield from self._delete(dest, now, temp_tally_key(self.namespace))
        return held if dest.is_topic else removed + held

    def finish_deletions(self, now: int, started_before: int, limit: int) -> Op:
        """Finish the deletions whose driver died (or stalls): up to `limit` of those recorded before
        `started_before` (ms; admin.begin_deletion), each taken over first (its record's time moved to
        `now`, so other ticks leave it alone for as long) and run as its driver runs it (`_delete`), with
        the tally it is counted in. A driver still going and this meeting on one deletion is harmless:
        each step is atomic, neither makes the destination again, and only the step that finds it still
        there counts it (destination_delete.lua). Returns their uris."""
        finished = []
        for uri, tally in (yield from self.run(admin.stalled_deletions(self, started_before, limit))):
            if (yield from self.run(admin.take_over_deletion(self, uri, now))):
                dest = parse_destination(uri, allow_wildcards=True)
                yield from self._delete(dest, now, tally, recorded=True)
                finished.append(uri)
        return finished

    def _delete(self, dest: Destination, now: int, tally: str = "", recorded: bool = False) -> Op:
        """A deletion, whoever drives it (the operator, a temporary destination's end, maintenance taking
        one over): recorded first unless it is already (`recorded`), so that maintenance finishes it if
        this driver dies; then a topic's subscriptions and the topic (`_delete_topic`), or a queue, purged
        first when the deletion is counted in `tally` (each message counted as it goes), and deleted; the
        record goes in the last step. Returns (what the subscriptions' removal or the purge removed, what
        the deletion found in the destination's store)."""
        if not recorded:
            yield from self.run(admin.begin_deletion(self, dest, now, tally))
        if dest.is_topic:  # its subscriptions first (bounded calls), then its own keys
            return (yield from self._delete_topic(dest, now, tally))
        removed = 0
        if tally:
            try:
                removed = yield from self.run(queues.purge(self, dest, now, 0, tally=tally))
            except UnknownDestination:  # deleted meanwhile (purge.lua makes no queue): its record goes below
                removed = 0
        return removed, (yield from self.run(admin.delete_destination(self, dest, now, tally)))

    def _delete_topic(self, dest: Destination, now: int, tally: str = "") -> Op:
        """A topic's subscriptions removed, then the topic (admin.delete_destination), again while a
        subscription made meanwhile (a client resubscribing when told its went) keeps its deletion from
        going ahead: none is left behind subscribed to a topic that no longer exists. Returns (what
        topics.delete removed, what its deletion found in the topic's store)."""
        removed, first = 0, True
        while True:
            removed += yield from self.run(topics.delete(self, dest, now, jobs=first))
            held = yield from self.run(admin.delete_destination(self, dest, now, tally))
            if held is not None:
                return removed, held
            first = False

    def connection_changed(self, info: dict[str, str], now: int, added: bool) -> Op:
        return self.run(advisory.connection_changed(self, info, now, added))

    def virtual_routing(self) -> Op:
        return self.run(virtual.routing(self))

    # -- the operator's message operations (spec §14.3) -----------------------------------------------

    def browse(self, dest: Destination, selector: str | None, cursor: str | None, limit: int, now: int,
               parked: bool = True, examine: int = queues.BROWSE_EXAMINE) -> Op:
        return self.run(queues.browse(self, dest, selector, cursor, limit, now, parked, examine))

    def browser_limit(self, dest: Destination, connection_id: str | None) -> Op:
        _refuse_on_topic(dest, "browse")
        if dest.is_temporary:  # a browser is a consumer there (ActiveMQ's TempQueue.addSubscription)
            _refuse_others_temp(dest, connection_id)
        return (yield from self.run(queues.browser_limit(self, dest)))

    def open_browser(self, dest: Destination, browser_id: str, lease_ms: int, prefetch: int,
                     selector: str | None, now: int) -> Op:
        _refuse_on_topic(dest, "browse")
        return self.run(queues.open_browser(self, dest, browser_id, lease_ms, prefetch, selector, now))

    def renew_browsers(self, dest: Destination, browser_ids: list[str], lease_ms: int, now: int) -> Op:
        return self.run(queues.renew_browsers(self, dest, browser_ids, lease_ms, now))

    def close_browsers(self, dest: Destination, browser_ids: list[str], reason: str, now: int) -> Op:
        return self.run(queues.close_browsers(self, dest, browser_ids, reason, now))

    def browsers(self, dest: Destination, most: int, now: int) -> Op:
        _refuse_on_topic(dest, "browse")
        return self.run(queues.browsers(self, dest, most, now))

    def get_message(self, dest: Destination, message_id: str, now: int) -> Op:
        return self.run(queues.get_message(self, dest, message_id, now))

    def parked_times(self, dest: Destination, message_ids: list[str]) -> Op:
        return self.run(queues.parked_times(self, dest, message_ids))

    def remove(self, dest: Destination, message_ids: list[str], now: int) -> Op:
        if dest.is_topic:  # a topic's scheduled messages (its jobs) are its own: those may be cancelled
            jobs = (yield Command(("HMGET", f"{self.prefix(dest)}:sched", *message_ids))
                    if message_ids else [])
            if not all(jobs):
                _refuse_on_topic(dest, "remove messages (other than scheduled ones) from")
        return (yield from self.run(queues.remove(self, dest, message_ids, now)))

    def scheduled_page(self, dest: Destination, cursor: str | None, start: int | None, end: int | None,
                       limit: int, now: int) -> Op:
        return self.run(queues.scheduled_page(self, dest, cursor, start, end, limit, now))

    def with_parked(self, dests: list[Destination]) -> Op:
        return self.run(queues.with_parked(self, dests))

    def cancel_scheduled(self, dest: Destination, job_ids: list[str], now: int) -> Op:
        return self.run(queues.cancel_scheduled(self, dest, job_ids, now))

    def remove_matching(self, dest: Destination, selector: str | None, limit: int | None, now: int,
                        progress: Callable[[int, int], None] | None = None) -> Op:
        _refuse_on_topic(dest, "remove messages from")
        return (yield from self.run(queues.remove_matching(self, dest, selector, limit, now, progress)))

    def purge(self, dest: Destination, now: int, progress: Callable[[int, int], None] | None = None) -> Op:
        st = yield from self.stats(dest, now)
        return (yield from self.run(queues.purge(self, dest, now, st.queue_size + st.parked, progress)))

    def transfer(self, dest: Destination, mode: str, target: Destination | None, message_ids: list[str],
                 selector: str | None, limit: int | None, now: int) -> Op:
        _refuse_on_topic(dest, f"{mode} messages of")
        return (yield from self.run(queues.transfer(self, dest, mode, target, message_ids, selector, limit,
                                                    now)))

    # -- transactions --------------------------------------------------------------------------------

    def tx_begin(self, ttl_ms: int) -> Op:
        return self.run(transactions.begin(self, ttl_ms))

    def tx_renew(self, txs: list[str], ttl_ms: int) -> Op:
        return self.run(transactions.renew(self, txs, ttl_ms))

    def tx_send(self, tx: str, dest: Destination, messages: Iterable[Message], now: int) -> Op:
        return self.run(transactions.send(self, tx, dest, messages, now))

    def tx_ack(self, tx: str, consumer: ConsumerRef, message_ids: list[str], mode: str, now: int,
               mark_delivered: bool = True) -> Op:
        return self.run(transactions.ack(self, tx, consumer, message_ids, mode, now, mark_delivered))

    def tx_check(self, tx: str, size: int, body_bytes: int, places: Iterable[str]) -> Op:
        return self.run(transactions.check(self, tx, size, body_bytes, places))

    def tx_commit(self, tx: str, now: int) -> Op:
        return self.run(transactions.commit(self, tx, now))

    def tx_rollback(self, tx: str, now: int, redeliver: bool = True) -> Op:
        return self.run(transactions.rollback(self, tx, now, redeliver))


def _refuse_others_temp(dest: Destination, connection_id: str | None) -> None:
    if connection_id != dest.temporary_owner:  # ActiveMQ's TempQueue/TempTopic, no stealing
        raise OperationRefused(f"Subscribing to a temporary {dest.kind} created by another "
                               "connection is not permitted", destination=dest.uri)


def _refuse_on_topic(dest: Destination, what: str) -> None:
    """a topic stores each message once for all its subscriptions (topics.py), so taking one out
    by id would pull it from under every subscriber; ActiveMQ's TopicView has no removeMessage/move."""
    if dest.is_topic:
        raise OperationRefused(f"cannot {what} a topic ({dest.uri}): a topic's messages belong to its "
                               "subscriptions; ActiveMQ's TopicView has no such operation",
                               destination=dest.uri)

