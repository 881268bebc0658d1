"""Client connections (docs/api.md, "Connections"): the connection registry (broker_core/connections.py)
as the console's Connections page reads it, and Close.

- `GET /api/v1/connections`: a page of connections, filtered, with a cursor;
- `GET /api/v1/connections/<id>`: one connection with its subscriptions and producers;
- `POST /api/v1/connections/<id>/close`: staff only; the owning process ends the connection the way its
  protocol does (STOMP: ERROR, then the close), its unacknowledged messages go back to their queues.

Who sees what: staff and superusers see every connection; another user sees their own connections and
those that subscribe to or sent to a destination they may read.
"""

from __future__ import annotations

import contextlib
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.response import Response

from broker_core.connections import FILTERS, LIST_MAX, ConnectionInfo
from broker_core.destinations import parse_destination
from broker_core.errors import BrokerError, UnknownConsumer
from broker_core.model import ConsumerRef
from gateway import permissions, runtime
from gateway.api.base import GatewayView, db
from gateway.api.errors import Problem
from gateway.api.schema import problems

DEFAULT_LIMIT = 50
CALLS_PER_PAGE = 10  # script calls one request makes, at most, to fill a filtered page


def _may_see(user: Any, patterns: list[Any] | None, info: ConnectionInfo) -> bool:
    if patterns is None or info.user == user.get_username():
        return True
    for name in info.destinations:
        try:
            dest = parse_destination(name, allow_wildcards=True)
        except BrokerError:
            continue
        if permissions.visible(patterns, dest):
            return True
    return False


def _limit(request: Request) -> int:
    text = request.query_params.get("limit") or str(DEFAULT_LIMIT)
    try:
        value = int(text)
    except ValueError:
        raise Problem(400, "invalid_request", "Invalid limit", f"limit must be an integer, got {text[:32]!r}"
                      ) from None
    if not 1 <= value <= LIST_MAX:
        raise Problem(400, "invalid_request", "Invalid limit", f"limit must be 1..{LIST_MAX}, got {value}")
    return value


def detail(info: ConnectionInfo) -> dict[str, Any]:
    return {**info.as_dict(), "subscriptions": list(info.subscriptions), "producers": list(info.producers)}


async def _visible_or_404(request: Request, connection_id: str) -> ConnectionInfo:
    info = await runtime.async_broker().connection_get(connection_id)
    if info is not None and not permissions.is_staff(request.user):
        patterns = await db(permissions.readable_patterns, request.user, "read")
        if not _may_see(request.user, patterns, info):
            info = None
    if info is None:
        raise Problem(404, "unknown_connection", "Unknown connection",
                      f"no connection {connection_id!r} is registered (it ended, or you may not see it)")
    return info


class ConnectionListView(GatewayView):
    @extend_schema(operation_id="connections_list", summary="Client connections, a page at a time",
                   parameters=[OpenApiParameter(name, str) for name in (*FILTERS, "cursor")]
                   + [OpenApiParameter("limit", int)],
                   responses={200: {"type": "object"}, **problems(400, 401)})
    async def get(self, request: Request) -> Response:
        if not request.user.is_authenticated:
            raise exceptions.NotAuthenticated()
        limit = _limit(request)
        filters = {name: request.query_params.get(name, "") for name in FILTERS}
        cursor = request.query_params.get("cursor") or ""
        admin = permissions.is_staff(request.user)
        patterns = None if admin else await db(permissions.readable_patterns, request.user, "read")
        broker = runtime.async_broker()
        found: list[ConnectionInfo] = []
        examined = 0
        for _call in range(CALLS_PER_PAGE):
            page = await broker.connection_list(cursor, limit - len(found), filters,
                                                with_destinations=not admin)
            examined += page.examined
            found += [i for i in page.items if admin or _may_see(request.user, patterns, i)]
            cursor = page.cursor
            if not cursor or len(found) >= limit:
                break
        return Response({"connections": [i.as_dict() for i in found], "next_cursor": cursor or None,
                         "examined": examined})


class ConnectionDetailView(GatewayView):
    @extend_schema(operation_id="connections_detail", summary="One connection with its subscriptions "
                   "and producers", responses={200: {"type": "object"}, **problems(401, 404)})
    async def get(self, request: Request, connection_id: str) -> Response:
        if not request.user.is_authenticated:
            raise exceptions.NotAuthenticated()
        return Response(detail(await _visible_or_404(request, connection_id)))


class ConnectionCloseView(GatewayView):
    @extend_schema(operation_id="connections_close", summary="Close a client connection (staff)",
                   request=None, responses={202: {"type": "object"}, 200: {"type": "object"},
                                            **problems(401, 403, 404)})
    async def post(self, request: Request, connection_id: str) -> Response:
        if not request.user.is_authenticated:
            raise exceptions.NotAuthenticated()
        if not permissions.is_staff(request.user):
            raise exceptions.PermissionDenied(f"user {request.user.get_username()!r} may not close "
                                              "connections: only staff users may")
        info = await _visible_or_404(request, connection_id)
        reason = f"closed by {request.user.get_username()} from the console"

        async def run() -> Response:
            broker = runtime.async_broker()
            if info.protocol == "rest":
                return Response(await close_rest(info, reason), status=200)
            asked = await broker.connection_close(connection_id, reason)
            if asked is None:
                raise Problem(404, "unknown_connection", "Unknown connection",
                              f"connection {connection_id!r} ended meanwhile")
            return Response({"id": connection_id, "status": "closing", "process": asked[0],
                             "protocol": asked[1]}, status=202)

        return await self.audited(request, "close_connection", "", connection_id, {}, run)


async def close_rest(info: ConnectionInfo, reason: str) -> dict[str, Any]:
    """A REST consumer has no socket to end: close its broker consumer (its unacknowledged messages go
    back, its next request gets 410) and drop the entry."""
    broker = runtime.async_broker()
    for sub in info.subscriptions:
        for consumer_id in sub["consumers"]:
            ref = ConsumerRef(parse_destination(sub["destinations"][0], allow_wildcards=True), consumer_id,
                              sub["ack_mode"])
            with contextlib.suppress(UnknownConsumer):  # it lapsed or closed meanwhile
                await broker.close_consumer(ref, reason)
    await broker.connection_drop([info.connection_id])
    return {"id": info.connection_id, "status": "closed", "process": "", "protocol": "rest"}
