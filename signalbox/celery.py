"""The Celery app. Workers and beat run broker_core maintenance; tasks stay one-line wrappers."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "signalbox.settings")

app = Celery("signalbox")
# Every CELERY_* name in signalbox/settings.py configures this app (broker = REDIS_URL by default).
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
