"""The per-process broker clients and the wake-up hub the gateway adapters share."""

from __future__ import annotations

import asyncio
import uuid

from django.test import override_settings

from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from gateway import runtime


async def test_a_waiting_adapter_is_woken_when_dispatch_fills_its_consumers_outbox():
    with override_settings(SIGNALBOX_NAMESPACE=f"t{uuid.uuid4().hex[:12]}"):
        runtime.policies.cache_clear()
        runtime._async.clear()
        try:
            hub = runtime.wakeups()
            await hub.start()
            aio = runtime.async_broker()
            c = await aio.add_consumer("orders", ConsumerSpec(prefetch=5, notify=hub.channel))
            assert await hub.wait(c.consumer_id, 0.2) is False  # nothing yet
            await aio.send("orders", Message(body="m"))
            assert await hub.wait(c.consumer_id, 2) is True
            assert [d.body for d in await aio.receive(c, 5)] == ["m"]
            # a wake-up that arrives while nobody waits is not lost
            await aio.send("orders", Message(body="n"))
            await asyncio.sleep(0.1)
            assert await hub.wait(c.consumer_id, 0.01) is True
        finally:
            runtime.policies.cache_clear()
            runtime._async.clear()
