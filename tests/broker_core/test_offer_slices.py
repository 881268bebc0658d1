"""A queue message offered to many consumers with selectors (issue 21; includes/dispatch.lua 'offered'):
the dispatch chunk ends once its selector work reaches a call's worth, even in the middle of offering one
message, and the next chunk offers that message only to the consumers whose selectors have not refused it
yet. Each test runs in both script forms."""

from __future__ import annotations

import pytest

from broker_core.destinations import parse_destination
from broker_core.messages import Message

from ..helpers.broker import consumer, drain
from .test_chunked_close import calls

BIG = 100_000  # each evaluation of s LIKE '%Q' / '%Z' runs through about this many bytes
REFUSING = 12  # about three evaluations per call's worth (256 KiB)


@pytest.fixture(params=[True, False], ids=["functions", "eval"])
def form(request, broker):
    broker.driver.functions = request.param
    return broker


def test_one_message_offered_to_many_selector_consumers_goes_on_across_chunks(form, redis_client):
    broker = form
    refusing = [consumer(broker, prefetch=10, selector="s LIKE '%Q'", consumer_id=f"r{i}")
                for i in range(REFUSING)]
    taker = consumer(broker, prefetch=10, selector="s LIKE '%Z'", consumer_id="taker")
    message = Message(body="x", message_id="big", properties={"s": "a" * BIG + "Z"})
    names = [name for name, _ in calls(broker, broker.ops.send(parse_destination("orders"), [message],
                                                               broker._now()))]
    # 13 evaluations of ~100 kB: the send's chunk and at least three more
    assert names[0] == "send" and names.count("dispatch") >= 3
    assert [d.message_id for d in drain(broker, taker)] == ["big"]
    assert all(drain(broker, c) == [] for c in refusing)
    p = f"{broker.namespace}:{{q:orders}}"
    assert redis_client.hget(f"{p}:meta", "offered") in (None, b"")
    # each refusing selector was evaluated once: no errors, and the next message starts afresh
    assert int(redis_client.hget(f"{p}:meta", "selector_errors") or 0) == 0
    broker.send("orders", Message(body="y", message_id="small", properties={"s": "Q"}))
    assert [d.message_id for d in drain(broker, refusing[0])] == ["small"]


def test_a_consumer_closed_between_chunks_is_offered_the_message_again_when_it_comes_back(form, redis_client):
    broker = form
    first = consumer(broker, prefetch=10, selector="s LIKE '%Q'", consumer_id="r0")
    for i in range(1, REFUSING):
        consumer(broker, prefetch=10, selector="s LIKE '%Q'", consumer_id=f"r{i}")
    message = Message(body="x", message_id="big", properties={"s": "a" * BIG + "Z"})
    driving = calls(broker, broker.ops.send(parse_destination("orders"), [message], broker._now()))
    for name, _ in driving:
        if name == "send":
            break
    driving.close()  # the rest of the pass is left for later
    p = f"{broker.namespace}:{{q:orders}}"
    assert redis_client.hget(f"{p}:meta", "offered").endswith(b"|big")
    broker.close_consumer(first)  # forgets the record: r0's answer was for its old selector
    again = consumer(broker, prefetch=10, selector="s LIKE '%Z'", consumer_id="r0")
    broker.dispatch("orders")
    assert [d.message_id for d in drain(broker, again)] == ["big"]


def test_selector_aware_routing_past_a_calls_work_gives_the_queue_its_copy(form, redis_client):
    """selectorAware checks a virtual topic's consumer queue's consumers' selectors in the send: past a
    call's worth of selector work the queue gets the copy unchecked (forward.lua forward.work_spent), so many
    consumers cannot hold one send longer; the copy waits there like any message nobody selects."""
    from broker_core.config.virtual import VirtualConfig
    from broker_core.ops import virtual

    broker = form
    virtual.configure(broker, VirtualConfig.from_config(
        {"virtualTopic": [{"name": "VirtualTopic.>", "selectorAware": True}]}))
    q = "Consumer.a.VirtualTopic.Orders"
    for i in range(REFUSING):
        consumer(broker, q, prefetch=10, selector="s LIKE '%Q'", consumer_id=f"r{i}")
    small = "Consumer.b.VirtualTopic.Orders"
    consumer(broker, small, prefetch=10, selector="s LIKE '%Q'", consumer_id="s0")
    big = Message(body="x", message_id="big", properties={"s": "a" * BIG + "Z"})
    broker.send("topic://VirtualTopic.Orders", big)
    # queue a's consumers were checked until the work was spent: it got the copy; b's one consumer, after
    # that, was not checked either
    assert broker.stats(q).queue_size == 1 and broker.stats(small).queue_size == 1
    broker.send("topic://VirtualTopic.Orders", Message(body="y", message_id="small", properties={"s": "x"}))
    assert broker.stats(q).queue_size == 1  # a cheap one is still checked, and selected by nobody
