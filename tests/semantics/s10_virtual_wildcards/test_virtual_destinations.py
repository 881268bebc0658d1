"""Virtual destinations (spec §10, issue 5 item 5) against a real Redis: client-side composites,
configured composite queues and topics, virtual topics, mirrored queues, and forwarding that survives a
process dying between the steps."""

from __future__ import annotations

import pytest
import redis

from broker_core import maintenance
from broker_core.broker import Broker
from broker_core.config.virtual import VirtualConfig, load_virtual_config
from broker_core.destinations import Destination, parse_destination, split_composite
from broker_core.drivers.loop import typed_error as _typed_error
from broker_core.effects import Command, Eval
from broker_core.errors import InvalidDestination, InvalidPolicy
from broker_core.messages import Message
from broker_core.ops import virtual

from ...helpers.broker import consumer, drain


class Crash(Exception):
    """The process 'dies' here: the request that matched is never run."""


def run_until_crash(broker: Broker, op, dies_at) -> None:
    """Drive an operation as Broker._run does, but stop dead before the first request `dies_at` matches."""
    request = next(op)
    while True:
        if dies_at(request):
            op.close()
            raise Crash
        try:
            try:
                reply = broker._step(request)
            except redis.ResponseError as exc:
                request = op.throw(_typed_error(exc))  # as Broker._run: e.g. a destination's first use
            else:
                request = op.send(reply)
        except StopIteration:
            raise AssertionError("the operation finished before the crash point") from None


def delivers_to(suffix: str):
    """Matches the step that delivers a copy to the destination whose prefix ends with `suffix`: the
    target's send and the record's removal, one MULTI/EXEC (ops/forward.py)."""
    def matches(request) -> bool:
        calls = request if isinstance(request, list) else [request]
        return any(isinstance(c, Eval) and c.keys[0].endswith(suffix) for c in calls)
    return matches


def configure(broker: Broker, **table) -> VirtualConfig:
    config = VirtualConfig.from_config(table)
    virtual.configure(broker, config)
    return config


def ids_on(broker: Broker, dest: str) -> list[str]:
    return [b.message.message_id for b in broker.browse(dest, limit=1000).messages]


def test_a_client_side_composite_sends_one_copy_to_each_part_with_the_same_id(broker):
    ids = broker.send("a,b, c ,a", Message(body="hi", message_id="m1"))
    assert ids == ["m1"]
    for name in ("a", "b", "c"):
        assert ids_on(broker, name) == ["m1"]
        assert broker.stats(name).enqueued == 1
    got = drain(broker, consumer(broker, "b"))
    # CompositeDestinationBroker.send: every part's message names the composite as its original destination
    assert [(d.message_id, d.body, d.original_destination) for d in got] == [("m1", "hi", "queue://a,b,c")]


def test_a_client_side_composite_naming_no_destination_is_refused_and_sends_nothing(broker):
    with pytest.raises(InvalidDestination, match="names no destination"):
        broker.send(" , ,", Message(body="x"))
    assert broker.destinations() == []


def test_a_composite_queue_forwards_only_with_original_destination_and_filtered_destinations(broker):
    configure(broker, compositeQueue=[{
        "name": "orders.all",
        "forwardTo": ["orders.copy", {"queue": "orders.big", "selector": "amount > 100"},
                      {"queue": "orders.never", "selector": ""}],  # a filter without a selector: never
    }])
    sent = broker.send("orders.all", [Message(body="small", message_id="s", properties={"amount": 5}),
                                      Message(body="big", message_id="b", properties={"amount": 500})])
    assert [x.status for x in sent] == ["forwarded", "forwarded"]
    assert ids_on(broker, "orders.copy") == ["s", "b"]
    assert ids_on(broker, "orders.big") == ["b"]
    assert "queue://orders.never" not in broker.destinations()
    stats = broker.stats("orders.all")
    assert stats.queue_size == 0 and stats.enqueued == 0  # forwardOnly: nothing kept on the composite
    got = drain(broker, consumer(broker, "orders.big"))
    assert got[0].original_destination == "queue://orders.all"


def test_forward_only_false_keeps_the_message_and_send_when_not_matched_keeps_only_unmatched(broker):
    configure(broker, compositeQueue=[
        {"name": "keep", "forwardOnly": False, "forwardTo": ["keep.copy"]},
        {"name": "fallback", "sendWhenNotMatched": True,
         "forwardTo": [{"queue": "fallback.eu", "selector": "region = 'eu'"}]},
    ])
    broker.send("keep", Message(body="x", message_id="k"))
    assert ids_on(broker, "keep") == ["k"] and ids_on(broker, "keep.copy") == ["k"]
    broker.send("fallback", [Message(body="eu", message_id="e", properties={"region": "eu"}),
                             Message(body="us", message_id="u", properties={"region": "us"})])
    assert ids_on(broker, "fallback.eu") == ["e"]
    assert ids_on(broker, "fallback") == ["u"]


def test_a_composite_pattern_applies_to_every_matching_destination(broker):
    configure(broker, compositeQueue=[{"name": "audit.>", "forwardOnly": False, "forwardTo": ["audit.all"]}])
    broker.send("audit.eu", Message(body="1", message_id="m1"))
    broker.send("audit.us.west", Message(body="2", message_id="m2"))
    assert sorted(ids_on(broker, "audit.all")) == ["m1", "m2"]


def test_a_process_dying_before_the_copies_are_delivered_loses_none_and_maintenance_delivers_them(
        broker, clock):
    configure(broker, compositeQueue=[{"name": "x", "forwardTo": ["x.a", "x.b"]}])
    broker.ensure_destination("x.a")
    op = broker.ops.send(parse_destination("x"), [Message(body="m", message_id="m1")], clock.now_ms())
    with pytest.raises(Crash):  # dies right after the send step, before any copy is delivered
        run_until_crash(broker, op, delivers_to("{q:x.a}"))
    assert ids_on(broker, "x.a") == []
    assert broker.stats("x").forwarding == 2  # both copies wait in the forwarding hash
    maintenance.run_recovery(broker, "x")  # a fresh record is left to the process that wrote it...
    assert ids_on(broker, "x.a") == []
    clock.advance(3_000)  # ...for 2 s
    maintenance.run_recovery(broker, "x")
    assert ids_on(broker, "x.a") == ["m1"] and ids_on(broker, "x.b") == ["m1"]
    assert broker.stats("x").forwarding == 0


def test_a_copys_delivery_and_its_records_removal_are_one_atomic_step(broker, clock):
    """Issue 5 item 5 (FLOWFIX, review finding 4): no step between a copy's arrival and its record's
    removal in which a process could die; so no re-run after a crash can deliver the copy twice, even once
    it has left the target's duplicate audit (test_flow_virtual_review covers that case)."""
    configure(broker, compositeQueue=[{"name": "x", "forwardTo": ["x.a"]}])
    op = broker.ops.send(parse_destination("x"), [Message(body="m", message_id="m1")], clock.now_ms())
    steps = []
    with pytest.raises(Crash):
        run_until_crash(broker, op, lambda r: steps.append(r) or delivers_to("{q:x.a}")(r))
    [step] = [r for r in steps if delivers_to("{q:x.a}")(r)]
    assert isinstance(step, list) and [e.script for e in step] == ["send", "forward_done"]
    assert not [r for r in steps if isinstance(r, Command) and r.args[:1] == ("HDEL",)
                and r.args[1].endswith(":fwd")]
    assert ids_on(broker, "x.a") == [] and broker.stats("x").forwarding == 1  # neither happened


def test_a_client_side_composite_interrupted_between_parts_is_completed_by_maintenance(broker, clock):
    broker.ensure_destination("p2")
    op = broker.ops.send_composite(split_composite("p1,p2"), [Message(body="m", message_id="m1")],
                                   clock.now_ms())
    with pytest.raises(Crash):
        run_until_crash(broker, op, delivers_to("{q:p2}"))
    assert ids_on(broker, "p1") == ["m1"] and ids_on(broker, "p2") == []
    maintenance.run_recovery(broker, "p1")
    clock.advance(3_000)
    maintenance.run_recovery(broker, "p1")
    assert ids_on(broker, "p2") == ["m1"]


def test_virtual_topic_copies_go_to_existing_consumer_queues_only(broker):
    broker.ensure_destination("Consumer.A.VirtualTopic.Orders")
    consumer(broker, "Consumer.B.VirtualTopic.Orders")  # subscribing creates the consumer queue
    broker.ensure_destination("Consumer.A.B.VirtualTopic.Orders")  # '*' is exactly one element
    broker.ensure_destination("Consumer.A.VirtualTopic.Other")
    broker.send("topic://VirtualTopic.Orders", Message(body="o", message_id="o1"))
    assert ids_on(broker, "Consumer.A.VirtualTopic.Orders") == ["o1"]
    assert ids_on(broker, "Consumer.B.VirtualTopic.Orders") == ["o1"]
    assert ids_on(broker, "Consumer.A.B.VirtualTopic.Orders") == []
    assert ids_on(broker, "Consumer.A.VirtualTopic.Other") == []
    got = broker.get_message("Consumer.A.VirtualTopic.Orders", "o1")
    assert got.message.original_destination == "topic://VirtualTopic.Orders"
    # A consumer queue created later gets only what is sent from then on.
    broker.ensure_destination("Consumer.C.VirtualTopic.Orders")
    broker.send("topic://VirtualTopic.Orders", Message(body="o", message_id="o2"))
    assert ids_on(broker, "Consumer.C.VirtualTopic.Orders") == ["o2"]
    assert ids_on(broker, "Consumer.A.VirtualTopic.Orders") == ["o1", "o2"]
    # A deleted consumer queue is no longer a target.
    broker.delete_destination("Consumer.C.VirtualTopic.Orders")
    broker.send("topic://VirtualTopic.Orders", Message(body="o", message_id="o3"))
    assert "queue://Consumer.C.VirtualTopic.Orders" not in broker.destinations()


def test_virtual_topic_subscribers_of_the_topic_itself_still_receive(broker):
    broker.ensure_destination("Consumer.A.VirtualTopic.Orders")
    sub = consumer(broker, "topic://VirtualTopic.Orders")
    broker.send("topic://VirtualTopic.Orders", Message(body="o", message_id="o1"))
    assert [d.message_id for d in drain(broker, sub)] == ["o1"]
    assert ids_on(broker, "Consumer.A.VirtualTopic.Orders") == ["o1"]


def test_mirrored_queues_copy_every_queue_message_to_its_mirror_topic(broker):
    configure(broker, useMirroredQueues=True)  # the default virtual topic stays: nothing explicit
    broker.ensure_destination("Consumer.ops.VirtualTopic.Mirror.orders")
    broker.send("orders", Message(body="m", message_id="m1"))
    assert ids_on(broker, "orders") == ["m1"]  # kept on the queue as well
    assert ids_on(broker, "Consumer.ops.VirtualTopic.Mirror.orders") == ["m1"]


def test_a_mirror_prefix_is_concatenated_without_a_dot(broker):
    config = VirtualConfig.from_config({"mirroredQueue": {"prefix": "Mirror.Topic"}})
    assert config.mirrored_queue.topic_for(Destination("queue", "Foo.Bar")).uri == "topic://Mirror.TopicFoo.Bar"
    assert config.virtual_topics == ()  # an explicit configuration replaces the default virtual topic


def test_configuring_any_virtual_destination_replaces_the_default_virtual_topic(broker):
    configure(broker, compositeQueue=[{"name": "x", "forwardTo": ["y"]}])
    broker.ensure_destination("Consumer.A.VirtualTopic.Orders")
    broker.send("topic://VirtualTopic.Orders", Message(body="o", message_id="o1"))
    assert ids_on(broker, "Consumer.A.VirtualTopic.Orders") == []


def test_bad_configuration_is_refused_with_the_entry_and_setting_named():
    with pytest.raises(InvalidPolicy, match=r"compositeQueue #1 \(queue://x\): forwardTo must be"):
        VirtualConfig.from_config({"compositeQueue": [{"name": "x", "forwardTo": []}]})
    with pytest.raises(InvalidPolicy, match="forwardTo #1: selector"):
        VirtualConfig.from_config({"compositeQueue": [{"name": "x", "forwardTo": [
            {"queue": "y", "selector": "a = "}]}]})
    with pytest.raises(InvalidPolicy, match="forward in a circle: queue://a -> queue://b -> queue://a"):
        VirtualConfig.from_config({"compositeQueue": [{"name": "a", "forwardTo": ["b"]},
                                                      {"name": "b", "forwardTo": ["a"]}]})
    with pytest.raises(InvalidPolicy, match="useMirroredQueues = true has no effect when virtual"):
        VirtualConfig.from_config({"useMirroredQueues": True,
                                   "compositeQueue": [{"name": "a", "forwardTo": ["b"]}]})
    with pytest.raises(InvalidPolicy, match="unknown setting 'forwardOnyl'"):
        VirtualConfig.from_config({"compositeQueue": [{"name": "a", "forwardTo": ["b"],
                                                       "forwardOnyl": False}]})


def test_the_configuration_is_shared_through_redis(redis_client, namespace, broker):
    configure(broker, compositeQueue=[{"name": "x", "forwardTo": ["y"]}])
    other = Broker(redis_client, namespace, broker.clock)  # another process
    other.send("x", Message(body="m", message_id="m1"))
    assert ids_on(other, "y") == ["m1"]


def test_the_example_configuration_lists_its_virtual_destinations():
    config = load_virtual_config("signalbox.example.toml")
    rows = {(row["type"], row.get("name")) for row in virtual.describe(config)}
    assert ("compositeQueue", "queue://orders.incoming") in rows
    assert ("virtualTopic", "topic://VirtualTopic.>") in rows


def test_a_composite_topic_forwards_to_queues_and_its_own_subscribers_still_receive(broker):
    configure(broker, compositeTopic=[{"name": "audit", "forwardOnly": False, "forwardTo": ["audit.store"]}])
    sub = consumer(broker, "topic://audit")
    broker.send("topic://audit", Message(body="a", message_id="a1"))
    assert [d.message_id for d in drain(broker, sub)] == ["a1"]
    assert ids_on(broker, "audit.store") == ["a1"]
    assert broker.get_message("audit.store", "a1").message.original_destination == "topic://audit"


def test_a_client_side_composite_with_a_topic_part_publishes_to_the_topic(broker):
    sub = consumer(broker, "topic://news")
    broker.send("inbox,topic://news", Message(body="n", message_id="n1"))
    assert ids_on(broker, "inbox") == ["n1"]
    assert [d.message_id for d in drain(broker, sub)] == ["n1"]


def test_a_transaction_sent_to_a_composite_queue_is_routed_when_it_commits(broker):
    configure(broker, compositeQueue=[{"name": "x", "forwardTo": ["x.a", "x.b"]}])
    tx = broker.begin()
    broker.send("x", Message(body="t", message_id="t1"), tx=tx)
    assert "queue://x.a" not in broker.destinations()
    broker.commit(tx)
    assert ids_on(broker, "x.a") == ["t1"] and ids_on(broker, "x.b") == ["t1"] and ids_on(broker, "x") == []


def test_concurrent_producers_on_a_composite_reach_every_target_once_and_in_each_producers_order(
        redis_client, namespace):
    import threading

    from broker_core.clock import SystemClock

    broker = Broker(redis_client, namespace, SystemClock())
    configure(broker, compositeQueue=[{"name": "fan", "forwardTo": ["fan.a", "fan.b", "topic://fan.t"]}])

    def produce(n: int) -> None:
        for i in range(50):
            broker.send("fan", Message(body="m", message_id=f"p{n}-{i:03d}"))

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for target in ("fan.a", "fan.b"):
        got = ids_on(broker, target)
        assert sorted(got) == sorted(f"p{n}-{i:03d}" for n in range(4) for i in range(50))
        for n in range(4):  # each producer's messages in the order it sent them
            mine = [x for x in got if x.startswith(f"p{n}-")]
            assert mine == sorted(mine)
    assert broker.stats("fan").forwarding == 0 and broker.stats("fan").queue_size == 0


def test_a_process_keeps_a_routing_plan_only_until_the_configuration_changes(redis_client, namespace, broker):
    """A process keeps the plan it made for a destination (ops/virtual.py `origin`); a new configuration,
    made here or by another process, routes the next send by the new one."""
    configure(broker, compositeQueue=[{"name": "x", "forwardTo": ["y"]}])
    broker.send("x", Message(body="m", message_id="m1"))
    assert broker.ops.virtual.plans  # kept
    configure(broker, compositeQueue=[{"name": "x", "forwardTo": ["z"]}])
    broker.send("x", Message(body="m", message_id="m2"))
    other = Broker(redis_client, namespace, broker.clock)  # another process, with its own plans
    other.send("x", Message(body="m", message_id="m3"))
    assert ids_on(broker, "y") == ["m1"]
    assert ids_on(broker, "z") == ["m2", "m3"]
