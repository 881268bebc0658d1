"""GET /api/v1/console/node: the node's health for the console's node page (staff only; docs/api.md,
"Console"). The figures come from signalbox.node, which GET /metrics reads too."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from gateway import permissions, runtime
from gateway.api.base import GatewayView
from gateway.api.schema import problems
from signalbox import node


class NodeView(GatewayView):
    @extend_schema(operation_id="console_node",
                   summary="Redis, broker memory, processes, maintenance (staff)",
                   responses={200: {"type": "object"}, **problems(401, 403)})
    async def get(self, request: Request) -> Response:
        # Hosts, process ids and Redis internals are the operators' business, as the audit log.
        if not permissions.is_staff(request.user):
            raise PermissionDenied("the node's health is for staff users")
        return Response(await node.gather(runtime.async_redis(), settings.SIGNALBOX_NAMESPACE))
