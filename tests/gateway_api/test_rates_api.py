"""GET /api/v1/console/rates and /api/v1/console/<kind>/<name>/rates (docs/api.md, "Rate history"): the
sampler's history over a range, audited purges and moves as events, a wrong range named, permissions."""

from __future__ import annotations

import pytest

from broker_core import rates
from gateway import runtime
from tests.gateway_api.mixins import assert_problem, blocking, send

pytestmark = pytest.mark.django_db(transaction=True)

R = "/api/v1/console/queues/orders.eu/rates"


async def test_a_queue_s_history_with_its_purge_and_move_as_events(api, alice):
    await send(api, alice, {"body": "a"}, {"body": "b"}, {"body": "c"})
    broker = runtime.broker()
    await blocking(broker.ensure_destination)("orders.us")
    await blocking(rates.sample)(broker, ["queue://orders.eu"])
    moving = await api.post("/api/v1/queues/orders.eu/move-matching",
                            json={"target": "orders.us", "limit": 1}, headers=alice)
    assert moving.status_code == 200, moving.text
    await api.post("/api/v1/queues/orders.eu/purge", headers=alice)
    await api.post("/api/v1/queues/orders.none/purge", headers=alice)  # refused (404): no event
    response = await api.get(f"{R}?range=5m", headers=alice)
    assert response.status_code == 200 and response.headers["Cache-Control"] == "no-store"
    body = response.json()
    assert body["destination"] == "queue://orders.eu" and body["range"] == "5m"
    assert body["series"] == list(rates.SERIES) and body["resolution_ms"] == 5_000
    assert len(body["times"]) == 60 and all(len(body["rates"][s]) == 60 for s in rates.SERIES)
    # one sample: the base (its step reads 0, the others were not sampled)
    assert body["sampled_since"] == body["sampled_until"]
    assert [v for v in body["rates"]["enqueued"] if v is not None] == [0.0]
    assert [(e["action"], e["count"], e["user"]) for e in body["events"]] == [
        ("move_matching", 1, "alice"), ("purge", 2, "alice")]
    # the target of a move sees it too
    moved = (await api.get("/api/v1/console/queues/orders.us/rates", headers=alice)).json()
    assert [(e["action"], e["destination"], e["target"]) for e in moved["events"]] == [
        ("move_matching", "queue://orders.eu", "queue://orders.us")]
    assert moved["range"] == "1h" and len(moved["times"]) == 720


async def test_a_wrong_range_is_named_and_an_unknown_queue_is_404(api, alice):
    body = assert_problem(await api.get(f"{R}?range=7d", headers=alice), 400, "invalid_range")
    assert "'7d'" in body["detail"] and "5m, 1h, 24h" in body["detail"]
    assert_problem(await api.get("/api/v1/console/queues/orders.none/rates", headers=alice), 404,
                   "unknown_destination")


async def test_rates_need_read_permission_and_the_broker_wide_sum_needs_every_destination(api, alice,
                                                                                           make_user):
    await send(api, alice, {"body": "a"})
    outsider = await blocking(make_user)("outsider", [("queue://billing.>", "read")])
    assert_problem(await api.get(R, headers=outsider), 403)
    body = assert_problem(await api.get("/api/v1/console/rates", headers=outsider), 403, "permission_denied")
    assert "every destination" in body["detail"]
    root = await blocking(make_user)("root", superuser=True)
    everything = (await api.get("/api/v1/console/rates?range=24h", headers=root)).json()
    assert everything["destination"] is None and everything["resolution_ms"] == 60_000
    assert len(everything["times"]) == 1440
