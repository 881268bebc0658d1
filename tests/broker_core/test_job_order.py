"""Scheduled messages due in the same millisecond come back in the order they were sent, as ActiveMQ's
scheduler keeps insertion order for jobs with the same time. The parked set (a zset scored by due time)
breaks ties by member, the message id, so the ids the broker makes sort in the order it makes them
(messages.new_message_id: the time, then a per-process count within a millisecond, in an alphabet in byte
order). Against the real Redis, with the test's clock standing still, and the ids' clock pinned to one
millisecond where a test says so (the case a tight loop meets)."""

from __future__ import annotations

import base64
import os
import types

import pytest

from broker_core import maintenance, messages
from broker_core.messages import Message

from ..helpers.broker import consumer, drain

N = 12


@pytest.fixture(params=["same_ms", "real_clock"])
def id_clock(request, monkeypatch):
    """The clock the broker's ids are made by: stopped at one millisecond, or the real one."""
    if request.param == "same_ms":
        stopped = types.SimpleNamespace(time_ns=lambda: 1_800_000_000_000_000_000)
        monkeypatch.setattr(messages, "time", stopped)
        # and the ids made after it go on from the real clock, not from that (future) millisecond
        monkeypatch.setattr(messages, "_ID_LAST", [-1, 0])
    return request.param


def bodies(deliveries) -> list[str]:
    return [d.body for d in deliveries]


def sent(n: int = N, **schedule) -> list[Message]:
    return [Message(body=f"m{i:02d}", **schedule) for i in range(n)]


def expected(n: int = N) -> list[str]:
    return [f"m{i:02d}" for i in range(n)]


@pytest.mark.parametrize("dest", ["queue://orders", "topic://ticks"])
@pytest.mark.parametrize("batch", [True, False], ids=["batch", "one_by_one"])
def test_delayed_messages_due_together_come_back_in_send_order(broker, clock, id_clock, dest, batch):
    c = consumer(broker, dest)
    msgs = sent(delay_ms=1_000)
    if batch:
        broker.send(dest, msgs)
    else:
        for m in msgs:
            broker.send(dest, m)
    assert drain(broker, c) == []
    clock.advance(1_000)
    maintenance.run_due(broker)
    assert bodies(drain(broker, c)) == expected()


@pytest.mark.parametrize("dest", ["queue://orders", "topic://ticks"])
def test_jobs_due_now_sent_in_one_batch_come_in_send_order(broker, id_clock, dest):
    c = consumer(broker, dest)
    broker.send(dest, sent(delay_ms=0))
    assert bodies(drain(broker, c)) == expected()


@pytest.mark.parametrize("dest", ["queue://orders", "topic://ticks"])
def test_repeating_jobs_due_together_fire_in_send_order(broker, clock, id_clock, dest):
    c = consumer(broker, dest)
    broker.send(dest, sent(delay_ms=1_000, period_ms=1_000, repeat=1))
    clock.advance(1_000)
    maintenance.run_due(broker)
    assert bodies(drain(broker, c)) == expected()
    clock.advance(1_000)
    maintenance.run_due(broker)
    assert bodies(drain(broker, c)) == expected()


@pytest.mark.parametrize("dest", ["queue://orders", "topic://ticks"])
def test_a_transactions_delayed_sends_come_back_in_send_order(broker, clock, id_clock, dest):
    c = consumer(broker, dest)
    tx = broker.begin()
    for m in sent(delay_ms=1_000):
        broker.send(dest, m, tx=tx)
    broker.commit(tx)
    clock.advance(1_000)
    maintenance.run_due(broker)
    assert bodies(drain(broker, c)) == expected()


def old_style_id() -> str:
    """An id as the broker made them before: 48-bit ms and 48 random bits, url-safe base64."""
    raw = (1_800_000_000_000 << 48 | int.from_bytes(os.urandom(6), "big")).to_bytes(12, "big")
    return "ID:" + base64.urlsafe_b64encode(raw).decode()


@pytest.mark.parametrize("dest", ["queue://orders", "topic://ticks"])
def test_parked_entries_with_old_style_ids_still_come_back(broker, clock, dest):
    """Jobs parked under ids made the old way (stored before this change) come back with the new ones
    due at the same time: every one, once (their order among themselves is by id, as it was)."""
    c = consumer(broker, dest)
    old = [Message(body=f"old{i}", message_id=old_style_id(), delay_ms=1_000) for i in range(5)]
    broker.send(dest, old)
    broker.send(dest, sent(5, delay_ms=1_000))
    assert broker.stats(dest).parked == 10
    clock.advance(1_000)
    maintenance.run_due(broker)
    got = bodies(drain(broker, c))
    assert sorted(got) == sorted([m.body for m in old] + expected(5))
    assert [b for b in got if b.startswith("m")] == expected(5)
    assert broker.stats(dest).parked == 0


def test_ids_sort_in_the_order_they_are_made(id_clock):
    ids = [messages.new_message_id() for _ in range(5_000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(i.startswith("ID:") and len(i) == 19 for i in ids)


async def test_a_scheduler_browse_lists_jobs_due_together_in_send_order(broker, aio, id_clock):
    """A BROWSE walks a destination's jobs by due time, and jobs due together in the order they were sent,
    as ActiveMQ's job store lists them (the later-due job, sent first, comes last)."""
    from broker_core.destinations import Destination, parse_destination
    from broker_core.scheduler import SchedulerRequest

    broker.send("queue://browsed", [Message(body="late", delay_ms=2_000), *sent(delay_ms=1_000)])
    consumer(broker, "queue://browse.replies")

    async def may(dest: Destination, action: str) -> bool:
        return True

    replies = parse_destination("queue://browse.replies")
    assert await aio.manage_scheduler(SchedulerRequest("BROWSE", reply_to=replies), may) == N + 1
    assert [m.message.body for m in broker.browse(replies).messages] == [*expected(), "late"]


@pytest.mark.parametrize("dest", ["queue://orders", "topic://ticks"])
def test_messages_waiting_out_one_redelivery_delay_come_back_in_their_order(broker, clock, id_clock, dest):
    """Parked for a redelivery delay (a queue's, a topic subscription's), due together: back in the order
    they had (their pending score, which they come back with, orders them whatever the ids)."""
    c = consumer(broker, dest, prefetch=100, ack_mode="client-individual")
    broker.send(dest, sent())
    got = drain(broker, c)
    assert bodies(got) == expected()
    broker.nack(c, [d.message_id for d in reversed(got)])
    assert drain(broker, c) == []
    clock.advance(1_000)
    maintenance.run_due(broker)
    assert bodies(drain(broker, c)) == expected()
