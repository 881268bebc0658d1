"""Queue dispatch, spec §1: consumer order, round-robin, prefetch windows, message priority, close."""

from __future__ import annotations

from broker_core.messages import Message

from ...helpers.broker import consumer, drain


def send(broker, *bodies, dest="orders", **kw):
    return broker.send(dest, [Message(body=b, **kw) for b in bodies])


def bodies(deliveries):
    return [d.body for d in deliveries]


def test_equal_priority_consumers_receive_one_message_each_in_turn(broker):
    a = consumer(broker, prefetch=10, consumer_id="A")
    b = consumer(broker, prefetch=10, consumer_id="B")
    send(broker, *[f"m{i}" for i in range(6)])
    assert bodies(drain(broker, a)) == ["m0", "m2", "m4"]
    assert bodies(drain(broker, b)) == ["m1", "m3", "m5"]


def test_round_robin_with_prefetch_one_alternates_consumers(broker):
    a = consumer(broker, prefetch=1, consumer_id="A")
    b = consumer(broker, prefetch=1, consumer_id="B")
    send(broker, *[f"m{i}" for i in range(4)])
    seen = []
    for _ in range(2):
        for c in (a, b):
            (d,) = broker.receive(c)
            seen.append((c.consumer_id, d.body))
            broker.ack(c, d.message_id)
    assert seen == [("A", "m0"), ("B", "m1"), ("A", "m2"), ("B", "m3")]


def test_strict_order_dispatch_fills_the_first_consumer_before_the_next(broker, policy):
    policy("orders", strictOrderDispatch=True)
    a = consumer(broker, prefetch=3, consumer_id="A")
    b = consumer(broker, prefetch=3, consumer_id="B")
    send(broker, *[f"m{i}" for i in range(5)])
    assert bodies(drain(broker, a)) == ["m0", "m1", "m2"]
    assert bodies(drain(broker, b)) == ["m3", "m4"]


def test_higher_priority_consumer_always_wins_while_it_has_room(broker):
    low = consumer(broker, prefetch=10, priority=0, consumer_id="low")
    high = consumer(broker, prefetch=10, priority=5, consumer_id="high")
    send(broker, *[f"m{i}" for i in range(4)])
    assert bodies(drain(broker, high)) == ["m0", "m1", "m2", "m3"]
    assert drain(broker, low) == []


def test_lower_priority_consumer_gets_messages_only_when_the_higher_is_full(broker):
    high = consumer(broker, prefetch=2, priority=5, consumer_id="high")
    low = consumer(broker, prefetch=10, priority=0, consumer_id="low")
    send(broker, *[f"m{i}" for i in range(5)])
    assert bodies(drain(broker, high)) == ["m0", "m1"]
    assert bodies(drain(broker, low)) == ["m2", "m3", "m4"]


def test_in_flight_never_exceeds_prefetch_and_acks_open_the_window(broker):
    c = consumer(broker, prefetch=2)
    send(broker, *[f"m{i}" for i in range(5)])
    first = drain(broker, c)
    assert bodies(first) == ["m0", "m1"]
    assert broker.stats("orders").consumers[0].in_flight == 2
    broker.ack(c, first[0].message_id, mode="individual")
    assert bodies(drain(broker, c)) == ["m2"]


def test_delivered_ack_extends_the_prefetch_window_and_a_standard_ack_contracts_it(broker):
    c = consumer(broker, prefetch=2, ack_mode="client-individual")
    send(broker, *[f"m{i}" for i in range(6)])
    got = drain(broker, c)
    assert len(got) == 2
    broker.ack(c, [d.message_id for d in got], mode="delivered")  # window now 2 + 2
    more = drain(broker, c)
    assert bodies(more) == ["m2", "m3"]
    stats = broker.stats("orders").consumers[0]
    assert (stats.in_flight, stats.prefetch_extension) == (4, 2)
    broker.ack(c, got[0].message_id)  # an individual ack removes one and contracts the extension by one
    stats = broker.stats("orders").consumers[0]
    assert (stats.in_flight, stats.prefetch_extension) == (3, 1)
    assert drain(broker, c) == []  # 3 in flight - 1 extension = 2 = prefetch: still full


def test_prefetch_zero_consumer_pulls_one_message_per_receive(broker):
    c = consumer(broker, prefetch=0)
    send(broker, "m0", "m1", "m2")
    assert broker.stats("orders").in_flight == 0  # nothing is pushed to a pull consumer
    (d,) = broker.receive(c, 1)
    assert d.body == "m0"
    assert broker.stats("orders").in_flight == 1
    assert bodies(broker.receive(c, 1)) == ["m1"]


def test_pull_request_stands_until_cancelled(broker):
    c = consumer(broker, prefetch=0)
    assert broker.receive(c, 1) == []
    send(broker, "late")  # arrives while the receive call waits: dispatched to the standing pull
    assert bodies(broker.receive(c, 1)) == ["late"]
    assert broker.receive(c, 1) == []
    broker.cancel_pull(c)
    send(broker, "after")
    assert broker.stats("orders").in_flight == 1  # only "late"; "after" waits for the next pull


def test_policy_prefetch_replaces_only_the_client_default(broker, policy):
    policy("orders", queuePrefetch=7)
    assert consumer(broker).prefetch == 7
    assert consumer(broker, prefetch=1000).prefetch == 7
    assert consumer(broker, prefetch=10).prefetch == 10


def test_default_queue_prefetch_is_1000(broker):
    assert consumer(broker).prefetch == 1000


def test_without_prioritized_messages_dispatch_is_fifo_whatever_the_priority(broker):
    send(broker, "low", priority=1)
    send(broker, "high", priority=9)
    c = consumer(broker)
    assert bodies(drain(broker, c)) == ["low", "high"]


def test_prioritized_messages_dispatch_9_to_0_and_fifo_within_a_level(broker, policy):
    policy("orders", prioritizedMessages=True)
    for body, p in [("a4", 4), ("b9", 9), ("c0", 0), ("d9", 9), ("e4", 4)]:
        send(broker, body, priority=p)
    c = consumer(broker)
    assert bodies(drain(broker, c)) == ["b9", "d9", "a4", "e4", "c0"]


def test_a_message_nobody_takes_is_overtaken_by_later_ones(broker):
    c = consumer(broker, selector="kind = 'b'")
    send(broker, "first", properties={"kind": "a"})
    send(broker, "second", properties={"kind": "b"})
    assert bodies(drain(broker, c)) == ["second"]
    assert broker.stats("orders").pending == 1


def test_closing_a_consumer_returns_its_messages_with_the_counter_raised_and_redispatches(broker):
    a = consumer(broker, prefetch=2, consumer_id="A")
    send(broker, "m0", "m1")
    got = drain(broker, a)
    assert [d.redelivered for d in got] == [False, False]
    b = consumer(broker, prefetch=10, consumer_id="B")
    broker.close_consumer(a)
    again = drain(broker, b)
    assert bodies(again) == ["m0", "m1"]
    assert [d.redelivery_count for d in again] == [1, 1]
    assert [d.delivery_count for d in again] == [2, 2]


def test_messages_the_adapter_never_received_return_without_a_counter_bump(broker):
    a = consumer(broker, prefetch=2, consumer_id="A")
    send(broker, "m0", "m1")
    broker.receive(a, 1)  # m0 reached the client, m1 did not
    b = consumer(broker, prefetch=10, consumer_id="B")
    broker.close_consumer(a)
    assert [(d.body, d.redelivery_count) for d in drain(broker, b)] == [("m0", 1), ("m1", 0)]


def test_redelivered_messages_go_ahead_of_fresh_ones(broker):
    a = consumer(broker, prefetch=1, consumer_id="A")
    send(broker, "m0", "m1", "m2")
    drain(broker, a)
    broker.close_consumer(a)
    b = consumer(broker, prefetch=10, consumer_id="B")
    assert bodies(drain(broker, b)) == ["m0", "m1", "m2"]


def test_matching_messages_flow_behind_a_deep_non_matching_backlog(broker):
    send(broker, *[f"x{i}" for i in range(1000)], properties={"kind": "x"})
    send(broker, "wanted", properties={"kind": "y"})
    busy = consumer(broker, prefetch=1, selector="kind = 'x'", consumer_id="busy")
    picky = consumer(broker, prefetch=5, selector="kind = 'y'", consumer_id="picky")
    assert bodies(drain(broker, picky)) == ["wanted"]
    assert len(drain(broker, busy)) == 1
    assert broker.stats("orders").skipped >= 999  # counted for the console


def test_paused_queue_dispatches_nothing_until_resumed(broker):
    c = consumer(broker)
    broker.pause("orders")
    send(broker, "m0")
    assert drain(broker, c) == []
    broker.resume("orders")
    assert bodies(drain(broker, c)) == ["m0"]


def test_expired_message_is_not_dispatched_and_is_counted(broker, clock):
    send(broker, "soon", expiration=clock.now_ms() + 100)
    send(broker, "keeps")
    clock.advance(200)
    c = consumer(broker)
    assert bodies(drain(broker, c)) == ["keeps"]
    stats = broker.stats("orders")
    assert (stats.expired, stats.dequeued, stats.queue_size) == (1, 1, 1)


def test_message_expired_on_send_is_not_enqueued(broker, clock):
    send(broker, "late", expiration=clock.now_ms() - 1)
    stats = broker.stats("orders")
    assert (stats.enqueued, stats.queue_size, stats.expired_on_arrival) == (0, 0, 1)


def test_a_policy_file_applies_to_existing_destinations_when_loaded_at_run_time(broker, tmp_path):
    from broker_core.config.policy_map import load_policy_file

    send(broker, *[f"m{i}" for i in range(4)], priority=0)
    send(broker, "urgent", priority=9)
    path = tmp_path / "policies.toml"
    path.write_text('[[policy.entry]]\nqueue = ">"\n[[policy.entry]]\nqueue = "orders"\n'
                    'queuePrefetch = 5\nprioritizedMessages = true\n')
    broker.policies.load_from(load_policy_file(path))
    broker.refresh_policies()
    send(broker, "late-low", priority=0)
    send(broker, "late-high", priority=9)
    c = consumer(broker)
    assert c.prefetch == 5
    # messages sent before the change keep their FIFO places; later ones are ordered by priority
    first = drain(broker, c)
    assert bodies(first) == ["m0", "m1", "m2", "m3", "urgent"]
    broker.ack(c, first[-1].message_id)  # cumulative
    assert bodies(drain(broker, c)) == ["late-high", "late-low"]


def test_a_full_consumer_the_queue_tries_to_dispatch_to_is_marked_slow_until_it_has_room(broker, clock):
    c = consumer(broker, prefetch=1, ack_mode="client-individual")
    send(broker, "m0")
    assert broker.stats("orders").consumers[0].slow_since is None
    clock.advance(5)
    send(broker, "m1")  # the queue has a message for it, its window is full
    assert broker.stats("orders").consumers[0].slow_since == clock.now_ms()
    (m0,) = drain(broker, c)
    broker.ack(c, m0.message_id)  # room: m1 goes to it and it is not slow any more
    assert broker.stats("orders").consumers[0].slow_since is None


def test_consumer_priority_is_followed_as_consumers_of_other_priorities_come_and_go(broker):
    # A pass reads only the consumers it offers messages to while all have one priority (meta 'cprio');
    # a consumer of another priority sorts the order again, and once it has gone the others share in turn.
    a = consumer(broker, prefetch=10, consumer_id="A")
    b = consumer(broker, prefetch=10, consumer_id="B")
    send(broker, "m0", "m1")
    assert (bodies(drain(broker, a)), bodies(drain(broker, b))) == (["m0"], ["m1"])
    high = consumer(broker, prefetch=10, priority=5, consumer_id="high")
    low = consumer(broker, prefetch=10, priority=-5, consumer_id="low")
    send(broker, "m2", "m3")
    got = drain(broker, high)
    assert bodies(got) == ["m2", "m3"] and drain(broker, a) == drain(broker, b) == drain(broker, low) == []
    broker.ack(high, got[-1].message_id)
    broker.close_consumer(high)
    send(broker, "m4", "m5", "m6", "m7")
    assert (bodies(drain(broker, a)), bodies(drain(broker, b))) == (["m4", "m6"], ["m5", "m7"])
    assert drain(broker, low) == []
    broker.close_consumer(low)
    send(broker, "m8", "m9")
    assert (bodies(drain(broker, a)), bodies(drain(broker, b))) == (["m8"], ["m9"])


def test_a_lapsed_consumer_first_in_the_order_is_passed_over_and_the_others_share_in_turn(broker, clock):
    first = consumer(broker, prefetch=10, consumer_id="first", lease_ms=1000)
    others = [consumer(broker, prefetch=10, consumer_id=f"c{i}", lease_ms=10_000) for i in range(3)]
    clock.advance(1500)  # the first one's lease has lapsed; the reaper has not run
    send(broker, *[f"m{i}" for i in range(6)])
    assert drain(broker, first) == []
    assert [bodies(drain(broker, c)) for c in others] == [["m0", "m3"], ["m1", "m4"], ["m2", "m5"]]


def test_an_order_entry_whose_consumer_is_gone_is_passed_over_and_dropped(broker, redis_client, namespace):
    # Only a store changed outside the scripts has one (they write a consumer and its order entry together).
    a = consumer(broker, prefetch=10, consumer_id="A")
    b = consumer(broker, prefetch=10, consumer_id="B")
    order = f"{namespace}:{{q:orders}}:corder"
    redis_client.lpush(order, "ghost")
    send(broker, "m0", "m1", "m2")
    assert (bodies(drain(broker, a)), bodies(drain(broker, b))) == (["m0", "m2"], ["m1"])
    assert b"ghost" not in redis_client.lrange(order, 0, -1)


def test_a_consumer_full_in_an_earlier_pass_takes_its_turn_once_it_has_room(broker):
    # §1.4: doActualDispatch starts each pass with an empty fullConsumers set, so B, full when m3 came and
    # passed over then, is first in turn for m4 once its ack made room (A/B round-robin, B next); seen on
    # ActiveMQ 5.17.2 in a run of random sends, acks and closes against Debian's package.
    b = consumer(broker, prefetch=1, ack_mode="client-individual", consumer_id="B")
    c = consumer(broker, prefetch=3, ack_mode="client-individual", consumer_id="C")
    send(broker, "m1", "m2")
    (m1,) = drain(broker, b)
    assert bodies(drain(broker, c)) == ["m2"]
    send(broker, "m3")  # B is full: C takes it
    assert bodies(drain(broker, c)) == ["m3"]
    broker.ack(b, m1.message_id, mode="individual")
    send(broker, "m4")
    assert bodies(drain(broker, b)) == ["m4"]
    assert drain(broker, c) == []
