"""Memory limits over HTTP: Idempotency-Key records are bounded per user (a new key past the bound is
refused by name and sends nothing; keys held are still honoured), and Redis at its maxmemory refuses a
send with a named 503, not a 500, while reads go on and nothing stored is lost."""

from __future__ import annotations

import pytest

from tests.gateway_api.mixins import assert_problem, consumer, receive

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/queues/orders.eu/messages"


async def test_new_idempotency_keys_past_the_per_user_bound_are_refused_and_held_ones_still_replay(
        api, alice, settings, redis_client, api_namespace):
    settings.SIGNALBOX_IDEMPOTENCY_KEYS_PER_USER = 3
    for k in range(3):
        response = await api.post(URL, json={"body": f"m{k}"}, headers={**alice, "Idempotency-Key": f"k{k}"})
        assert response.status_code == 201
    refused = await api.post(URL, json={"body": "m3"}, headers={**alice, "Idempotency-Key": "k3"})
    problem = assert_problem(refused, 429, "idempotency_keys_full")
    assert problem["limit"] == 3 and "SIGNALBOX_IDEMPOTENCY_KEYS_PER_USER" in problem["detail"]
    replay = await api.post(URL, json={"body": "m1"}, headers={**alice, "Idempotency-Key": "k1"})
    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
    assert (await api.post(URL, json={"body": "plain"}, headers=alice)).status_code == 201
    got = await receive(api, alice, await consumer(api, alice))
    assert [m["body"] for m in got] == ["m0", "m1", "m2", "plain"]  # nothing of the refused request

    overview = (await api.get("/api/v1/console/overview", headers=alice)).json()
    assert overview["idempotency_keys"] == {"count": 3, "per_user_limit": 3}
    assert overview["redis_memory"]["policy"] == "noeviction" and overview["redis_memory"]["max"] > 0

    # Records that expired leave the bound: their index entries go at the next new key.
    index = f"{api_namespace}:gw:idem:index"
    redis_client.zadd(index, {m: 1 for m in redis_client.zrange(index, 0, -1)})
    again = await api.post(URL, json={"body": "m4"}, headers={**alice, "Idempotency-Key": "k4"})
    assert again.status_code == 201
    assert redis_client.zcard(index) == 1


async def test_a_send_at_redis_maxmemory_is_a_named_503_and_nothing_stored_is_lost(api, alice, redis_client):
    for k in range(3):
        assert (await api.post(URL, json={"body": f"m{k}"}, headers=alice)).status_code == 201
    before = redis_client.config_get("maxmemory")["maxmemory"]
    redis_client.config_set("maxmemory", 1)  # over it already: every write that may grow memory refused
    try:
        refused = await api.post(URL, json={"body": "too much"}, headers=alice)
        problem = assert_problem(refused, 503, "redis_maxmemory")
        assert "maxmemory" in problem["detail"] and refused.headers["Retry-After"] == "1"
        keyed = await api.post(URL, json={"body": "keyed"}, headers={**alice, "Idempotency-Key": "k"})
        assert_problem(keyed, 503, "redis_maxmemory")
        stats = await api.get("/api/v1/queues/orders.eu", headers=alice)  # reads go on
        assert stats.status_code == 200 and stats.json()["queue_size"] == 3
        # consumers drain it (the consuming scripts may run past maxmemory)
        got = await receive(api, alice, await consumer(api, alice))
        assert [m["body"] for m in got] == ["m0", "m1", "m2"]
    finally:
        redis_client.config_set("maxmemory", before)
    assert (await api.post(URL, json={"body": "after"}, headers=alice)).status_code == 201

