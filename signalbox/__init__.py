"""The Django project package: settings, ASGI routing, root URLs, the Celery app and the launcher."""

from .celery import app as celery_app

__all__ = ["celery_app"]
