"""The root URLs answer: landing page, OpenAPI schema, admin login, static files through ASGI."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.django_db


def test_the_landing_page_links_health_admin_and_schema(client):
    response = client.get("/")

    assert response.status_code == 200
    html = response.content.decode()
    for href in ('href="/healthz"', 'href="/admin/"', 'href="/api/schema/"'):
        assert href in html


def test_the_openapi_schema_is_served_to_logged_in_users(admin_client, client):
    response = admin_client.get("/api/schema/")

    assert response.status_code == 200
    assert b"title: Signalbox API" in response.content
    assert client.get("/api/schema/").status_code == 401  # only /healthz answers anonymous users


def test_admin_asks_anonymous_users_to_log_in(client):
    response = client.get("/admin/")

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


async def test_the_asgi_app_serves_static_files():
    from signalbox.asgi import application

    scope_response = await _asgi_get(application, "/static/signalbox/signalbox.css")

    assert scope_response["status"] == 200
    assert b"font-family" in scope_response["body"]


async def _asgi_get(application, path: str) -> dict:
    """One GET straight through the ASGI application (AsyncClient bypasses the static handler)."""
    messages = []
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        # Django aborts the response on an early disconnect, so the client stays connected.
        await asyncio.Event().wait()

    async def send(message):
        messages.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    await application(scope, receive, send)
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return {"status": start["status"], "body": body}
