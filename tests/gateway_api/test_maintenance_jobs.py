"""GET /api/v1/maintenance/jobs: the maintenance jobs' progress and last runs per destination (admin), and
the dispatcher's tick; the jobs are run by the session's real Celery worker."""

from __future__ import annotations

import pytest

from signalbox import tasks
from tests.gateway_api.mixins import EndpointTests, assert_problem, blocking, send

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = "/api/v1/maintenance/jobs"


async def _root(make_user):
    return await blocking(make_user)("root", superuser=True)


async def _worker(task, *args, **kwargs):
    """Run a task on the real worker and wait for its result (off the event loop)."""
    return await blocking(lambda: task.delay(*args, **kwargs).get(timeout=30))()


class TestMaintenanceJobs(EndpointTests):
    method, path, action = "get", JOBS, "admin"
    params = {"destination": "queue://orders.eu"}

    async def prepare(self, api, headers):
        from django.contrib.auth.models import User

        from tests.gateway_api.mixins import token_headers

        def seeder():
            user, _ = User.objects.get_or_create(username="seeder", is_superuser=True)
            return token_headers(user)

        await send(api, await blocking(seeder)(), {"body": "one"})
        return {}

    async def check(self, api, response, context, inspector):
        body = response.json()
        assert body["count"] == 1
        (row,) = body["results"]
        assert row["destination"] == "queue://orders.eu"
        assert set(row) == {"destination", "recover", "expire", "slow"}
        assert row["slow"]["tracked"] == 0


async def test_a_sweep_run_by_the_worker_shows_its_progress_and_the_tick_its_last_run(
        api, make_user, api_namespace, celery_worker):
    root = await _root(make_user)
    await send(api, root, {"body": "a"}, {"body": "b"}, {"body": "c", "ttl": 1})
    before = (await api.get(JOBS, headers=root)).json()
    assert before["tick"]["status"] == "error"
    assert "never run" in before["tick"]["error"]

    swept = await _worker(tasks.sweep_expired, "orders.eu", namespace=api_namespace)
    ticked = await _worker(tasks.tick, api_namespace)

    response = await api.get(JOBS, headers=root)
    assert response.status_code == 200
    body = response.json()
    assert body["tick"]["status"] == "ok"
    # orders.eu and the dead-letter queue its expired message went to
    assert body["tick"]["destinations"] == ticked["destinations"] == body["count"] == 2
    assert body["tick"]["age_ms"] >= 0
    expire = next(r for r in body["results"] if r["destination"] == "queue://orders.eu")["expire"]
    assert swept["cycle_done"] and (swept["examined"], swept["expired"]) == (3, 1)
    assert (expire["running"], expire["examined"], expire["last_examined"], expire["last_expired"]) == (
        0, 3, 3, 1)
    assert expire["last_done"] >= expire["started"] > 0
    assert "leased_until" not in expire  # no worker holds the job now


async def test_the_list_shows_only_destinations_the_user_administers(api, make_user, api_namespace):
    root = await _root(make_user)
    await send(api, root, {"body": "x"}, destination="orders.eu")
    await send(api, root, {"body": "x"}, destination="orders.us")
    await send(api, root, {"body": "x"}, destination="billing.eu")
    operator = await blocking(make_user)("operator", [("queue://orders.>", "admin"), ("queue://billing.>",
                                                                                       "read")])

    body = (await api.get(JOBS, headers=operator)).json()
    assert [row["destination"] for row in body["results"]] == ["queue://orders.eu", "queue://orders.us"]
    assert body["count"] == 2

    paged = (await api.get(JOBS, headers=root, params={"limit": 2, "offset": 1})).json()
    assert [row["destination"] for row in paged["results"]] == ["queue://orders.eu", "queue://orders.us"]
    assert paged["count"] == 3 and paged["previous"] and paged["next"] is None


async def test_unknown_and_invalid_destinations_are_named(api, make_user, api_namespace):
    root = await _root(make_user)
    body = assert_problem(await api.get(JOBS, headers=root, params={"destination": "nowhere"}), 404,
                          "unknown_destination")
    assert "queue://nowhere" in body["detail"]
    assert_problem(await api.get(JOBS, headers=root, params={"destination": "queue://bad name"}), 400,
                   "invalid_destination")
