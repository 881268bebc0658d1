"""The virtual destination copy counters over HTTP (issue 5): a topic's statistics show the copies dropped
for a full dropOnResourceLimit consumer queue (`forward_dropped`) and those a target refused for good
(`forward_refused`), as broker_core's DestinationStats count them."""

from __future__ import annotations

import pytest

from broker_core.config.virtual import VirtualConfig
from broker_core.messages import Message
from broker_core.ops import virtual
from gateway import runtime
from tests.gateway_api.mixins import blocking

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_topics_statistics_show_dropped_and_refused_copies(api, make_user):
    broker = runtime.broker()
    config = VirtualConfig.from_config(
        {"virtualTopic": [{"name": "VirtualTopic.>", "dropOnResourceLimit": True}]})
    await blocking(virtual.configure)(broker, config)
    await blocking(broker.policies.set_entry)("queue", "Consumer.a.VirtualTopic.Orders",
                                              {"memoryLimit": 1024, "sendFailIfNoSpace": True})
    await blocking(broker.ensure_destination)("Consumer.a.VirtualTopic.Orders")
    await blocking(broker.send)("topic://VirtualTopic.Orders", [Message(body="1"), Message(body="2")])
    root = await blocking(make_user)("root", superuser=True)
    body = (await api.get("/api/v1/topics/VirtualTopic.Orders", headers=root)).json()
    assert body["forward_dropped"] == 1 and body["forward_refused"] == 0
