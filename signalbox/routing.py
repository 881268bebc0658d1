"""WebSocket routing: every package's websocket_urlpatterns, behind session auth and an Origin check."""

from __future__ import annotations

from typing import Any

from channels.security.websocket import OriginValidator
from django.conf import settings

from gateway.routing import websocket_urlpatterns as gateway_websocket_urlpatterns

websocket_urlpatterns = [*gateway_websocket_urlpatterns]


class BrowserOriginValidator(OriginValidator):
    """Rejects cross-site browser connections, accepts clients that send no Origin at all.

    Browsers always send Origin, so a foreign Origin is a cross-site page riding the user's session.
    Broker clients (STOMP over WebSocket, scripts) send none; channels' AllowedHostsOriginValidator
    would refuse them, which is wrong for a message broker's gateway.
    """

    def valid_origin(self, parsed_origin: Any) -> bool:
        if parsed_origin is None:
            return True
        return super().valid_origin(parsed_origin)


def origin_checked(application: Any) -> BrowserOriginValidator:
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = ["localhost", "127.0.0.1", "[::1]"]
    return BrowserOriginValidator(application, allowed)
