"""The OpenAPI 3 schema is generated from the code, valid, complete, and served with a docs page."""

from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator
from openapi_spec_validator import validate

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


def test_the_schema_is_valid_openapi_3(schema):
    assert schema["openapi"].startswith("3.")
    validate(schema)


def test_every_gateway_endpoint_is_described(schema):
    from gateway.api import urls

    documented = set(schema["paths"])
    # /api/message without a path is the same servlet; ActiveMQ's console XML feeds sit where its console
    # serves them, outside /api/ (signalbox/urls.py)
    assert len(urls.urlpatterns) - 1 + 1 == len(documented)
    for path in ("/api/v1/{kind}/{name}/messages", "/api/v1/{kind}/{name}/consumers/{consumer_id}/receive",
                 "/api/message/{path}", "/api/v1/destinations", "/api/v1/audit", "/admin/xml/{feed}.jsp"):
        assert path in documented, sorted(documented)


def test_errors_are_documented_as_problem_details(schema):
    send = schema["paths"]["/api/v1/{kind}/{name}/messages"]["post"]
    for status in ("400", "401", "403", "413", "429", "501", "503"):
        content = send["responses"][status]["content"]
        assert content["application/problem+json"]["schema"]["$ref"].endswith("/Problem")
    assert {"tokenAuth": []} in send["security"]


def test_the_schema_and_the_interactive_page_are_served_to_authenticated_users(client, django_user_model):
    user = django_user_model.objects.create_user("reader", password="pw")
    from rest_framework.authtoken.models import Token

    token = Token.objects.create(user=user)
    schema = client.get("/api/schema/?format=json", HTTP_AUTHORIZATION=f"Token {token.key}")
    assert schema.json()["info"]["title"] == "Signalbox API"
    client.force_login(user)
    assert client.get("/api/schema/").status_code == 200  # the page's own fetch: the console session
    page = client.get("/api/docs/")
    assert page.status_code == 200 and b"swagger-ui" in page.content
    assert b"/static/drf_spectacular_sidecar/" in page.content  # served locally, no CDN


def test_anonymous_users_get_neither_the_schema_nor_the_page(client):
    for path in ("/api/schema/", "/api/schema/?format=json"):
        refused = client.get(path)
        assert refused.status_code == 401 and refused["Content-Type"] == "application/problem+json", path
        assert refused.json()["code"] == "not_authenticated"
    page = client.get("/api/docs/")
    assert page.status_code == 302 and page["Location"] == "/console/login/?next=/api/docs/"


def test_every_operation_documents_the_problems_it_can_answer(schema):
    # schemathesis found undocumented answers (400 invalid_destination on every path with a name, 415 on
    # bodies, 404 on unroutable names...): each operation now lists them, as problem details
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            expected = {"401", "429"}
            if "{" in path:
                expected |= {"400", "404"}
            if "requestBody" in operation:
                expected |= {"400", "413"} | (set() if path.startswith("/api/message") else {"415"})
            if "/consumers/{consumer_id}" in path:
                expected.add("410")
            missing = expected - set(responses)
            assert not missing, f"{method.upper()} {path} does not document {sorted(missing)}"
            for status in expected:
                content = responses[status]["content"]["application/problem+json"]
                assert content["schema"]["$ref"].endswith("/Problem")
            assert responses["429"]["headers"]["Retry-After"]["required"] is True
