"""Producer flow control over STOMP (issue 5 item 6), against a live gateway process: a SEND refused for
memory gets an ERROR frame carrying its receipt id and ActiveMQ's message; the sends before it stand."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def test_a_send_to_a_full_queue_gets_an_error_with_its_receipt_id(clients, queue_name, broker):
    broker.policies.set_entry("queue", queue_name, {"memoryLimit": 2048, "sendFailIfNoSpace": True})
    client = clients()
    client.conn.send(f"/queue/{queue_name}", "x" * 1000, receipt="r1")
    assert client.expect("RECEIPT").headers["receipt-id"] == "r1"
    client.conn.send(f"/queue/{queue_name}", "y" * 1000, receipt="r2")
    error = client.expect("ERROR")
    assert error.headers["receipt-id"] == "r2"
    assert error.headers["message"].startswith(f"Usage Manager Memory Limit reached on queue://{queue_name}")
    assert b"destination memoryLimit 2048 bytes" in error.body
    stats = broker.stats(f"queue://{queue_name}")
    assert stats.enqueued == 1 and stats.blocked_sends == 1
