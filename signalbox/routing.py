"""WebSocket routing: every package's websocket_urlpatterns, behind session auth and an Origin check."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http.request import is_same_domain

from gateway.routing import websocket_urlpatterns as gateway_websocket_urlpatterns

websocket_urlpatterns = [*gateway_websocket_urlpatterns]

_DEFAULT_PORTS = {"http": 80, "https": 443}
Origin = tuple[str, str, int]  # scheme, host (lower case, IPv6 without brackets), port


def parse_origin(text: str) -> Origin | None:
    """(scheme, host, port) of a serialized origin (RFC 6454), or None when it is not one ("null",
    a path, userinfo, a scheme other than http/https)."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username is not None \
            or parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else _DEFAULT_PORTS[scheme]


def configured_origins() -> list[Origin]:
    """SIGNALBOX_ALLOWED_ORIGINS, parsed; a wrong entry stops the start."""
    origins = []
    for entry in getattr(settings, "SIGNALBOX_ALLOWED_ORIGINS", []):
        origin = parse_origin(entry)
        if origin is None:
            raise ImproperlyConfigured(f"SIGNALBOX_ALLOWED_ORIGINS: {entry!r} is not an origin; give "
                                       "scheme://host[:port], e.g. https://console.example.com")
        origins.append(origin)
    return origins


class BrowserOriginValidator:
    """Refuses WebSocket handshakes from pages of other origins; accepts clients that send no Origin.

    Browsers always send Origin, and they send the console's session cookie to any port of the host, so
    a page of http://127.0.0.1:9999 would otherwise ride the admin's session: scheme, host and port
    must all match an allowed origin. Those are SIGNALBOX_ALLOWED_ORIGINS when set; by default every
    ALLOWED_HOSTS name (a leading dot covering subdomains, as in ALLOWED_HOSTS; `*` gives none) with the
    scheme and port this connection came in on, i.e. pages served by this very server. Broker clients
    (STOMP over WebSocket, scripts) send no Origin; channels' AllowedHostsOriginValidator would refuse
    them, which is wrong for a message broker's gateway.
    """

    def __init__(self, application: Any) -> None:
        self.application = application
        self.configured = configured_origins()
        hosts = list(settings.ALLOWED_HOSTS)
        if settings.DEBUG and not hosts:
            hosts = ["localhost", "127.0.0.1", "[::1]"]
        self.hosts = [h.lower().strip("[]") for h in hosts if h != "*"]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if self.allowed(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)

    def allowed(self, scope: dict[str, Any]) -> bool:
        values = [value for name, value in scope.get("headers", []) if name == b"origin"]
        if not values:
            return True
        if len(values) > 1:
            return False
        origin = parse_origin(values[0].decode("latin-1"))
        if origin is None:
            return False
        if self.configured:
            return origin in self.configured
        scheme, host, port = origin
        return (scheme, port) == self.served_at(scope) and any(is_same_domain(host, h) for h in self.hosts)

    @staticmethod
    def served_at(scope: dict[str, Any]) -> tuple[str, int]:
        """The scheme and port of this server as a page of it has them in its origin."""
        scheme = "https" if scope.get("scheme") == "wss" else "http"
        server = scope.get("server")
        port = server[1] if server and server[1] is not None else settings.SIGNALBOX_PORT
        return scheme, int(port)


def origin_checked(application: Any) -> BrowserOriginValidator:
    return BrowserOriginValidator(application)
