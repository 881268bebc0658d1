"""A transaction's commit stays all-or-nothing when one of its calls fails other than by refusing: a Lua
runtime error (a script error, not its error reply) or a call Redis refuses before it runs."""

from __future__ import annotations

import pytest

from broker_core.errors import TransactionError
from broker_core.messages import Message

from ..helpers.broker import consumer, drain


def test_a_step_that_dies_with_a_runtime_error_applies_nothing_after_it(broker, redis_client, namespace):
    """A step's script that raises (here: WRONGTYPE from a corrupted consumer key) never reaches the
    end of its call, where a refusal is recorded: the later steps must not apply, nor the commit end."""
    c = consumer(broker, prefetch=10, ack_mode="transacted", consumer_id="C")
    broker.send("orders", Message(body="m0"))
    (d,) = drain(broker, c)
    tx = broker.begin()
    broker.send("audit", Message(body="in-tx"), tx=tx)
    broker.ack(c, d.message_id, tx=tx)
    (inflight,) = [k for k in redis_client.keys(f"{namespace}*") if b"inflight" in k and b"C" in k]
    saved = redis_client.dump(inflight)
    redis_client.delete(inflight)
    redis_client.set(inflight, b"corrupt")  # the ack's ZSCORE raises WRONGTYPE
    with pytest.raises(TransactionError):
        broker.commit(tx)
    assert broker.stats("audit").enqueued == 0  # the send after the check that died did not land
    redis_client.delete(inflight)
    redis_client.restore(inflight, 0, saved)
    broker.commit(tx)  # still open, whole
    assert (broker.stats("audit").enqueued, broker.stats("orders").dequeued) == (1, 1)
