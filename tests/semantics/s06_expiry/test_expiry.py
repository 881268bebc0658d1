"""Expiry (spec §6): an expired message is dead-lettered with its expiration and cause, or dropped with
processExpired off; one that expires on arrival or before the adapter takes it is never delivered; the
sweep walks the queue page by page (those moved from test_redelivery.py unchanged); a non-durable topic
subscriber's message that expired while pending is discarded, as 5.17.2 does."""

from __future__ import annotations

from broker_core.messages import Message
from broker_core.model import ConsumerSpec

from ...helpers.broker import consumer, drain

DLQ = "ActiveMQ.DLQ"


def test_an_expired_persistent_message_lands_in_the_dlq_with_its_expiration_and_cause(broker, clock):
    expiration = clock.now_ms() + 50
    (sent,) = broker.send("orders", Message(body="stale", expiration=expiration))
    clock.advance(100)
    result = broker.sweep_expired("orders")
    assert (result.examined, result.expired, result.done) == (1, 1, True)
    (dead,) = drain(broker, consumer(broker, DLQ))
    assert dead.message_id == sent
    assert dead.properties["originalExpiration"] == expiration  # a long beyond int range
    cause = dead.properties["dlqDeliveryFailureCause"]
    assert cause == f"java.lang.Throwable: Message Expired. Expiration:{expiration}"
    assert dead.expiration == 0  # never expires in the DLQ
    assert broker.stats("orders").expired == 1


def test_expired_on_arrival_goes_to_the_dlq_but_is_not_enqueued(broker, clock):
    (sent,) = broker.send("orders", Message(body="late", expiration=clock.now_ms() - 1))
    assert sent.status == "expired"
    assert broker.stats("orders").enqueued == 0
    assert [d.body for d in drain(broker, consumer(broker, DLQ))] == ["late"]


def test_process_expired_off_drops_expired_messages(broker, policy, clock):
    policy("orders", processExpired=False)
    broker.send("orders", Message(body="stale", expiration=clock.now_ms() + 10))
    clock.advance(20)
    assert broker.dispatch("orders").dispatched == 0
    consumer(broker)  # the dispatch pass finds it expired
    stats = broker.stats("orders")
    assert (stats.expired, stats.discarded, stats.deadlettered) == (1, 1, 0)


def test_a_message_that_expires_before_the_adapter_takes_it_is_never_delivered(broker, clock):
    c = consumer(broker, prefetch=5)
    broker.send("orders", [Message(body="short", expiration=clock.now_ms() + 10), Message(body="ok")])
    clock.advance(20)
    assert [d.body for d in drain(broker, c)] == ["ok"]
    assert broker.stats("orders").expired == 1


def test_the_sweep_walks_the_queue_page_by_page_and_leaves_in_flight_messages_alone(broker, policy, clock):
    policy("orders", maxExpirePageSize=10)
    c = consumer(broker, prefetch=3)
    broker.send("orders", [Message(body=str(i), expiration=clock.now_ms() + 10) for i in range(25)])
    assert broker.stats("orders").in_flight == 3
    clock.advance(20)
    pages = []
    while True:
        result = broker.sweep_expired("orders")
        pages.append((result.examined, result.expired))
        if result.done:
            break
    assert pages == [(10, 10), (10, 10), (2, 2)]
    stats = broker.stats("orders")
    assert (stats.expired, stats.in_flight, stats.pending) == (22, 3, 0)
    del c


def test_a_non_durable_subscribers_message_that_expired_while_pending_is_discarded(broker, clock):
    """ActiveMQ 5.17.2's TopicSubscription.dispatchMatched gives a message that expired while it waited in
    the subscription's pending list to discard(): counted in the subscription's DiscardedCount (here
    `evicted`) and the topic's dequeues, not as expired, and dead-lettered with the cause
    `TopicSubDiscard. ID:<consumer id>` (5.19's discard(message, expired=true) calls messageExpired)."""
    t = "topic://prices"
    c = broker.add_consumer(t, ConsumerSpec(prefetch=1, ack_mode="client-individual"), consumer_id="sub-1")
    broker.send(t, [Message(body="a"), Message(body="b", expiration=clock.now_ms() + 10)])
    clock.advance(100)
    [a] = broker.receive(c)
    broker.ack(c, a.message_id)  # "b", pending behind the full window, is dispatched now: expired
    assert broker.receive(c) == []
    (s,) = broker.subscriptions(t)
    assert (s.expired, s.evicted, s.deadlettered) == (0, 1, 1)
    stats = broker.stats(t)
    assert (stats.expired, stats.evicted, stats.dequeued) == (0, 1, 2)
    (dead,) = drain(broker, consumer(broker, DLQ))
    assert (dead.body, dead.original_destination) == ("b", t)
    assert dead.properties["dlqDeliveryFailureCause"] == "java.lang.Throwable: TopicSubDiscard. ID:sub-1"


def test_processexpired_off_drops_a_non_durable_subscribers_discarded_expired_message(broker, clock):
    """The discard of a message that expired while pending goes through sendToDeadLetterQueue, whose
    strategy's isSendToDeadLetterQueue refuses any expired message without processExpired, whatever the
    cause (AbstractDeadLetterStrategy, 5.17.2): discarded (DiscardedCount), not dead-lettered."""
    broker.policies.set_entry("topic", "prices", {"processExpired": False})
    broker.refresh_policies()
    t = "topic://prices"
    c = broker.add_consumer(t, ConsumerSpec(prefetch=1, ack_mode="client-individual"), consumer_id="sub-1")
    broker.send(t, [Message(body="a"), Message(body="b", expiration=clock.now_ms() + 10)])
    clock.advance(100)
    [a] = broker.receive(c)
    broker.ack(c, a.message_id)  # "b" is dispatched now: expired, discarded
    assert broker.receive(c) == []
    (s,) = broker.subscriptions(t)
    assert (s.evicted, s.deadlettered, s.discarded) == (1, 0, 1)
    assert "queue://ActiveMQ.DLQ" not in broker.destinations()


def test_a_durable_subscribers_message_that_expired_while_pending_expires(broker, clock):
    """A durable subscription is a prefetch subscription (PrefetchSubscription.dispatchPending): the
    message expires (Topic.messageExpired), dead-lettered with the expiry's cause."""
    t = "topic://prices"
    spec = ConsumerSpec(prefetch=1, ack_mode="client-individual", client_id="c", subscription_name="d")
    c = broker.add_consumer(t, spec)
    expiration = clock.now_ms() + 10
    broker.send(t, [Message(body="a"), Message(body="b", expiration=expiration)])
    clock.advance(100)
    [a] = broker.receive(c)
    broker.ack(c, a.message_id)
    assert broker.receive(c) == []
    (s,) = broker.subscriptions(t)
    assert (s.expired, s.evicted) == (1, 0)
    (dead,) = drain(broker, consumer(broker, DLQ))
    cause = dead.properties["dlqDeliveryFailureCause"]
    assert cause == f"java.lang.Throwable: Message Expired. Expiration:{expiration}"


def test_a_non_durable_subscribers_message_that_expired_in_its_window_is_counted_expired_only(broker, clock):
    """Dispatched, then expired before the adapter took it: the client's consumer expiry check would send
    an EXPIRED ack, which ActiveMQ's TopicSubscription.acknowledge only counts (ExpiredCount, dequeues):
    no dead letter, no Expired advisory (a queue's or durable subscription's EXPIRED ack goes to
    messageExpired: test_a_message_that_expires_before_the_adapter_takes_it_is_never_delivered)."""
    from broker_core.ops import advisory

    t = "topic://prices"
    watcher = broker.add_consumer(advisory.topic("Expired", t), ConsumerSpec(ack_mode="auto"))
    c = broker.add_consumer(t, ConsumerSpec(prefetch=5, ack_mode="client-individual"))
    broker.send(t, [Message(body="brief", expiration=clock.now_ms() + 10), Message(body="ok")])
    clock.advance(100)
    assert [d.body for d in drain(broker, c)] == ["ok"]
    (s,) = broker.subscriptions(t)
    assert (s.expired, s.deadlettered, s.discarded, s.evicted) == (1, 0, 0, 0)
    assert (broker.stats(t).expired, broker.stats(t).dequeued) == (1, 1)
    assert "queue://ActiveMQ.DLQ" not in broker.destinations()
    assert drain(broker, watcher) == []


def test_a_topics_sweep_expires_for_offline_durable_subscriptions_only(broker, clock):
    """Topic.doBrowse, the topic's expiry task in 5.17.2, expires a stored message for each durable
    subscription that is not active (BrokerService's enableMessageExpirationOnActiveDurableSubs, default
    false, is not offered); an active subscriber's pending message waits for its dispatch, and a
    non-durable subscription's is never swept. With two offline subscriptions the dead-letter queue's
    audit keeps one copy."""
    t = "topic://prices"
    offline = [broker.add_consumer(t, ConsumerSpec(client_id=n, subscription_name="s")) for n in ("a", "b")]
    for c in offline:
        broker.close_consumer(c)
    active = broker.add_consumer(t, ConsumerSpec(client_id="c", subscription_name="s", prefetch=1,
                                                 ack_mode="client-individual"))
    plain = broker.add_consumer(t, ConsumerSpec(prefetch=1, ack_mode="client-individual"))
    broker.send(t, [Message(body="held"), Message(body="brief", expiration=clock.now_ms() + 10)])
    clock.advance(100)
    while not broker.sweep_expired(t).done:
        pass
    expired = {(s.client_id, s.durable): (s.expired, s.pending) for s in broker.subscriptions(t)}
    assert expired == {("a", True): (1, 1), ("b", True): (1, 1), ("c", True): (0, 1), (None, False): (0, 1)}
    assert len(drain(broker, consumer(broker, DLQ))) == 1
    del active, plain


def test_expired_on_arrival_counts_as_expired_on_a_topic_and_not_on_a_queue(broker, clock):
    """Topic.send counts an expired message in ExpiredCount as it expires it; Queue.send does not
    ("message not stored - or added to stats yet")."""
    t = "topic://prices"
    broker.add_consumer(t, ConsumerSpec())
    broker.send(t, Message(body="late", expiration=clock.now_ms() - 1))
    broker.send("orders", Message(body="late", expiration=clock.now_ms() - 1))
    topic, queue = broker.stats(t), broker.stats("orders")
    assert (topic.expired, topic.expired_on_arrival, topic.enqueued) == (1, 1, 0)
    assert (queue.expired, queue.expired_on_arrival, queue.enqueued) == (0, 1, 0)


def test_a_message_that_expired_while_its_producer_waited_for_space_counts_expired(redis_client, namespace):
    """Queue.send's waiting send finds it expired once there is room: messageExpired (the DLQ) and
    ExpiredCount, not stored."""
    import threading
    import time

    from broker_core.broker import Broker
    from broker_core.clock import SystemClock

    from ...helpers.broker import KB

    broker = Broker(redis_client, namespace, SystemClock())
    broker.policies.set_entry("queue", "orders", {"memoryLimit": 2 * 1100})
    broker.send("orders", [Message(body=KB), Message(body=KB)])
    c = consumer(broker, "orders", prefetch=1)

    def consume_later():
        time.sleep(0.5)
        broker.ack(c, broker.receive(c, 1)[0].message_id)

    worker = threading.Thread(target=consume_later)
    worker.start()
    (sent,) = broker.send("orders", Message(body=KB, expiration=int(time.time() * 1000) + 200))
    worker.join()
    stats = broker.stats("orders")
    assert sent.status == "expired"
    assert (stats.expired, stats.expired_on_arrival, stats.enqueued, stats.deadlettered) == (1, 1, 2, 1)
