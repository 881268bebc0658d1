"""Scheduler management's walk over the destination registry (AsyncBroker.manage_scheduler), against the
real Redis: destinations without anything parked cost no call of their own, and no permission check."""

from __future__ import annotations

import pytest

from broker_core.destinations import Destination, parse_destination
from broker_core.errors import ResourceAllocationError, UnknownMessage
from broker_core.messages import Message
from broker_core.scheduler import SchedulerRequest


def calls_made(redis_client) -> int:
    return int(redis_client.info("stats")["total_commands_processed"])


async def test_destinations_without_jobs_cost_neither_a_call_each_nor_a_permission_check(broker, aio,
                                                                                          redis_client):
    for i in range(3_000):
        broker.ensure_destination(f"queue://walk.{i}")
    broker.send("queue://walk.1500", Message(body="later", delay_ms=3_600_000))
    asked: list[str] = []

    async def may(dest: Destination, action: str) -> bool:
        asked.append(dest.uri)
        return True

    for request in (SchedulerRequest("BROWSE", reply_to=parse_destination("queue://walk.replies")),
                    SchedulerRequest("REMOVE", job_id="none-such")):
        asked.clear()
        before = calls_made(redis_client)
        try:
            done = await aio.manage_scheduler(request, may)
        except UnknownMessage:
            done = 0
        # (a call per destination was 3,000 commands and 3,000 permission checks: 2.3 s for 10,000)
        assert calls_made(redis_client) - before < 3_000 + 100
        assert asked == ["queue://walk.1500"]
        assert done == (1 if request.action == "BROWSE" else 0)


async def test_a_browse_is_admitted_by_its_reply_tos_flow_control_then_sent_whole(broker, aio):
    """BROWSE requests repeated without flow control filled Redis without bound with their copies. A BROWSE
    is admitted as a producer's send: while its reply-to has room for its first message it is sent whole,
    past the limit (as SchedulerBroker, which turns producer flow control off for its messages, so a BROWSE
    is never cut short); once the reply-to is full the next BROWSE fails as a send there would (here at
    once: sendFailIfNoSpace), naming the limit, and sends nothing."""
    broker.policies.set_entry("queue", "walk.full", {"memoryLimit": 2 * 1100, "sendFailIfNoSpace": True})
    broker.send("queue://walk.jobs", [Message(body=f"job{i}", delay_ms=3_600_000) for i in range(3)])
    browse = SchedulerRequest("BROWSE", reply_to=parse_destination("queue://walk.full"))

    async def may(dest: Destination, action: str) -> bool:
        return True

    assert await aio.manage_scheduler(browse, may) == 3
    assert (await aio.stats("queue://walk.full")).queue_size == 3  # (3 x 1,024 bytes: past the limit)
    with pytest.raises(ResourceAllocationError) as refused:
        await aio.manage_scheduler(browse, may)
    assert "Usage Manager Memory Limit reached on queue://walk.full" in str(refused.value)
    assert "memoryLimit 2200 bytes" in str(refused.value)
    assert (await aio.stats("queue://walk.full")).queue_size == 3
    assert (await aio.stats("queue://walk.jobs")).parked == 3  # (the jobs stay)
