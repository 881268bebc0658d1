"""One error shape for the whole API: RFC 9457 problem details (`application/problem+json`).

Every failure, whether a broker_core error, a DRF exception or a gateway refusal, becomes
`{"type", "title", "status", "detail", "instance", "code", ...}` plus the members that let a client act
on it (a selector's `position` and `expected`, a validation error's `errors`, `retry_after`).
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from rest_framework import exceptions, status
from rest_framework.response import Response

from broker_core import errors as broker_errors
from gateway import unavailable
from gateway.logins import LoginRefused

log = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:signalbox:problem:"

# broker_core error code -> (HTTP status, title). Unknown codes are 400 unless they carry retry_after.
BROKER_STATUS: dict[str, tuple[int, str]] = {
    "invalid_selector": (400, "Invalid selector"),
    "invalid_destination": (400, "Invalid destination"),
    "invalid_message": (400, "Invalid message"),
    "message_too_large": (413, "Message too large"),
    "invalid_consumer": (400, "Invalid consumer"),
    "too_many_consumers": (409, "Too many consumers"),  # SIGNALBOX_MAX_CONSUMERS (errors.TooManyConsumers)
    "invalid_policy": (400, "Invalid policy"),
    "unknown_consumer": (404, "Unknown consumer"),
    "unknown_destination": (404, "Unknown destination"),
    "no_destination": (404, "Unknown destination"),
    "unknown_message": (404, "Unknown message"),
    "not_in_flight": (409, "Message not in flight"),
    "transaction_error": (409, "Transaction error"),
    "operation_refused": (409, "Operation refused"),
    # topics (issue 5)
    "unknown_subscription": (404, "Unknown subscription"),
    "durable_in_use": (409, "Durable subscription in use"),
    # Producer flow control and resource limits (issue 4 names): refused now, try again later.
    "flow_control": (503, "Flow control"),
    "producer_flow_control": (503, "Flow control"),
    "resource_limit": (503, "Resource limit reached"),
    "destination_full": (503, "Destination full"),
    "redis_maxmemory": (503, "Redis memory full"),  # the maxmemory backstop (errors.RedisMaxMemory)
}


class Problem(exceptions.APIException):
    """A gateway refusal with its own code, status and extra members."""

    def __init__(self, status_code: int, code: str, title: str, detail: str, **extra: Any) -> None:
        super().__init__(detail=detail, code=code)
        self.status_code = status_code
        self.problem_code = code
        self.title = title
        self.extra = extra


# The ASGI scope's key for url_not_utf8's refusal: asgi.py sets it, GatewayView raises it after the login.
URL_NOT_UTF8 = "signalbox.url_not_utf8"


def url_not_utf8(scope: dict[str, Any]) -> Problem | None:
    """A refusal when the URL's path or a query parameter is not UTF-8 once percent-decoded, else None.
    uvicorn and Django decode %XX with errors="replace", so `/queues/a%FFb` and `/queues/a%FEb` would
    both name the queue `a\ufffdb` (U+FFFD), which neither client asked for, and a send would create it;
    a query value (`?destination=`, `clientId=`) the same. Only URLs holding a `%` need the look."""

    def check(raw: bytes, what: str, parameter: str) -> Problem | None:
        try:
            unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            return Problem(400, "invalid_parameter", "Invalid parameter",
                           f"{what} is not UTF-8 once percent-decoded (byte 0x{exc.object[exc.start]:02X} "
                           f"at {exc.start + 1} of {len(exc.object)}): percent-encode the text's UTF-8 bytes",
                           parameter=parameter)
        return None

    path = scope.get("raw_path") or b""
    if b"%" in path and (refusal := check(path.split(b"?")[0], "the path", "path")) is not None:
        return refusal
    query = scope.get("query_string") or b""
    if b"%" in query:
        for field in query.split(b"&"):
            if b"%" not in field:
                continue
            name, _, value = field.replace(b"+", b" ").partition(b"=")
            label = unquote_to_bytes(name).decode("utf-8", "replace")
            refusal = check(name, "a query parameter's name", label) or check(
                value, f"query parameter {label}", label)
            if refusal is not None:
                return refusal
    return None


class NotSupportedYet(Problem):
    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(501, "not_supported", "Not supported yet", detail, **extra)


def topics_not_supported(destination: str = "") -> NotSupportedYet:
    where = f" ({destination})" if destination else ""
    return NotSupportedYet(
        f"topics are not yet supported by this broker{where}; use a queue (queue://name, or type=queue "
        "on /api/message)", destination=destination)


def problem(status_code: int, code: str, title: str, detail: str, instance: str = "",
            **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"type": TYPE_PREFIX + code, "title": title, "status": status_code,
                            "detail": detail, "code": code}
    if instance:
        body["instance"] = instance
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


def _drf_code(exc: exceptions.APIException) -> str:
    codes = exc.get_codes()
    return codes if isinstance(codes, str) else exc.default_code


def describe(exc: BaseException) -> tuple[int, dict[str, Any], dict[str, str]] | None:
    """(status, problem members without instance, headers) for a known exception, else None."""
    headers: dict[str, str] = {}
    if isinstance(exc, Problem):
        return exc.status_code, problem(exc.status_code, exc.problem_code, exc.title, str(exc.detail),
                                        **exc.extra), headers
    if isinstance(exc, broker_errors.BrokerError):
        status_code, title = BROKER_STATUS.get(exc.code, (400, exc.code.replace("_", " ").capitalize()))
        extra = {k: v for k, v in exc.details.items() if isinstance(v, str | int | float | bool)}
        retry_after = getattr(exc, "retry_after", None) or exc.details.get("retry_after")
        if retry_after is not None:
            status_code = 503 if status_code == 400 else status_code
            headers["Retry-After"] = str(max(1, round(float(retry_after))))
            extra["retry_after"] = float(retry_after)
        elif status_code == 503:
            headers["Retry-After"] = "1"
        return status_code, problem(status_code, exc.code, title, exc.message, **extra), headers
    if unavailable.store_unavailable(exc):  # (logged once, where the response is made: log_unavailable)
        wait = unavailable.retry_after()
        headers["Retry-After"] = str(wait)
        return 503, problem(503, unavailable.CODE, unavailable.TITLE, unavailable.explain(exc),
                            retry_after=wait), headers
    if isinstance(exc, RequestDataTooBig):
        # (Django's text names its own setting, which an operator sets as SIGNALBOX_MAX_REQUEST_BYTES)
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return 413, problem(413, "request_too_large", "Request too large",
                            f"the request body is over {limit} bytes (SIGNALBOX_MAX_REQUEST_BYTES); a body "
                            "sent as body_base64 takes 4/3 of its size"), headers
    if isinstance(exc, exceptions.ValidationError):
        errors = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        first = _first_message(errors)
        return 400, problem(400, "validation_error", "Invalid request", first, errors=errors), headers
    if isinstance(exc, Http404):
        return 404, problem(404, "not_found", "Not found", str(exc) or "no such resource"), headers
    if isinstance(exc, DjangoPermissionDenied):
        return 403, problem(403, "permission_denied", "Permission denied",
                            str(exc) or "you may not do this"), headers
    if isinstance(exc, LoginRefused):  # (HTTP Basic or POST /api/v1/auth/token; gateway/logins.py)
        headers["Retry-After"] = str(round(exc.retry_after))
        return 429, problem(429, "login_refused", "Login refused", exc.message,
                            retry_after=exc.retry_after), headers
    if isinstance(exc, exceptions.Throttled):
        wait = exc.wait or 1
        headers["Retry-After"] = str(max(1, round(wait)))
        return 429, problem(429, "rate_limited", "Too many requests", str(exc.detail),
                            retry_after=wait), headers
    if isinstance(exc, exceptions.APIException):
        code = _drf_code(exc)
        titles = {401: "Authentication required", 403: "Permission denied", 404: "Not found",
                  405: "Method not allowed", 406: "Not acceptable", 415: "Unsupported media type"}
        title = titles.get(exc.status_code, code.replace("_", " ").capitalize())
        return exc.status_code, problem(exc.status_code, code, title, str(exc.detail)), headers
    return None


def _first_message(errors: Any) -> str:
    if isinstance(errors, dict):
        for key, value in errors.items():
            inner = _first_message(value)
            return f"{key}: {inner}" if key != "non_field_errors" else inner
    if isinstance(errors, list) and errors:
        return _first_message(errors[0])
    return str(errors)


def log_unavailable(path: str, exc: BaseException, response: Any = None) -> None:
    """The one line of a 503 for Redis being away: the request's path and the cause (the driver's text,
    which the client is not shown). `response` is marked as logged, so that Django's request log does not
    add a second line for it (its "Service Unavailable: <path>", at ERROR, without the cause)."""
    log.warning("%s: %s: Redis unavailable (%s)", HTTPStatus.SERVICE_UNAVAILABLE.phrase, path, exc)
    if response is not None:
        response._has_been_logged = True  # (django.utils.log.log_response's own mark)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's EXCEPTION_HANDLER: every exception a view raises becomes a problem response."""
    request = context.get("request")
    described = describe(exc)
    if described is None:
        log.exception("unexpected error in %s", getattr(request, "path", "?"), exc_info=exc)
        described = (500, problem(500, "internal_error", "Internal error",
                                  "the gateway failed unexpectedly; the error is logged"), {})
    status_code, body, headers = described
    if request is not None:
        body["instance"] = request.get_full_path() if hasattr(request, "get_full_path") else ""
    response = Response(body, status=status_code, content_type=PROBLEM_CONTENT_TYPE)
    if isinstance(exc, exceptions.APIException) and getattr(exc, "auth_header", None):
        response["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
    for name, value in headers.items():
        response[name] = value
    if unavailable.store_unavailable(exc):
        log_unavailable(getattr(request, "path", "?"), exc, response)
    return response


def problem_response(request: HttpRequest, status_code: int, code: str, title: str, detail: str,
                     **extra: Any) -> JsonResponse:
    """A problem response outside DRF (URL-level 404/500 under /api/)."""
    body = problem(status_code, code, title, detail, request.get_full_path(), **extra)
    return JsonResponse(body, status=status_code, content_type=PROBLEM_CONTENT_TYPE)


def not_found(request: HttpRequest, exception: Exception | None = None) -> Any:
    """handler404: problem details under /api/, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return problem_response(request, 404, "not_found", "Not found", f"no resource at {request.path}")
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def server_error(request: HttpRequest) -> Any:
    if request.path.startswith("/api/"):
        return problem_response(request, 500, "internal_error", "Internal error",
                                "the gateway failed unexpectedly; the error is logged")
    from django.views.defaults import server_error as django_server_error

    return django_server_error(request)


class UnavailableMiddleware(MiddlewareMixin):
    """The same answer for Django's own views (console pages, admin): DRF views and the API's hot path
    answer through gateway/api/errors.describe before an exception gets here. Only process_exception: no
    work on requests that succeed."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not unavailable.store_unavailable(exception):
            return None
        if request.path.startswith("/api/"):
            response: HttpResponse = problem_response(
                request, 503, unavailable.CODE, unavailable.TITLE, unavailable.explain(exception),
                retry_after=unavailable.retry_after())
        else:
            text = f"503 {unavailable.TITLE}: {unavailable.explain(exception)}\n"
            response = HttpResponse(text, status=503, content_type="text/plain; charset=utf-8")
        response["Retry-After"] = str(unavailable.retry_after())
        log_unavailable(request.path, exception, response)
        return response


__all__ = ["PROBLEM_CONTENT_TYPE", "Problem", "NotSupportedYet", "describe", "exception_handler",
           "problem", "status", "topics_not_supported", "UnavailableMiddleware"]
