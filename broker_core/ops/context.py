"""What every operation module needs: the key namespace and its key names, running a script on a home, and
finishing what a script started, with no knowledge of the modules above.

Two things a script call may lead to belong to modules above this one, so they are yielded as effects for
the router (ops/router.py) to run inline: a destination used for the first time is created (`Create`, on
the script's NO_DESTINATION), and a destination whose outbox (its forwarding hash) has records gets them
delivered (`Forward`, on the script's FORWARDS_WAITING flag). Everything else goes to the driver.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .. import keys
from ..config.entry import PolicyEntry
from ..config.virtual import VirtualConfig
from ..destinations import Destination
from ..effects import Command, Create, Eval, Forward, NoDestination, Op, Policy
from ..errors import UnknownConsumer, UnknownDestination
from ..keys import Home
from ..model import MAX_CONSUMERS, ConsumerRef, DispatchResult, TransactionLimits
from ..resp import reply_text as _str
from ..scripts import calls
from ..scripts.calls import FORWARDS_WAITING, PASS_HAS_MORE

MAX_DISPATCH_CHUNKS = 1_000  # per operation; each chunk is its own bounded script call
# In-flight messages a closed (or reaped, aborted) consumer returns per script call, and messages an ended
# topic subscription held released per call; the rest follow in further calls (return_owed). A message
# costs about 10 µs of Redis CPU: 200 keep a call at 2-6 ms, well under the 20 ms bound
# (docs/benchmarks.md, "Closing and reaping").
RETURN_CHUNK = 200
# A new retroactive durable subscription's catch-up on the messages stored for the other durable
# subscriptions (scripts/lua/includes/topic.lua catch_up): stored messages examined per script call (one
# read each tells whether a durable subscription holds it, however many the topic has), the rest in
# further calls (topics.catch_up). A message an offline subscription holds, replayed, costs about 13 µs of
# Redis CPU: 200 keep a call at 2.5-4.5 ms (docs/benchmarks.md, "Session 28" and "Session 29").
BACKLOG_CHECKS = 200


class VirtualCache:
    """A process's copy of the virtual destination configuration, re-read when its version moves (checked
    every second by virtual.current), and the routing plans worked out from it alone (virtual.plan)."""

    def __init__(self) -> None:
        self.config = VirtualConfig()
        self.version: int | None = None
        self.checked = float("-inf")
        self.plans: dict[tuple[str, tuple[Destination, ...]], bytes | None] = {}

    def set(self, config: VirtualConfig, version: int | None) -> None:
        self.config, self.version, self.checked = config, version, time.monotonic()
        self.plans = {}


class Context:
    """One key namespace and this process's per-namespace state, passed to every operation."""

    def __init__(self, namespace: str = "sb", return_chunk: int = RETURN_CHUNK,
                 transaction_limits: TransactionLimits | None = None,
                 backlog_checks: int = BACKLOG_CHECKS, max_consumers: int | None = None) -> None:
        self.namespace = namespace
        self.return_chunk = return_chunk  # messages returned (or released) per call
        self.backlog_checks = max(1, backlog_checks)  # a retroactive catch-up's messages a call (1 at least)
        self.transaction_limits = transaction_limits or TransactionLimits()
        # the consumers one queue may have (model.MAX_CONSUMERS, SIGNALBOX_MAX_CONSUMERS; 0: no limit)
        self.max_consumers = MAX_CONSUMERS if max_consumers is None else max(0, int(max_consumers))
        self.registry_key = keys.registry_key(namespace)
        self.deletions_key = keys.deletions_key(namespace)  # deletions under way (admin.begin_deletion)
        self.virtual = VirtualCache()  # this process's copy of the routing configuration
        # Deliveries pushed to consumers of this process (outbox.lua push_*): the wake-up channel its
        # consumers give as `notify`; a send names it, and the pushes to it come back in the send's reply
        # and go to `local_push` instead of through Redis pub/sub (gateway/runtime.py sets both).
        self.local_channel: str | None = None
        self.local_push: Callable[[bytes], None] | None = None

    def prefix(self, dest: Destination) -> str:
        return keys.prefix(self.namespace, dest)

    def home_prefix(self, home: Home) -> str:
        return keys.home_prefix(self.namespace, home)

    def events_key(self, dest: Destination) -> str:
        """The lifecycle event stream every script appends to (read by the console's live view)."""
        return f"{self.prefix(dest)}:events"

    def eval(self, home: Home, now: int, call: Eval) -> Op:
        """Run a script call (scripts/calls.py, made for `home`'s prefix); on first use of its destination
        create it (`Create`) and run it again."""
        for _ in range(2):
            try:
                return (yield call)
            except NoDestination:
                yield Create(home.destination, now)
        raise UnknownDestination(f"destination {home.uri} could not be created")

    def ensure(self, dest: Destination, now: int) -> Op:
        """Create `dest` unless it exists (its policy hash is what a script needs)."""
        if not (yield Command(("EXISTS", f"{self.prefix(dest)}:policy"))):
            yield Create(dest, now)

    def write_policy(self, dest: Destination) -> Op:
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

    def continue_dispatch(self, home: Home, now: int, flags: int, hold: int) -> Op:
        """Finish what a script started: have its forwards delivered (flag 2; they wait on the destination,
        a subscription's on its topic) and keep running chunks while the pass has more to examine (flag 1);
        each call is bounded."""
        dispatched = 0
        chunks = 0
        while flags and chunks < MAX_DISPATCH_CHUNKS:
            if flags & FORWARDS_WAITING:
                yield Forward(home.destination, now)
            if not flags & PASS_HAS_MORE:
                break
            call = calls.Dispatch.call(self.home_prefix(home), now)
            tail = calls.Dispatch.parse((yield from self.eval(home, now, call)))
            dispatched += tail.dispatched
            flags, hold = tail.flags, tail.hold_until
            chunks += 1
        return DispatchResult(dispatched, hold)

    def subscription_home(self, topic: Destination, consumer_id: str, known: str | None) -> Op:
        """The home of a topic consumer: its subscription (`known`: its key when the caller has it)."""
        if known is None:
            raw = yield Command(("HGET", f"{self.prefix(topic)}:subof", consumer_id))
            if raw is None:
                raise UnknownConsumer(f"no consumer {consumer_id} on {topic.uri}", consumer_id=consumer_id)
            known = _str(raw)
        return Home(topic, known)

    def home(self, consumer: ConsumerRef) -> Op:
        """Where a consumer's messages are: its queue, or its topic subscription (resolved once per call)."""
        dest = consumer.destination
        if not dest.is_topic:
            return Home(dest)
        return (yield from self.subscription_home(dest, consumer.consumer_id,
                                                  getattr(consumer, "subscription", None)))
