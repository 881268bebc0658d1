"""The destination list's filters on the server (issue 26, item 7): non-empty, has consumers and
dead-letter queue, with kind, name, sort and paging; a destination created after the statistics index
was built is filtered by its own counters; a wrong value is refused naming the parameter."""

from __future__ import annotations

import pytest

from broker_core.broker import Broker
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from tests.gateway_api.mixins import assert_problem, blocking

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "/api/v1/destinations"


async def names(api, headers, **params) -> list[str]:
    response = await api.get(LIST, params={"limit": 100, **params}, headers=headers)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["count"] == len(body["results"])
    return [r["destination"] for r in body["results"]]


@pytest.fixture
def seeded(redis_client, api_namespace) -> Broker:
    """busy (2 messages, a consumer), idle (1 message, none), served (a consumer, no message), empty,
    DLQ.busy (a message), topic://news (a durable subscription offline with a message)."""
    broker = Broker(redis_client, api_namespace)
    broker.add_consumer("busy", ConsumerSpec(prefetch=0, lease_ms=60_000))
    broker.send("busy", [Message(body="a"), Message(body="b")])
    broker.send("idle", Message(body="c"))
    broker.add_consumer("served", ConsumerSpec(prefetch=0, lease_ms=60_000))
    broker.ensure_destination("empty")
    broker.send("DLQ.busy", Message(body="dead"))
    durable = broker.add_consumer("topic://news", ConsumerSpec(client_id="c", subscription_name="s",
                                                               lease_ms=60_000))
    broker.close_consumer(durable)
    broker.send("topic://news", Message(body="n"))
    return broker


async def test_each_filter_and_their_combination(api, make_user, seeded):
    root = await blocking(make_user)("root", superuser=True)
    everything = await names(api, root)
    assert set(everything) == {"queue://busy", "queue://idle", "queue://served", "queue://empty",
                               "queue://DLQ.busy", "topic://news"}
    assert set(await names(api, root, non_empty="true")) == {"queue://busy", "queue://idle",
                                                             "queue://DLQ.busy", "topic://news"}
    assert await names(api, root, non_empty="false") == ["queue://empty", "queue://served"]
    assert await names(api, root, kind="queue", has_consumers="true") == ["queue://busy", "queue://served"]
    assert await names(api, root, kind="queue", has_consumers="false") == ["queue://DLQ.busy", "queue://empty",
                                                                           "queue://idle"]
    # a filter agrees with the column it filters on, whatever counts as a consumer (a topic's durable
    # subscription offline counts as one in consumer_count)
    rows = (await api.get(LIST, params={"limit": 100}, headers=root)).json()["results"]
    for flag in (True, False):
        assert set(await names(api, root, has_consumers=str(flag).lower())) == {
            r["destination"] for r in rows if (r["consumer_count"] > 0) == flag}
        assert set(await names(api, root, non_empty=str(flag).lower())) == {
            r["destination"] for r in rows if (r["messages"] > 0) == flag}
    assert await names(api, root, dlq="true") == ["queue://DLQ.busy"]
    assert "queue://DLQ.busy" not in await names(api, root, dlq="false")
    # the operator's question: which queues hold messages nobody consumes, largest first
    assert await names(api, root, kind="queue", non_empty="true", has_consumers="false", dlq="false",
                       ordering="-messages") == ["queue://idle"]
    # sorted by name and by a statistic, with paging over the filtered rows
    first = (await api.get(LIST, params={"non_empty": "true", "ordering": "-messages", "limit": 1},
                           headers=root)).json()
    assert first["count"] == 4 and [r["name"] for r in first["results"]] == ["busy"]
    assert "non_empty=true" in first["next"]
    following = (await api.get(first["next"], headers=root)).json()
    assert following["count"] == 4 and following["results"][0]["name"] in {"DLQ.busy", "idle", "news"}


async def test_a_destination_newer_than_the_index_is_filtered_by_its_own_counters(api, make_user, seeded):
    root = await blocking(make_user)("root", superuser=True)
    assert "queue://late" not in await names(api, root, non_empty="true")  # the index is built here
    seeded.send("late", Message(body="x"))  # created after it: not in the index yet
    assert "queue://late" in await names(api, root, non_empty="true")
    assert "queue://late" in await names(api, root, has_consumers="false", ordering="-messages")
    assert "queue://late" not in await names(api, root, non_empty="false")


async def test_a_wrong_filter_value_is_refused_naming_the_parameter(api, make_user, seeded):
    root = await blocking(make_user)("root", superuser=True)
    for name in ("non_empty", "has_consumers", "dlq"):
        response = await api.get(LIST, params={name: "maybe"}, headers=root)
        assert_problem(response, 400, "invalid_parameter")
        assert response.json()["parameter"] == name and name in response.json()["detail"]


async def test_filters_show_only_what_the_user_may_read(api, make_user, seeded):
    reader = await blocking(make_user)("reader", [("queue://idle", "read"), ("queue://busy", "read")])
    assert await names(api, reader, non_empty="true") == ["queue://busy", "queue://idle"]
    assert await names(api, reader, has_consumers="false") == ["queue://idle"]


async def test_the_hidden_count_is_what_the_user_may_not_read_of_the_kind_asked_for(api, make_user, seeded):
    reader = await blocking(make_user)("reader", [("queue://idle", "read"), ("queue://busy", "read")])
    root = await blocking(make_user)("root", superuser=True)

    async def hidden(headers, **params) -> int:
        response = await api.get(LIST, params=params, headers=headers)
        assert response.status_code == 200, response.text
        return response.json()["hidden"]

    # six destinations: the reader sees two queues; three queues and the topic are hidden
    assert await hidden(reader) == 4
    assert await hidden(reader, kind="queue") == 3
    assert await hidden(reader, kind="topic") == 1
    # a name filter narrows what is shown, not what is hidden: the count says the list is not all there is
    assert await hidden(reader, search="idle") == 4
    assert await hidden(root) == 0
