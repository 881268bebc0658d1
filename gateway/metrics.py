"""What this web process records for GET /metrics (docs/metrics.md): HTTP requests by route and status
with their latency, WebSocket frames by protocol, command and outcome, password logins by outcome.

These live in the process, in prometheus_client's default registry. uvicorn runs one web process today;
with several behind one port a scrape reaches one of them at random, so per-process series (even with a
`process` label) would jump between processes from scrape to scrape. Set PROMETHEUS_MULTIPROC_DIR (an
empty folder, before the processes start) and prometheus_client keeps these values in files there,
which the scrape sums over every process (`signalbox.metrics`): one target, as Prometheus expects.
"""

from __future__ import annotations

import time
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from prometheus_client import Counter, Histogram, disable_created_metrics

# Without this every counter and histogram also gets a `<name>_created` gauge (the time the process
# made it): a series per label set that no dashboard or alert uses.
disable_created_metrics()

HTTP_REQUESTS = Counter(
    "signalbox_http_requests", "HTTP requests answered, by route name, method and status.",
    ["route", "method", "status"])
HTTP_DURATION = Histogram(
    "signalbox_http_request_duration_seconds",
    "Time from a request's arrival to the end of its response, by route name and method "
    "(a long-poll receive includes its wait).", ["route", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0))
WS_FRAMES = Counter(
    "signalbox_ws_frames", "STOMP frames (over WebSocket and TCP) and JSON protocol requests handled, by "
    "protocol, command and outcome (ok; error: refused with an ERROR frame or error object; internal_error).",
    ["protocol", "command", "outcome"])

PASSWORD_LOGINS = Counter(
    "signalbox_password_logins", "Password logins (STOMP, JSON protocol, HTTP Basic, token endpoint, "
    "console) by outcome: ok; failed (a wrong user name or password); refused_failures and refused_queue "
    "(refused unchecked by the login guard: SIGNALBOX_LOGIN_FAILURES, SIGNALBOX_LOGIN_QUEUE). A login the "
    "process's credential cache answers (the same credentials again within SIGNALBOX_AUTH_CACHE_SECONDS) "
    "runs no password check and is not counted.", ["outcome"])

# The scope key through which Django's middleware or the API's hot path names the route it served.
ROUTE_KEY = "signalbox.route"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def set_route(scope: dict[str, Any], route: str) -> None:
    scope[ROUTE_KEY] = route


# (route, method, status) -> that series of HTTP_REQUESTS and HTTP_DURATION's (route, method): route names,
# methods and statuses are few, so this stays small
_series: dict[tuple[str, str, str], tuple[Any, Any]] = {}


def instrument_http(app: Any, static_prefix: str = "/static/") -> Any:
    """An ASGI wrapper counting and timing every HTTP request. The route label is the URL pattern's name
    (`api-messages`, `healthz`, `admin:index`), never the path: paths carry destination names and
    consumer ids, which would make a series per queue and per consumer. Unnamed patterns show their
    view's dotted path; requests no pattern matched are `unmatched`, static files `static`."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        status = "disconnected"  # the client left before any answer (e.g. during a long poll)

        async def watched(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await app(scope, receive, watched)
        except BaseException:
            if status == "disconnected":
                status = "500"
            raise
        finally:
            route = scope.get(ROUTE_KEY)
            if route is None:
                route = "static" if scope.get("path", "").startswith(static_prefix) else "unmatched"
            method = scope.get("method", "")
            method = method if method in _METHODS else "other"
            series = _series.get((route, method, status))
            if series is None:  # (labels() looks the series up under a lock: once per route, method, status)
                series = _series[route, method, status] = (HTTP_REQUESTS.labels(route, method, status),
                                                           HTTP_DURATION.labels(route, method))
            series[0].inc()
            series[1].observe(time.perf_counter() - started)

    return wrapped


def route_middleware(get_response: Any) -> Any:
    """Django middleware (innermost) that names the matched URL pattern for `instrument_http`."""

    def label(request: Any) -> None:
        match = getattr(request, "resolver_match", None)
        scope = getattr(request, "scope", None)
        if match is not None and scope is not None:
            scope[ROUTE_KEY] = match.view_name  # the pattern's name with its namespace, e.g. admin:index

    if iscoroutinefunction(get_response):
        async def middleware(request: Any) -> Any:
            response = await get_response(request)
            label(request)
            return response

        return markcoroutinefunction(middleware)

    def sync_middleware(request: Any) -> Any:
        response = get_response(request)
        label(request)
        return response

    return sync_middleware


route_middleware.sync_capable = True  # type: ignore[attr-defined]
route_middleware.async_capable = True  # type: ignore[attr-defined]


# (protocol, command, outcome) -> that series of WS_FRAMES: `labels` takes a lock and builds a key on every
# call, a few microseconds of every frame; the label sets are few (the commands are STOMP's own)
_frames: dict[tuple[str, str, str], Any] = {}


def frame(protocol: str, command: str, outcome: str, count: int = 1) -> None:
    key = (protocol, command, outcome)
    series = _frames.get(key)
    if series is None:
        series = _frames[key] = WS_FRAMES.labels(protocol, command, outcome)
    series.inc(count)
