"""The HTTP password logins behind the login guard (gateway/logins.py): HTTP Basic on the REST API, POST
/api/v1/auth/token and the console's login form. Past `SIGNALBOX_LOGIN_FAILURES` failed logins from one
address, a login is refused unchecked: 429 `login_refused` with Retry-After on the API, the refusal's text
on the login page. Through the real ASGI app (the client's address is 127.0.0.1) and Django's hasher,
counted."""

from __future__ import annotations

import base64
import time

import pytest

from tests.helpers import hashers

pytestmark = pytest.mark.django_db(transaction=True)


def basic(name: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}


@pytest.fixture
def checks(settings) -> list[str]:
    """The password checks Django's hasher ran (users made after this fixture hash with it)."""
    return hashers.counted(settings)


@pytest.fixture
def amq(checks, make_user) -> None:
    make_user("amq", [("queue://orders.>", "admin")])  # password "pw"


@pytest.mark.parametrize("lean", [True, False], ids=["lean path", "django path"])
async def test_basic_logins_past_the_failures_get_429_login_refused_unchecked(api, amq, checks, settings,
                                                                               lean):
    settings.SIGNALBOX_API_HOT_PATH = lean
    settings.SIGNALBOX_LOGIN_FAILURES = 2
    for _ in range(2):
        answer = await api.post("/api/message/orders.g?type=queue", content="x",
                                headers=basic("amq", "wrong"))
        assert answer.status_code == 401
    answer = await api.post("/api/message/orders.g?type=queue", content="x", headers=basic("amq", "pw"))
    assert answer.status_code == 429
    problem = answer.json()
    assert problem["code"] == "login_refused"
    assert problem["detail"].startswith("Too many failed logins from 127.0.0.1: 2 in 60 s")
    assert problem["detail"].endswith("(SIGNALBOX_LOGIN_FAILURES)")
    assert int(answer.headers["Retry-After"]) >= 1
    assert len(checks) == 2  # the refused login ran no hasher
    settings.SIGNALBOX_LOGIN_FAILURE_DELAY = 0.3
    started = time.monotonic()
    answer = await api.get("/api/message/orders.g?type=queue&oneShot=true", headers=basic("amq", "pw"))
    assert answer.status_code == 429  # a GET too, until the window passes
    assert time.monotonic() - started >= 0.3  # answered after the pause
    assert len(checks) == 2


async def test_the_token_endpoint_past_the_failures_answers_429_login_refused(api, amq, checks, settings):
    settings.SIGNALBOX_LOGIN_FAILURES = 2
    for _ in range(2):
        answer = await api.post("/api/v1/auth/token", json={"username": "amq", "password": "wrong"})
        assert answer.status_code == 400
    answer = await api.post("/api/v1/auth/token", json={"username": "amq", "password": "pw"})
    assert answer.status_code == 429
    assert answer.json()["code"] == "login_refused"
    assert len(checks) == 2


async def test_a_right_password_before_the_limit_clears_the_address(api, amq, checks, settings):
    settings.SIGNALBOX_LOGIN_FAILURES = 2

    async def token(password: str) -> int:
        answer = await api.post("/api/v1/auth/token", json={"username": "amq", "password": password})
        return answer.status_code

    assert [await token(p) for p in ("wrong", "pw", "wrong", "pw")] == [400, 200, 400, 200]


def test_the_console_login_page_shows_the_refusal(client, checks, settings, django_user_model):
    django_user_model.objects.create_user("carol", password="pw")
    settings.SIGNALBOX_LOGIN_FAILURES = 1
    page = client.post("/console/login/", {"username": "carol", "password": "wrong"})
    assert page.status_code == 200
    assert b"Your user name and password did not match" in page.content
    page = client.post("/console/login/", {"username": "carol", "password": "pw"})
    assert page.status_code == 200  # not logged in: the form again
    assert b"Too many failed logins from 127.0.0.1: 1 in 60 s" in page.content
    assert b"(SIGNALBOX_LOGIN_FAILURES)" in page.content
    assert "_auth_user_id" not in client.session
    assert len(checks) == 1


def test_the_console_login_goes_to_next_on_this_site_only(client, django_user_model):
    django_user_model.objects.create_user("dave", password="pw")
    page = client.post("/console/login/", {"username": "dave", "password": "pw", "next": "/console/topics/"})
    assert page.status_code == 302 and page["Location"] == "/console/topics/"
    client.logout()
    page = client.post("/console/login/", {"username": "dave", "password": "pw",
                                           "next": "https://evil.example/console/"})
    assert page.status_code == 302 and page["Location"] == "/console/"
    assert client.get("/console/login/").status_code == 302  # logged in: the login page moves on
