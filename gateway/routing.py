"""WebSocket URL patterns of the gateway, collected by signalbox.routing."""

from django.urls import path

from gateway.consumers import JsonConsumer, PingConsumer, StompConsumer
from gateway.ws.events import ConsoleEventsConsumer

websocket_urlpatterns = [
    path("ws/ping", PingConsumer.as_asgi()),
    path("stomp", StompConsumer.as_asgi()),
    path("ws/v1", JsonConsumer.as_asgi()),
    path("ws/console/events", ConsoleEventsConsumer.as_asgi()),  # live feed
]
