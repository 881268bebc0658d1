"""The topic page shows each subscription's pending-message limit in force and whether it is retroactive
(issue 5: console shows what broker.subscriptions lists)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from broker_core.model import ConsumerSpec

pytestmark = pytest.mark.e2e


def test_the_topic_page_shows_the_pending_limit_and_the_retroactive_flag(admin_page, console_server, broker,
                                                                        topic_name):  # noqa: F811
    broker.policies.set_entry("topic", topic_name, {"pendingMessageLimitStrategy": "constant",
                                                    "pendingMessageLimit": 7})
    broker.refresh_policies()
    topic = f"topic://{topic_name}"
    broker.add_consumer(topic, ConsumerSpec(retroactive=True, lease_ms=120_000))
    broker.add_consumer(topic, ConsumerSpec(client_id=f"listing-{topic_name}", subscription_name="audit",
                                           lease_ms=120_000))
    admin_page.goto(f"{console_server.url}/console/topics/{topic_name}/")
    live = admin_page.locator('#subscriptions tr[data-durable="0"]')
    durable = admin_page.locator('#subscriptions tr[data-durable="1"]')
    expect(live.locator('[data-col="pending_limit"]')).to_have_text("7")
    expect(live.locator(".state")).to_contain_text("retroactive")
    expect(durable.locator('[data-col="pending_limit"]')).to_have_text("none")  # no limit for durables
    expect(durable.locator(".state")).not_to_contain_text("retroactive")
