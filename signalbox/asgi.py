"""The ASGI application: Django over HTTP (static files included) and Channels over WebSocket."""

import os

from gateway.api.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "signalbox.settings")
# Set up Django (app registry, settings) before anything imports models through the consumers.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from gateway.metrics import instrument_http  # noqa: E402
from signalbox import collector, node  # noqa: E402
from signalbox.routing import origin_checked, websocket_urlpatterns  # noqa: E402

# The web process's heartbeat for the node page (a daemon thread; signalbox/node.py).
node.start_heartbeat("web")

application = ProtocolTypeRouter(
    {
        # The single-command set-up has no separate web server, so the app serves /static/ itself.
        # Every request is counted and timed for /metrics (gateway/metrics.py).
        "http": instrument_http(ASGIStaticFilesHandler(django_asgi_app)),
        "websocket": origin_checked(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
# Start-up is over: its objects out of the cyclic collector's sight (signalbox/collector.py).
collector.settle()
