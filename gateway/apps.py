from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "Signalbox gateway"

    def ready(self) -> None:
        from gateway import credentials, permissions

        permissions.connect_signals()
        # in every process (`manage.py changepassword` too): a changed user or token reaches the others
        credentials.connect_signals()
