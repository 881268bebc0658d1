"""The console's rate charts (docs/api.md, "Rate history"):

- `GET /api/v1/console/rates?range=5m|1h|24h`: every destination summed (the overview);
- `GET /api/v1/console/{queues|topics}/<name>/rates?range=...`: one destination.

Rates come from broker_core's rate history (broker_core/rates.py, sampled by the maintenance tick); the
operator's operations that take messages out (purge, move, remove, retry) come from the audit log as
`events` with their time, user and count: the chart marks them instead of drawing them as a rate.
"""

from __future__ import annotations

import datetime
from typing import Any

from django.db.models import Q
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from broker_core import rates
from broker_core.destinations import Destination
from gateway import permissions, runtime
from gateway.api.base import GatewayView, db, stats_or_404
from gateway.api.common import destination_from_url
from gateway.api.errors import Problem
from gateway.api.schema import KIND_PARAM, problems

# Audited actions drawn as marks on a chart (gateway/api/views_admin.py names them)
MARKED = ("purge", "move_message", "move_matching", "remove_message", "remove_matching", "retry_message",
          "retry_matching")
EVENTS_SHOWN = 200  # the newest in the range
RANGE_PARAM = OpenApiParameter("range", str, enum=list(rates.RANGES), description="Default 1h")


def _range(request: Request) -> str:
    name = request.query_params.get("range") or "1h"
    if name not in rates.RANGES:
        raise Problem(400, "invalid_range", "Invalid range",
                      f"range {name!r} is not one of {', '.join(rates.RANGES)}", range=name)
    return name


def _events(destination: Destination | None, since_ms: int, patterns: Any) -> list[dict[str, Any]]:
    """The marked operations in the range, oldest first (blocking: runs in a worker thread)."""
    from gateway.models import AuditRecord

    since = datetime.datetime.fromtimestamp(since_ms / 1000, tz=datetime.UTC)
    query = AuditRecord.objects.filter(action__in=MARKED, succeeded=True, at__gte=since)
    if destination is not None:  # moved away from it, or moved to it
        query = query.filter(Q(destination=destination.uri) | Q(parameters__target=destination.uri))
    out = []
    for r in query.order_by("-at")[:EVENTS_SHOWN]:
        if patterns is not None and (destination is None or r.destination != destination.uri):
            # (a move to this destination from one the user may not read is not shown)
            try:
                seen = permissions.visible(patterns, rates.parse_destination(r.destination))
            except Exception:  # (a name recorded by a refused request) not drawn
                seen = False
            if not seen:
                continue
        result = r.result if isinstance(r.result, dict) else {}
        count = result.get("removed", result.get("count"))
        out.append({"at": int(r.at.timestamp() * 1000), "action": r.action, "destination": r.destination,
                    "target": (r.parameters or {}).get("target"), "user": r.username,
                    "count": count if isinstance(count, int) else None})
    return out[::-1]


async def _answer(range_name: str, destination: Destination | None, patterns: Any) -> Response:
    broker = runtime.async_broker()
    now = broker.clock.now_ms()
    h = await rates.history(broker, destination, range_name, now)
    events = await db(_events, destination, h.times[0], patterns)
    return Response({
        "destination": destination.uri if destination else None, "range": h.range,
        "resolution_ms": h.resolution_ms, "now": now, "series": list(rates.SERIES), "times": h.times,
        "rates": h.rates, "sampled_since": h.since_ms, "sampled_until": h.until_ms, "events": events,
    }, headers={"Cache-Control": "no-store"})


class BrokerRatesView(GatewayView):
    @extend_schema(operation_id="console_rates",
                   summary="Message rates of every destination summed, over a range",
                   parameters=[RANGE_PARAM], responses={200: {"type": "object"}, **problems(400, 401, 403)})
    async def get(self, request: Request) -> Response:
        range_name = _range(request)
        patterns = await db(permissions.readable_patterns, request.user, "read")
        if patterns is not None:
            # the sum covers every destination: only for those who may read them all
            raise Problem(403, "permission_denied", "Permission denied",
                          f"user {request.user.get_username()!r} may not read every destination, and the "
                          "broker-wide rates count all of them; open a destination's page for its rates")
        return await _answer(range_name, None, patterns)


class DestinationRatesView(GatewayView):
    @extend_schema(operation_id="console_destination_rates",
                   summary="Message rates of a destination over a range",
                   parameters=[KIND_PARAM, RANGE_PARAM],
                   responses={200: {"type": "object"}, **problems(400, 401, 403, 404)})
    async def get(self, request: Request, kind: str, name: str) -> Response:
        range_name = _range(request)
        destination = destination_from_url(kind, name)
        await self.require(request, destination, "read")
        await stats_or_404(destination)
        patterns = await db(permissions.readable_patterns, request.user, "read")
        return await _answer(range_name, destination, patterns)
