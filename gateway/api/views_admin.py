"""Administration over HTTP: destinations with statistics, consumers, message groups, browsing and
message operations, pause/resume/purge, policies, and the audit log. Every state-changing action
is audited (who, what, when, result)."""

from __future__ import annotations

import dataclasses
from typing import Any

from asgiref.sync import sync_to_async
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from broker_core.destinations import Destination, covers, parse_destination
from gateway import permissions, runtime
from gateway.api import serializers as s
from gateway.api.base import GatewayView, db, on_existing, refuse_temporary_contents, stats_or_404
from gateway.api.codec import render_message
from gateway.api.common import destination_from_url, int_param, json_body
from gateway.api.destination_index import Filters, list_destinations
from gateway.api.errors import Problem
from gateway.api.pagination import page, page_bounds
from gateway.api.render import consumer_json, destination_json
from gateway.api.schema import KIND_PARAM, problem_doc, problems

SORTABLE = ("name", "messages", "queue_size", "pending", "in_flight", "enqueued", "dequeued", "dispatched",
            "expired", "consumer_count", "group_count",
            "deadlettered", "enqueue_rate", "dequeue_rate")  # its columns sort too


# The destination list's filters on statistics and names (absent: no filter; false: the opposite).
FILTERS = {"non_empty": "true: only destinations with messages (pending or in flight); false: only empty",
           "has_consumers": "true: only destinations with consumers; false: only those without",
           "dlq": "true: only dead-letter queues; false: everything but them"}


def _tristate(request: Request, name: str) -> bool | None:
    text = (request.query_params.get(name) or "").lower()
    if text in ("", "any"):
        return None
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise Problem(400, "invalid_parameter", "Invalid parameter", f"{name} is true or false", parameter=name)


class DestinationListView(GatewayView):
    @extend_schema(
        operation_id="destination_list", summary="Destinations with statistics (filter, sort, page)",
        parameters=[OpenApiParameter("kind", str, enum=["queue", "topic"]),
                    OpenApiParameter("search", str, description="Part of the name"),
                    OpenApiParameter("ordering", str, enum=[*SORTABLE, *[f"-{k}" for k in SORTABLE]]),
                    *[OpenApiParameter(name, bool, description=text) for name, text in FILTERS.items()],
                    OpenApiParameter("limit", int), OpenApiParameter("offset", int)],
        responses={200: s.DestinationPageSerializer, **problems(400, 401)})
    async def get(self, request: Request) -> Response:
        kind = request.query_params.get("kind")
        if kind not in (None, "", "queue", "topic"):
            raise Problem(400, "invalid_parameter", "Invalid parameter", "kind is queue or topic",
                          parameter="kind")
        search = (request.query_params.get("search") or "").lower()
        ordering = request.query_params.get("ordering") or "name"
        if ordering.lstrip("-") not in SORTABLE:
            raise Problem(400, "invalid_parameter", "Invalid parameter",
                          f"ordering is one of {', '.join(SORTABLE)} (- for descending)",
                          parameter="ordering")
        limit, offset = page_bounds(request)
        # fast with 10,000 destinations (pipelined stats, a statistics index)
        where = Filters(**{name: _tristate(request, name) for name in FILTERS})
        patterns = await db(permissions.readable_patterns, request.user, "read")
        count, rows, hidden = await list_destinations(runtime.async_broker(), patterns, kind, search,
                                                      ordering, limit, offset, where)
        return Response({**page(request, count, limit, offset, rows), "hidden": hidden})


class DestinationDetailView(GatewayView):
    @extend_schema(operation_id="destination_detail", summary="A destination: statistics, consumers, policy",
                   parameters=[KIND_PARAM],
                   responses={200: s.DestinationDetailSerializer, **problems(401, 403, 404, 501)})
    async def get(self, request: Request, kind: str, name: str) -> Response:
        destination = await self.destination(request, kind, name, "read")
        stats = await stats_or_404(destination)
        out = destination_json(stats)
        now = runtime.async_broker().clock.now_ms()
        out["consumers"] = [consumer_json(c, now) for c in stats.consumers]
        policy = await sync_to_async(runtime.policies().resolve, thread_sensitive=False)(destination)
        out["policy"] = {k: v for k, v in policy.to_attributes().items()}
        return Response(out)

    @extend_schema(operation_id="destination_create", summary="Create a destination (idempotent)",
                   parameters=[KIND_PARAM], request=None,
                   responses={201: s.DestinationSerializer, **problems(400, 401, 403, 501)})
    async def put(self, request: Request, kind: str, name: str) -> Response:
        destination = await self.destination(request, kind, name, "admin")

        async def create() -> Response:
            await runtime.async_broker().ensure_destination(destination)
            stats = await stats_or_404(destination)
            return Response(destination_json(stats), status=status.HTTP_201_CREATED)

        return await self.audited(request, "create_destination", destination.uri, "", {}, create)

    @extend_schema(operation_id="destination_delete", summary="Delete a destination and its messages",
                   parameters=[KIND_PARAM],
                   responses={200: s.RemovedSerializer, **problems(401, 403, 404, 501)})
    async def delete(self, request: Request, kind: str, name: str) -> Response:
        destination = await self.destination(request, kind, name, "admin")

        async def delete() -> Response:
            removed = await runtime.async_broker().delete_destination(destination)
            return Response({"removed": int(removed or 0)})

        return await on_existing(self, request, destination, "delete_destination", delete)


class DestinationActionView(GatewayView):
    """POST /pause, /resume, /purge."""

    action_name = ""

    @extend_schema(parameters=[KIND_PARAM], request=None,
                   responses={200: s.DestinationSerializer, **problems(401, 403, 404, 501)})
    async def post(self, request: Request, kind: str, name: str) -> Response:
        destination = await self.destination(request, kind, name, "admin")
        action = self.action_name

        async def run() -> Response:
            broker = runtime.async_broker()
            result: dict[str, Any] = {}
            if action == "pause":
                await broker.pause(destination)
            elif action == "resume":
                await broker.resume(destination)
            else:
                result["removed"] = await broker.purge(destination)
            out = destination_json(await stats_or_404(destination))
            return Response({**out, **result})

        return await on_existing(self, request, destination, action, run)


class GroupsView(GatewayView):
    @extend_schema(operation_id="group_list", summary="Message groups and their owners (cursor paging)",
                   parameters=[KIND_PARAM,
                               OpenApiParameter("cursor", str, description="next_cursor of the page before"),
                               OpenApiParameter("limit", int, description="About this many groups (1-1000, "
                                                "default 100): Redis's scan decides the exact number")],
                   responses={200: s.GroupPageSerializer, **problems(400, 401, 403, 404, 501)})
    async def get(self, request: Request, kind: str, name: str) -> Response:
        destination = await self.destination(request, kind, name, "read")
        await stats_or_404(destination)
        limit = int_param(request, "limit", 100, 1, 1000)
        cursor = request.query_params.get("cursor") or None
        page = await runtime.async_broker().message_groups_page(destination, cursor=cursor, limit=limit)
        return Response({"groups": [dataclasses.asdict(g) for g in page.groups],
                         "next_cursor": page.next_cursor})

    @extend_schema(operation_id="group_remove_all", summary="removeAllMessageGroups",
                   parameters=[KIND_PARAM],
                   responses={200: s.CountSerializer, **problems(401, 403, 404, 501)})
    async def delete(self, request: Request, kind: str, name: str) -> Response:
        destination = await self.destination(request, kind, name, "admin")

        async def run() -> Response:
            return Response({"count": await runtime.async_broker().remove_all_message_groups(destination)})

        return await on_existing(self, request, destination, "remove_all_message_groups", run)


class GroupDetailView(GatewayView):
    @extend_schema(operation_id="group_remove", summary="removeMessageGroup", parameters=[KIND_PARAM],
                   responses={200: s.CountSerializer, **problems(401, 403, 404, 501)})
    async def delete(self, request: Request, kind: str, name: str, group_id: str) -> Response:
        destination = await self.destination(request, kind, name, "admin")

        async def run() -> Response:
            removed = await runtime.async_broker().remove_message_group(destination, group_id)
            if not removed:
                raise Problem(404, "unknown_group", "Unknown group",
                              f"no message group {group_id!r} on {destination.uri}", group_id=group_id)
            return Response({"count": removed})

        return await on_existing(self, request, destination, "remove_message_group", run, group_id)


class MessageDetailView(GatewayView):
    @extend_schema(operation_id="message_detail", summary="One stored message", parameters=[KIND_PARAM],
                   responses={200: s.StoredMessageSerializer, **problems(401, 403, 404, 501)})
    async def get(self, request: Request, kind: str, name: str, message_id: str) -> Response:
        destination = await self.destination(request, kind, name, "read")
        refuse_temporary_contents(request, destination)
        await stats_or_404(destination)
        return Response(render_message(await runtime.async_broker().get_message(destination, message_id)))

    @extend_schema(operation_id="message_remove", summary="Remove a message (in flight too)",
                   parameters=[KIND_PARAM], responses={204: None, **problems(401, 403, 404, 501),
                                                       **problem_doc(409, "operation_refused: a topic's "
                                                                          "messages are its subscriptions'")})
    async def delete(self, request: Request, kind: str, name: str, message_id: str) -> Response:
        destination = await self.destination(request, kind, name, "admin")

        async def run() -> Response:
            if not await runtime.async_broker().remove_message(destination, message_id):
                raise _no_message(destination, message_id)
            return Response(status=status.HTTP_204_NO_CONTENT)

        return await on_existing(self, request, destination, "remove_message", run, message_id)


def _no_message(destination: Destination, message_id: str) -> Problem:
    return Problem(404, "unknown_message", "Unknown message", f"no message {message_id} on {destination.uri}",
                   message_id=message_id, destination=destination.uri)


async def _target(view: GatewayView, request: Request, body: dict[str, Any]) -> Destination:
    text = body.get("target")
    if not text:
        raise Problem(400, "validation_error", "Invalid request", "target: this field is required",
                      errors={"target": ["This field is required."]})
    target = parse_destination(text)
    if target.is_topic:
        destination_from_url("topic", target.name)  # 501 until topics exist
    await view.require(request, target, "write")
    return target


class MessageActionView(GatewayView):
    """POST /messages/{id}/move, /copy (body: target) and /retry (a dead-letter queue's message back to
    where it came from)."""

    action_name = ""

    @extend_schema(parameters=[KIND_PARAM], request=s.TargetSerializer,
                   responses={200: s.CountSerializer, **problems(400, 401, 403, 404, 501)}
                   | problem_doc(409, "Operation refused"))
    async def post(self, request: Request, kind: str, name: str, message_id: str) -> Response:
        destination = await self.destination(request, kind, name, "admin")
        action = self.action_name
        if action in ("move", "copy"):  # (taken out to another queue, its messages would be read there)
            refuse_temporary_contents(request, destination)
        target = None
        if action != "retry":
            target = await _target(self, request, json_body(request, required=True))
        broker = runtime.async_broker()

        async def run() -> Response:
            if action == "retry":
                count = await broker.retry_message(destination, message_id)
            elif action == "move":
                count = await broker.move_message(destination, message_id, target)
            else:
                count = await broker.copy_message(destination, message_id, target)
            if not count:
                raise _no_message(destination, message_id)
            return Response({"count": int(count)})

        params = {"target": target.uri} if target else {}
        return await on_existing(self, request, destination, f"{action}_message", run, message_id, params)


class MatchingActionView(GatewayView):
    """POST /move-matching, /copy-matching (body: selector, target, limit), /retry-matching and
    /remove-matching (body: selector, limit: one server-side walk, in flight too)."""

    action_name = ""

    @extend_schema(parameters=[KIND_PARAM], request=s.MatchingSerializer,
                   responses={200: s.CountSerializer, **problems(400, 401, 403, 404, 501)}
                   | problem_doc(409, "Operation refused"))
    async def post(self, request: Request, kind: str, name: str) -> Response:
        destination = await self.destination(request, kind, name, "admin")
        body = s.MatchingSerializer(data=json_body(request))
        body.is_valid(raise_exception=True)
        options = body.validated_data
        selector = options.get("selector") or None
        action = self.action_name
        if action in ("move", "copy"):  # (taken out to another queue, its messages would be read there)
            refuse_temporary_contents(request, destination)
        target = None if action in ("retry", "remove") else await _target(self, request, options)
        broker = runtime.async_broker()

        async def run() -> Response:
            if action == "retry":
                count = await broker.retry_messages(destination, selector)
            elif action == "remove":
                count = await broker.remove_matching(destination, selector, options.get("limit"))
            elif action == "move":
                count = await broker.move_matching(destination, selector, target, options.get("limit"))
            else:
                count = await broker.copy_matching(destination, selector, target, options.get("limit"))
            return Response({"count": int(count)})

        params = {"selector": selector, **({"target": target.uri} if target else {})}
        return await on_existing(self, request, destination, f"{action}_matching", run, "", params)


class ScheduledView(GatewayView):
    @extend_schema(operation_id="scheduled_list",
                   summary="Scheduled jobs: delayed messages, repeating and cron jobs (no redelivery delays)",
                   parameters=[KIND_PARAM, OpenApiParameter("cursor", str), OpenApiParameter("limit", int)],
                   responses={200: s.ScheduledPageSerializer, **problems(400, 401, 403, 404, 501)})
    async def get(self, request: Request, kind: str, name: str) -> Response:
        destination = await self.destination(request, kind, name, "read")
        refuse_temporary_contents(request, destination)
        await stats_or_404(destination)
        limit = int_param(request, "limit", 100, 1, 1000)
        cursor = request.query_params.get("cursor") or None
        found: list[dict[str, Any]] = []
        broker = runtime.async_broker()
        # the jobs the stats' `scheduled` counts (the table's "first 50 of N"): a message waiting for a
        # redelivery delay is none, and is seen in browse
        for _ in range(20):  # bounded: at most 20 pages per request, then a cursor
            result = await broker.scheduled(destination, cursor=cursor, limit=limit - len(found))
            found += [{**render_message(delivery), "state": "parked"} for delivery, _ in result.jobs]
            cursor = result.next_cursor
            if cursor is None or len(found) >= limit:
                break
        times = await broker.parked_times(destination, [m["message_id"] for m in found])
        for m in found:  # when it is due; a repeating job's period and repeats left; a cron job's expression
            m.update(times.get(m["message_id"])
                     or {"due": None, "period": None, "repeats_left": None, "cron": None})
        return Response({"messages": found, "next_cursor": cursor})


# -- policies -----------------------------------------------------------------------------------------

def _entry_json(entry: Any) -> dict[str, Any]:
    return {"id": entry.id, "kind": entry.kind, "pattern": entry.pattern,
            "attributes": dict(entry.attributes)}


class PolicyListView(GatewayView):
    @extend_schema(operation_id="policy_list", summary="The policy map's entries",
                   responses={200: s.PolicyEntrySerializer(many=True), **problems(401)})
    async def get(self, request: Request) -> Response:
        store = runtime.policies()
        entries = await sync_to_async(store.entries, thread_sensitive=False)()
        patterns = await db(permissions.readable_patterns, request.user, "read")
        # An entry is shown to those who may read everything its pattern covers.
        return Response([_entry_json(e) for e in entries
                         if patterns is None or any(covers(p, e.destination) for p in patterns)])


POLICY_PARAMS = [OpenApiParameter("kind", str, OpenApiParameter.PATH, enum=["queue", "topic"]),
                 OpenApiParameter("pattern", str, OpenApiParameter.PATH,
                                  description="Destination name or wildcard pattern (orders.>, *.eu)")]


@extend_schema(parameters=POLICY_PARAMS)
class PolicyDetailView(GatewayView):
    """One entry, addressed by kind and pattern (`/policies/queue/orders.>`)."""

    async def _pattern(self, request: Request, kind: str, pattern: str, action: str) -> Destination:
        if kind not in ("queue", "topic"):
            raise Problem(404, "not_found", "Not found",
                          "policy entries are under /policies/queue/ or /policies/topic/")
        destination = parse_destination(pattern, kind, allow_wildcards=True)  # type: ignore[arg-type]
        await self.require(request, destination, action)  # type: ignore[arg-type]
        return destination

    @extend_schema(operation_id="policy_detail", summary="A policy entry",
                   responses={200: s.PolicyEntrySerializer, **problems(400, 401, 403, 404)})
    async def get(self, request: Request, kind: str, pattern: str) -> Response:
        destination = await self._pattern(request, kind, pattern, "read")
        for entry in await sync_to_async(runtime.policies().entries, thread_sensitive=False)():
            if entry.id == destination.uri:
                return Response(_entry_json(entry))
        raise Problem(404, "unknown_policy", "Unknown policy entry", f"no policy entry {destination.uri}")

    @extend_schema(operation_id="policy_set", summary="Add or replace a policy entry (applied at once)",
                   request=s.PolicyWriteSerializer,
                   responses={200: s.PolicyEntrySerializer, **problems(400, 401, 403)})
    async def put(self, request: Request, kind: str, pattern: str) -> Response:
        destination = await self._pattern(request, kind, pattern, "admin")
        body = s.PolicyWriteSerializer(data=json_body(request, required=True))
        body.is_valid(raise_exception=True)
        attributes = body.validated_data["attributes"]

        async def run() -> Response:
            entry = await sync_to_async(runtime.policies().set_entry, thread_sensitive=False)(
                kind, destination.name, attributes)
            await runtime.async_broker().refresh_policies()
            return Response(_entry_json(entry))

        return await self.audited(request, "set_policy", destination.uri, "", {"attributes": attributes}, run)

    @extend_schema(operation_id="policy_remove", summary="Remove a policy entry",
                   responses={204: None, **problems(401, 403, 404)})
    async def delete(self, request: Request, kind: str, pattern: str) -> Response:
        destination = await self._pattern(request, kind, pattern, "admin")

        async def run() -> Response:
            removed = await sync_to_async(runtime.policies().remove_entry, thread_sensitive=False)(
                kind, destination.name)
            if not removed:
                raise Problem(404, "unknown_policy", "Unknown policy entry",
                              f"no policy entry {destination.uri}")
            await runtime.async_broker().refresh_policies()
            return Response(status=status.HTTP_204_NO_CONTENT)

        return await self.audited(request, "remove_policy", destination.uri, "", {}, run)


# -- audit ------------------------------------------------------------------------------------------

class AuditListView(GatewayView):
    @extend_schema(operation_id="audit_list", summary="Audit records of administrative actions (staff)",
                   parameters=[OpenApiParameter("destination", str), OpenApiParameter("action", str),
                               OpenApiParameter("limit", int), OpenApiParameter("offset", int)],
                   responses={200: s.AuditPageSerializer, **problems(401, 403)})
    async def get(self, request: Request) -> Response:
        from rest_framework.exceptions import PermissionDenied

        from gateway.models import AuditRecord

        if not permissions.is_staff(request.user):
            raise PermissionDenied("the audit log is for staff users")
        limit, offset = page_bounds(request)
        filters = {k: request.query_params[k] for k in ("destination", "action")
                   if request.query_params.get(k)}

        def load() -> tuple[int, list[dict[str, Any]], list[str]]:
            query = AuditRecord.objects.filter(**filters)
            rows = query[offset:offset + limit]
            # the filter's choices: every action recorded (the action column is indexed), not a guess
            actions = list(AuditRecord.objects.order_by("action").values_list("action", flat=True).distinct())
            return query.count(), [
                {"at": r.at.isoformat(), "username": r.username, "action": r.action,
                 "destination": r.destination, "target": r.target, "parameters": r.parameters,
                 "succeeded": r.succeeded, "status_code": r.status_code, "result": r.result}
                for r in rows], actions

        count, rows, actions = await db(load)
        return Response({**page(request, count, limit, offset, rows), "actions": actions})
