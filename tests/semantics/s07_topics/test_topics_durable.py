"""Durable topic subscriptions (spec §7.4) and their offline timeout."""

from __future__ import annotations

import msgpack
import pytest

from broker_core import maintenance
from broker_core.broker import Broker
from broker_core.destinations import parse_destination
from broker_core.errors import DurableSubscriptionInUse, InvalidConsumer, UnknownSubscription
from broker_core.messages import Message
from broker_core.model import ConsumerSpec

from ...helpers.broker import drain
from .test_topics import bodies, stored, sub

T = "topic://news"


def durable(broker: Broker, dest: str = T, client: str = "app", name: str = "audit", **kw):
    return sub(broker, dest, client_id=client, subscription_name=name, **kw)


def offline_durable(broker: Broker, **kw):
    d = durable(broker, **kw)
    broker.close_consumer(d)
    return d


def test_an_offline_durable_subscription_keeps_receiving(broker):
    offline_durable(broker)
    broker.send(T, [Message(body=str(i)) for i in range(3)])
    [info] = broker.subscriptions(T)
    assert info.durable and not info.active and info.pending == 3 and info.offline_since is not None
    again = durable(broker)
    assert bodies(drain(broker, again)) == ["0", "1", "2"]


def test_unacked_messages_come_back_redelivered_when_the_durable_subscriber_returns(broker):
    d = durable(broker)
    broker.send(T, [Message(body="a"), Message(body="b")])
    [a, _b] = broker.receive(d, 2)
    broker.ack(d, a.message_id)
    broker.close_consumer(d)
    again = durable(broker)
    [b] = broker.receive(again)
    assert b.body == "b" and b.redelivered


def test_a_durable_subscription_survives_a_new_broker_instance(broker, redis_client, namespace, clock):
    offline_durable(broker)
    broker.send(T, Message(body="kept"))
    restarted = Broker(redis_client, namespace, clock)
    again = durable(restarted)
    assert bodies(drain(restarted, again)) == ["kept"]


def test_messages_a_durable_selector_does_not_match_are_not_kept(broker):
    offline_durable(broker, selector="kind = 'keep'")
    broker.send(T, [Message(body="k", properties={"kind": "keep"}),
                    Message(body="x", properties={"kind": "no"})])
    [info] = broker.subscriptions(T)
    assert info.pending == 1
    assert stored(broker, T) == 1
    assert broker.stats(T).no_subscription == 1


def test_a_second_active_subscriber_on_the_same_durable_key_is_refused_with_activemqs_text(broker):
    durable(broker)
    with pytest.raises(DurableSubscriptionInUse) as err:
        durable(broker)
    assert str(err.value) == "Durable consumer is in use for client: app and subscriptionName: audit"


def test_resubscribing_with_another_selector_replaces_the_subscription_and_drops_its_messages(broker):
    offline_durable(broker, selector="n > 1")
    broker.send(T, [Message(body=str(n), properties={"n": n}) for n in range(4)])
    assert broker.subscriptions(T)[0].pending == 2
    again = durable(broker, selector="n < 1")
    assert drain(broker, again) == []
    assert stored(broker, T) == 0
    assert broker.stats(T).removed_with_subscription == 2
    broker.send(T, [Message(body=str(n), properties={"n": n}) for n in range(2)])
    assert bodies(drain(broker, again)) == ["0"]


def test_resubscribing_with_the_same_selector_keeps_the_messages(broker):
    offline_durable(broker, selector="n > 1")
    broker.send(T, [Message(body=str(n), properties={"n": n}) for n in range(4)])
    again = durable(broker, selector="n > 1")
    assert bodies(drain(broker, again)) == ["2", "3"]



def test_resubscribing_with_no_local_changed_replaces_the_subscription_and_drops_its_messages(broker):
    """§7.4: TopicRegion.hasDurableSubChanged compares noLocal on a NoLocalSubscriptionAware store (KahaDB,
    the memory store); ActiveMQ 5.17.2 dropped the kept message either way the flag changed
    (09_durable_retroactive.json, resubscribing_with_no_local_turned_*)."""
    for before, after in ((False, True), (True, False)):
        name = f"nl-{before}"
        offline_durable(broker, name=name, no_local=before, connection_id="conn-1")
        broker.send(T, Message(body="kept", connection_id="conn-2"))
        again = durable(broker, name=name, no_local=after, connection_id="conn-1")
        assert drain(broker, again) == []
        broker.send(T, Message(body="later", connection_id="conn-2"))
        assert bodies(drain(broker, again)) == ["later"]
        broker.close_consumer(again)
    offline_durable(broker, name="same", no_local=True, connection_id="conn-1")
    broker.send(T, Message(body="kept", connection_id="conn-2"))
    same = durable(broker, name="same", no_local=True, connection_id="conn-3")
    assert bodies(drain(broker, same)) == ["kept"]

def test_a_stomp_selector_is_kept_as_activemq_holds_it_and_one_kept_before_without_is_the_same(
        broker, redis_client):
    """A STOMP subscription's selector is kept with ActiveMQ's `convert_string_expressions:` prefix (its
    ProtocolConverter adds it, and its advisories and views show it); a durable subscription stored before
    that, without it, is still the same selector when its STOMP subscriber comes back (not replaced)."""
    offline_durable(broker, selector="n > 1", stomp_selector=True)
    [info] = broker.subscriptions(T)
    assert info.selector == "convert_string_expressions:n > 1"
    subs = f"{broker.ops.prefix(parse_destination(T))}:subs"
    [(key, packed)] = redis_client.hgetall(subs).items()
    old = msgpack.unpackb(packed)
    old["selector_text"] = "n > 1"  # as stored before the prefix was kept
    redis_client.hset(subs, key, msgpack.packb(old))
    broker.send(T, [Message(body=str(n), properties={"n": str(n)}) for n in range(4)])
    again = durable(broker, selector="n > 1", stomp_selector=True)
    assert bodies(drain(broker, again)) == ["2", "3"]  # kept (and STOMP's string coercion applied)


def test_resubscribing_on_another_topic_replaces_the_subscription(broker):
    offline_durable(broker)
    broker.send(T, Message(body="old"))
    moved = durable(broker, "topic://other")
    assert broker.subscriptions(T) == []
    assert stored(broker, T) == 0
    broker.send("topic://other", Message(body="new"))
    assert bodies(drain(broker, moved)) == ["new"]


def test_resubscribing_on_another_topic_while_active_is_refused(broker):
    durable(broker)
    with pytest.raises(DurableSubscriptionInUse):
        durable(broker, "topic://other")


def test_unsubscribe_removes_an_offline_subscription_and_its_messages(broker):
    offline_durable(broker)
    broker.send(T, [Message(body="a"), Message(body="b")])
    assert broker.unsubscribe(T, client_id="app", subscription_name="audit") == 2
    assert broker.subscriptions(T) == []
    assert stored(broker, T) == 0
    fresh = durable(broker)
    assert drain(broker, fresh) == []


def test_unsubscribe_while_active_is_refused_and_changes_nothing(broker):
    d = durable(broker)
    broker.send(T, Message(body="a"))
    with pytest.raises(DurableSubscriptionInUse) as err:
        broker.unsubscribe(T, client_id="app", subscription_name="audit")
    assert str(err.value) == "Durable consumer is in use"
    assert bodies(drain(broker, d)) == ["a"]


def test_unsubscribe_of_an_unknown_subscription_names_it(broker):
    broker.ensure_destination(T)
    with pytest.raises(UnknownSubscription) as err:
        broker.unsubscribe(T, client_id="app", subscription_name="nope")
    assert str(err.value) == "No durable subscription exists for clientID: app and subscriptionName: nope"


def test_a_durable_subscription_needs_a_client_id(broker):
    with pytest.raises(InvalidConsumer):
        broker.add_consumer(T, ConsumerSpec(subscription_name="s"))


def test_a_lapsed_durable_consumer_goes_offline_and_keeps_its_messages(broker, clock):
    d = durable(broker, lease_ms=1_000)
    broker.send(T, Message(body="a"))
    broker.receive(d)
    clock.advance(2_000)
    assert broker.reap_lapsed(T) == [d.consumer_id]
    [info] = broker.subscriptions(T)
    assert not info.active and info.pending == 1
    again = durable(broker)
    [a] = broker.receive(again)
    assert a.body == "a" and a.redelivered


def test_stats_count_active_and_offline_durables(broker):
    durable(broker, name="one")
    offline_durable(broker, name="two")
    sub(broker, T)
    st = broker.stats(T)
    assert (st.durable_active, st.durable_offline, len(st.subscriptions)) == (1, 1, 3)


def test_offline_timeout_is_off_by_default(broker, clock):
    offline_durable(broker)
    clock.advance(10 * 86_400_000)
    assert broker.expire_offline_durables(T) == []
    assert maintenance.run_offline_durable_cleanup(broker, T) == []
    assert len(broker.subscriptions(T)) == 1


def test_offline_durables_past_the_timeout_are_removed_with_their_messages(broker, clock):
    broker.policies.set_entry("topic", ">", {"offlineDurableSubscriberTimeout": 60_000,
                                             "offlineDurableSubscriberTaskSchedule": 1_000})
    offline_durable(broker, name="old")
    durable(broker, name="online")
    broker.send(T, [Message(body="a"), Message(body="b")])
    clock.advance(59_999)
    assert maintenance.run_offline_durable_cleanup(broker, T) == []
    clock.advance(1_000)
    [removed] = maintenance.run_offline_durable_cleanup(broker, T)
    names = [s.subscription_name for s in broker.subscriptions(T)]
    assert names == ["online"] and removed.startswith("d.")
    st = broker.stats(T)
    assert st.removed_with_subscription == 2
    assert stored(broker, T) == 2  # still held by "online"


def test_the_offline_cleanup_runs_every_task_schedule_from_the_maintenance_tick(broker, clock):
    broker.policies.set_entry("topic", ">", {"offlineDurableSubscriberTimeout": 1_000,
                                             "offlineDurableSubscriberTaskSchedule": 300_000})
    offline_durable(broker, name="a")
    first = maintenance.run_due(broker)  # runs at once, nothing old enough yet
    assert first.offline_removed == []
    clock.advance(2_000)
    assert maintenance.run_due(broker).offline_removed == []  # the next run is 300 s after the first
    clock.advance(300_000)
    report = maintenance.run_due(broker)
    assert len(report.offline_removed) == 1 and report.offline_removed[0].startswith(T + "#d.")
    # A removed subscription's key is free again: subscribing creates a new, empty one.
    assert drain(broker, durable(broker, name="a")) == []


def test_a_durable_subscriber_back_on_another_connection_is_no_local_to_that_one(broker):
    """§7.3, §7.4: a reactivated durable subscription takes its new consumer's info (ActiveMQ's
    DurableTopicSubscription.activate), so noLocal compares publishers with the connection it is back on."""
    d = durable(broker, no_local=True, connection_id="conn-1")
    broker.close_consumer(d)
    again = durable(broker, no_local=True, connection_id="conn-2")
    broker.send(T, [Message(body="from-2", connection_id="conn-2"),
                    Message(body="from-1", connection_id="conn-1")])
    assert bodies(drain(broker, again)) == ["from-1"]


def test_a_durable_subscriber_back_with_another_priority_keeps_its_place_among_equals(broker):
    """PriorityDispatchPolicy sorts the topic's subscriptions by their consumers' priorities, equal ones in
    the order they were made (a stable sort of Topic.consumers, where a reactivated durable subscription
    keeps its place): back with priority 9, the oldest goes first among the 9s."""
    from .test_topics import events
    broker.policies.set_entry("topic", ">", {"dispatchPolicy": "priority"})
    d = durable(broker, priority=0, consumer_id="old")
    b = sub(broker, T, consumer_id="b", priority=9)
    c = sub(broker, T, consumer_id="c", priority=9)
    low = sub(broker, T, consumer_id="low", priority=1)
    broker.close_consumer(d)
    again = durable(broker, priority=9, consumer_id="back")
    [mid] = broker.send(T, Message(body="x"))
    order = [e["consumer"] for e in events(broker, T) if e["type"] == "dispatch" and e["msg"] == mid]
    assert order == [again.consumer_id, b.consumer_id, c.consumer_id, low.consumer_id]
    # and back at priority 0 it goes after every other
    broker.close_consumer(again)
    last = durable(broker, priority=0, consumer_id="last")
    [mid] = broker.send(T, Message(body="y"))
    order = [e["consumer"] for e in events(broker, T) if e["type"] == "dispatch" and e["msg"] == mid]
    assert order == [b.consumer_id, c.consumer_id, low.consumer_id, last.consumer_id]
