"""A topic send's fan-out in slices (issue 21; includes/fanout.lua): a send matches its subscriptions'
selectors until a call's worth of selector work (max_call_evaluation_bytes), and the rest of its
subscriptions, and every message sent after it, are matched by the calls that follow — the sender's, or
the maintenance tick's when the sender died. Nothing is lost, every counter is exact, and no later message
reaches a subscription before an earlier one. Each test runs in both script forms."""

from __future__ import annotations

import pytest

from broker_core import maintenance
from broker_core.destinations import parse_destination
from broker_core.event_stream import expand
from broker_core.messages import Message
from broker_core.scripts.calls import TopicSend

from ..helpers.broker import consumer, drain
from .test_chunked_close import calls

TOPIC = "topic://prices"
BIG = 100_000  # each matching evaluation of s LIKE '%Z' runs through about this many bytes
MATCHING = 12  # with a call's worth of 256 KiB, about three evaluations per call


@pytest.fixture(params=[True, False], ids=["functions", "eval"])
def form(request, broker):
    broker.driver.functions = request.param
    return broker


def _subscribers(broker):
    """MATCHING subscriptions that take a message whose s ends in Z (after ~100 kB of matching each), one
    whose selector never matches, and one without a selector."""
    takers = [consumer(broker, TOPIC, prefetch=100, selector="s LIKE '%Z'", consumer_id=f"t{i}")
              for i in range(MATCHING)]
    never = consumer(broker, TOPIC, prefetch=100, selector="s LIKE '%Q'", consumer_id="never")
    plain = consumer(broker, TOPIC, prefetch=100, consumer_id="plain")
    return takers, never, plain


def _big(i: int) -> Message:
    return Message(body=str(i), message_id=f"m{i}", properties={"s": "a" * BIG + "Z"})


def _keys(r, broker):
    return sorted(k.decode() for k in r.scan_iter(match=f"{broker.namespace}:{{t:prices}}:fanout*"))


def test_a_send_over_a_calls_selector_work_fans_out_in_slices(form, redis_client):
    broker = form
    takers, never, plain = _subscribers(broker)
    names, flags = [], None
    for name, reply in calls(broker, broker.ops.send(parse_destination(TOPIC), [_big(i) for i in range(3)],
                                                     broker._now())):
        names.append(name)
        if name == "topic_send":
            flags = TopicSend.parse(reply).tail.flags
            # stored once, matched so far by the first few, the rest queued
            p = f"{broker.namespace}:{{t:prices}}"
            assert redis_client.lrange(f"{p}:fanout", 0, -1) == [b"m0", b"m1", b"m2"]
            assert redis_client.hlen(f"{p}:msgs") == 3
    assert flags & 4
    # 3 messages x 12 matching evaluations of ~100 kB, about three per call
    assert names.count("topic_fanout") >= 8
    for c in (*takers, plain):
        assert [d.message_id for d in drain(broker, c)] == ["m0", "m1", "m2"], c.consumer_id
    assert drain(broker, never) == []
    p = f"{broker.namespace}:{{t:prices}}"
    assert _keys(redis_client, broker) == []
    assert {k: int(v) for k, v in redis_client.hgetall(f"{p}:refs").items()} == {
        f"m{i}".encode(): MATCHING + 1 for i in range(3)}
    stats = broker.stats(TOPIC)
    assert stats.enqueued == 3 and stats.no_subscription == 0
    enqueues = [e for _, e in expand(redis_client.xrange(f"{p}:events")) if e[b"type"] == b"enqueue"]
    assert [(e[b"msg"], int(e[b"subscriptions"])) for e in enqueues] == [
        (f"m{i}".encode(), MATCHING + 1) for i in range(3)]


def test_a_sender_dying_mid_fan_out_leaves_it_to_the_tick_and_later_sends_queue_behind(form, redis_client):
    broker = form
    takers, never, plain = _subscribers(broker)
    driving = calls(broker, broker.ops.send(parse_destination(TOPIC), [_big(0)], broker._now()))
    for name, _ in driving:
        if name == "topic_send":
            break
    driving.close()  # the sender died with its fan-out unfinished
    # a cheap message sent now matches nothing itself: it waits behind m0 for every subscription
    p = f"{broker.namespace}:{{t:prices}}"
    small = Message(body="small", message_id="small", properties={"s": "Z"})
    second = calls(broker, broker.ops.send(parse_destination(TOPIC), [small], broker._now()))
    for name, _ in second:
        if name == "topic_send":
            assert redis_client.lrange(f"{p}:fanout", 0, -1) == [b"m0", b"small"]
            assert drain(broker, plain) == []  # not even the subscription without a selector has it
            break
    second.close()  # that sender died too
    assert maintenance.run_recovery(broker, TOPIC).ran
    assert _keys(redis_client, broker) == []
    for c in (*takers, plain):
        assert [d.message_id for d in drain(broker, c)] == ["m0", "small"], c.consumer_id
    assert drain(broker, never) == []


def test_the_tick_finishes_a_fan_out_nobody_drives(form, redis_client):
    broker = form
    takers, _, plain = _subscribers(broker)
    driving = calls(broker, broker.ops.send(parse_destination(TOPIC), [_big(0)], broker._now()))
    for name, _ in driving:
        if name == "topic_send":
            break
    driving.close()
    p = f"{broker.namespace}:{{t:prices}}"
    assert redis_client.llen(f"{p}:fanout") == 1
    got_early = {c.consumer_id for c in takers if drain(broker, c)}
    assert 0 < len(got_early) < MATCHING  # those matched before the cut have it already
    assert maintenance.run_recovery(broker, TOPIC).ran
    assert _keys(redis_client, broker) == []
    late = {c.consumer_id for c in takers if drain(broker, c)}
    assert late | got_early == {c.consumer_id for c in takers} and not late & got_early
    assert [d.message_id for d in drain(broker, plain)] == ["m0"]


def test_a_deferred_message_nobody_takes_is_counted_and_not_kept(form, redis_client):
    broker = form
    for i in range(MATCHING):
        consumer(broker, TOPIC, prefetch=100, selector="s LIKE '%Q'", consumer_id=f"n{i}")
    # (a LIKE '%Q' over ~100 kB not ending in Q costs as much as one that matches)
    broker.send(TOPIC, [_big(0), _big(1)])
    p = f"{broker.namespace}:{{t:prices}}"
    assert _keys(redis_client, broker) == []
    stats = broker.stats(TOPIC)
    assert stats.enqueued == 2 and stats.no_subscription == 2
    assert redis_client.hlen(f"{p}:msgs") == 0 and redis_client.hlen(f"{p}:refs") == 0
    assert int(redis_client.hget(f"{p}:meta", "mem") or 0) == 0


def test_deleting_a_topic_mid_fan_out_leaves_nothing(form, redis_client):
    broker = form
    _subscribers(broker)
    driving = calls(broker, broker.ops.send(parse_destination(TOPIC), [_big(0)], broker._now()))
    for name, _ in driving:
        if name == "topic_send":
            break
    driving.close()
    assert _keys(redis_client, broker)
    broker.delete_destination(TOPIC)
    assert _keys(redis_client, broker) == []


def test_wildcard_subscriptions_past_a_calls_work_get_the_copy_and_decide_there(form, redis_client):
    """Matching a send against many wildcard subscriptions stops at a call's worth too: the patterns not
    decided by then get their copy, and their pseudo-topic matches its subscriptions itself (in slices),
    counting the copy `no_subscription` when none takes it: the message is counted once, there."""
    broker = form
    refusing = [consumer(broker, "topic://p.>", prefetch=10, selector="s LIKE '%Q'", consumer_id=f"w{i}")
                for i in range(MATCHING)]
    exact = consumer(broker, "topic://p.x", prefetch=10, consumer_id="exact")
    broker.send("topic://p.x", _big(0))
    assert [d.message_id for d in drain(broker, exact)] == ["m0"]
    assert all(drain(broker, c) == [] for c in refusing)
    assert broker.stats("topic://p.x").no_subscription == 0
    assert broker.stats("topic://p.>").no_subscription == 1
    broker.send("topic://p.x", Message(body="q", message_id="q", properties={"s": "Q"}))
    assert [d.message_id for d in drain(broker, refusing[0])] == ["q"]


def test_a_committed_send_finishes_its_fan_out(form, redis_client):
    broker = form
    takers, never, plain = _subscribers(broker)
    tx = broker.begin()
    broker.send(TOPIC, [_big(0), _big(1)], tx=tx)
    broker.commit(tx)
    assert _keys(redis_client, broker) == []
    for c in (*takers, plain):
        assert [d.message_id for d in drain(broker, c)] == ["m0", "m1"], c.consumer_id


def test_a_call_gives_messages_to_at_most_32_subscriptions(form, redis_client):
    """Without any selector too: each subscription that takes messages costs the call its pending list
    and dispatch chunk, so a call serves at most fanout.MAX_TAKERS (32) of them. Two messages for 100
    subscriptions, one message after the other: 32 in the send, 32 + 32 + (4 and the second's 28), then
    32 + 32 + 8."""
    broker = form
    subs = [consumer(broker, TOPIC, prefetch=10, consumer_id=f"p{i}") for i in range(100)]
    msgs = [Message(body=str(i), message_id=f"s{i}") for i in range(2)]
    op = broker.ops.send(parse_destination(TOPIC), msgs, broker._now())
    names = [name for name, _ in calls(broker, op)]
    assert names.count("topic_send") == 1 and names.count("topic_fanout") == 6
    assert _keys(redis_client, broker) == []
    for c in subs:
        assert [d.message_id for d in drain(broker, c)] == ["s0", "s1"], c.consumer_id
    assert broker.stats(TOPIC).enqueued == 2


def test_a_batch_to_a_topic_with_few_subscriptions_is_one_call(form, redis_client):
    broker = form
    subs = [consumer(broker, TOPIC, prefetch=200, consumer_id=f"p{i}") for i in range(30)]
    msgs = [Message(body=str(i), message_id=f"s{i}") for i in range(100)]
    op = broker.ops.send(parse_destination(TOPIC), msgs, broker._now())
    names = [name for name, _ in calls(broker, op)]
    assert names == ["topic_send"]
    for c in subs:
        assert [d.message_id for d in drain(broker, c)] == [f"s{i}" for i in range(100)]


WILD_WIDE = 2_010  # subscriptions of one pattern: past what a send's call visits (wildcard.MAX_VISITS, 2,000)
WILD_TAKERS = (0, 1_000, 2_009)  # without a selector; every other one's never matches


def _wide_pattern(broker, takers=()):
    return {i: consumer(broker, "topic://w.>", prefetch=10,
                        **({} if i in takers else {"selector": "n = -1"}), consumer_id=f"w{i}")
            for i in range(WILD_WIDE)}


def test_a_send_tries_a_calls_worth_of_a_patterns_subscriptions_and_the_copy_decides(form, redis_client):
    """A pattern with more subscriptions than a send's call visits: the send stops reading and trying them
    at its bound, so the pattern gets the copy undecided and its pseudo-topic matches them in slices,
    counting the copy `no_subscription` when none takes it (not the sending topic, nor its NoConsumer
    advisory). Reading every definition of the pattern made one send of 64 ms of CPU at 10,000."""
    broker = form
    _wide_pattern(broker)
    broker.send("topic://w.x", Message(body="a", message_id="a", properties={"n": 1}))
    assert broker.stats("topic://w.x").no_subscription == 0
    assert broker.stats("topic://w.>").no_subscription == 1
    assert not redis_client.keys(f"{broker.namespace}:{{t:w.>}}:fanout*")


def test_every_subscription_of_a_wide_pattern_gets_its_messages_in_order(form, redis_client):
    """Past the bound nothing is lost: each subscription of the pattern that takes the messages gets every
    one once, in send order, single sends and a batch alike, as does the topic's own subscription."""
    broker = form
    subs = _wide_pattern(broker, WILD_TAKERS)
    exact = consumer(broker, "topic://w.x", prefetch=10, consumer_id="exact")
    for n in range(2):
        broker.send("topic://w.x", Message(body=f"m{n}", message_id=f"m{n}", properties={"n": n}))
    broker.send("topic://w.x", [Message(body=f"m{n}", message_id=f"m{n}", properties={"n": n})
                                for n in range(2, 5)])
    want = [f"m{n}" for n in range(5)]
    for i in WILD_TAKERS:
        assert [d.message_id for d in drain(broker, subs[i])] == want, i
    assert drain(broker, subs[1]) == []
    assert [d.message_id for d in drain(broker, exact)] == want
    assert broker.stats("topic://w.>").no_subscription == 0


MANY_SEGMENTS = "a.b.c.d.e.f.g.h"  # 255 patterns match it: its segments, those of a bit mask made `*`
MAX_PATTERNS = 200  # wildcard.MAX_PATTERNS: the patterns a call decides at most


def _forward_events(redis_client, broker, topic):
    raw = expand(redis_client.xrange(f"{broker.namespace}:{{t:{topic[8:]}}}:events"))
    return sum(1 for _, f in raw if f[b"type"] == b"forward")


def test_a_call_decides_a_bounded_number_of_matching_patterns_and_the_fan_out_the_rest(form, redis_client):
    """255 patterns match the topic, each with one subscription that takes everything: a call decides at
    most MAX_PATTERNS of them (each a definition read, a try, a copy recorded: 2,000 made one send of
    38 ms of CPU), the fan-out's calls the others; every pattern's subscription gets each message once, in
    send order, a batch and a single send alike, as does the topic's own subscription."""
    broker = form
    segments = MANY_SEGMENTS.split(".")
    patterns = [".".join("*" if mask >> i & 1 else s for i, s in enumerate(segments))
                for mask in range(1, 2 ** len(segments))]
    subs = [consumer(broker, f"topic://{p}", prefetch=10, consumer_id=f"w{n}")
            for n, p in enumerate(patterns)]
    topic = f"topic://{MANY_SEGMENTS}"
    exact = consumer(broker, topic, prefetch=10, consumer_id="exact")
    per_call, names = [], []
    sends = ([Message(body=f"m{n}", message_id=f"m{n}") for n in range(3)],
             [Message(body="m3", message_id="m3")])
    for batch in sends:
        before = _forward_events(redis_client, broker, topic)
        for name, _ in calls(broker, broker.ops.send(parse_destination(topic), batch, broker._now())):
            if name in ("topic_send", "topic_fanout"):
                names.append(name)
                after = _forward_events(redis_client, broker, topic)
                per_call.append(after - before)
                before = after
    assert sum(per_call) == 4 * len(patterns)
    assert max(per_call) <= MAX_PATTERNS, per_call
    assert names.count("topic_fanout") >= 4
    want = ["m0", "m1", "m2", "m3"]
    for n, c in enumerate(subs):
        assert [d.message_id for d in drain(broker, c)] == want, patterns[n]
    assert [d.message_id for d in drain(broker, exact)] == want
    assert broker.stats(topic).no_subscription == 0
    assert not redis_client.keys(f"{broker.namespace}:{{t:{MANY_SEGMENTS}}}:fanout*")


MAX_TRIES = 4000  # fanout.MAX_TRIES: the tries of its messages against subscriptions a send makes at most


def test_a_send_makes_a_bounded_number_of_tries_however_cheaply_they_refuse(form):
    """60 subscriptions whose selectors refuse every message after reading one small property, and a
    batch of 100: 6,000 tries that neither take anything nor spend the selector budget. The send stops
    at MAX_TRIES and the fan-out's calls try the rest (a batch of 100 to 2,000 such subscriptions was one
    call of 234 ms); one that does take them gets every message once, in order."""
    broker = form
    topic = "topic://cheap"
    for n in range(60):
        consumer(broker, topic, prefetch=1, selector="n = -1", consumer_id=f"r{n}")
    taker = consumer(broker, topic, prefetch=200, selector="n >= 0", consumer_id="taker")
    batch = [Message(body=f"m{i}", message_id=f"m{i}", properties={"n": i}) for i in range(100)]
    op = broker.ops.send(parse_destination(topic), batch, broker._now())
    names = [name for name, _ in calls(broker, op) if name in ("topic_send", "topic_fanout")]
    assert names[0] == "topic_send" and names.count("topic_fanout") >= 1, names
    assert [d.message_id for d in drain(broker, taker)] == [f"m{i}" for i in range(100)]
    assert broker.stats(topic).no_subscription == 0


def test_a_subscription_made_again_under_its_key_mid_fan_out_does_not_get_the_earlier_message(form):
    """A fan-out's list holds the subscriptions of the send's moment: a durable subscription removed and
    made again under the same key before the fan-out reaches it is another subscription, made after the
    message was sent (ActiveMQ dispatches a send to the subscriptions of that moment, under its lock)."""
    broker = form
    plain = [consumer(broker, TOPIC, prefetch=10, consumer_id=f"p{i}") for i in range(40)]
    late = consumer(broker, TOPIC, prefetch=10, client_id="app", subscription_name="late", consumer_id="d1")
    broker.close_consumer(late)
    driving = calls(broker, broker.ops.send(parse_destination(TOPIC), [Message(body="x", message_id="m0")],
                                            broker._now()))
    for name, _ in driving:
        if name == "topic_send":
            break
    driving.close()  # the sender died: 32 subscriptions have m0, the rest wait for the fan-out
    assert broker.unsubscribe(TOPIC, client_id="app", subscription_name="late") == 0  # (no message yet)
    again = consumer(broker, TOPIC, prefetch=10, client_id="app", subscription_name="late", consumer_id="d2")
    assert maintenance.run_recovery(broker, TOPIC).ran
    assert drain(broker, again) == []
    for c in plain:
        assert [d.message_id for d in drain(broker, c)] == ["m0"], c.consumer_id
    assert broker.stats(TOPIC).enqueued == 1
