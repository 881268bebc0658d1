"""Names in URL paths: how the REST API and the console put a destination's name (and every other text of
a path segment: a message, consumer, connection, group, client or subscription id, a policy pattern) in a
URL, and read it back.

A client percent-encodes the whole text into one segment (`to_segment`: Python's `quote(text, safe="")`,
JavaScript's encodeURIComponent), so the queue `orders/eu` is `/api/v1/queues/orders%2Feu`. The ASGI
server decodes the path before the application sees it (scope["path"]): `/api/v1/queues/orders/eu`, which
is no route, or the wrong one (the queue `x/purge` would read as the queue `x` and its /purge). So the
gateway routes on the raw path (`routing_path`, applied by gateway.api.asgi's handler to every HTTP
request): every escape is decoded except `%2F` and `%25`, which stay encoded, so a `/` or a `%` inside a
segment stays apart from the separator and from an escape. The `segment` converter (`<segment:name>` in
the URL patterns) decodes those two when Django hands the segment to a view (`from_segment`).

A path without `%2F` or `%25` routes as before, so the paths of every name without `/` and `%` are
unchanged. Django's test clients decode the whole path themselves; they reach such names only as before.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from django.urls import register_converter, reverse

_KEPT = re.compile(rb"(%2[Ff]|%25)")
_ESCAPE = re.compile(r"%2F|%25")
_KEPT_TEXT = {"%2F": "/", "%25": "%"}


def routing_path(raw_path: bytes) -> str:
    """The raw path with every escape decoded (as UTF-8, an undecodable byte as U+FFFD, as ASGI servers do)
    but `%2F` and `%25`, upper-cased."""
    pieces = _KEPT.split(raw_path)  # text, kept escape, text, ...
    return b"".join(piece.upper() if i % 2 else unquote_to_bytes(piece)
                    for i, piece in enumerate(pieces)).decode("utf-8", "replace")


def from_segment(segment: str) -> str:
    """A segment of a routing path as the text it encodes."""
    return _ESCAPE.sub(lambda m: _KEPT_TEXT[m.group()], segment)


def to_segment(text: str) -> str:
    """`text` as one path segment: every character but the unreserved ones percent-encoded (UTF-8)."""
    return quote(text, safe="")


def path_in_url(path: str) -> str:
    """A routing path in URL form (request.get_full_path, a problem's `instance`): Django's
    escape_uri_path, but `%` stays, since in a routing path it only starts the escapes %2F and %25."""
    return quote(path, safe="/:@&+$,-_.!~*'()%")


class SegmentConverter:
    regex = "[^/]+"

    def to_python(self, value: str) -> str:
        return from_segment(value)

    def to_url(self, value: str) -> str:
        return to_segment(value)


register_converter(SegmentConverter, "segment")


def reverse_named(viewname: str, *args: Any) -> str:
    """reverse() for a route whose parameters are `segment`s. The converter encodes each one whole, then
    reverse() quotes the URL again and turns each `%` into `%25`; as the patterns hold no `%` of their own,
    taking that layer off again is exact."""
    return reverse(viewname, args=args).replace("%25", "%")
