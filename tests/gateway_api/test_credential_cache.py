"""The API's credential cache (gateway/credentials.py): verified Basic credentials and tokens are not checked
again (no password hasher, no database) until the user or token changes, never kept in plain, bounded.
Through the real ASGI app and Redis, on Django's path and on the lean paths alike."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework import authentication
from rest_framework.authtoken.models import Token

from gateway.credentials import verified
from gateway.models import DestinationPermission
from tests.gateway_api.mixins import blocking
from tests.helpers.users import change_user

pytestmark = pytest.mark.django_db(transaction=True)


def basic(name: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch, credentials_settled: None) -> list[str]:
    """The usernames DRF's Basic authentication verified with Django's authenticate (the hasher)."""
    calls: list[str] = []
    original = authentication.authenticate

    def spy(request: Any = None, **credentials: Any) -> Any:
        calls.append(credentials.get("username", ""))
        return original(request=request, **credentials)

    monkeypatch.setattr(authentication, "authenticate", spy)
    return calls


@pytest.fixture
def amq(make_user) -> dict[str, str]:
    make_user("amq", [("queue://orders.>", "admin")])
    return basic("amq", "pw")


async def _post(api, headers: dict[str, str], queue: str = "orders.cache") -> int:
    return (await api.post(f"/api/message/{queue}?type=queue", content="x", headers=headers)).status_code




@pytest.mark.parametrize("lean", [True, False], ids=["lean path", "django path"])
async def test_verified_basic_credentials_skip_the_hasher(api, amq, checks, settings, lean):
    settings.SIGNALBOX_API_HOT_PATH = lean
    assert [await _post(api, amq) for _ in range(5)] == [200] * 5
    assert checks == ["amq"]  # verified once
    assert await _post(api, basic("amq", "wrong")) == 401
    assert await _post(api, basic("amq", "wrong")) == 401
    assert checks == ["amq", "amq", "amq"]  # a failure is never remembered


async def test_a_new_password_takes_effect_at_once(api, amq, checks):
    assert await _post(api, amq) == 200
    await change_user("amq", password="new")
    assert await _post(api, amq) == 401  # the old password: verified again, and refused
    assert await _post(api, basic("amq", "new")) == 200
    assert checks == ["amq", "amq", "amq"]


@pytest.mark.parametrize("lean", [True, False], ids=["lean path", "django path"])
async def test_a_deactivated_or_deleted_user_is_refused_at_once(api, amq, make_user, settings, lean):
    settings.SIGNALBOX_API_HOT_PATH = lean
    other = basic("other", "pw")
    await blocking(make_user)("other", [("queue://orders.>", "admin")])
    assert await _post(api, amq) == await _post(api, other) == 200
    await change_user("amq", is_active=False)
    assert await _post(api, amq) == 401
    assert await _post(api, other) == 200  # another user's entry stays
    await blocking(User.objects.filter(username="other").delete)()
    assert await _post(api, other) == 401


async def test_a_deleted_token_is_refused_at_once(api, alice, settings):
    settings.SIGNALBOX_API_HOT_PATH = True
    url = "/api/v1/queues/orders.tok/messages"
    assert (await api.post(url, json={"body": "x"}, headers=alice)).status_code == 201
    assert (await api.post(url, json={"body": "x"}, headers=alice)).status_code == 201  # (lean path)
    await blocking(Token.objects.filter(user__username="alice").delete)()
    assert (await api.post(url, json={"body": "x"}, headers=alice)).status_code == 401
    amq_get = await api.get("/api/message/orders.tok?type=queue&clientId=t&readTimeout=10", headers=alice)
    assert amq_get.status_code == 401


async def test_a_revoked_permission_is_refused_at_once(api, amq):
    assert await _post(api, amq) == 200
    assert await _post(api, amq) == 200  # credentials remembered: the lean path
    await blocking(DestinationPermission.objects.all().delete)()
    assert await _post(api, amq) == 403


async def test_the_cache_is_bounded_and_keeps_no_credential(api, make_user, checks, settings):
    settings.SIGNALBOX_AUTH_CACHE_ENTRIES = 2
    for name in ("u1", "u2", "u3"):
        await blocking(make_user)(name, [("queue://orders.>", "write")])
    for name in ("u1", "u2", "u3"):  # u3 pushes out u1, the least recently used
        assert await _post(api, basic(name, "pw")) == 200
    assert len(verified.entries) == 2
    assert await _post(api, basic("u3", "pw")) == 200
    assert await _post(api, basic("u1", "pw")) == 200
    assert checks == ["u1", "u2", "u3", "u1"]
    for key, (_until, user, _auth) in verified.entries.items():
        assert len(key) == 32  # a keyed BLAKE2b digest (a MAC) of the header
        assert b"pw" not in key and base64.b64encode(b"pw") not in key
        assert user.password.startswith(("pbkdf2_", "md5$", "argon2", "bcrypt"))  # Django's hash


async def test_an_entry_lapses_after_its_time(api, amq, checks, settings):
    settings.SIGNALBOX_AUTH_CACHE_SECONDS = 0.0
    assert await _post(api, amq) == await _post(api, amq) == 200
    assert checks == ["amq", "amq"]


# -- over a real server: a password changed in the console's admin, in the server's own process ----------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real uvicorn server of a fresh database: (server, its data folder, its namespace)."""
    import uuid

    from tests.helpers.gateway_server import prepare_database, start_gateway

    data_dir, namespace = tmp_path_factory.mktemp("credential-cache"), f"t{uuid.uuid4().hex[:12]}"
    prepare_database(data_dir, namespace)
    gateway = start_gateway(data_dir, namespace, name="credentials")
    try:
        yield gateway, data_dir, namespace
    finally:
        gateway.stop()


def _admin_form(client, url: str, data: dict[str, str]):
    import re

    page = client.get(url)
    assert page.status_code == 200, page.text[:300]
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    return client.post(url, data={"csrfmiddlewaretoken": token, **data}, headers={"Referer": str(page.url)})


@pytest.mark.e2e
def test_a_password_changed_in_the_admin_is_refused_at_once_by_the_server(server):
    import re

    import httpx

    base = f"http://127.0.0.1:{server[0].port}"
    url = "/api/message/bob.cache?type=queue"
    with httpx.Client(base_url=base, timeout=30) as bob, httpx.Client(base_url=base, timeout=30) as admin:
        for _ in range(3):  # verified once, then remembered (the lean path)
            assert bob.post(url, content="x", headers=basic("bob", "secret")).status_code == 200
        logged_in = _admin_form(admin, "/admin/login/?next=/admin/",
                                {"username": "alice", "password": "secret", "next": "/admin/"})
        assert logged_in.status_code == 302, logged_in.text[:300]
        listing = admin.get("/admin/auth/user/", params={"q": "bob"}).text
        bob_pk = re.search(r'/admin/auth/user/(\d+)/change/', listing).group(1)
        changed = _admin_form(admin, f"/admin/auth/user/{bob_pk}/password/",
                              {"password1": "N3w-pass-phrase", "password2": "N3w-pass-phrase",
                               "usable_password": "true"})
        assert changed.status_code == 302, changed.text[:500]
        assert bob.post(url, content="x", headers=basic("bob", "secret")).status_code == 401
        assert bob.post(url, content="x", headers=basic("bob", "N3w-pass-phrase")).status_code == 200


@pytest.mark.e2e
def test_a_password_changed_by_another_process_is_refused_within_a_second(server):
    import subprocess
    import sys
    import time

    import httpx

    from tests.helpers.gateway_server import ROOT, server_env

    gateway, data_dir, namespace = server

    def elsewhere(code: str) -> None:  # as `manage.py changepassword` would: another process, same stores
        prelude = "from django.contrib.auth.models import User; "
        subprocess.run([sys.executable, "manage.py", "shell", "-c", prelude + code], cwd=ROOT, check=True,
                       timeout=120, env=server_env(data_dir, namespace), capture_output=True)

    elsewhere("User.objects.create_superuser('dana', 'd@example.com', 'before-1')")
    url = "/api/message/dana.elsewhere?type=queue"
    with httpx.Client(base_url=f"http://127.0.0.1:{gateway.port}", timeout=30) as dana:
        for _ in range(3):  # verified once, then remembered
            assert dana.post(url, content="x", headers=basic("dana", "before-1")).status_code == 200
        elsewhere("u = User.objects.get(username='dana'); u.set_password('after-1'); u.save()")
        changed_at = time.monotonic()
        while dana.post(url, content="x", headers=basic("dana", "before-1")).status_code == 200:
            assert time.monotonic() - changed_at < 5, "the server kept the old password"  # (the TTL is 30 s)
            time.sleep(0.1)
        assert dana.post(url, content="x", headers=basic("dana", "after-1")).status_code == 200
