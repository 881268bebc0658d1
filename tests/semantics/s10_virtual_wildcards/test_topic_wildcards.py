"""Wildcard topic subscriptions (issue #5; docs/broker_core.md "Wildcard subscriptions").

A subscription on `topic://orders.>` is a subscription of the pattern's pseudo-topic; a send to a
matching topic records a copy for it in the same step (scripts/lua/includes/wildcard.lua) and
ops/forward.py delivers it, with the real topic as the destination its consumer sees.
"""

from __future__ import annotations

import json

import pytest

from broker_core import maintenance
from broker_core.broker import Broker
from broker_core.destinations import Destination, matches, parse_destination
from broker_core.effects import Eval
from broker_core.errors import InvalidConsumer, InvalidDestination
from broker_core.keys import wildcards_key
from broker_core.messages import Message
from broker_core.ops import advisory
from broker_core.scripts.library import SCRIPT_DIR

from ...broker_core.test_chunked_close import calls
from ...helpers.broker import consumer, drain
from .test_flow_virtual_edges import Crash, drive

# (pattern, topic name, matches?): one table for the Python matcher (destinations.matches) and the Lua
# one (includes/wildcard.lua wildcard.matches), which must agree (ActiveMQ's DestinationFilter rules).
CASES = [
    ("orders.*", "orders.eu", True),
    ("orders.*", "orders", False),
    ("orders.*", "orders.eu.north", False),
    ("orders.>", "orders", True),  # '>' is the remaining segments, including none
    ("orders.>", "orders.eu", True),
    ("orders.>", "orders.eu.north", True),
    ("orders.>", "ordersx.eu", False),
    ("orders.>", "order", False),
    ("*.eu", "orders.eu", True),
    ("*.eu", "orders.us", False),
    ("*.eu", "eu", False),
    ("orders.*.eu", "orders.x.eu", True),
    ("orders.*.eu", "orders.x.y.eu", False),
    ("orders.*.>", "orders.x", True),
    ("orders.*.>", "orders.x.y.z", True),
    ("orders.*.>", "orders", False),
    (">", "anything", True),
    (">", "a.b.c", True),
    ("*", "a", True),
    ("*", "a.b", False),
    ("*.*", "a.b", True),
    ("a.b", "a.b", True),  # no wildcard: only itself
    ("a.b", "a.b.c", False),
    ("ActiveMQ.Advisory.>", "ActiveMQ.Advisory.Consumer.Queue.orders", True),
    ("o-r_d.ers.*", "o-r_d.ers.x%y", True),  # Lua pattern characters in names are plain text
    ("o-r_d.ers.*", "oxr_d.ers.x", False),
]


def subscribe(broker: Broker, pattern: str, **kw):
    return consumer(broker, f"topic://{pattern}", prefetch=kw.pop("prefetch", 100), **kw)


def ids(broker: Broker, c) -> list[str]:
    return [d.message_id for d in drain(broker, c)]


def registry(broker: Broker) -> set[str]:
    return {m.decode() for m in broker.redis.smembers(wildcards_key(broker.namespace))}


@pytest.mark.parametrize(("pattern", "name", "expected"), CASES)
def test_the_python_matcher_follows_the_table(pattern, name, expected):
    assert matches(parse_destination(pattern, "topic", allow_wildcards=True),
                   parse_destination(name, "topic")) is expected


def test_the_lua_matcher_follows_the_same_table(redis_client):
    # the include is functions only (its module table `wildcard`, built by base.lua's `base.lazy`), so it
    # runs alone: the very text every script uses
    prelude = "local base = {}\nfunction base.lazy(t, build) build(t) return t end\n"
    source = prelude + (SCRIPT_DIR / "includes" / "wildcard.lua").read_text() + (
        "\nlocal out = {}\nfor i = 1, #ARGV, 2 do\n"
        "  out[#out + 1] = wildcard.matches(ARGV[i], ARGV[i + 1]) and 1 or 0\nend\nreturn out")
    got = redis_client.eval(source, 0, *[x for pattern, name, _ in CASES for x in (pattern, name)])
    assert [bool(x) for x in got] == [expected for _, _, expected in CASES]


def test_star_is_one_segment_and_greater_than_is_the_rest(broker):
    one, rest = subscribe(broker, "orders.*"), subscribe(broker, "orders.>")
    for name in ("orders", "orders.eu", "orders.eu.north", "prices.eu"):
        broker.send(f"topic://{name}", Message(body=name, message_id=f"m-{name}"))
    assert ids(broker, one) == ["m-orders.eu"]
    assert ids(broker, rest) == ["m-orders", "m-orders.eu", "m-orders.eu.north"]
    # prices.eu had no subscription at all: dropped and counted, as before
    assert broker.stats("topic://prices.eu").no_subscription == 1


def test_each_matching_pattern_and_the_exact_subscription_get_one_copy(broker):
    subs = {p: subscribe(broker, p) for p in ("orders.>", "orders.*", "*.eu", "*.*")}
    exact = subscribe(broker, "orders.eu")
    broker.send("topic://orders.eu", [Message(body="a", message_id="m1"), Message(body="b", message_id="m2")])
    for c in (*subs.values(), exact):
        assert ids(broker, c) == ["m1", "m2"]
    stats = broker.stats("topic://orders.eu")
    assert (stats.no_subscription, stats.forwarding) == (0, 0)


def test_a_message_only_a_wildcard_takes_is_delivered_not_dropped(broker):
    c = subscribe(broker, "orders.>")
    broker.send("topic://orders.eu", Message(body="x", message_id="m1"))
    assert ids(broker, c) == ["m1"]
    stats = broker.stats("topic://orders.eu")
    assert (stats.enqueued, stats.no_subscription) == (1, 0)
    assert broker.redis.hlen(f"{broker.namespace}:{{t:orders.eu}}:msgs") == 0  # nothing held there


def test_the_consumer_sees_the_real_topic_and_the_messages_own_original_destination(broker):
    c = subscribe(broker, "orders.>")
    broker.send("topic://orders.eu", Message(body="x", message_id="m1"))
    broker.send("topic://orders.a,topic://orders.b.c", Message(body="y", message_id="m2"))  # a composite
    got = drain(broker, c)
    assert [(d.message_id, d.original_destination) for d in got] == [
        ("m1", None), ("m2", "topic://orders.a,orders.b.c")]  # the composite's copy keeps its own
    assert got[0].destination == "topic://orders.eu"
    assert got[0].body == "x"
    # both parts match; the part delivered first wins, the other is the same id (a duplicate to drop)
    assert got[1].destination in ("topic://orders.a", "topic://orders.b.c")


def test_a_subscription_on_everything_also_sees_advisories(broker):
    everything = subscribe(broker, ">")
    subscribe(broker, "orders.eu")  # its advisories are on topics '>' matches, as in ActiveMQ
    broker.send("topic://orders.eu", Message(body="x", message_id="m1"))
    got = drain(broker, everything)
    assert [(d.destination, d.message_id) for d in got][-1] == ("topic://orders.eu", "m1")
    assert [d.destination for d in got[:-1]] == [
        "topic://ActiveMQ.Advisory.Topic",  # orders.eu created
        advisory.topic("Consumer", "topic://orders.eu").uri,
    ]


def test_a_subscription_made_by_another_process_gets_the_next_send(broker, redis_client, namespace, clock):
    # each process reads the registry in the send step; nothing is cached per process
    sender = Broker(redis_client, namespace, clock)
    sender.send("topic://orders.eu", Message(body="before", message_id="m0"))
    c = subscribe(broker, "orders.>")
    sender.send("topic://orders.eu", Message(body="after", message_id="m1"))
    assert ids(broker, c) == ["m1"]


def test_a_durable_wildcard_subscription_keeps_receiving_while_offline(broker):
    spec = dict(client_id="app", subscription_name="all-orders", ack_mode="client-individual")
    d = subscribe(broker, "orders.>", **spec)
    broker.close_consumer(d)
    assert registry(broker) == {"orders.>"}  # an offline durable still counts
    broker.send("topic://orders.eu", Message(body="x", message_id="m1"))
    broker.send("topic://orders.us", Message(body="y", message_id="m2"))
    d = subscribe(broker, "orders.>", **spec)
    got = drain(broker, d)
    assert [(x.message_id, x.destination) for x in got] == [("m1", "topic://orders.eu"),
                                                             ("m2", "topic://orders.us")]
    (sub,) = broker.subscriptions("topic://orders.>")
    assert (sub.durable, sub.client_id, sub.subscription_name) == (True, "app", "all-orders")


def test_selector_and_no_local_apply_to_a_wildcard_subscription(broker):
    c = subscribe(broker, "orders.>", selector="region = 'eu'", no_local=True, connection_id="conn-1")
    broker.send("topic://orders.a", [
        Message(body="1", message_id="eu-other", properties={"region": "eu"}, connection_id="conn-2"),
        Message(body="2", message_id="us-other", properties={"region": "us"}, connection_id="conn-2"),
        Message(body="3", message_id="eu-own", properties={"region": "eu"}, connection_id="conn-1"),
    ])
    assert ids(broker, c) == ["eu-other"]


def test_no_message_is_lost_when_the_process_dies_between_the_send_and_the_forward(broker, clock):
    c = subscribe(broker, "orders.>")
    op = broker.ops.send(parse_destination("topic://orders.eu"), [Message(body="m", message_id="m1")],
                         clock.now_ms())

    def delivering_the_copy(request):  # the forward step's send to the pattern's pseudo-topic
        return any(isinstance(e, Eval) and e.keys[0].endswith("{t:orders.>}")
                   for e in (request if isinstance(request, list) else [request]))

    with pytest.raises(Crash):
        drive(broker, op, stop_at=delivering_the_copy)
    assert drain(broker, c) == []
    assert broker.stats("topic://orders.eu").forwarding == 1  # the record survived the crash
    maintenance.run_recovery(broker, "topic://orders.eu")  # notes the record...
    clock.advance(3_000)
    maintenance.run_recovery(broker, "topic://orders.eu")  # ...and delivers it
    maintenance.run_recovery(broker, "topic://orders.eu")
    assert ids(broker, c) == ["m1"]
    assert broker.stats("topic://orders.eu").forwarding == 0


def test_the_registry_follows_the_patterns_subscriptions(broker):
    a = subscribe(broker, "orders.>")
    b = subscribe(broker, "orders.>")
    durable = subscribe(broker, "*.eu", client_id="app", subscription_name="eu")
    subscribe(broker, "orders.eu")  # an exact subscription is not a pattern
    assert registry(broker) == {"orders.>", "*.eu"}
    broker.close_consumer(a)
    assert registry(broker) == {"orders.>", "*.eu"}  # b still subscribes
    broker.close_consumer(b)
    assert registry(broker) == {"*.eu"}
    broker.close_consumer(durable)
    assert registry(broker) == {"*.eu"}  # offline, not gone
    broker.unsubscribe("topic://*.eu", client_id="app", subscription_name="eu")
    assert registry(broker) == set()
    broker.send("topic://orders.eu", Message(body="x", message_id="m1"))
    assert broker.stats("topic://orders.>").enqueued == 0  # nothing copied to a forgotten pattern


def test_a_lapsed_wildcard_consumer_leaves_the_registry(broker, clock):
    subscribe(broker, "orders.>", lease_ms=1_000)
    clock.advance(5_000)
    broker.reap_lapsed("topic://orders.>")
    assert registry(broker) == set()


def test_maintenance_runs_on_the_patterns_which_are_not_listed_as_destinations(broker, clock):
    subscribe(broker, "orders.>", lease_ms=1_000)
    broker.send("topic://orders.eu", Message(body="x", message_id="m1"))
    assert broker.destinations() == ["topic://orders.eu"]  # a pattern is no destination
    clock.advance(5_000)
    report = maintenance.run_due(broker)  # the lapsed consumer on the pattern is reaped
    assert len(report.reaped) == 1
    assert registry(broker) == set()


def test_deleting_the_patterns_topic_forgets_it(broker):
    subscribe(broker, "orders.>", client_id="app", subscription_name="s")
    broker.delete_destination("topic://orders.>")
    assert registry(broker) == set()


def test_a_dead_letter_of_a_wildcard_subscription_goes_to_the_real_topics_dlq(broker):
    broker.policies.set_entry("topic", ">", {"deadLetterStrategy": "individual"})
    broker.refresh_policies()
    # durable: a non-durable subscription's poison ack dead-letters nothing (TopicSubscription)
    c = subscribe(broker, "orders.>", ack_mode="client-individual", client_id="app", subscription_name="s")
    broker.send("topic://orders.eu", Message(body="x", message_id="m1"))
    (d,) = drain(broker, c)
    broker.nack(c, ["m1"], poison=True)
    dlq = consumer(broker, "queue://ActiveMQ.DLQ.Topic.orders.eu")
    (dead,) = drain(broker, dlq)
    assert (dead.message_id, dead.destination, dead.original_destination) == (
        "m1", "queue://ActiveMQ.DLQ.Topic.orders.eu", "topic://orders.eu")


def test_a_wildcard_on_advisory_topics_receives_advisories(broker):
    watcher = consumer(broker, "topic://ActiveMQ.Advisory.Consumer.Queue.>", ack_mode="auto")
    consumer(broker, "queue://orders", consumer_id="c1")
    (got,) = drain(broker, watcher)
    assert got.destination == advisory.topic("Consumer", "queue://orders").uri
    assert json.loads(got.body)["ConsumerInfo"]["consumerId"] == "c1"


def test_a_wildcard_on_advisory_topics_receives_destination_advisories(broker):
    # the Python side's check (advisory.destination_changed) counts a wildcard like the Lua one
    watcher = consumer(broker, "topic://ActiveMQ.Advisory.*", ack_mode="auto")
    broker.ensure_destination("queue://orders")
    (got,) = drain(broker, watcher)
    assert got.destination == "topic://ActiveMQ.Advisory.Queue"
    assert json.loads(got.body)["DestinationInfo"]["destination"] == "queue://orders"


# -- refusals -----------------------------------------------------------------------------------------

def test_sending_to_a_wildcard_is_refused_and_changes_nothing(broker):
    c = subscribe(broker, "orders.>")
    before = sorted(broker.redis.keys(f"{broker.namespace}:*"))
    for dest in ("topic://orders.>", Destination("topic", "orders.*")):
        with pytest.raises(InvalidDestination, match="not one to send to"):
            broker.send(dest, Message(body="x"))
    tx = broker.begin()
    with pytest.raises(InvalidDestination, match="not one to send to"):
        broker.send(Destination("topic", "orders.>"), Message(body="x"), tx=tx)
    broker.rollback(tx)
    after = sorted(broker.redis.keys(f"{broker.namespace}:*"))
    assert after == before
    assert drain(broker, c) == []


def test_a_consumer_on_a_wildcard_queue_is_refused_with_the_reason(broker):
    for dest in ("queue://orders.>", Destination("queue", "orders.*")):
        with pytest.raises(InvalidDestination, match="wildcard queue destinations are not supported"):
            broker.add_consumer(dest)
    assert broker.destinations() == []


def test_a_retroactive_wildcard_subscription_is_refused(broker):
    with pytest.raises(InvalidConsumer, match="retroactive consumers are not supported on wildcard"):
        subscribe(broker, "orders.>", retroactive=True)
    assert registry(broker) == set()


def test_the_registrys_trie_finds_exactly_the_matching_patterns(redis_client):
    """Past SCAN_MOST registered patterns a send reads the trie of them (wildcard.walk: the prefixes of
    the patterns matching its name), not all of them: it finds, for every name of the table, exactly the
    patterns of the table the Python matcher matches to it; counted out again, it leaves no key."""
    include = ("local base = {}\nfunction base.lazy(t, build) build(t) return t end\n"
               + (SCRIPT_DIR / "includes" / "wildcard.lua").read_text())
    count = include + ("\nfor i = 3, #ARGV do wildcard.index(ARGV[1], ARGV[i], tonumber(ARGV[2])) end\n"
                       "return 0")
    walk = include + ("\nlocal out = {}\nfor i = 2, #ARGV do\n"
                      "  local found = wildcard.walk(ARGV[1], wildcard.segments(ARGV[i]))\n"
                      "  out[#out + 1] = table.concat(found, ' ')\nend\nreturn out")
    patterns = sorted({p for p, _, _ in CASES})
    names = sorted({n for _, n, _ in CASES})
    ns = "trie-test"
    redis_client.eval(count, 0, ns, 1, *patterns, "a.>.b")  # ('>' not last, as no name allows: left out)
    for name, line in zip(names, redis_client.eval(walk, 0, ns, *names), strict=True):
        want = sorted(p for p in patterns if matches(parse_destination(p, "topic", allow_wildcards=True),
                                                    parse_destination(name, "topic")))
        assert sorted(line.decode().split()) == want, name
    redis_client.eval(count, 0, ns, -1, *patterns, "a.>.b")
    assert redis_client.keys(f"{ns}:wildcards:t:*") == []


FILLERS = 2_010  # registered patterns past wildcard.SCAN_MOST (2,000): sends read the trie


def test_a_registry_past_its_scan_size_is_read_through_its_trie_kept_with_the_subscriptions(broker):
    """The trie is kept from a namespace's first pattern on, and built by the first send that reads a
    registry that large when its patterns were registered before it (its keys deleted here); then kept as
    subscriptions come and go: the patterns matching a topic get its messages, a pattern whose
    subscriptions went gets none, and once all went no trie key is left."""
    fillers = [subscribe(broker, f"f{n}.>") for n in range(FILLERS)]
    subs = {p: subscribe(broker, p) for p in ("orders.>", "orders.*", "*.eu", "orders.eu.>", "*")}
    trie = [*broker.redis.keys(f"{broker.namespace}:wildcards:t:*"), f"{broker.namespace}:wildcards:indexed"]
    assert broker.redis.delete(*trie) == len(trie) > 2
    broker.send("topic://orders.eu", Message(body="a", message_id="a"))
    assert broker.redis.exists(f"{broker.namespace}:wildcards:indexed")
    broker.close_consumer(subs.pop("orders.*"))
    later = subscribe(broker, "orders.*")  # (counted in again)
    broker.send("topic://orders.eu", Message(body="b", message_id="b"))
    broker.send("topic://eu", Message(body="c", message_id="c"))
    assert ids(broker, subs["orders.>"]) == ["a", "b"]
    assert ids(broker, subs["*.eu"]) == ["a", "b"]
    assert ids(broker, subs["orders.eu.>"]) == ["a", "b"]  # ('>': none left)
    assert ids(broker, subs["*"]) == ["c"]
    assert ids(broker, later) == ["b"]
    assert ids(broker, fillers[0]) == []
    for c in [*fillers, *subs.values(), later]:
        broker.close_consumer(c)
    assert registry(broker) == set()
    assert broker.redis.keys(f"{broker.namespace}:wildcards:t:*") == []


def _trie(broker: Broker) -> dict[str, dict[str, int]]:
    return {k.decode(): {f.decode(): int(v) for f, v in broker.redis.hgetall(k).items()}
            for k in broker.redis.keys(f"{broker.namespace}:wildcards:t:*")}


def _trie_of(broker: Broker, patterns: set[str]) -> dict[str, dict[str, int]]:
    """The trie `patterns` make (wildcard.lua wildcard.index): per prefix node, the patterns through each
    segment after it, '' those ending there, '>' those ending with '>' after it."""
    trie: dict[str, dict[str, int]] = {}

    def count(path: str, field: str) -> None:
        node = trie.setdefault(f"{broker.namespace}:wildcards:t:{path}", {})
        node[field] = node.get(field, 0) + 1

    for name in patterns:
        segments, path = name.split("."), ""
        for i, segment in enumerate(segments):
            count(path, segment)
            if segment == ">":
                break
            path = segment if i == 0 else f"{path}.{segment}"
        else:
            count(path, "")
    return trie


@pytest.mark.parametrize("functions", [True, False], ids=["functions", "eval"])
@pytest.mark.parametrize("change", [False, True], ids=["alone", "patterns coming and going"])
def test_the_trie_of_patterns_registered_before_it_is_built_across_calls_while_sends_wait(broker, change,
                                                                                          functions):
    """A registry past SCAN_MOST whose patterns were registered before the trie existed (its keys deleted
    here) gets it built a slice a call (in one call it took 80 ms at 10,000 patterns): the send's call
    builds a slice and leaves the patterns to its fan-out, whose calls build the rest, then decide them;
    the message reaches the patterns matching it, the registry's at that moment (one whose subscription
    went meanwhile gets nothing), once. Patterns subscribed to and left meanwhile are counted in and out
    where the build is: the trie built is that of the registry. In both script forms (the library keeps
    its state between calls: a call builds one slice)."""
    broker.driver.functions = functions

    fillers = [subscribe(broker, f"f{n}.>") for n in range(FILLERS)]
    subs = {p: subscribe(broker, p) for p in ("orders.>", "orders.*", "*.eu", "orders.eu.>", "*")}
    broker.send("topic://orders.eu", Message(body="warm"))  # (the topic made)
    for c in subs.values():
        drain(broker, c)
    ns = broker.namespace
    broker.redis.delete(f"{ns}:wildcards:indexed", *broker.redis.keys(f"{ns}:wildcards:t:*"))
    op = broker.ops.send(parse_destination("topic://orders.eu"), [Message(body="a", message_id="a")],
                         broker._now())
    fanouts, added = 0, []
    for name, _ in calls(broker, op):
        if name == "topic_send":
            assert not broker.redis.exists(f"{ns}:wildcards:indexed")  # (a slice built, not all)
            if change:
                broker.close_consumer(subs.pop("orders.*"))
                for c in fillers[:300]:
                    broker.close_consumer(c)
                added += [subscribe(broker, f"g{n}.*.x") for n in range(300)]
                added.append(subscribe(broker, "orders.eu"))  # (no pattern: an ordinary topic's)
        fanouts += name == "topic_fanout"
    assert fanouts >= 2
    assert broker.redis.exists(f"{ns}:wildcards:indexed") and not broker.redis.exists(f"{ns}:wildcards:scan")
    assert _trie(broker) == _trie_of(broker, registry(broker))
    assert ids(broker, subs["orders.>"]) == ["a"]
    assert ids(broker, subs["*.eu"]) == ["a"]
    assert ids(broker, subs["orders.eu.>"]) == ["a"]
    assert ids(broker, subs["*"]) == []
    if not change:
        assert ids(broker, subs["orders.*"]) == ["a"]
    broker.send("topic://orders.eu", Message(body="b", message_id="b"))
    assert ids(broker, subs["orders.>"]) == ["b"]
    for c in [*fillers[300 if change else 0:], *subs.values(), *added]:
        broker.close_consumer(c)
    assert registry(broker) == set()
    assert broker.redis.keys(f"{ns}:wildcards:t:*") == []
