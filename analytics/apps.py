from django.apps import AppConfig


class AnalyticsConfig(AppConfig):
    """Installed only for its management command (signalbox_analytics); analytics/ needs no Django."""

    name = "analytics"
    label = "signalbox_analytics"
