"""The console's Analytics pages: the analytics pipeline's summary (analytics/pipeline.py, stored in Redis
at `<ns>:analytics:summary`) for every destination, and per destination its latency, throughput,
dead-letter and group-balance charts with the rebalance recommendation. The browser draws them from
`summary.json`; the "Remove all message groups" button calls the REST API like the queue page's."""

from __future__ import annotations

import datetime as dt
import functools
import time
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from analytics import config
from analytics.store import read_summary
from broker_core.destinations import Destination, parse_destination
from broker_core.errors import InvalidDestination
from gateway.permissions import allowed

LOGIN = "console:login"
NOT_RUN = ("The analytics jobs have not run yet: run `python manage.py signalbox_analytics` or set "
           "SIGNALBOX_ANALYTICS_SECONDS to schedule them.")


@functools.cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def _summary() -> dict[str, Any] | None:
    return read_summary(_redis(), settings.SIGNALBOX_NAMESPACE)


def _moment(ms: int) -> dict[str, str]:
    """A moment of the run's range as the console shows times (UTC, to the second), and for <time>."""
    moment = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return {"text": moment.strftime("%Y-%m-%d %H:%M:%S UTC"), "iso": moment.strftime("%Y-%m-%dT%H:%M:%SZ")}


def _stale(summary: dict[str, Any]) -> str | None:
    """What to say when the jobs are scheduled (SIGNALBOX_ANALYTICS_SECONDS) and the last run is older than
    two of their periods and a minute: the scheduled runs have stopped (worker or beat down, runs failing),
    and the page would otherwise show old figures as the current ones. None when not overdue or not
    scheduled (a run by hand is as old as its time says)."""
    period_s = config.analytics_seconds()
    age_ms = int(time.time() * 1000) - summary["generated_at_ms"]
    if period_s <= 0 or age_ms <= 2 * period_s * 1000 + 60_000:
        return None
    every = f"{period_s / 60:g} min" if period_s % 60 == 0 else f"{period_s:g} s"
    computed = _moment(summary["generated_at_ms"])["text"]
    return (f"These figures are stale: the analytics jobs are scheduled every {every}, but the last run was "
            f"computed {computed}. Are the Celery worker and beat running, and do the runs succeed (the "
            "worker's log)?")


def _destination(kind: str, name: str) -> Destination:
    if kind not in ("queue", "topic"):
        raise Http404(f"unknown destination kind {kind!r}; expected queue or topic")
    try:
        return parse_destination(name, kind)  # type: ignore[arg-type]
    except InvalidDestination as exc:
        raise Http404(str(exc)) from None


def _forbidden(request: HttpRequest, detail: str) -> HttpResponse:
    return render(request, "console/forbidden.html", {"detail": detail, "section": ""}, status=403)


@login_required(login_url=LOGIN)
def index(request: HttpRequest) -> HttpResponse:
    """Every destination of the last run that the user may read, with its totals."""
    summary = _summary()
    rows = []
    for uri, entry in sorted(((summary or {}).get("destinations") or {}).items()):
        destination = parse_destination(uri)
        if allowed(request.user, destination, "read"):
            balance = entry["groups"].get("balance") or {}
            lost = entry["totals"].get("lost", 0)  # (summaries from before the counter have none)
            rows.append({"destination": destination, "totals": entry["totals"],
                         "recommend_reset": bool(balance.get("recommend_reset")),
                         "lost": f"{lost:,}" if lost else ""})
    moments = ({name: _moment(summary[f"{name}_ms"]) for name in ("since", "until", "generated_at")}
               if summary else {})
    return render(request, "console/analytics.html", {
        "section": "analytics", "summary": summary, "moments": moments, "rows": rows, "not_run": NOT_RUN,
        "stale": _stale(summary) if summary else None, "destination": None})


@login_required(login_url=LOGIN)
def destination(request: HttpRequest, kind: str, name: str) -> HttpResponse:
    dest = _destination(kind, name)
    if not allowed(request.user, dest, "read"):
        return _forbidden(request, f"You have no read permission on {dest.uri}.")
    return render(request, "console/analytics.html", {
        "section": "analytics", "destination": dest, "admin": allowed(request.user, dest, "admin"),
        "not_run": NOT_RUN})


@login_required(login_url=LOGIN)
def summary_json(request: HttpRequest, kind: str, name: str) -> JsonResponse:
    """The destination's part of the summary, with the run's range; 404 (with the reason) when missing."""
    dest = _destination(kind, name)
    if not allowed(request.user, dest, "read"):
        return JsonResponse({"detail": f"You have no read permission on {dest.uri}."}, status=403)
    summary = _summary()
    if summary is None:
        return JsonResponse({"detail": NOT_RUN}, status=404)
    entry = summary["destinations"].get(dest.uri)
    if entry is None:
        return JsonResponse({"detail": f"The last analytics run saw no events on {dest.uri}."}, status=404)
    return JsonResponse({"destination": dest.uri, "since_ms": summary["since_ms"],
                         "until_ms": summary["until_ms"], "generated_at_ms": summary["generated_at_ms"],
                         "stale": _stale(summary), "counters": summary["counters"], **entry})
