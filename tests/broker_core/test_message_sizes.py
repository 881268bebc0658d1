"""A destination's message sizes (ActiveMQ's DestinationStatistics messageSize: AverageMessageSize,
MinMessageSize, MaxMessageSize), kept by the scripts where a message is counted enqueued, each at the size
its memory usage counts; on both script forms (the function library keeps the last value it made between
calls, EVAL does not: test_script_forms.py), with sends to several destinations interleaved, so a value is
read back both as the one the library made last and as another's."""

from __future__ import annotations

import uuid

from broker_core.broker import Broker
from broker_core.messages import Message
from broker_core.model import MessageSizes

from ..helpers.broker import consumer, drain
from .test_script_forms import client7, functions_url  # noqa: F401  (fixtures: a Redis >= 7)
from .test_sizes import sized  # noqa: F401, F811  (the fixture: a Broker on each script form)


def size_of(broker: Broker, body: str, **fields) -> int:
    """What one message of `body` (and `fields`) counts: its memory charge, alone on a queue of its own."""
    dest = f"alone.{uuid.uuid4().hex[:8]}"
    broker.send(dest, Message(body=body, **fields))
    return broker.stats(dest).memory_usage


def expected(*sizes: int) -> MessageSizes:
    return MessageSizes(len(sizes), sum(sizes), min(sizes), max(sizes))


def test_sizes_of_interleaved_sends_and_batches(sized):  # noqa: F811
    broker = sized
    a, b, c, small = (size_of(broker, "a" * 3000), size_of(broker, "b" * 5000), size_of(broker, "c" * 9000),
                      size_of(broker, "s"))
    assert small == 1024 and a < b < c  # (the floor: minimumMessageSize)
    broker.send("one", Message(body="b" * 5000))
    broker.send("two", Message(body="c" * 9000))
    broker.send("one", [Message(body="a" * 3000), Message(body="s")])  # a batch: smaller than the first
    broker.send("two", Message(body="a" * 3000))
    broker.send("one", Message(body="c" * 9000))  # larger than any before
    broker.send("one", Message(body="b" * 5000))  # neither
    assert broker.stats("one").message_sizes == expected(b, a, small, c, b)
    assert broker.stats("two").message_sizes == expected(c, a)
    assert broker.stats("one").message_sizes.average == (b + a + small + c + b) // 5


def test_what_counts_is_what_is_counted_enqueued(sized, clock):  # noqa: F811
    broker = sized
    a, b = size_of(broker, "a" * 3000), size_of(broker, "b" * 5000)
    late = size_of(broker, "b" * 5000, delay_ms=1_000)  # (its delay is packed too)
    broker.send("q", Message(message_id="m1", body="a" * 3000))
    broker.send("q", Message(message_id="m1", body="a" * 3000))  # a duplicate: not enqueued again
    broker.send("q", Message(body="b" * 9000, expiration=1))  # expired on arrival: not enqueued
    broker.send("q", Message(body="b" * 5000, delay_ms=1_000))  # enqueued when it arrives
    stats = broker.stats("q")
    assert stats.enqueued == 1 and stats.message_sizes == expected(a)
    c = consumer(broker, "q")
    assert [d.body for d in drain(broker, c)] == ["a" * 3000]
    clock.advance(1_000)
    assert [d.body for d in drain(broker, c)] == ["b" * 5000]
    stats = broker.stats("q")
    assert stats.enqueued == 2 and stats.message_sizes == expected(a, late)  # consumed, still counted
    # a topic counts what it is sent, taken by a subscription or not (Topic.dispatch)
    broker.send("topic://t", [Message(body="a" * 3000), Message(body="b" * 5000)])
    assert broker.stats("topic://t").message_sizes == expected(a, b)
