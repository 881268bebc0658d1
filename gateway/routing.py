"""WebSocket URL patterns of the gateway, collected by signalbox.routing."""

from django.urls import path

from gateway.consumers import PingConsumer

websocket_urlpatterns = [
    path("ws/ping", PingConsumer.as_asgi()),
]
