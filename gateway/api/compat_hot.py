"""The lean path of ActiveMQ's /api/message (compat.py), as hot_path.HotPath is for the native endpoints.

A POST of a text message, and a GET (or DELETE) that finds a message at once, cost about 0.5 ms of
Django's request object, URL resolver, middleware chain and DRF's request wrapping: more than the
broker's work. For the plain case this path parses the ASGI scope itself and calls the operations the
view calls (compat.send_message, compat.take_one), with the same checks in the same order: allowed host,
credentials from the authentication cache (Basic or token, never a session), no Sec-Fetch-Site,
permission, rate limit. Anything else goes to Django unchanged, before anything has changed: credentials
not yet verified, a form body, `action=unsubscribe`, a topic when topics are off, a parameter Django
would refuse, a first GET without a session cookie (the view makes the cookie), and a GET that finds no
message at once (Django's handler long-polls, and watches for the client leaving; the turn this path
took is ended first). The answers are the view's, byte for byte but for the order of headers
(tests/gateway_api/test_compat_hot_path.py compares them).
"""

from __future__ import annotations

import codecs
from typing import Any

from django.conf import settings
from django.http.cookie import parse_cookie
from django.utils.http import parse_header_parameters

from gateway.api import compat
from gateway.api.errors import Problem
from gateway.api.hot_path import allowed_methods, query_pairs, request_headers

PREFIX = "/api/message"
_METHODS = ("GET", "DELETE", "POST")
_FALLBACK = None
# The request headers this path reads (hot_path.request_headers), and those that send a request to Django
# (Sec-Fetch-Site: a browser's request, the view's cross-site check answers).
_HEADERS_READ = (b"host", b"authorization", b"content-type", b"cookie", b"selector")
_HEADERS = frozenset(_HEADERS_READ)
_NOT_HOT = frozenset({b"sec-fetch-site"})
# Pieces of an answer, as the view's passes through DRF (Allow) and Django's middleware
# (hot_path.HotPath.tail).
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


class CompatHotPath:
    def __init__(self, hot: Any) -> None:
        self.hot = hot
        self.allow = (b"Allow", allowed_methods(compat.MessageServletView).encode())
        self.max_fields = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS  # (a setting change makes a new one)

    @staticmethod
    def wants(scope: dict[str, Any]) -> bool:
        path = scope["path"]
        return scope["method"] in _METHODS and (path == PREFIX or path.startswith(PREFIX + "/"))

    def route(self, scope: dict[str, Any]) -> str:
        return "api-activemq-root" if scope["path"] == PREFIX else "api-activemq"

    async def serve(self, scope: dict[str, Any], body: bytes) -> Answer | None:
        hot = self.hot
        path = scope["path"][len(PREFIX) + 1:] if scope["path"] != PREFIX else ""
        if scope["path"] != PREFIX and not path:
            return _FALLBACK  # `/api/message/`: Django's 404
        found = request_headers(scope["headers"], _HEADERS, _NOT_HOT)
        if found is None:
            return _FALLBACK
        host, authorization, content_type, cookie, selector = map(found.get, _HEADERS_READ)
        if host is None or authorization is None or not hot.host_allowed(host):
            return _FALLBACK
        await hot.verified.refresh()
        hit = hot.verified.lookup(authorization)
        if hit is None or authorization[:6].lower() not in (b"basic ", b"token ", b"bearer"):
            return _FALLBACK
        user = hit[0]
        try:
            params: dict[str, list[str]] = {}
            for key, value in query_pairs(scope.get("query_string", b""), "utf-8", self.max_fields):
                params.setdefault(key, []).append(value)
            if "action" in params:
                return _FALLBACK
            destination = compat.compat_destination(path, params)
            if scope["method"] == "POST":
                media = (content_type or b"").split(b";")[0].strip().lower()
                if media in (b"application/x-www-form-urlencoded", b"multipart/form-data"):
                    return _FALLBACK
                if content_type is not None and not _utf8(content_type):
                    return _FALLBACK  # Django decodes the body by the charset it names
                if not await hot.allowed(user, [destination], "write"):
                    return _FALLBACK
                text = compat.message_text(params, b"" if "body" in params else body, "utf-8")
            else:
                if not await hot.allowed(user, [destination], "read"):
                    return _FALLBACK
                cookies = parse_cookie(cookie.decode("latin-1")) if cookie else {}
                session = cookies.get(compat.SESSION_COOKIE)
                client, new_cookie = compat.client_key(params, session)
                if new_cookie is not None:
                    return _FALLBACK  # the view makes the session and its cookie
                selector_text = selector.decode("latin-1") if selector is not None else None
                compat.read_timeout_ms(params)  # (refuses a bad readTimeout here, before any change)
        except (Problem, ValueError, UnicodeError, LookupError):
            return _FALLBACK  # Django answers the refusal; nothing has changed
        except Exception:  # noqa: BLE001 - e.g. an invalid destination name: Django's answer too
            return _FALLBACK
        try:
            await hot.throttle(_Caller(user), "compat")
            if scope["method"] == "POST":
                message_id = await compat.send_message(user, destination, params, text)
                return self.answer(200, "text/plain", [("messageID", message_id)], b"Message sent")
            # the whole answer is built (its headers encoded included) before it is handed to the handler,
            # which settles the message once it has written it (after_write.py)
            peer = scope.get("client") or ("",)
            taken = await compat.take_one(user.pk, client, destination, params, selector_text,
                                          lambda built: self.answer(200, built[0], built[2], built[1]),
                                          scope, wait=False, who=(user.get_username(), f"http://{peer[0]}"))
        except Exception as exc:  # noqa: BLE001 - answered as the view's exception handler does
            return hot.problem(scope, exc, self.allow)
        return taken  # None: nothing at once, Django's long poll (the turn is ended)

    def answer(self, status: int, content_type: str, headers: list[tuple[str, str]],
               payload: bytes) -> Answer:
        tail = self.hot.tail
        return status, [(b"Content-Type", content_type.encode()),
                        *((name.encode("latin-1"), value.encode("latin-1")) for name, value in headers),
                        self.allow, tail[0], (b"Content-Length", str(len(payload)).encode()),
                        *tail[1:]], payload


def _utf8(content_type: bytes) -> bool:
    """Whether the view reads a body of this Content-Type as UTF-8: no charset parameter, or one naming UTF-8
    (Django's request takes a charset it knows as the body's encoding, compat.MessageServletView.post)."""
    if b"charset" not in content_type.lower():
        return True
    charset = parse_header_parameters(content_type.decode("latin-1"))[1].get("charset")
    if charset is None:
        return True
    try:
        return codecs.lookup(charset).name == "utf-8"
    except LookupError:
        return True  # one Django does not know: it keeps its default, UTF-8


class _Caller:
    __slots__ = ("user",)

    def __init__(self, user: Any) -> None:
        self.user = user
