"""The OpenAPI schema's view, and descriptions of the gateway's authentication classes (drf-spectacular
extensions)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from drf_spectacular.views import SpectacularAPIView
from rest_framework.renderers import JSONRenderer

from gateway.api import serializers as s
from gateway.api.common import topics_supported


class SchemaView(SpectacularAPIView):
    """drf-spectacular's schema view, whose refusals (401) are problem details in JSON like the API's,
    not problem members written as YAML."""

    def handle_exception(self, exc: Exception) -> Any:
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return super().handle_exception(exc)


class TokenScheme(OpenApiAuthenticationExtension):
    target_class = "gateway.api.auth.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "`Token <key>`; get the key from POST /api/v1/auth/token"}


class SessionScheme(OpenApiAuthenticationExtension):
    target_class = "gateway.api.auth.SessionAuthentication"
    name = "cookieAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}


class BasicScheme(OpenApiAuthenticationExtension):
    target_class = "gateway.api.auth.BasicAuthentication"
    name = "basicAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "http", "scheme": "basic"}


# What every operation may answer besides its own statuses, and the problem codes behind each (docs/api.md,
# Errors). Added by `complete_problems` wherever the operation can meet the cause.
_COMMON_PROBLEMS = {
    "400": "Invalid request: `invalid_destination` (a name in the path), `invalid_parameter`, "
           "`invalid_json` (also past MAX_JSON_DEPTH, lone surrogates), `invalid_body`, "
           "`validation_error`, `invalid_idempotency_key`, and broker_core's `invalid_*` codes",
    "401": "Not authenticated: `not_authenticated`, `authentication_failed`",
    "403": "Permission denied: `permission_denied` (the detail names the action and destination); "
           "`cross_site_request` on /api/message",
    "404": "Not found: `not_found` (no such path, e.g. a name with a slash), `unknown_destination`, "
           "`unknown_consumer`, `unknown_message`, `unknown_group`, `unknown_policy`",
    "413": "Too large: `request_too_large` (SIGNALBOX_MAX_REQUEST_BYTES), `message_too_large`",
    "415": "Unsupported media type: `unsupported_media_type` (send application/json)",
    "409": "Conflict: `idempotency_in_progress` (a request with this Idempotency-Key still runs)",
    "422": "Unprocessable: `idempotency_key_reused` (this Idempotency-Key came with another request)",
    "410": "Gone: `consumer_aborted` (a slow-consumer strategy or an operator aborted the consumer)",
    "429": "Rate limited: `rate_limited` (Retry-After; SIGNALBOX_API_RATE_LIMIT); `login_refused` (a "
           "password login, HTTP Basic or the token endpoint, refused unchecked: SIGNALBOX_LOGIN_FAILURES, "
           "SIGNALBOX_LOGIN_QUEUE)",
    "503": "Unavailable for now: `flow_control`, `resource_limit`, `destination_full`, or Redis "
           "unreachable (Retry-After)",
}


def _can_answer(status: str, path: str, operation: dict[str, Any]) -> bool:
    has_path_parameters = "{" in path
    has_body = "requestBody" in operation
    has_query = any(p.get("in") == "query" for p in operation.get("parameters", []))
    public = not operation.get("security") or {} in operation.get("security", [])
    if status == "400":
        return has_path_parameters or has_body or has_query
    if status == "403":
        return not public
    if status == "404":
        return has_path_parameters
    if status == "413":
        return has_body
    if status == "415":
        return has_body and not path.startswith("/api/message")  # the servlet takes any body
    if status == "410":
        return "/consumers/{consumer_id}" in path
    if status in ("409", "422"):
        return any(p.get("in") == "header" and p.get("name", "").lower() == "idempotency-key"
                   for p in operation.get("parameters", []))
    if status == "503":
        return not path.startswith("/api/v1/auth/")  # the token endpoint needs only the database
    return True


def complete_problems(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: every operation documents every problem it can answer, so the
    schema is complete (schemathesis checks status codes, content types and bodies against it)."""
    problem = {"schema": {"$ref": "#/components/schemas/Problem"}}
    for path, item in result.get("paths", {}).items():
        for method, operation in item.items():
            if method not in ("get", "put", "post", "patch", "delete"):
                continue
            responses = operation.setdefault("responses", {})
            for status, description in _COMMON_PROBLEMS.items():
                if not _can_answer(status, path, operation):
                    continue
                answer = responses.setdefault(status, {"description": description})
                answer.setdefault("content", {}).setdefault(PROBLEM_TYPE, problem)
                if status in ("429", "503"):
                    answer.setdefault("headers", {})["Retry-After"] = _RETRY_AFTER
    return result


_RETRY_AFTER = {"required": True, "schema": {"type": "integer", "minimum": 1},
                "description": "Seconds to wait before trying again"}


# -- what the views declare: their problem responses and the {kind} parameter

PROBLEM_TYPE = "application/problem+json"
PROBLEMS = {code: OpenApiResponse(s.ProblemSerializer, description=text) for code, text in {
    400: "Invalid request (problem details)", 401: "Not authenticated", 403: "Permission denied",
    404: "Unknown destination or consumer", 413: "Message too large", 429: "Rate limited",
    501: "Not supported yet (topics, scheduled delivery)", 503: "Flow control: retry later",
}.items()}


def problems(*codes: int) -> dict[tuple[int, str], OpenApiResponse]:
    """Problem-details responses for the schema, under their own media type. Every endpoint may
    answer 401 (no or bad credentials) and 429 (rate limit)."""
    return {(code, PROBLEM_TYPE): PROBLEMS[code] for code in sorted({*codes, 401, 429})}


def problem_doc(code: int, text: str) -> dict[tuple[int, str], OpenApiResponse]:
    return {(code, PROBLEM_TYPE): OpenApiResponse(s.ProblemSerializer, description=text)}


# Topic URLs answer 501 until broker_core has topics; the schema offers them from then on.
KIND_PARAM = OpenApiParameter("kind", str, OpenApiParameter.PATH,
                              enum=["queues", "topics"] if topics_supported() else ["queues"])
