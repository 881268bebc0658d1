"""Producer flow control over HTTP (issue 5 item 6): a send refused for memory is 503 with Retry-After and a
problem body naming the destination, the limit and the usage; nothing is stored."""

from __future__ import annotations

import pytest

from gateway import runtime
from tests.gateway_api.mixins import assert_problem, blocking, send

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_send_to_a_full_queue_is_503_with_retry_after_and_names_the_limit(api, alice):
    broker = runtime.broker()
    await blocking(broker.policies.set_entry)("queue", "orders.eu", {"memoryLimit": 2048,
                                                                      "sendFailIfNoSpace": True})
    await send(api, alice, {"body": "x" * 500})  # each counts minimumMessageSize, 1024 bytes
    await send(api, alice, {"body": "y" * 500})
    response = await api.post("/api/v1/queues/orders.eu/messages", json={"body": "z"}, headers=alice)
    problem = assert_problem(response, 503, "resource_limit")
    assert response.headers["Retry-After"] == "1"
    assert problem["detail"].startswith("Usage Manager Memory Limit reached on queue://orders.eu")
    assert problem["destination"] == "queue://orders.eu" and problem["limit"] == 2048
    assert problem["scope"] == "destination" and problem["usage"] == 2048 and problem["retry_after"] == 1.0
    stats = await blocking(broker.stats)("orders.eu")
    assert stats.queue_size == 2 and stats.blocked_sends == 1
