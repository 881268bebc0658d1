"""A topic with many subscriptions: the offline-durable cleanup (topic_admin expire_offline,
offlineDurableSubscriberTimeout) looks at a bounded number of subscriptions a script call and removes a
bounded number, the rest in the calls after it, so its longest call is the same whatever the topic's
size (5,000 subscriptions made one call of 240-920 ms); a send reads the definitions of a call's worth of
subscriptions and leaves the others to its fan-out's calls (docs/benchmarks.md, "Session 29")."""

from __future__ import annotations

import pytest

from broker_core.destinations import parse_destination
from broker_core.messages import Message
from broker_core.model import ConsumerRef, ConsumerSpec
from broker_core.ops import topics
from broker_core.scripts.calls import TopicSend

from ..helpers.broker import drain
from .test_chunked_close import calls
from .test_retroactive_catchup import _commands

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
