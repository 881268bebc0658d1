"""A topic with many subscriptions: the offline-durable cleanup (topic_admin expire_offline,
offlineDurableSubscriberTimeout) looks at a bounded number of subscriptions a script call and removes a
bounded number, the rest in the calls after it, so its longest call is the same whatever the topic's
size (5,000 subscriptions made one call of 240-920 ms); a send reads the definitions of a call's worth of
subscriptions and leaves the others to its fan-out's calls (docs/benchmarks.md, "Session 29")."""

from __future__ import annotations

import pytest

from broker_core import maintenance
from broker_core.destinations import parse_destination
from broker_core.event_stream import expand
from broker_core.messages import Message
from broker_core.model import ConsumerRef, ConsumerSpec
from broker_core.ops import topics
from broker_core.scripts.calls import TopicSend

from ..helpers.broker import drain
from .test_chunked_close import calls
from .test_retroactive_catchup import _commands

# counts what the server ran (INFO commandstats): on a server of its own (tests/conftest.py redis_url)
pytestmark = pytest.mark.private_redis

TIMEOUT = 5_000


def offline(broker, topic, names):
    # (a durable key names one subscription in the broker: one client id per topic)
    for name in names:
        spec = ConsumerSpec(client_id=topic, subscription_name=name)
        broker.close_consumer(broker.add_consumer(topic, spec))


def test_expire_offline_goes_in_bounded_calls_and_removes_exactly_the_expired(broker, clock, monkeypatch):
    """Durable subscriptions offline past the timeout go, every one, with their messages; those offline
    since later, the active one and the non-durable ones stay; the most commands a call runs and how many
    it removes are the same with 60 subscriptions as with 12."""
    monkeypatch.setattr(topics, "OFFLINE_LOOKS", 4, raising=False)
    monkeypatch.setattr(topics, "OFFLINE_REMOVALS", 2, raising=False)
    most = {}
    for size, topic in ((12, "topic://few"), (60, "topic://wide")):
        old = [f"old{i}" for i in range(size // 2)]
        offline(broker, topic, old)
        broker.send(topic, Message(body="held"))
        clock.advance(TIMEOUT + 1)
        broker.add_consumer(topic, ConsumerSpec(), consumer_id=f"live-{size}")
        broker.add_consumer(topic, ConsumerSpec(client_id=topic, subscription_name="active"))
        offline(broker, topic, [f"new{i}" for i in range(size // 2 - 2)])
        op = broker.ops.expire_offline_durables(parse_destination(topic), TIMEOUT, broker._now())
        per_call, before = [], _commands(broker.redis)
        for name, _ in calls(broker, op):
            if name == "topic_admin":
                per_call.append(_commands(broker.redis) - before)
            before = _commands(broker.redis)
        most[size] = max(per_call)
        left = {s.subscription_name for s in broker.subscriptions(topic) if s.subscription_name}
        assert left == {"active", *(f"new{i}" for i in range(size // 2 - 2))}
        assert broker.redis.hlen(f"{broker.namespace}:{{t:{topic[8:]}}}:msgs") == 0  # (released with them)
    assert most[60] == most[12]


WIDE = 2_010  # past fanout.MAX_VISITS (2,000): the definitions a send reads at most
TAKERS = (0, 1_000, 2_005)  # the subscriptions without a selector; every other one's never matches


@pytest.mark.parametrize("policy", ["simple", "roundRobin"])
def test_a_send_reads_a_calls_worth_of_definitions_and_leaves_the_rest_to_the_fan_out(broker, policy):
    """A send to a topic with more subscriptions than a call visits reads the first MAX_VISITS definitions
    (in the dispatch policy's order: roundRobin's turns wrap round :sorder) and queues the others for the
    fan-out's calls; every subscription that matches gets each message once, in send order, single sends
    and a batch alike."""
    broker.policies.set_entry("topic", ">", {"dispatchPolicy": policy})
    broker.refresh_policies()
    topic = "topic://wide"
    for i in range(WIDE):
        spec = ConsumerSpec(prefetch=10) if i in TAKERS else ConsumerSpec(selector="n = -1")
        broker.add_consumer(topic, spec, consumer_id=f"s{i}")
    deferred = []
    for n in range(3):  # (roundRobin: each send starts one further on)
        op = broker.ops.send(parse_destination(topic), [Message(f"m{n}", properties={"n": n})], broker._now())
        for name, reply in calls(broker, op):
            if name == "topic_send":
                deferred.append(bool(TopicSend.parse(reply).tail.flags & 4))
    assert deferred == [True] * 3
    # a batch: the first message cut past the definitions read, the next ones queued whole behind it
    broker.send(topic, [Message(f"m{n}", properties={"n": n}) for n in range(3, 6)])
    for i in TAKERS:
        got = drain(broker, ConsumerRef(parse_destination(topic), f"s{i}"))
        assert [d.body for d in got] == [f"m{n}" for n in range(6)], i
    assert not broker.redis.keys(f"{broker.namespace}:{{t:wide}}:fanout*")


def _dispatch_order(broker, topic, mid):
    raw = expand(broker.redis.xrange(f"{broker.namespace}:{{t:{topic[8:]}}}:events"))
    fields = [{k.decode(): v.decode() for k, v in f.items()} for _, f in raw]
    return [f["sub"] for f in fields if f["type"] == "dispatch" and f["msg"] == mid]


def _send_cut(broker, topic, n):
    """Send one message, driving its calls; returns (its id, the keys its fan-out was left with by the
    send's call, in the order they are to be matched)."""
    op = broker.ops.send(parse_destination(topic), [Message(f"m{n}", properties={"n": n})], broker._now())
    p = f"{broker.namespace}:{{t:{topic[8:]}}}"
    left = None
    for name, reply in calls(broker, op):
        if name == "topic_send":
            assert TopicSend.parse(reply).tail.flags & 4  # (cut: the rest goes to the fan-out's calls)
            mid = broker.redis.lindex(f"{p}:fanout", 0).decode()
            left = [k.decode() for k in broker.redis.lrange(f"{p}:fanout:{mid}", 0, -1)]
    [mid] = broker.redis.zrange(f"{p}:order", -1, -1)  # (the newest stored: takers hold it)
    return mid.decode(), left


def test_the_priority_policy_visits_by_priority_across_the_cut(broker):
    """Under dispatchPolicy=priority a send reads the first MAX_VISITS subscriptions in priority order and
    leaves the rest to the fan-out in that order: highest priority first, equal ones in the order they were
    made (PriorityDispatchPolicy's stable sort), with subscriptions removed, added after, and a durable one
    replaced (its selector changed) with another priority, which makes it the newest of its priority. The
    same on a topic whose subscriptions were made before the priority order was kept (its :sprio gone):
    the send leaves every subscription to the fan-out, which builds the order in slices and then visits
    them in it. The order is kept whatever the policy: this topic's subscriptions are made under the
    default one."""
    topic = "topic://prio"
    made = []  # (key, priority, takes the message), in the order made

    def add(i, priority, taker, durable=False, selector=None):
        selector = selector or (None if taker else "n = -1")
        if durable:
            spec = ConsumerSpec(client_id="app", subscription_name=f"d{i}", priority=priority,
                                selector=selector)
            ref = broker.add_consumer(topic, spec)
        else:
            spec = ConsumerSpec(priority=priority, selector=selector)
            ref = broker.add_consumer(topic, spec, consumer_id=f"s{i}")
        made.append((ref.subscription, priority, taker))
        return ref

    takers = {0, 1, 7, 1_000, 1_999, 2_000, 2_005}  # (priorities (i * 7) % 10: 0, 7, 9, 0, 3, 0, 5)
    refs = {}
    for i in range(WIDE):
        refs[i] = add(i, (i * 7) % 10, i in takers, durable=i in (3, 2_004))
    for i in (5, 1_500, 2_000):  # removed (non-durable: closing ends them)
        broker.close_consumer(refs[i])
        made = [e for e in made if e[0] != refs[i].subscription]
    for i in (3, 2_004):  # replaced, with a new priority, taking the message now
        broker.close_consumer(refs[i])
        made = [e for e in made if e[0] != refs[i].subscription]
        add(i, 9 if i == 3 else 0, True, durable=True, selector="n >= 0")
    add(WIDE, 9, True)
    add(WIDE + 1, 0, True)
    broker.policies.set_entry("topic", ">", {"dispatchPolicy": "priority"})
    broker.refresh_policies()
    order = [key for key, _, _ in sorted(made, key=lambda e: -e[1])]  # (stable, as ActiveMQ's)
    taking = {key for key, _, taker in made if taker}
    p = f"{broker.namespace}:{{t:prio}}"
    for n, old in enumerate((False, True, False)):  # (the third: after the second built it)
        if old:
            broker.redis.delete(f"{p}:sprio")
            broker.redis.rpush(f"{p}:sorder", "c.gone")  # (a key listed without its definition: dropped)
        mid, left = _send_cut(broker, topic, n)
        if old:
            assert left == ["sprio"]  # (the keys of the priority order, listed once it is built)
        else:
            assert left == order[len(order) - len(left):]
            assert len(left) >= len(order) - 2_000
        # (the fan-out finished by the send's op: each taker got the message, in the order visited)
        assert _dispatch_order(broker, topic, mid) == [key for key in order if key in taking]
        assert [k.decode() for k in broker.redis.lrange(f"{p}:sprio", 0, -1)] == order
        assert broker.redis.llen(f"{p}:sorder") == len(order)


def test_a_priority_send_reads_as_much_with_a_thousand_subscriptions_more(broker):
    """The send's call under dispatchPolicy=priority runs the same commands with 2,010 subscriptions as with
    3,010: it reads MAX_VISITS definitions (an HMGET a thousand), not every one, and the rest of the keys go
    to the fan-out by the server's copy of the priority order."""
    broker.policies.set_entry("topic", ">", {"dispatchPolicy": "priority"})
    broker.refresh_policies()
    per_call = {}
    for size in (WIDE, WIDE + 1_000):
        topic = f"topic://prio{size}"
        for i in range(size):
            broker.add_consumer(topic, ConsumerSpec(priority=i % 10, selector="n = -1"), consumer_id=f"s{i}")
        broker.send(topic, Message("warm", properties={"n": 0}))  # (its :sprio complete: no build)
        op = broker.ops.send(parse_destination(topic), [Message("x", properties={"n": 0})], broker._now())
        before = _commands(broker.redis)
        for name, _ in calls(broker, op):
            if name == "topic_send":
                per_call[size] = _commands(broker.redis) - before
                break
        op.close()
    assert per_call[WIDE] == per_call[WIDE + 1_000]


def _old_priority_topic(broker, topic, size, takers=()):
    """`size` subscriptions of priorities (i * 7) % 10 (those in `takers` take every message, the others
    none), made before the priority order was kept (its :sprio deleted), under the priority policy;
    returns their refs."""
    broker.policies.set_entry("topic", ">", {"dispatchPolicy": "priority"})
    broker.refresh_policies()
    refs = {}
    for i in range(size):
        selector = None if i in takers else "n = -1"
        if i % 10 == 3:
            spec = ConsumerSpec(client_id=topic, subscription_name=f"d{i}", priority=(i * 7) % 10,
                                selector=selector)
            refs[i] = broker.add_consumer(topic, spec)
        else:
            spec = ConsumerSpec(priority=(i * 7) % 10, selector=selector)
            refs[i] = broker.add_consumer(topic, spec, consumer_id=f"s{i}")
    broker.send(topic, Message("warm", message_id=f"warm-{topic}", properties={"n": -1}))
    broker.redis.delete(f"{broker.namespace}:{{t:{topic[8:]}}}:sprio")
    return refs


def test_building_the_priority_order_of_old_subscriptions_reads_as_much_with_a_thousand_more(broker):
    """The send to a topic whose subscriptions were made before the priority order was kept runs the same
    commands with 2,010 subscriptions as with 3,010 (the order is built a slice a call: reading every
    definition in the send's call took 37 ms at 10,000), and the build goes on in the fan-out's calls."""
    per_call, builds = {}, {}
    for size in (WIDE, WIDE + 1_000):
        topic = f"topic://old{size}"
        _old_priority_topic(broker, topic, size)
        op = broker.ops.send(parse_destination(topic), [Message("x", properties={"n": 0})], broker._now())
        before, names = _commands(broker.redis), []
        for name, _ in calls(broker, op):
            if name == "topic_send":
                per_call[size] = _commands(broker.redis) - before
            names.append(name)
            before = _commands(broker.redis)
        builds[size] = names.count("topic_fanout")
        p = f"{broker.namespace}:{{t:old{size}}}"
        assert broker.redis.llen(f"{p}:sprio") == size
    assert per_call[WIDE] == per_call[WIDE + 1_000]
    assert builds[WIDE] >= 2 and builds[WIDE + 1_000] > builds[WIDE]


@pytest.mark.parametrize("when", ["walking", "moving", "starting over"])
def test_a_priority_order_built_across_calls_delivers_in_it_while_subscriptions_change(broker, when):
    """While the order of old subscriptions is built (its first slice by the send, the others by the
    fan-out's calls), subscriptions are made, removed, and a durable one comes back with another priority
    (keeping its place among its equals): the message sent goes, once the order is complete, to the
    subscriptions of its send that take it, highest priority first, equal ones in the order they were
    made; the order kept is that of every subscription there is, and the next send goes by it too.
    `when`: the changes come while the definitions are walked (after the send's call), while the keys
    are moved to the order, or then with durable subscriptions back with another priority (the build
    starts over)."""
    topic = "topic://prio"
    size = WIDE + 2
    takers = {0, 3, 7, 13, 1_000, 1_999, 2_003, 2_005, WIDE}
    refs = _old_priority_topic(broker, topic, size, takers)
    made = [[refs[i].subscription, (i * 7) % 10, i in takers] for i in range(size)]  # (in the order made)
    p = f"{broker.namespace}:{{t:prio}}"

    def back(i, priority):  # (a durable subscription back, its selector the same)
        selector = None if i in takers else "n = -1"
        broker.close_consumer(refs[i])
        broker.add_consumer(topic, ConsumerSpec(client_id=topic, subscription_name=f"d{i}", priority=priority,
                                                selector=selector))
        next(e for e in made if e[0] == refs[i].subscription)[1] = priority

    def remove(i):
        broker.close_consumer(refs[i])
        made[:] = [e for e in made if e[0] != refs[i].subscription]

    late = []

    def add(name, priority):
        ref = broker.add_consumer(topic, ConsumerSpec(priority=priority), consumer_id=name)
        made.append([ref.subscription, priority, True])
        late.append(ref.subscription)

    def change():
        remove(7)
        remove(2_005)
        add("late9", 9)  # (moving: among the keys moved already)
        add("late0", 0)  # (moving: among those not moved yet)
        if when != "moving":
            back(13, 9)  # (priority 1 before; walking: walked already)
            back(2_003, 0)  # (1 before; walking: past the first slice)

    op = broker.ops.send(parse_destination(topic), [Message("m0", message_id="m0", properties={"n": 0})],
                         broker._now())
    fanouts, changed = 0, False
    for name, reply in calls(broker, op):
        if name == "topic_send":
            assert TopicSend.parse(reply).tail.flags & 4  # (left to the fan-out while the order is built)
        fanouts += name == "topic_fanout"
        walking = broker.redis.hexists(f"{p}:meta", "sprio_walk")
        moving = broker.redis.hexists(f"{p}:meta", "sprio_moved") and broker.redis.exists(f"{p}:sprio:build")
        if not changed and (walking if when == "walking" else moving):
            changed = True
            change()
            if when == "moving":  # (late9 put among the keys moved, late0 among those to move)
                assert late[0].encode() in broker.redis.lrange(f"{p}:sprio", 0, -1)
                assert broker.redis.zscore(f"{p}:sprio:build", late[1]) is not None
    assert changed and fanouts >= 3
    order = [key for key, _, _ in sorted(made, key=lambda e: -e[1])]  # (stable, as ActiveMQ's)
    assert [k.decode() for k in broker.redis.lrange(f"{p}:sprio", 0, -1)] == order
    mid = "m0"
    sent_to = [k for k in order if k not in late and any(e[0] == k and e[2] for e in made)]
    assert _dispatch_order(broker, topic, mid) == sent_to
    mid, _ = _send_cut(broker, topic, 1)
    assert _dispatch_order(broker, topic, mid) == [k for k in order if any(e[0] == k and e[2] for e in made)]
    assert not broker.redis.keys(f"{p}:fanout*") and not broker.redis.exists(f"{p}:sprio:build")


def test_the_pending_limits_are_read_a_page_a_call_and_turn_no_round_robin(broker, monkeypatch):
    """The subscriptions' pending-message limits (the listing, the topic's stats) are read LIMITS_PAGE
    subscriptions a call (each one's consumer loaded: 10,000 were one call of 275 ms), every one's right,
    and reading them is no send: the roundRobin policy's start does not turn."""
    monkeypatch.setattr(topics, "LIMITS_PAGE", 2)
    broker.policies.set_entry("topic", ">", {"dispatchPolicy": "roundRobin", "pendingMessageLimitStrategy":
                                             "constant", "pendingMessageLimit": 5})
    broker.refresh_policies()
    topic = "topic://limits"
    for i in range(4):
        broker.add_consumer(topic, ConsumerSpec(maximum_pending_message_limit=3 if i == 1 else 0),
                            consumer_id=f"s{i}")
    broker.add_consumer(topic, ConsumerSpec(client_id="app", subscription_name="d"), consumer_id="d")
    broker.send(topic, Message("x"))
    rr = broker.redis.hget(f"{broker.namespace}:{{t:limits}}:meta", "rr")
    op = topics.pending_limits(broker.ops, parse_destination(topic), broker._now())
    pages = [name for name, _ in calls(broker, op) if name == "topic_admin"]
    assert len(pages) == 3
    got = {s.consumer_id: s.pending_message_limit for s in broker.subscriptions(topic)}
    assert got == {"s0": 5, "s1": 3, "s2": 5, "s3": 5, "d": -1}  # (a durable subscription has none)
    assert broker.redis.hget(f"{broker.namespace}:{{t:limits}}:meta", "rr") == rr


BATCH = 10


def _wide(broker, policy, takers=TAKERS, topic="topic://wide"):
    broker.policies.set_entry("topic", ">", {"dispatchPolicy": policy})
    broker.refresh_policies()
    for i in range(WIDE):
        spec = ConsumerSpec(prefetch=2 * BATCH) if i in takers else ConsumerSpec(selector="n = -1")
        broker.add_consumer(topic, spec, consumer_id=f"s{i}")


def _fanout_lists(broker):
    """The lengths of the topic's fan-out lists (:fanout:<id>), by the id naming each."""
    p = f"{broker.namespace}:{{t:wide}}"
    ids = [i.decode() for i in broker.redis.lrange(f"{p}:fanout", 0, -1)]
    return {i: broker.redis.llen(f"{p}:fanout:{i}") for i in ids if broker.redis.exists(f"{p}:fanout:{i}")}


def _send_and_die(broker, topic, msgs):
    """Send `msgs` in one call and stop there, as a sender dying before it drives its fan-out; returns the
    fan-out lists the send left."""
    driving = calls(broker, broker.ops.send(parse_destination(topic), msgs, broker._now()))
    for name, reply in driving:
        if name == "topic_send":
            assert TopicSend.parse(reply).tail.flags & 4
            break
    driving.close()
    return _fanout_lists(broker)


@pytest.mark.parametrize("functions", [True, False], ids=["functions", "eval"])
@pytest.mark.parametrize("policy", ["simple", "strictOrder", "roundRobin"])
def test_a_batch_past_the_cut_lists_the_subscriptions_once_and_reaches_each_in_order(broker, policy,
                                                                                     functions):
    """A batch to a topic with more subscriptions than a send reads: the send's call lists the
    subscriptions' keys once, in one list its messages share (each from its own index), not one list per
    message (100 messages to 10,000 subscriptions made one call of 36 ms of copies); so does a second
    batch queued whole behind the first. Every subscription that takes them gets every message once, in
    send order, and nothing is left behind. In both script forms (the library keeps a send's list between
    its functions' calls: it must not reach the next send)."""
    broker.driver.functions = functions
    topic = "topic://wide"
    _wide(broker, policy)
    batches = [[Message(f"m{n}", message_id=f"m{n}", properties={"n": n}) for n in range(b, b + BATCH)]
               for b in (0, BATCH)]
    assert _send_and_die(broker, topic, batches[0]) == {f"m{BATCH - 1}": WIDE}  # (the last finishes last)
    assert _send_and_die(broker, topic, batches[1]) == {f"m{BATCH - 1}": WIDE, f"m{2 * BATCH - 1}": WIDE}
    assert maintenance.run_recovery(broker, topic).ran
    for i in TAKERS:
        got = drain(broker, ConsumerRef(parse_destination(topic), f"s{i}"))
        assert [d.body for d in got] == [f"m{n}" for n in range(2 * BATCH)], i
    assert not broker.redis.keys(f"{broker.namespace}:{{t:wide}}:fanout*")
    p = f"{broker.namespace}:{{t:wide}}"
    enqueues = [e for _, e in expand(broker.redis.xrange(f"{p}:events")) if e[b"type"] == b"enqueue"]
    assert [(e[b"msg"], int(e[b"subscriptions"])) for e in enqueues] == [
        (f"m{n}".encode(), len(TAKERS)) for n in range(2 * BATCH)]


@pytest.mark.parametrize("policy", ["simple", "roundRobin"])
def test_a_batch_whose_first_message_is_cut_part_way_shares_the_list_from_its_cut(broker, policy):
    """The first message of a batch cut after 32 subscriptions took it (fanout.MAX_TAKERS), before the
    definitions the send read end: the list it starts lists the keys from its cut on, and the next message
    pushes those before it in front (roundRobin: the first subscription of :sorder comes last, its turn
    wrapped round); each reaches every subscription once, in order."""
    topic = "topic://wide"
    takers = (*range(40), 2_005)
    _wide(broker, policy, takers)
    batch = [Message(f"m{n}", message_id=f"m{n}", properties={"n": n}) for n in range(3)]
    assert _send_and_die(broker, topic, batch) == {"m2": WIDE}
    p = f"{broker.namespace}:{{t:wide}}"
    assert broker.redis.hget(f"{p}:fanout:at", "m0") == b"32|m2"  # (its first 32 takers have it already)
    assert maintenance.run_recovery(broker, topic).ran
    for i in takers:
        got = drain(broker, ConsumerRef(parse_destination(topic), f"s{i}"))
        assert [d.body for d in got] == ["m0", "m1", "m2"], i
    assert not broker.redis.keys(f"{p}:fanout*")


def test_a_batchs_fan_out_goes_to_the_subscriptions_of_its_send(broker):
    """Each message of a batch goes to the subscriptions there were at its send: one made while the
    fan-out goes on gets none of them (only what is sent after it), one removed meanwhile is skipped; the
    counts say who took each message."""
    topic = "topic://wide"
    _wide(broker, "simple")
    batch = [Message(f"m{n}", message_id=f"m{n}", properties={"n": n}) for n in range(BATCH)]
    _send_and_die(broker, topic, batch)
    late = broker.add_consumer(topic, ConsumerSpec(prefetch=2 * BATCH), consumer_id="late")
    gone = ConsumerRef(parse_destination(topic), "s2005")  # (past the definitions the send read)
    broker.close_consumer(gone)
    assert maintenance.run_recovery(broker, topic).ran
    assert not broker.redis.keys(f"{broker.namespace}:{{t:wide}}:fanout*")
    for i in (0, 1_000):
        got = drain(broker, ConsumerRef(parse_destination(topic), f"s{i}"))
        assert [d.body for d in got] == [f"m{n}" for n in range(BATCH)], i
    assert drain(broker, late) == []
    p = f"{broker.namespace}:{{t:wide}}"
    enqueues = [e for _, e in expand(broker.redis.xrange(f"{p}:events")) if e[b"type"] == b"enqueue"]
    assert [int(e[b"subscriptions"]) for e in enqueues] == [2] * BATCH
    # held by the two that took them, not by the fan-out (its reference let go) nor the one removed
    assert {k: int(v) for k, v in broker.redis.hgetall(f"{p}:refs").items()} == {
        f"m{n}".encode(): 2 for n in range(BATCH)}
    broker.send(topic, Message("after", message_id="after"))
    assert [d.body for d in drain(broker, late)] == ["after"]


def test_deleting_a_topic_mid_way_through_a_batchs_fan_out_leaves_nothing(broker):
    topic = "topic://wide"
    _wide(broker, "simple")
    _send_and_die(broker, topic, [Message(f"m{n}", message_id=f"m{n}", properties={"n": n})
                                  for n in range(BATCH)])
    fanning = calls(broker, broker.ops.fan_out(parse_destination(topic), broker._now()))
    for name, _ in fanning:
        if name == "topic_fanout":
            break
    fanning.close()  # (its driver died too: m0 done, m1 part way through the list the others share)
    p = f"{broker.namespace}:{{t:wide}}"
    assert broker.redis.llen(f"{p}:fanout") == BATCH - 1 and broker.redis.hexists(f"{p}:fanout:at", "m1")
    broker.delete_destination(topic)
    assert not broker.redis.keys(f"{p}:fanout*")
