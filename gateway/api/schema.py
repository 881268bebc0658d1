"""The OpenAPI schema's view, and descriptions of the gateway's authentication classes (drf-spectacular
extensions)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.views import SpectacularAPIView
from rest_framework.renderers import JSONRenderer


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
