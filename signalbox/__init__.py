"""The Django project package: settings, ASGI routing, root URLs, the Celery app and the launcher.

The Celery app is loaded on first use of `signalbox.celery_app` (or `signalbox.celery`), not on import:
`signalbox.cli`, the command line, lives in this package and must start without Django or Celery.
No task uses `shared_task`, so nothing needs the app to exist before its module is imported.
"""

from typing import Any

__all__ = ["celery_app"]


def __getattr__(name: str) -> Any:
    if name == "celery_app":
        from .celery import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
