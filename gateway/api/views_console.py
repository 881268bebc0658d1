"""API endpoints the web console needed and the rest of the API lacked (docs/api.md, "Console").

- `GET /api/v1/console/overview`: broker totals and Redis memory;
- `GET /api/v1/console/permissions?destination=A,B`: what the user may do on each (to hide buttons;
  the endpoints refuse anyway);
- `GET /api/v1/console/queues/<q>/groups`: message groups with message counts, held-back messages and
  the group map's type and fill;
- `GET /api/v1/console/dead-letters`: each dead-letter queue with its original destinations and causes.

Read-only, built on broker_core's operations like every other view.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from broker_core.destinations import parse_composite
from gateway import permissions, runtime
from gateway.api.base import GatewayView, db, stats_or_404
from gateway.api.common import destination_from_url, idempotency_keys_count
from gateway.api.destination_index import (
    is_dead_letter_queue,
    largest_subscription,
    parse_destination,
    totals,
)
from gateway.api.schema import KIND_PARAM, problems

# How many pending and in-flight messages the groups view counts (from the head of the queue).
# Counts are exact below it; on deeper queues they describe the first EXAMINE messages (and say so).
EXAMINE = 5_000
PAGE = 1_000
# The groups view lists at most this many groups (50,000 made a 5 MB answer); the summary gives the count.
GROUPS_SHOWN = 1_000


class OverviewView(GatewayView):
    @extend_schema(operation_id="console_overview", summary="Broker totals and Redis memory (console)",
                   responses={200: {"type": "object"}, **problems(401)})
    async def get(self, request: Request) -> Response:
        broker = runtime.async_broker()
        patterns = await db(permissions.readable_patterns, request.user, "read")
        out = await totals(broker, patterns)
        largest = out.get("largest")
        if largest and largest["destination"].startswith("topic://"):
            # which subscription holds the topic's backlog (one topic's statistics)
            out = {**out, "largest": {**largest, "subscription": largest_subscription(
                await broker.stats(parse_destination(largest["destination"])))}}
        memory = await runtime.async_redis().info("memory")
        out["redis_memory"] = {"used": int(memory.get("used_memory", 0)),
                               "peak": int(memory.get("used_memory_peak", 0)),
                               "max": int(memory.get("maxmemory", 0)),
                               "policy": str(memory.get("maxmemory_policy", ""))}
        # the gateway's Idempotency-Key records (bounded per user, gateway/api/common.py)
        out["idempotency_keys"] = {"count": int(await idempotency_keys_count(runtime.async_redis())),
                                   "per_user_limit": settings.SIGNALBOX_IDEMPOTENCY_KEYS_PER_USER}
        return Response(out)


class PermissionsView(GatewayView):
    @extend_schema(operation_id="console_permissions", summary="What the user may do on destinations",
                   parameters=[OpenApiParameter("destination", str, description="Comma-separated")],
                   responses={200: {"type": "object"}, **problems(400, 401)})
    async def get(self, request: Request) -> Response:
        text = request.query_params.get("destination") or ""
        destinations = parse_composite(text, allow_wildcards=True) if text.strip() else []
        user = request.user
        out: dict[str, Any] = {"user": user.get_username(), "staff": permissions.is_staff(user),
                               "destinations": {}}
        for d in destinations[:200]:
            out["destinations"][d.uri] = {a: await permissions.allowed_async(user, d, a)
                                          for a in permissions.ACTIONS}
        return Response(out)


def _map_capacity(policy: Any) -> tuple[str, int | None]:
    attributes = policy.to_attributes()
    kind = str(attributes.get("messageGroupMapFactoryType", "cached"))
    if kind == "cached":
        return kind, int(attributes.get("groupMapCacheSize", 1024))
    if kind == "bucket":
        return kind, int(attributes.get("groupMapBucketCount", 1024))
    return kind, None  # simple: unbounded


async def _walk(destination: Any, limit: int = EXAMINE) -> tuple[list[Any], bool]:
    """Up to `limit` stored messages from the head (pending, parked, then in flight); (messages, all seen)."""
    broker = runtime.async_broker()
    found: list[Any] = []
    cursor = None
    while len(found) < limit:
        page = await broker.browse(destination, cursor=cursor, limit=min(PAGE, limit - len(found)))
        found += page.messages
        cursor = page.next_cursor
        if cursor is None:
            return found, True
    return found, False


class GroupCountsView(GatewayView):
    @extend_schema(operation_id="console_groups",
                   summary="Message groups with owners, counts, held-back messages, map type and fill",
                   parameters=[KIND_PARAM], responses={200: {"type": "object"}, **problems(401, 403, 404)})
    async def get(self, request: Request, kind: str, name: str) -> Response:
        destination = destination_from_url(kind, name)
        await self.require(request, destination, "read")
        stats = await stats_or_404(destination)
        broker = runtime.async_broker()
        groups, cursor = [], None
        while len(groups) < GROUPS_SHOWN:
            page = await broker.message_groups_page(destination, cursor=cursor,
                                                    limit=GROUPS_SHOWN - len(groups))
            groups += page.groups
            cursor = page.next_cursor
            if cursor is None:
                break
        listed_all = cursor is None and len(groups) <= GROUPS_SHOWN
        groups = groups[:GROUPS_SHOWN]
        policy = await sync_to_async(runtime.policies().resolve, thread_sensitive=False)(destination)
        map_type, capacity = _map_capacity(policy)
        # A consumer is busy when its prefetch window is full; its groups' pending messages wait for it.
        full = {c.consumer_id for c in stats.consumers
                if c.prefetch > 0 and c.in_flight >= c.prefetch + c.prefetch_extension}
        owner_of = {g.group_id: g.owner for g in groups}
        counts = await broker.group_counts(destination, EXAMINE, EXAMINE)
        pending = {g: p for g, (p, _) in counts.groups.items()}
        in_flight = {g: f for g, (_, f) in counts.groups.items()}
        # Pending messages of a group whose owner's window is full wait for that owner (§3: the group
        # stays with it), even when other consumers have room.
        held = {g: p for g, p in pending.items() if p and owner_of.get(g) in full}
        named = {c.consumer_id: c for c in stats.consumers}  # owners by their client / connection (console)

        def owner(consumer_id: str) -> dict[str, Any]:
            c = named.get(consumer_id)
            return {"owner_client_id": c.client_id if c else None,
                    "owner_connection_id": c.connection_id if c else None,
                    "owner_added": c.added if c else None}

        rows = [{**dataclasses.asdict(g), **owner(g.owner), "pending": pending.get(g.group_id, 0),
                 "in_flight": in_flight.get(g.group_id, 0), "held_back": held.get(g.group_id, 0),
                 "owner_busy": g.owner in full} for g in groups]
        # (with only the first groups listed, which of the others have an owner is not known here)
        unowned = sorted(g for g, p in pending.items() if p and g not in owner_of) if listed_all else []
        return Response({
            "destination": destination.uri, "map_type": map_type, "capacity": capacity,
            "group_count": stats.group_count,
            "fill": round(stats.group_count / capacity, 4) if capacity else None,
            "groups": rows, "groups_complete": listed_all,
            "unassigned": [{"group_id": g, "pending": pending[g]} for g in unowned[:200]],
            "held_back": sum(held.values()), "examined": counts.pending_examined + counts.in_flight_examined,
            "complete": counts.all_pending and counts.all_in_flight,
        })


def _cause(properties: dict[str, Any]) -> str:
    """A dead letter's cause in a few words (the full text stays on the message)."""
    text = properties.get("dlqDeliveryFailureCause")
    if text is None:
        return "poison (NACK)"  # a poison NACK dead-letters with a null cause, as in ActiveMQ
    text = str(text)
    if "exceeds redelivery policy limit" in text:
        return "redelivery limit exceeded"
    if "expired" in text.lower():
        return "expired"
    return text[:80]


class DeadLettersView(GatewayView):
    @extend_schema(operation_id="console_dead_letters",
                   summary="Dead-letter queues with their original destinations and causes",
                   responses={200: {"type": "object"}, **problems(401)})
    async def get(self, request: Request) -> Response:
        broker = runtime.async_broker()
        patterns = await db(permissions.readable_patterns, request.user, "read")
        out = []
        for uri in await broker.destinations():
            if not uri.startswith("queue://") or not is_dead_letter_queue(uri[len("queue://"):]):
                continue  # cheap string test first: 10,000 names are not all parsed
            destination = parse_destination(uri)
            if not permissions.visible(patterns, destination):
                continue
            stats = await broker.stats(destination)
            messages, complete = await _walk(destination, 1_000)
            origins: dict[tuple[str, str], list[str]] = {}
            for browsed in messages:
                m = browsed.message
                key = (m.original_destination or "", _cause(m.properties))
                origins.setdefault(key, []).append(m.message_id)
            ranked = sorted(origins.items(), key=lambda item: -len(item[1]))
            out.append({"destination": uri, "name": destination.name, "queue_size": stats.queue_size,
                        "complete": complete, "examined": len(messages),
                        # the ids let the console retry one origin's messages (no selector names it)
                        "origins": [{"original_destination": o, "cause": c, "count": len(ids),
                                     "message_ids": ids} for (o, c), ids in ranked]})
        return Response({"dead_letter_queues": out})
