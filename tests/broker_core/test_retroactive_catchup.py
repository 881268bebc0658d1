"""A new retroactive durable subscription's catch-up on the messages stored for the other durable
subscriptions (§7.5; scripts/lua/includes/topic.lua catch_up): bounded script calls, `backlog_checks`
stored messages each whatever the number of subscriptions, the subscriber's add_consumer driving them to
the end, the maintenance tick finishing what a dead process left. The budget is made small through the
broker's own parameter (`broker.ops.backlog_checks`), so 30 messages take several calls."""

from __future__ import annotations

import pytest

from broker_core import maintenance
from broker_core.destinations import parse_destination
from broker_core.messages import Message
from broker_core.model import ConsumerRef, ConsumerSpec

from ..helpers.broker import drain
from .test_chunked_close import calls

# counts what the server ran (INFO commandstats): on a server of its own (tests/conftest.py redis_url)
pytestmark = pytest.mark.private_redis

BACKLOG = 30
CHECKS = 10


def durable(broker, topic, name, **kw):
    # (a durable key names one subscription in the broker: one client id per topic)
    return broker.add_consumer(topic, ConsumerSpec(client_id=topic, subscription_name=name,
                                                   ack_mode="client-individual", **kw))


def backlog(broker, topic, retained=True):
    """Two offline durable subscriptions holding parts of BACKLOG messages (one every even one, the other
    the first ten); a live non-durable one holding the rest only (not in the backlog); the recovery buffer
    keeping the last 5, and a retained message."""
    broker.policies.set_entry("topic", ">", {"subscriptionRecoveryPolicy": "fixedCount",
                                             "subscriptionRecoveryMaximumSize": 5})
    broker.refresh_policies()
    for name, selector in (("even", "n % 2 = 0"), ("low", "n < 10")):
        broker.close_consumer(durable(broker, topic, name, selector=selector))
    broker.add_consumer(topic, ConsumerSpec(), consumer_id="live")
    broker.send(topic, [Message(body=f"m{i}", properties={"n": i}) for i in range(BACKLOG)])
    if retained:
        broker.send(topic, Message(body="r", properties={"n": 101, "ActiveMQ.Retain": True}))


def bodies(broker, consumer):
    return [d.body for d in drain(broker, consumer)]


@pytest.mark.parametrize("selector", [None, "n > 3 AND n <> 12", "n = 29 OR n = 101"])
def test_a_backlog_over_one_calls_budget_is_replayed_as_in_one_call(broker, selector):
    """The same messages in the same order whatever the budget; the recovery buffer only when the backlog
    gave nothing (the last selector: m29 is held by no other durable, n = 101 is the retained one)."""
    got = {}
    for checks, topic in ((1_000_000, "topic://whole"), (CHECKS, "topic://sliced")):
        broker.ops.backlog_checks = checks
        backlog(broker, topic)
        chosen = {"selector": selector} if selector else {}
        late = durable(broker, topic, "late", retroactive=True, **chosen)
        got[checks] = bodies(broker, late)
    want = [f"m{i}" for i in range(BACKLOG) if (i % 2 == 0 or i < 10)]
    if selector == "n > 3 AND n <> 12":
        want = [b for b in want if int(b[1:]) > 3 and b != "m12"]
    if selector == "n = 29 OR n = 101":
        want = ["m29"]  # nothing from the backlog: the buffer (its last 5 sent: m26..m29, r), through it
    assert got[CHECKS] == got[1_000_000] == [*want, "r"]


def test_the_subscribe_call_checks_at_most_its_budget_and_the_rest_follows_in_calls(broker):
    broker.ops.backlog_checks = CHECKS
    topic = "topic://sliced"
    backlog(broker, topic)
    op = broker.ops.add_consumer(parse_destination(topic), ConsumerSpec(
        client_id=topic, subscription_name="late", retroactive=True, ack_mode="client-individual"),
        broker._now(), "late")
    scripts = [name for name, _ in calls(broker, op) if name in ("topic_subscribe", "topic_catchup")]
    # 10 stored messages a call, however many durables; 31 stored (the retained one too), so 4 calls
    assert scripts == ["topic_subscribe"] + ["topic_catchup"] * 3


def test_a_subscriber_dying_midway_is_finished_by_the_tick_and_later_sends_come_after(broker, clock):
    broker.ops.backlog_checks = CHECKS
    topic = "topic://sliced"
    backlog(broker, topic, retained=False)
    op = broker.ops.add_consumer(parse_destination(topic), ConsumerSpec(
        client_id=topic, subscription_name="late", retroactive=True, ack_mode="client-individual"),
        broker._now(), "late")
    driving = calls(broker, op)
    for name, _ in driving:
        if name == "topic_subscribe":
            break  # the first call made: the process dies here
    driving.close()
    late = broker.subscriptions(topic)[-1]
    assert late.subscription_name == "late" and late.pending == 10  # m0..m9: the first 10 stored
    consumer = ConsumerRef(parse_destination(topic), "late")
    assert broker.receive(consumer, 100) == []  # nothing dispatched before the whole backlog is in
    broker.send(topic, Message(body="after", properties={"n": 1000}))
    assert broker.receive(consumer, 100) == []
    clock.advance(3_000)
    maintenance.run_due(broker)
    assert broker.redis.hget(f"{broker.namespace}:{{t:sliced}}:s:{late.key}:meta", "catchup") is None
    want = [f"m{i}" for i in range(BACKLOG) if (i % 2 == 0 or i < 10)]
    assert bodies(broker, consumer) == [*want, "after"]  # each once, the backlog first


def test_a_returning_consumer_finishes_an_unfinished_catch_up_first(broker, clock):
    broker.ops.backlog_checks = CHECKS
    topic = "topic://sliced"
    backlog(broker, topic, retained=False)
    op = broker.ops.add_consumer(parse_destination(topic), ConsumerSpec(
        client_id=topic, subscription_name="late", retroactive=True, ack_mode="client-individual",
        lease_ms=1_000), broker._now(), "late")
    driving = calls(broker, op)
    for name, _ in driving:
        if name == "topic_subscribe":
            break
    driving.close()
    clock.advance(1_500)
    assert broker.reap_lapsed(topic) == ["late"]  # its lease lapsed: offline, the catch-up unfinished
    back = durable(broker, topic, "late")
    want = [f"m{i}" for i in range(BACKLOG) if (i % 2 == 0 or i < 10)]
    assert bodies(broker, back) == want


# -- among many durable subscriptions ---------------------------------------------------------------------

CROWD = 300


def _commands(client) -> int:
    """The commands the server has run, those scripts ran among them (INFO commandstats), but the scripts'
    calls themselves and INFO."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items()
               if k not in ("cmdstat_info", "cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall"))


def crowd(broker, topic, others):
    """BACKLOG messages a live non-durable subscription holds, the first durable one every even one; then
    `others` durable subscriptions, offline, made after them (they hold none: an odd message is held by no
    durable subscription at all)."""
    broker.add_consumer(topic, ConsumerSpec(), consumer_id=f"live-{topic[8:]}")
    broker.close_consumer(durable(broker, topic, "holder", selector="n % 2 = 0"))
    broker.send(topic, [Message(body=f"m{i}", properties={"n": i}) for i in range(BACKLOG)])
    for n in range(others):
        broker.close_consumer(durable(broker, topic, f"d{n}"))


def test_a_catch_up_call_does_the_same_work_among_hundreds_of_durable_subscriptions(broker):
    """Each call's work is bounded by its checks alone: the most commands one subscribe or catch-up call
    runs is the same with 300 other durable subscriptions as with one (it was 4 a stored message for
    each of them, and every subscription's definition read), and so is the number of calls."""
    broker.ops.backlog_checks = CHECKS
    most, count, got = {}, {}, {}
    for others, topic in ((1, "topic://few"), (CROWD, "topic://crowd")):
        crowd(broker, topic, others)
        op = broker.ops.add_consumer(parse_destination(topic), ConsumerSpec(
            client_id=topic, subscription_name="late", retroactive=True, ack_mode="client-individual"),
            broker._now(), "late")
        per_call, before = [], _commands(broker.redis)
        for name, _ in calls(broker, op):
            after = _commands(broker.redis)
            if name in ("topic_subscribe", "topic_catchup"):
                per_call.append(after - before)
            before = _commands(broker.redis)
        most[others], count[others] = max(per_call), len(per_call)
        got[others] = bodies(broker, ConsumerRef(parse_destination(topic), "late"))
    assert most[CROWD] == most[1] and count[CROWD] == count[1] == 4  # (30 stored, 10 a call, then the end)
    assert got[CROWD] == got[1] == [f"m{i}" for i in range(0, BACKLOG, 2)]


def test_many_durables_each_holding_some_of_the_backlog_give_it_in_topic_order(broker):
    """40 durable subscriptions each holding the messages of its own residue (one acknowledged its own,
    another unsubscribed with its messages still to be released): the same messages, in topic order,
    whatever the budget, as a backlog held by one."""
    parts = 40
    got = {}
    for checks, topic in ((1_000_000, "topic://whole"), (3, "topic://sliced")):
        broker.ops.backlog_checks = checks
        subs = [durable(broker, topic, f"p{i}", selector=f"n % {parts} = {i}") for i in range(parts)]
        for sub in subs[2:]:
            broker.close_consumer(sub)
        broker.send(topic, [Message(body=f"m{i}", properties={"n": i}) for i in range(3 * parts)])
        for delivery in drain(broker, subs[0]):  # p0 has its own: nobody holds them any more
            broker.ack(subs[0], delivery.message_id)
        broker.close_consumer(subs[0])
        broker.close_consumer(subs[1])
        # p1 unsubscribed: its messages are released in the calls after it (here: none made)
        leaving = calls(broker, broker.ops.unsubscribe(parse_destination(topic), topic, "p1", broker._now()))
        for name, _ in leaving:
            if name == "topic_admin":
                break
        leaving.close()
        assert broker.redis.scard(f"{broker.namespace}:{{t:{topic[8:]}}}:ended") > 0
        late = durable(broker, topic, "late", retroactive=True, prefetch=500)
        got[checks] = bodies(broker, late)
    want = [f"m{i}" for i in range(3 * parts) if i % parts > 1]
    assert got[3] == got[1_000_000] == want
