"""The Celery app. Workers and beat run broker_core maintenance; tasks stay one-line wrappers."""

import os
import warnings
from typing import Any

from celery import Celery, signals
from celery.exceptions import SecurityWarning

from signalbox import logs, node

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "signalbox.settings")

# signalbox.tasks: the maintenance tasks (broker_core/maintenance.py) every worker knows.
app = Celery("signalbox", include=["signalbox.tasks"])
# Every CELERY_* name in signalbox/settings.py configures this app (broker = REDIS_URL by default).
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.setup_logging.connect
def use_signalbox_logging(**kwargs: Any) -> None:
    """Workers and beat log like every other process of the run (signalbox/logs.py: SIGNALBOX_LOG_LEVEL,
    SIGNALBOX_LOG_FORMAT) instead of Celery's own set-up; with a receiver here Celery neither installs
    handlers nor redirects stdout."""
    logs.configure()


@signals.worker_ready.connect
def worker_heartbeat(sender: Any = None, **kwargs: Any) -> None:
    """A worker's heartbeat for the node page (signalbox/node.py), from its main process."""
    node.start_heartbeat("worker", getattr(sender, "hostname", "") or "")


@signals.worker_shutdown.connect
def worker_heartbeat_stop(**kwargs: Any) -> None:
    node.stop_heartbeat("worker")


@signals.beat_init.connect
def beat_heartbeat(**kwargs: Any) -> None:
    """Beat's heartbeat (node.py registers its stop at exit: beat has no shutdown signal)."""
    node.start_heartbeat("beat")


if os.environ.get("SIGNALBOX_PROCESS"):
    # Started by `run`, whose launcher says once, in one line, what to do about running as root; Celery's
    # multi-line "superuser privileges" warning would repeat it at every worker (re)start.
    warnings.filterwarnings("ignore", category=SecurityWarning)

MAINTENANCE_TICK = "signalbox.maintenance.tick"
MAINTENANCE_TICK_SECONDS = 1.0
# A tick no worker started within this long is dropped: the next one does the same work, and ticks
# must not pile up while the workers are down.
MAINTENANCE_TICK_EXPIRES = 5.0


@app.on_after_configure.connect
def schedule_maintenance(sender: Celery, **kwargs: Any) -> None:
    """Beat sends the maintenance dispatcher every second. The periods themselves come from the
    destination policies, read at every tick, so changing them needs no restart. The tick carries the
    namespace of the process running beat, so a worker serves the deployment that scheduled it."""
    from django.conf import settings

    sender.add_periodic_task(
        MAINTENANCE_TICK_SECONDS,
        sender.signature(MAINTENANCE_TICK, kwargs={"namespace": settings.SIGNALBOX_NAMESPACE}),
        name="broker maintenance",
        expires=MAINTENANCE_TICK_EXPIRES,
        ignore_result=True,
    )


# -- archive the lifecycle events every SIGNALBOX_ARCHIVE_SECONDS (default 60 s);
# run the PySpark jobs every SIGNALBOX_ANALYTICS_SECONDS (0, the default, leaves them off).
ANALYTICS_ARCHIVE = "signalbox.analytics.archive"
ANALYTICS_RUN = "signalbox.analytics.run"


@app.on_after_configure.connect
def schedule_analytics(sender: Celery, **kwargs: Any) -> None:
    from django.conf import settings

    from analytics import config

    namespace = {"namespace": settings.SIGNALBOX_NAMESPACE}
    for task, name, seconds in ((ANALYTICS_ARCHIVE, "analytics archive", config.archive_seconds()),
                                (ANALYTICS_RUN, "analytics jobs", config.analytics_seconds())):
        if seconds > 0:
            # A run nobody started within one period is dropped: the next one covers the same ground.
            sender.add_periodic_task(seconds, sender.signature(task, kwargs=namespace), name=name,
                                     expires=seconds, ignore_result=True)
