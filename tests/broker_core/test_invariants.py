"""Hypothesis state machines drive the queue engine and the topics on a real Redis and checks its invariants.

Random sends (some grouped, some expiring), consumer opens and closes, lease lapses, receives, acks,
nacks and poison nacks, expiry sweeps, moves, removes, purges and group resets; after every step: every
message is in exactly one place - on the queue (pending, parked or in flight with one consumer), acked,
in the dead-letter queue, moved to the archive queue or purged - and nothing waits in transit; in-flight
stays within prefetch (plus the DELIVERED-ack extension); a group has at most one owner and the messages
dispatched to it since it was last bound are with that owner; each consumer gets never-returned messages
of one group (or the ungrouped ones) in send order.
"""

from __future__ import annotations

import re
import uuid

import hypothesis.strategies as st
import msgpack
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker_core import maintenance
from broker_core.broker import Broker
from broker_core.clock import FakeClock
from broker_core.destinations import Destination
from broker_core.effects import Eval
from broker_core.errors import DurableSubscriptionInUse, UnknownSubscription
from broker_core.event_stream import expand
from broker_core.keys import Home
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from broker_core.ops.context import RETURN_CHUNK
from broker_core.topics import durable_key, durable_registry_field, is_durable_key

DEST = "inv"
ARCHIVE = "inv.archive"
DLQ = "ActiveMQ.DLQ"
GROUPS = [None, None, "G1", "G2", "G3"]


class QueueMachine(RuleBasedStateMachine):
    redis_url = ""

    @initialize()
    def setup(self):
        self.client = redis.Redis.from_url(self.redis_url)
        self.ns = f"t{uuid.uuid4().hex[:12]}"
        self.clock = FakeClock()
        self.broker = Broker(self.client, self.ns, self.clock)
        self.sent: dict[str, tuple[int, str | None]] = {}  # id -> (send index, group)
        self.kind_and_expiry: dict[str, tuple[str, int]] = {}  # id -> (its property 'kind', expiration)
        self.specs: dict[str, ConsumerSpec] = {}  # consumer id -> how it was opened
        self.acked: set[str] = set()
        self.consumers: dict[str, object] = {}
        self.received: dict[str, list[str]] = {}  # consumer -> fresh message ids in receive order
        self.seq = 0
        self.opened = 0
        self.purged: set[str] = set()
        self.broker.ensure_destination(ARCHIVE)
        self.broker.ensure_destination(DEST)

    def teardown(self):
        keys = list(self.client.scan_iter(match=f"{self.ns}:*", count=1000))
        if keys:
            self.client.delete(*keys)
        self.client.close()

    @rule(n=st.integers(1, 4), group=st.sampled_from(GROUPS), kind=st.sampled_from(["a", "b"]),
          ttl=st.sampled_from([0, 0, 0, 500, 3000]))
    def send(self, n, group, kind, ttl):
        batch = []
        for _ in range(n):
            self.seq += 1
            expiration = self.clock.now_ms() + ttl if ttl else 0
            # ids of the test's own making: generated ones are random, and the rules pick messages by id
            # (purge_or_remove sorts them), so a replay of the same steps would pick others
            batch.append(Message(body=str(self.seq), group_id=group, properties={"kind": kind},
                                 expiration=expiration, message_id=f"ID:m{self.seq:05d}"))
        ids = self.broker.send(DEST, batch)
        for message_id, message in zip(ids, batch, strict=True):
            self.sent[message_id] = (int(message.body), group)
            self.kind_and_expiry[message_id] = (kind, message.expiration)

    @precondition(lambda self: len(self.consumers) < 4)
    @rule(prefetch=st.sampled_from([0, 1, 2, 5]), priority=st.integers(0, 2),
          exclusive=st.booleans(), selector=st.sampled_from([None, None, "kind = 'a'"]),
          mode=st.sampled_from(["client", "client-individual"]))
    def open_consumer(self, prefetch, priority, exclusive, selector, mode):
        self.opened += 1  # ids must not depend on randomness outside hypothesis
        spec = ConsumerSpec(prefetch=prefetch, priority=priority, exclusive=exclusive, selector=selector,
                            ack_mode=mode, lease_ms=10_000)
        c = self.broker.add_consumer(DEST, spec, consumer_id=f"c{self.opened}")
        self.consumers[c.consumer_id] = c
        self.specs[c.consumer_id] = spec
        self.received[c.consumer_id] = []

    def _pick(self, data):
        return self.consumers[data.draw(st.sampled_from(sorted(self.consumers)))]

    @precondition(lambda self: self.consumers)
    @rule(data=st.data(), n=st.integers(1, 5))
    def receive(self, data, n):
        self._receive(self._pick(data), n)

    def _receive(self, c, n):
        got = self.broker.receive(c, n, lease_ms=10_000)
        # Returned messages go ahead of fresh ones by design, even those never received (no counter bump).
        returned = {e[b"msg"].decode() for _, e in expand(self.client.xrange(self._key("events")))
                    if e[b"type"] in (b"return", b"redeliver")}
        for d in got:
            if d.message_id not in returned:
                self.received[c.consumer_id].append(d.message_id)

    @precondition(lambda self: self.consumers)
    @rule(data=st.data(), n=st.integers(1, 5), which=st.integers(0, 10))
    def receive_then_ack(self, data, n, which):
        c = self._pick(data)
        self._receive(c, n)
        self._ack(c, which)

    @precondition(lambda self: self.consumers)
    @rule(data=st.data(), which=st.integers(0, 10))
    def ack(self, data, which):
        self._ack(self._pick(data), which)

    def _ack(self, c, which):
        held = self._held(c.consumer_id)
        if not held:
            return
        delivered = [m for m in held if m not in self._undelivered(c.consumer_id)]
        if not delivered:
            return
        target = delivered[which % len(delivered)]
        before = set(held)
        self.broker.ack(c, target)
        after = set(self._held(c.consumer_id))
        self.acked |= before - after

    @precondition(lambda self: self.consumers)
    @rule(data=st.data())
    def close(self, data):
        c = self._pick(data)
        self.broker.close_consumer(c)
        del self.consumers[c.consumer_id]

    def _holding_several(self):
        return sorted(cid for cid in self.consumers if len(self._held(cid)) > 1)

    @precondition(lambda self: self._holding_several())
    @rule(data=st.data(), chunk=st.integers(1, 3), calls=st.integers(0, 2))
    def close_and_die_between_chunks(self, data, chunk, calls):
        """The closing process returns `chunk` messages per call and dies after `calls` further calls (each
        with its dispatch run to the end): the rest stay owed until the tick or another close returns them."""
        c = self.consumers[data.draw(st.sampled_from(self._holding_several()))]
        self.broker.ops.return_chunk = chunk
        try:
            op = self.broker.ops.close_consumer(c, self.clock.now_ms(), "closed")
            request, left = next(op), calls
            while not (isinstance(request, Eval) and request.script == "return_owed" and left == 0):
                if isinstance(request, Eval) and request.script == "return_owed":
                    left -= 1
                request = op.send(self.broker._step(request))
            op.close()
        except StopIteration:
            pass  # everything went back within those calls
        finally:
            self.broker.ops.return_chunk = RETURN_CHUNK
        del self.consumers[c.consumer_id]

    @rule()
    def the_maintenance_tick_runs(self):
        maintenance.run_recovery(self.broker, DEST)
        assert not self._closing()

    @precondition(lambda self: self.consumers)
    @rule(data=st.data())
    def lapse(self, data):
        """The consumer's process dies: everyone else renews, time passes, the reaper runs."""
        c = self._pick(data)
        others = [cid for cid in self.consumers if cid != c.consumer_id]
        self.clock.advance(6_000)
        if others:
            self.broker.renew_leases(DEST, others, 10_000)
        self.clock.advance(6_000)
        assert self.broker.reap_lapsed(DEST) == [c.consumer_id]
        del self.consumers[c.consumer_id]

    @precondition(lambda self: self.consumers)
    @rule(data=st.data(), poison=st.booleans())
    def nack(self, data, poison):
        c = self._pick(data)
        delivered = [m for m in self._held(c.consumer_id) if m not in self._undelivered(c.consumer_id)]
        if delivered:
            self.broker.nack(c, data.draw(st.sampled_from(delivered)), poison=poison)

    @rule(ms=st.integers(0, 2000))
    def time_passes_and_the_sweep_runs(self, ms):
        self.clock.advance(ms)
        if self.consumers:
            self.broker.renew_leases(DEST, list(self.consumers), 10_000)
        while not self.broker.sweep_expired(DEST).done:
            pass

    @rule()
    def move_kind_b_to_the_archive(self):
        self.broker.move_matching(DEST, "kind = 'b'", ARCHIVE)

    @rule(everything=st.sampled_from([False, False, False, True]), which=st.integers(0, 50))
    def purge_or_remove(self, everything, which):
        before = self._live()
        if everything:
            self.broker.purge(DEST)
        elif before:
            self.broker.remove_message(DEST, sorted(before)[which % len(before)])
        # what left and did not expire into the DLQ meanwhile (the dispatch after a removal expires)
        self.purged |= before - self._live() - self._stored(DLQ)

    @rule(group=st.sampled_from(["G1", "G2", "G3", None]))
    def reset_groups(self, group):
        if group is None:
            self.broker.remove_all_message_groups(DEST)
        else:
            self.broker.remove_message_group(DEST, group)

    # -- views of Redis -------------------------------------------------------------------------

    def _key(self, suffix):
        return f"{self.ns}:{{q:{DEST}}}:{suffix}"

    def _held(self, cid):
        return [m.decode() for m in self.client.zrange(self._key(f"c:{cid}:inflight"), 0, -1)]

    def _live(self):
        pending = {m.decode() for m in self.client.zrange(self._key("pending"), 0, -1)}
        parked = {m.decode() for m in self.client.zrange(self._key("parked"), 0, -1)}
        return pending | parked | {m.decode() for m in self.client.hkeys(self._key("inflight"))}

    def _stored(self, dest):
        return {m.decode() for m in self.client.hkeys(f"{self.ns}:{{q:{dest}}}:msgs")}

    def _closing(self):
        """Closed consumers whose messages are still owed (broker_core/scripts/lua/includes/lifecycle.lua)."""
        return sorted(m.decode() for m in self.client.hkeys(self._key("closing")))

    def _undelivered(self, cid):
        return {m.decode() for m in self.client.lrange(self._key(f"c:{cid}:outbox"), 0, -1)}

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def every_message_is_in_exactly_one_place(self):
        if not self.sent:
            return
        holders: dict[str, str] = {}
        for cid in [*self.consumers, *self._closing()]:
            for m in self._held(cid):
                assert m not in holders, f"{m} is in flight with {holders[m]} and {cid}"
                holders[m] = cid
        inflight = {m.decode() for m in self.client.hkeys(self._key("inflight"))}
        assert inflight == set(holders)
        assert not self.client.hlen(self._key("fwd")), "a forward was left in transit"
        places = {
            "pending": {m.decode() for m in self.client.zrange(self._key("pending"), 0, -1)},
            "parked": {m.decode() for m in self.client.zrange(self._key("parked"), 0, -1)},
            "inflight": inflight, "acked": self.acked, "dead-lettered": self._stored(DLQ),
            "moved": self._stored(ARCHIVE), "purged": self.purged,
        }
        for message_id in self.sent:
            found = [name for name, ids in places.items() if message_id in ids]
            assert len(found) == 1, f"{message_id} is in {found or 'no place'}"
        stats = self.broker.stats(DEST)
        assert stats.expired == stats.deadlettered - self._poisoned() and stats.discarded == 0

    def _poisoned(self):
        return sum(1 for _, e in expand(self.client.xrange(self._key("events")))
                   if e[b"type"] == b"deadletter" and e[b"cause"] != b"expired")

    @invariant()
    def in_flight_stays_within_the_prefetch_window(self):
        if not self.consumers:
            return
        for s in self.broker.stats(DEST).consumers:
            if s.prefetch > 0:
                assert s.in_flight - s.prefetch_extension <= s.prefetch
            else:
                assert s.undelivered <= 5  # a pull asks for at most 5 messages at a time here

    @invariant()
    def a_group_has_one_owner_holding_what_was_dispatched_since_it_was_bound(self):
        if not self.sent:
            return
        groups = self.broker.message_groups(DEST) if self.client.exists(self._key("meta")) else []
        owners = {}
        for g in groups:
            assert g.group_id not in owners
            owners[g.group_id] = g.owner
            assert g.owner in self.consumers
        events = expand(self.client.xrange(self._key("events")))
        bound_at = {e[b"group"].decode(): i for i, (_, e) in enumerate(events)
                    if e[b"type"] == b"group_assign"}
        for group, owner in owners.items():
            start = bound_at[group]
            for _, e in events[start:]:
                if e[b"type"] == b"dispatch" and self.sent[e[b"msg"].decode()][1] == group:
                    m = e[b"msg"].decode()
                    holder = e[b"consumer"].decode()
                    assert holder == owner, f"{m} of {group} went to {holder}, owner is {owner}"

    @invariant()
    def no_message_waits_that_a_consumer_with_room_would_take(self):
        # Spec §1.4, and the "must not starve": when an operation returns, its dispatch has run to
        # the end, so a pending message (not yet expired) has no consumer that has room in its window
        # (prefetch > 0), passes its selector, may take it under the exclusive owner (if any), and owns its
        # group or finds it unowned.
        if not self.consumers or not self.client.exists(self._key("meta")):
            return
        now = self.clock.now_ms()
        owner = (self.client.hget(self._key("meta"), "owner") or b"").decode() or None
        groups = {g.group_id: g.owner for g in self.broker.message_groups(DEST)}
        room = {s.consumer_id for s in self.broker.stats(DEST).consumers
                if s.prefetch > 0 and s.in_flight < s.prefetch + s.prefetch_extension}
        # while a closed consumer's messages are owed, what scores at or above the fence waits for them
        fence = self.client.hget(self._key("meta"), "fence")
        for raw, score in self.client.zrange(self._key("pending"), 0, -1, withscores=True):
            m = raw.decode()
            if fence is not None and score >= float(fence):
                continue
            kind, expiration = self.kind_and_expiry[m]
            if expiration and expiration <= now:
                continue
            group = self.sent[m][1]
            for cid in room:
                spec = self.specs[cid]
                takes = ((owner is None or owner == cid)
                         and (spec.selector is None or kind == "a")
                         and (group is None or groups.get(group, cid) == cid))
                assert not takes, f"{m} waits although {cid} has room and would take it"

    @invariant()
    def each_consumer_gets_fresh_messages_of_a_group_in_send_order(self):
        for cid, ids in self.received.items():
            last: dict[str | None, int] = {}
            for m in ids:
                index, group = self.sent[m]
                assert index > last.get(group, 0), f"{cid} got {index} after {last[group]} ({group})"
                last[group] = index


@pytest.mark.e2e
def test_queue_engine_invariants_hold_under_random_operations(redis_url):
    QueueMachine.redis_url = redis_url
    QueueMachine.TestCase.settings = settings(
        max_examples=80, stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow])
    QueueMachine.TestCase().runTest()


# -- topics ----------------------------------------------------------------------------------------
# TOPICS (issue 5): non-durable, durable (going offline and online, timed out) and retroactive
# subscriptions, a pending-message limit that evicts, expiring messages. After every step: each
# subscription holds or has finished every message it matched exactly once - pending, parked, in flight,
# acknowledged, or evicted / expired with it counted - and holds nothing it did not match; a stored
# message's reference count is the number of subscriptions holding it, and nothing else is stored.

TOPIC = "inv.t"
TOPIC_URI = f"topic://{TOPIC}"
OTHER_TOPIC_URI = "topic://inv.t2"  # where a durable key may be re-subscribed (and so leave TOPIC)
RECOVER = 5
LIMIT = 3
DURABLE_REF = 2**32  # the weight of a durable subscription's reference in <topic>:refs (lifecycle.lua)


class TopicMachine(RuleBasedStateMachine):
    redis_url = ""

    @initialize()
    def setup(self):
        self.client = redis.Redis.from_url(self.redis_url)
        self.ns = f"t{uuid.uuid4().hex[:12]}"
        self.clock = FakeClock()
        self.broker = Broker(self.client, self.ns, self.clock)
        self.limit = LIMIT
        self._set_policy()
        self.seq = 0
        self.opened = 0
        self.sent: list[tuple[str, str]] = []  # (id, kind) in send order
        self.expires: dict[str, int] = {}  # id -> expiration (0: never)
        # subscription key -> {"kind": selector kind or None, "name": durable name or None,
        #   "consumer": Consumer or None (offline), "since": event stream id at its creation,
        #   "expected": ids it matched, "acked": ids it acknowledged, "fresh": ids received fresh}
        self.subs: dict[str, dict] = {}
        self.elsewhere: set[str] = set()  # durable names now on OTHER_TOPIC_URI
        self.broker.ensure_destination(TOPIC_URI)
        self.broker.ensure_destination(OTHER_TOPIC_URI)

    def _set_policy(self):
        # Dead letters go to the shared ActiveMQ.DLQ (the default strategy); the limit is LIMIT or 0.
        self.broker.policies.set_entry("topic", ">", {
            "pendingMessageLimitStrategy": "constant", "pendingMessageLimit": self.limit,
            "subscriptionRecoveryPolicy": "fixedCount", "subscriptionRecoveryMaximumSize": RECOVER})
        self.broker.refresh_policies()

    def teardown(self):
        keys = list(self.client.scan_iter(match=f"{self.ns}:*", count=1000))
        if keys:
            self.client.delete(*keys)
        self.client.close()

    def _key(self, suffix):
        return f"{self.ns}:{{t:{TOPIC}}}:{suffix}"

    def _last_event(self):
        last = self.client.xrevrange(self._key("events"), count=1)
        return last[0][0].decode() if last else "0"

    def _events(self, sub_key, kind):
        since = self.subs[sub_key]["since"]
        return [e[b"msg"].decode() for _, e in expand(self.client.xrange(self._key("events"), f"({since}"))
                if e[b"type"] == kind and e.get(b"sub", b"").decode() == sub_key]

    def _held(self, key):
        held = {m.decode() for m in self.client.zrange(self._key(f"s:{key}:pending"), 0, -1)}
        held |= {m.decode() for m in self.client.zrange(self._key(f"s:{key}:parked"), 0, -1)}
        return held | {m.decode() for m in self.client.hkeys(self._key(f"s:{key}:inflight"))}

    def _live(self, message_id):
        exp = self.expires.get(message_id, 0)
        return not exp or self.clock.now_ms() <= exp

    @rule(n=st.integers(1, 4), kind=st.sampled_from(["a", "b"]), ttl=st.sampled_from([0, 0, 0, 500]))
    def send(self, n, kind, ttl):
        batch = []
        for _ in range(n):
            self.seq += 1
            batch.append(Message(body=str(self.seq), properties={"kind": kind},
                                 expiration=self.clock.now_ms() + ttl if ttl else 0,
                                 message_id=f"ID:m{self.seq:05d}"))  # (as QueueMachine.send's)
        ids = self.broker.send(TOPIC_URI, batch)
        for message_id, message in zip(ids, batch, strict=True):
            self.sent.append((message_id, kind))
            self.expires[message_id] = message.expiration
            for s in self.subs.values():
                if s["kind"] in (None, kind):
                    s["expected"].add(message_id)

    def _subscribe(self, kind, name, prefetch, retroactive):
        self.opened += 1
        # (priorities 0, 4 and 8 in turn: the topic's :sprio keeps them in the priority policy's order)
        spec = ConsumerSpec(prefetch=prefetch, selector=f"kind = '{kind}'" if kind else None,
                            retroactive=retroactive, ack_mode="client-individual",
                            client_id="inv" if name else None, subscription_name=name,
                            priority=self.opened % 3 * 4)
        kinds = dict(self.sent)

        def matching(ids):
            return {m for m in ids if kind in (None, kinds.get(m)) and self._live(m)}

        # What the replay may draw from, read before the subscribe (§7.5): the recovery buffer, and for a
        # new durable what other durables still hold.
        buffer = matching(m.decode() for m in self.client.zrange(self._key("recov"), 0, -1))
        backlog = set()
        for key, other in self.subs.items():
            if other["name"] and other["name"] != name:
                backlog |= self._held(key)
        backlog = matching(backlog)
        previous = next((k for k, s in self.subs.items() if name and s["name"] == name), None)
        held_before = self._held(previous) if previous else set()
        since = self._last_event()
        c = self.broker.add_consumer(TOPIC_URI, spec, consumer_id=f"c{self.opened}")
        self.elsewhere.discard(name)
        entry = self.subs.get(c.subscription)
        new = entry is None or entry["kind"] != kind
        if new:  # new, or replaced for a changed selector
            entry = {"kind": kind, "name": name, "since": since, "expected": set(), "acked": set(),
                     "fresh": []}
            self.subs[c.subscription] = entry
        entry["consumer"] = c
        entry["prefetch"] = prefetch
        replayed = set(self._events(c.subscription, b"recover"))
        if not new:
            replayed = {m for m in replayed if m not in entry["expected"]}
        recovered = replayed
        if not retroactive:
            assert recovered == set(), f"{recovered} replayed to a subscriber that did not ask"
        elif name is None:
            assert recovered == buffer, f"non-durable got {recovered}, the buffer held {buffer}"
        elif new:
            # Topic.activate: the stored backlog first; the buffer only if that left nothing pending.
            assert backlog <= recovered, f"new durable missed {backlog - recovered} still stored for others"
            allowed = backlog | (buffer if not backlog else set())
            assert recovered <= allowed, f"new durable got {recovered - allowed} it should not"
        else:
            allowed = buffer if not (held_before - {m for m in held_before if not self._live(m)}) else set()
            assert recovered <= allowed, f"returning durable got {recovered - allowed} it should not"
        entry["expected"] |= recovered

    @precondition(lambda self: sum(1 for s in self.subs.values() if s["consumer"]) < 4)
    @rule(kind=st.sampled_from([None, "a", "b"]), prefetch=st.sampled_from([1, 2, 5]),
          retroactive=st.booleans())
    def open_non_durable(self, kind, prefetch, retroactive):
        self._subscribe(kind, None, prefetch, retroactive)

    def _in_use(self, name):
        return any(s["name"] == name and s["consumer"] for s in self.subs.values())

    @rule(name=st.sampled_from(["d1", "d2"]), kind=st.sampled_from([None, "a"]), retroactive=st.booleans())
    def open_durable(self, name, kind, retroactive):
        if self._in_use(name):
            self.opened += 1
            spec = ConsumerSpec(client_id="inv", subscription_name=name)
            with pytest.raises(DurableSubscriptionInUse):
                self.broker.add_consumer(TOPIC_URI, spec, consumer_id=f"c{self.opened}")
            return
        self._subscribe(kind, name, 2, retroactive)

    @rule(name=st.sampled_from(["d1", "d2"]))
    def resubscribe_durable_on_another_topic(self, name):
        """§7.4: the key moves; the subscription on TOPIC goes with its messages (refused while in use)."""
        self.opened += 1
        spec = ConsumerSpec(client_id="inv", subscription_name=name)
        if self._in_use(name):
            with pytest.raises(DurableSubscriptionInUse):
                self.broker.add_consumer(OTHER_TOPIC_URI, spec, consumer_id=f"c{self.opened}")
            return
        c = self.broker.add_consumer(OTHER_TOPIC_URI, spec, consumer_id=f"c{self.opened}")
        self.broker.close_consumer(c)
        for key in [k for k, s in self.subs.items() if s["name"] == name]:
            del self.subs[key]
        self.elsewhere.add(name)

    @rule(name=st.sampled_from(["d1", "d2"]))
    def unsubscribe_durable(self, name):
        """By key alone: the registry finds the topic (TOPIC or OTHER_TOPIC_URI)."""
        if self._in_use(name):
            with pytest.raises(DurableSubscriptionInUse):
                self.broker.unsubscribe(TOPIC_URI, client_id="inv", subscription_name=name)
            return
        known = name in self.elsewhere or any(s["name"] == name for s in self.subs.values())
        if not known:
            with pytest.raises(UnknownSubscription):
                self.broker.unsubscribe(TOPIC_URI, client_id="inv", subscription_name=name)
            return
        self.broker.unsubscribe(TOPIC_URI, client_id="inv", subscription_name=name)
        for key in [k for k, s in self.subs.items() if s["name"] == name]:
            del self.subs[key]
        self.elsewhere.discard(name)

    @rule(limit=st.sampled_from([LIMIT, LIMIT, 0]))
    def pending_limit_changes(self, limit):
        """§8.5: a limit of 0 drops what the window cannot take at once (counted, not dead-lettered)."""
        self.limit = limit
        self._set_policy()

    def _active(self):
        return sorted(k for k, s in self.subs.items() if s["consumer"])

    @precondition(lambda self: any(s["consumer"] for s in self.subs.values()))
    @rule(data=st.data(), n=st.integers(1, 4), ack=st.booleans())
    def receive(self, data, n, ack):
        key = data.draw(st.sampled_from(self._active()))
        s = self.subs[key]
        for d in self.broker.receive(s["consumer"], n):
            assert d.message_id in s["expected"], f"{key} got {d.message_id} it did not match"
            if not d.redelivered:
                assert d.message_id not in s["fresh"], f"{key} got {d.message_id} twice"
                s["fresh"].append(d.message_id)
            if ack:
                self.broker.ack(s["consumer"], d.message_id)
                s["acked"].add(d.message_id)

    @precondition(lambda self: any(s["consumer"] for s in self.subs.values()))
    @rule(data=st.data())
    def close(self, data):
        key = data.draw(st.sampled_from(self._active()))
        s = self.subs[key]
        self.broker.close_consumer(s["consumer"])
        s["consumer"] = None
        if not s["name"]:  # a non-durable subscription ends with its consumer
            del self.subs[key]

    def _holding_several(self):
        return [key for key in self._active() if len(self._held(key)) > 1]

    @precondition(lambda self: self._holding_several())
    @rule(data=st.data(), chunk=st.integers(1, 2), calls=st.integers(0, 1))
    def close_and_die_between_chunks(self, data, chunk, calls):
        """The closing process returns (or releases) `chunk` messages per call and dies after `calls`
        further calls: the rest wait for the tick, or for the next call that drives them."""
        key = data.draw(st.sampled_from(self._holding_several()))
        s = self.subs[key]
        self.broker.ops.return_chunk = chunk
        try:
            op = self.broker.ops.close_consumer(s["consumer"], self.clock.now_ms(), "closed")
            request, left = next(op), calls
            while not (isinstance(request, Eval) and request.script == "return_owed" and left == 0):
                if isinstance(request, Eval) and request.script == "return_owed":
                    left -= 1
                request = op.send(self.broker._step(request))
            op.close()
        except StopIteration:
            pass
        finally:
            self.broker.ops.return_chunk = RETURN_CHUNK
        s["consumer"] = None
        if not s["name"]:
            del self.subs[key]

    @rule()
    def the_maintenance_tick_runs(self):
        maintenance.run_recovery(self.broker, TOPIC_URI)
        for key in self.subs:
            maintenance.run_recovery(self.broker, Home(Destination("topic", TOPIC), key))
        assert not self._ended()
        assert not any(self.client.hlen(self._key(f"s:{key}:closing")) for key in self.subs)

    @rule(ms=st.sampled_from([0, 300, 1000, 20_000]))
    def time_passes_and_offline_durables_time_out(self, ms):
        self.clock.advance(ms)
        active = [self.subs[key]["consumer"].consumer_id for key in self._active()]
        if active:
            self.broker.renew_leases(TOPIC_URI, active, 30_000)
        for key in self.broker.expire_offline_durables(TOPIC_URI, 15_000):
            assert self.subs[key]["name"] and self.subs[key]["consumer"] is None
            del self.subs[key]
        self.broker.expire_offline_durables(OTHER_TOPIC_URI, 15_000)
        self.elsewhere = {n for n in self.elsewhere if self.client.hget(
            f"{self.ns}:durables", durable_registry_field("inv", n)) is not None}
        self.broker.dispatch(TOPIC_URI)

    # -- invariants ---------------------------------------------------------------------------------

    def _ended(self):
        """What ended subscriptions held and is still to be released (lifecycle.lua remove_subscription)."""
        return [m.decode() for k in self.client.smembers(self._key("ended"))
                for m in self.client.zrange(k, 0, -1)]

    @invariant()
    def no_message_waits_in_a_subscription_whose_consumer_has_room(self):
        # A subscription holds only what its selector matched, for its one consumer: when an operation
        # returns, its dispatch has run to the end, so with room in that consumer's window nothing live waits
        # (unless an earlier consumer's messages are still being returned: the fence holds the rest back).
        for key, s in self.subs.items():
            if not s["consumer"] or self.client.hlen(self._key(f"s:{key}:inflight")) >= s["prefetch"]:
                continue
            if self.client.hexists(self._key(f"s:{key}:meta"), "fence"):
                continue
            waiting = {m.decode() for m in self.client.zrange(self._key(f"s:{key}:pending"), 0, -1)}
            live = {m for m in waiting if self._live(m)}
            assert not live, f"{sorted(live)} wait in {key} although its consumer has room"

    @invariant()
    def each_subscription_has_each_matching_message_exactly_once_or_counted(self):
        stats = {s.key: s for s in self.broker.subscriptions(TOPIC_URI)}
        assert set(stats) == set(self.subs), "the broker's subscriptions differ from the model's"
        for key, s in self.subs.items():
            prefix = f"s:{key}"
            pending = {m.decode() for m in self.client.zrange(self._key(f"{prefix}:pending"), 0, -1)}
            parked = {m.decode() for m in self.client.zrange(self._key(f"{prefix}:parked"), 0, -1)}
            inflight = {m.decode() for m in self.client.hkeys(self._key(f"{prefix}:inflight"))}
            evicted, expired = set(self._events(key, b"evict")), set(self._events(key, b"expire"))
            dropped = set(self._events(key, b"drop"))
            places = {"pending": pending, "parked": parked, "inflight": inflight, "acked": s["acked"],
                      "evicted": evicted, "expired": expired, "dropped": dropped}
            for message_id in s["expected"]:
                found = [name for name, ids in places.items() if message_id in ids]
                assert len(found) == 1, f"{message_id} of {key} is in {found or 'no place'}"
            held = pending | parked | inflight
            assert held <= s["expected"], f"{key} holds {held - s['expected']} it did not match"
            counted = stats[key]
            assert (counted.evicted, counted.expired, counted.dropped) == (len(evicted), len(expired),
                                                                           len(dropped))
            if not s["name"]:
                assert len(pending) <= LIMIT

    @invariant()
    def a_stored_message_is_counted_once_per_subscription_holding_it(self):
        # (a durable subscription's reference weighs DURABLE_REF, lifecycle.lua ref_weight; an ended one's
        # messages are renamed aside under <n>:d<i>, remove_subscription)
        holders: dict[str, int] = {}
        for key in self.subs:
            weight = DURABLE_REF if is_durable_key(key) else 1
            for m in self._held(key):
                holders[m] = holders.get(m, 0) + weight
        for k in self.client.smembers(self._key("ended")):
            weight = DURABLE_REF if re.search(rb":d\d+$", k) else 1
            for m in self.client.zrange(k, 0, -1):
                holders[m.decode()] = holders.get(m.decode(), 0) + weight
        stored = {m.decode() for m in self.client.hkeys(self._key("msgs"))}
        refs = {k.decode(): int(v) for k, v in self.client.hgetall(self._key("refs")).items()}
        assert stored == set(holders), f"stored {stored ^ set(holders)} differs from what is held"
        assert refs == holders

    @invariant()
    def the_priority_order_is_the_stable_sort_of_the_subscriptions_by_priority(self):
        # (includes/topic.lua :sprio: PriorityDispatchPolicy's order, kept whatever the policy)
        order = [k.decode() for k in self.client.lrange(self._key("sorder"), 0, -1)]
        defs = self.client.hgetall(self._key("subs"))
        priority = {k.decode(): msgpack.unpackb(v, raw=False).get("priority") or 0 for k, v in defs.items()}
        expected = sorted(order, key=lambda k: -priority[k])
        assert [k.decode() for k in self.client.lrange(self._key("sprio"), 0, -1)] == expected

    @invariant()
    def each_durable_key_is_registered_on_the_one_topic_it_lives_on(self):
        registry = {k.decode(): v.decode() for k, v in self.client.hgetall(f"{self.ns}:durables").items()}
        on_topic = {durable_registry_field("inv", s["name"]) for s in self.subs.values() if s["name"]}
        elsewhere = {durable_registry_field("inv", n) for n in self.elsewhere}
        assert on_topic.isdisjoint(elsewhere)
        assert registry == {**{f: TOPIC_URI for f in on_topic}, **{f: OTHER_TOPIC_URI for f in elsewhere}}
        other = {s.key for s in self.broker.subscriptions(OTHER_TOPIC_URI)}
        assert other == {durable_key("inv", n) for n in self.elsewhere}

    @invariant()
    def what_was_evicted_or_expired_is_in_the_dlq_once_and_nothing_else_is(self):
        given_up = set()
        for _, e in expand(self.client.xrange(self._key("events"))):
            # (an expiry that stands for a non-durable subscriber's EXPIRED ack is counted only, as ActiveMQ's
            # TopicSubscription.acknowledge does: its event says `acked`)
            if e[b"type"] in (b"evict", b"expire") and b"msg" in e and b"acked" not in e:
                given_up.add(e[b"msg"].decode())
        dlq = {m.decode() for m in self.client.hkeys(f"{self.ns}:{{q:ActiveMQ.DLQ}}:msgs")}
        assert dlq == given_up, f"DLQ differs: {dlq ^ given_up}"
        topic = self.broker.stats(TOPIC_URI)
        assert topic.evicted == sum(1 for _, e in expand(self.client.xrange(self._key("events")))
                                    if e[b"type"] == b"evict")


@pytest.mark.e2e
def test_topic_invariants_hold_under_random_operations(redis_url):
    TopicMachine.redis_url = redis_url
    TopicMachine.TestCase.settings = settings(
        max_examples=60, stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow])
    TopicMachine.TestCase().runTest()
