"""Limit/offset paging for lists the gateway assembles itself (destinations, audit records)."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.utils.urls import remove_query_param, replace_query_param

from gateway.api.common import int_param

DEFAULT_LIMIT = 50
MAX_LIMIT = 1000


def page_bounds(request: Request) -> tuple[int, int]:
    limit = int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    offset = int_param(request, "offset", 0, 0, 10**9)
    return limit, offset


def page(request: Request, count: int, limit: int, offset: int, results: list[Any]) -> dict[str, Any]:
    url = request.build_absolute_uri()
    following = None
    if offset + limit < count:
        following = replace_query_param(replace_query_param(url, "limit", limit), "offset", offset + limit)
    previous = None
    if offset > 0:
        previous = replace_query_param(url, "limit", limit)
        previous = (remove_query_param(previous, "offset") if offset - limit <= 0
                    else replace_query_param(previous, "offset", offset - limit))
    return {"count": count, "next": following, "previous": previous, "results": results}
