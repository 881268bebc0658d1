"""Scheduler management's walk over the destination registry (AsyncBroker.manage_scheduler), against the
real Redis: destinations without anything parked cost no call of their own, and no permission check."""

from __future__ import annotations

from broker_core.destinations import Destination, parse_destination
from broker_core.errors import UnknownMessage
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


async def test_a_browse_to_a_full_reply_to_sends_every_job_without_flow_control(broker, aio):
    """SchedulerBroker sends a BROWSE's messages with producer flow control off: a reply-to over its memory
    limit (failing sends at once here) still gets every job, and the BROWSE does not fail half-way."""
    broker.policies.set_entry("queue", "walk.full", {"memoryLimit": 2 * 1100, "sendFailIfNoSpace": True})
    broker.send("queue://walk.full", [Message(body="x" * 1000), Message(body="y" * 1000)])  # full now
    broker.send("queue://walk.jobs", [Message(body=f"job{i}", delay_ms=3_600_000) for i in range(3)])

    async def may(dest: Destination, action: str) -> bool:
        return True

    done = await aio.manage_scheduler(SchedulerRequest("BROWSE", reply_to=parse_destination(
        "queue://walk.full")), may)
    assert done == 3
    assert (await aio.stats("queue://walk.full")).queue_size == 2 + 3
