"""Virtual destination routing over HTTP (issue 5): the composite destinations, virtual topics and
mirrored queues in force, as broker_core.ops.virtual.describe() shows them.

The configuration is the one every broker process routes with (stored in Redis, virtual.config_key),
read through the same cached operation the send path uses, so what is listed is what is applied.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from gateway import permissions, runtime
from gateway.api.base import GatewayView
from gateway.api.schema import problems


class ForwardToSerializer(serializers.Serializer):
    destination = serializers.CharField()
    selector = serializers.CharField(allow_null=True)


class VirtualDestinationSerializer(serializers.Serializer):
    type = serializers.ChoiceField(["compositeQueue", "compositeTopic", "virtualTopic", "mirroredQueue"])
    name = serializers.CharField(required=False,
                                 help_text="The composite's URI, or the virtual topics' pattern")
    forwardTo = ForwardToSerializer(many=True, required=False)  # noqa: N815 - the config's own name
    forwardOnly = serializers.BooleanField(required=False)  # noqa: N815
    sendWhenNotMatched = serializers.BooleanField(required=False)  # noqa: N815
    prefix = serializers.CharField(required=False)
    postfix = serializers.CharField(required=False)


class VirtualDestinationListView(GatewayView):
    @extend_schema(operation_id="virtual_destination_list",
                   summary="The virtual destination routing in force (staff)",
                   responses={200: VirtualDestinationSerializer(many=True), **problems(401, 403)})
    async def get(self, request: Request) -> Response:
        # Routing names destinations across the whole broker, so it is shown to staff only, as the audit log.
        if not permissions.is_staff(request.user):
            raise PermissionDenied("the virtual destination routing is for staff users")
        return Response(await runtime.async_broker().virtual_routing())
