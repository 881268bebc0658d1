"""The REST subscription listing shows `retroactive` and the pending-message limit in force (issue 5,
item 8: the console and APIs show topics' subscriptions)."""

from __future__ import annotations

import pytest

from tests.gateway_api.mixins import consumer

pytestmark = pytest.mark.django_db(transaction=True)

T = "/api/v1/topics/listed"


@pytest.fixture
def trader(make_user):
    return make_user("trader", [("topic://listed", "admin")])


async def test_the_listing_and_the_topic_stats_carry_retroactive_and_the_pending_message_limit(api, trader):
    await consumer(api, trader, "listed", kind="topics", retroactive=True)
    await consumer(api, trader, "listed", kind="topics", client_id="app-1", subscription_name="audit")
    listed = (await api.get(f"{T}/subscriptions", headers=trader)).json()
    assert sorted((s["durable"], s["retroactive"], s["pending_message_limit"]) for s in listed) == [
        (False, True, -1), (True, False, -1)]
    stats = (await api.get(T, headers=trader)).json()
    assert sorted(s["retroactive"] for s in stats["subscriptions"]) == [False, True]
    assert {s["pending_message_limit"] for s in stats["subscriptions"]} == {-1}
