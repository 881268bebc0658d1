"""GET /api/v1/maintenance/jobs: progress and last-run times of the maintenance jobs (issue 8), for the
console and for monitoring. The state is broker_core's (`maintenance.job_status` per destination,
`maintenance.last_tick` for the dispatcher); this view only pages it and filters it by admin permission.
"""

from __future__ import annotations

import asyncio
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from broker_core import maintenance
from broker_core.destinations import parse_destination
from gateway import permissions, runtime
from gateway.api.base import GatewayView, db, stats_or_404
from gateway.api.pagination import page, page_bounds
from gateway.api.schema import problems
from signalbox.maintenance_check import stale_after_ms, tick_status


class TickSerializer(serializers.Serializer):
    status = serializers.ChoiceField(["ok", "error"], help_text="error: the tick never ran or is stale")
    error = serializers.CharField(required=False, help_text="Why the tick is not healthy")
    last_tick = serializers.IntegerField(required=False, help_text="When the last tick finished (ms)")
    age_ms = serializers.IntegerField(required=False)
    duration_ms = serializers.IntegerField(required=False, help_text="How long the last tick took")
    destinations = serializers.IntegerField(required=False, help_text="Index entries the last tick visited")
    errors = serializers.IntegerField(required=False, help_text="Destinations whose maintenance failed")
    indexed = serializers.IntegerField(required=False, help_text="Entries in the index of due maintenance")
    still_due = serializers.IntegerField(required=False, help_text="Of them, due and left for the next tick")


class DestinationJobsSerializer(serializers.Serializer):
    destination = serializers.CharField()
    recover = serializers.DictField(help_text="last_work, reaped, forwarded, dispatched (, leased_until)")
    expire = serializers.DictField(help_text="The expiry sweep: started, running, examined, expired, "
                                             "pages, last_run, last_done, last_examined, last_expired "
                                             "(, leased_until)")
    slow = serializers.DictField(help_text="The slow-consumer check: last_run, tracked, aborted "
                                           "(, leased_until)")


class JobsPageSerializer(serializers.Serializer):
    tick = TickSerializer()
    count = serializers.IntegerField()
    next = serializers.CharField(allow_null=True)
    previous = serializers.CharField(allow_null=True)
    results = DestinationJobsSerializer(many=True)


def _statuses(uris: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The dispatcher's tick and each destination's jobs, read with the blocking client (one pipeline
    per destination)."""
    broker = runtime.broker()
    tick = tick_status(maintenance.last_tick(broker), broker.clock.now_ms(), stale_after_ms())
    return tick, [{"destination": uri, **maintenance.job_status(broker, uri)} for uri in uris]


class MaintenanceJobsView(GatewayView):
    @extend_schema(
        operation_id="maintenance_jobs",
        summary="Maintenance jobs: progress and last runs per destination (admin)",
        description="The expiry sweep, the slow-consumer check and recovery of every destination the "
                    "user administers (times in ms since the epoch), and the dispatcher's last tick: "
                    "`tick.status` is `error` when it never ran or is stale (no Celery beat or no worker).",
        parameters=[OpenApiParameter("destination", str, description="Only this destination "
                                                                     "(`queue://orders`, or `orders`)"),
                    OpenApiParameter("limit", int), OpenApiParameter("offset", int)],
        responses={200: JobsPageSerializer, **problems(400, 401, 403, 404)})
    async def get(self, request: Request) -> Response:
        limit, offset = page_bounds(request)
        wanted = request.query_params.get("destination")
        broker = runtime.async_broker()
        if wanted:
            destination = parse_destination(wanted)
            await self.require(request, destination, "admin")
            await stats_or_404(destination)
            uris = [destination.uri]
        else:
            patterns = await db(permissions.readable_patterns, request.user, "admin")
            uris = sorted(uri for uri in await broker.destinations()
                          if permissions.visible(patterns, parse_destination(uri)))
        tick, rows = await asyncio.to_thread(_statuses, uris[offset:offset + limit])
        return Response({"tick": tick, **page(request, len(uris), limit, offset, rows)})
