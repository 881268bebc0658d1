"""Beat archives the events every minute by default; the Spark jobs are scheduled only when enabled."""

from __future__ import annotations

from signalbox.celery import ANALYTICS_ARCHIVE, ANALYTICS_RUN, app, schedule_analytics


def test_beat_archives_every_minute_and_leaves_the_jobs_off_by_default(celery_worker):
    assert {ANALYTICS_ARCHIVE, ANALYTICS_RUN} <= set(celery_worker.app.tasks)
    entry = app.conf.beat_schedule["analytics archive"]
    assert (entry["task"], entry["schedule"]) == (ANALYTICS_ARCHIVE, 60.0)
    assert "analytics jobs" not in app.conf.beat_schedule


def test_the_jobs_schedule_follows_its_setting(monkeypatch):
    monkeypatch.setenv("SIGNALBOX_ANALYTICS_SECONDS", "3600")
    monkeypatch.setenv("SIGNALBOX_ARCHIVE_SECONDS", "30")
    before = dict(app.conf.beat_schedule)
    try:
        schedule_analytics(app)
        assert app.conf.beat_schedule["analytics jobs"]["schedule"] == 3600.0
        assert app.conf.beat_schedule["analytics jobs"]["task"] == ANALYTICS_RUN
        assert app.conf.beat_schedule["analytics archive"]["schedule"] == 30.0
    finally:
        app.conf.beat_schedule = before
