from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "Signalbox gateway"

    def ready(self) -> None:
        from gateway.permissions import connect_signals

        connect_signals()
