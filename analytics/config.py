"""Analytics settings: an environment variable, else the Django setting of the same name, else a default.

Works with and without Django (plain spark-submit), so the job reads the same knobs either way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def _setting(name: str, default: Any) -> Any:
    if os.environ.get(name):
        return os.environ[name]
    try:
        from django.conf import settings

        if settings.configured and getattr(settings, name, None) not in (None, ""):
            return getattr(settings, name)
    except ImportError:
        pass
    return default


def data_dir() -> Path:
    return Path(_setting("SIGNALBOX_DATA_DIR", Path(__file__).resolve().parent.parent / "var"))


def archive_url() -> str:
    """SIGNALBOX_ARCHIVE_URL: a folder (default <data dir>/archive) or a URL pyarrow.fs and Spark read."""
    return str(_setting("SIGNALBOX_ARCHIVE_URL", data_dir() / "archive"))


def archive_retention_days() -> int:
    """SIGNALBOX_ARCHIVE_RETENTION_DAYS: day folders older than this are deleted (0 keeps all)."""
    return _int("SIGNALBOX_ARCHIVE_RETENTION_DAYS", 30)


def archive_seconds() -> float:
    """SIGNALBOX_ARCHIVE_SECONDS: beat period of the archive task (0 turns it off)."""
    return float(_setting("SIGNALBOX_ARCHIVE_SECONDS", 60.0))


def archive_keep_ms() -> int:
    """SIGNALBOX_ARCHIVE_KEEP_MS: archived events younger than this stay in the stream for live views."""
    return _int("SIGNALBOX_ARCHIVE_KEEP_MS", 300_000)


def output_url() -> str:
    """SIGNALBOX_ANALYTICS_OUTPUT: where the job writes its Parquet tables and summary.json."""
    return str(_setting("SIGNALBOX_ANALYTICS_OUTPUT", data_dir() / "analytics"))


def analytics_seconds() -> float:
    """SIGNALBOX_ANALYTICS_SECONDS: beat period of the analytics job; 0 (the default) turns it off."""
    return float(_setting("SIGNALBOX_ANALYTICS_SECONDS", 0.0))


def analytics_window_hours() -> float:
    """SIGNALBOX_ANALYTICS_WINDOW_HOURS: the range a scheduled run covers, ending now."""
    return float(_setting("SIGNALBOX_ANALYTICS_WINDOW_HOURS", 24.0))


def _int(name: str, default: int) -> int:
    value = _setting(name, default)
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a whole number, got {value!r}") from exc
