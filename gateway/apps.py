from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "Signalbox gateway"

    def ready(self) -> None:
        from gateway.api import auth
        from gateway.permissions import connect_signals

        connect_signals()
        # in every process (`manage.py changepassword` too): a changed user or token reaches the others
        auth.connect_signals()
