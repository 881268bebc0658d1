"""A transaction's limits hold for every caller of broker_core, not only for the adapters that counted
them: its commit is one MULTI/EXEC that holds Redis for everyone (docs/broker_core.md, "Transactions").
A send or ack past a limit is refused before anything changes, naming its setting, and the transaction
stays as it was, to commit or roll back."""

from __future__ import annotations

import pytest

from broker_core.broker import Broker
from broker_core.errors import BrokerError
from broker_core.messages import Message

from ..helpers.broker import consumer, drain


def _limited(redis_client, namespace, clock, **limits) -> Broker:
    from broker_core.model import TransactionLimits
    return Broker(redis_client, namespace, clock, transaction_limits=TransactionLimits(**limits))


def _tx_state(redis_client, namespace, tx: str) -> list[bytes]:
    return redis_client.lrange(f"{namespace}:tx:{tx}", 0, -1)


def test_a_direct_send_past_the_default_size_is_refused_and_changes_nothing(broker, redis_client, namespace):
    """Broker.send(..., tx=...) was unbounded: 40,000 sends made a 4.7 s commit."""
    tx = broker.begin()
    broker.send("orders", [Message(body=f"m{n}") for n in range(200)], tx=tx)
    before = _tx_state(redis_client, namespace, tx)
    with pytest.raises(BrokerError) as refused:
        broker.send("orders", [Message(body=f"n{n}") for n in range(51)], tx=tx)
    assert refused.value.code == "transaction_too_large"
    assert "would hold 251 messages sent and acknowledged; the limit is 250 " \
           "(SIGNALBOX_MAX_TRANSACTION_SIZE)" in refused.value.message
    assert _tx_state(redis_client, namespace, tx) == before  # nothing added
    broker.send("orders", [Message(body=f"o{n}") for n in range(50)], tx=tx)  # up to the limit: taken
    broker.commit(tx)
    assert broker.stats("orders").queue_size == 250


@pytest.mark.parametrize(("limits", "sends", "setting", "held"), [
    ({"body_bytes": 10}, [("q1", ["é", "12345678"]), ("q1", ["x"])], "SIGNALBOX_MAX_TRANSACTION_BYTES", 11),
    ({"destinations": 2}, [("q1", ["a"]), ("q2", ["b"]), ("q3", ["c"])],
     "SIGNALBOX_MAX_TRANSACTION_DESTINATIONS", 3),
])
def test_each_limit_refuses_the_send_past_it(redis_client, namespace, clock, limits, sends, setting, held):
    broker = _limited(redis_client, namespace, clock, **limits)
    tx = broker.begin()
    *taken, (dest, over) = sends
    for name, bodies in taken:
        broker.send(name, [Message(body=b) for b in bodies], tx=tx)
    before = _tx_state(redis_client, namespace, tx)
    with pytest.raises(BrokerError) as refused:
        broker.send(dest, [Message(body=b) for b in over], tx=tx)
    assert refused.value.code == "transaction_too_large"
    assert refused.value.details["setting"] == setting and refused.value.details["held"] == held
    assert f"({setting})" in refused.value.message
    assert _tx_state(redis_client, namespace, tx) == before
    broker.commit(tx)  # what was taken commits
    assert sum(broker.stats(name).queue_size for name in {n for n, _ in taken}) == sum(
        len(bodies) for _, bodies in taken)


def test_a_composite_send_past_a_limit_adds_no_part(redis_client, namespace, clock):
    broker = _limited(redis_client, namespace, clock, destinations=2)
    tx = broker.begin()
    before = _tx_state(redis_client, namespace, tx)
    with pytest.raises(BrokerError) as refused:
        broker.send("a,b,topic://c", Message(body="m"), tx=tx)
    assert refused.value.code == "transaction_too_large"
    assert _tx_state(redis_client, namespace, tx) == before
    broker.send("a,b", Message(body="m"), tx=tx)
    broker.commit(tx)
    assert (broker.stats("a").queue_size, broker.stats("b").queue_size) == (1, 1)


def test_an_ack_past_a_limit_is_refused_before_its_messages_are_marked(redis_client, namespace, clock):
    broker = _limited(redis_client, namespace, clock, size=3)
    c = consumer(broker, prefetch=10, ack_mode="transacted", consumer_id="C")
    broker.send("orders", [Message(body=f"m{n}") for n in range(5)])
    ids = [d.message_id for d in drain(broker, c)]
    tx = broker.begin()
    broker.ack(c, ids[:2], tx=tx)
    before = _tx_state(redis_client, namespace, tx)
    with pytest.raises(BrokerError) as refused:
        broker.ack(c, ids[2:4], tx=tx)
    assert refused.value.code == "transaction_too_large"
    assert "would hold 4 messages sent and acknowledged; the limit is 3" in refused.value.message
    assert _tx_state(redis_client, namespace, tx) == before
    broker.commit(tx)
    assert (broker.stats("orders").dequeued, broker.stats("orders").in_flight) == (2, 3)
