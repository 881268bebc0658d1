"""URLs of the REST gateway, mounted at /api/ by signalbox.urls.

Destinations are addressed as /api/v1/queues/<name> and /api/v1/topics/<name>, the name percent-encoded
whole (gateway/paths.py); composites are sent through /api/v1/messages?destination=A,B,topic://C.
ActiveMQ's servlet lives at /api/message/.
"""

from __future__ import annotations

from django.urls import path, re_path, register_converter
from drf_spectacular.utils import extend_schema
from rest_framework.authtoken.models import Token
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from gateway import paths  # noqa: F401 - registers the `segment` converter
from gateway.api import (  # noqa: F401 - schema registers
    compat,
    jolokia,
    schema,
    views_admin,
    views_connections,
    views_console,
    views_maintenance,
    views_messaging,
    views_node,
    views_rates,
    views_topics,
    views_virtual,
)
from gateway.api.base import GatewayView
from gateway.logins import LoginRefused, failure_pause, in_login_thread


class TokenView(GatewayView):
    """POST username and password (JSON or form), get the user's API token (created on first use)."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_scope = "token"

    @extend_schema(operation_id="token_obtain", summary="Get your API token",
                   request={"application/json": {"type": "object", "properties": {
                       "username": {"type": "string"}, "password": {"type": "string"}},
                       "required": ["username", "password"]}},
                   responses={200: {"type": "object", "properties": {"token": {"type": "string"}}},
                              **views_messaging.problems(400)})
    async def post(self, request: Request) -> Response:
        def issue() -> str:
            serializer = AuthTokenSerializer(data=request.data, context={"request": request})
            serializer.is_valid(raise_exception=True)
            token, _ = Token.objects.get_or_create(user=serializer.validated_data["user"])
            return token.key

        try:
            return Response({"token": await in_login_thread(issue)})
        except (ValidationError, LoginRefused):
            await failure_pause()
            raise


class KindConverter:
    regex = "queues|topics"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(KindConverter, "kind")

# Every text in a path is a `segment`: one segment, percent-encoded whole, so a name may hold `/` or `%`
# (gateway/paths.py; docs/api.md, "Names in URLs").
D = "v1/<kind:kind>/<segment:name>"
CONSUMER = f"{D}/consumers/<segment:consumer_id>"

urlpatterns = [
    path("v1/auth/token", TokenView.as_view(), name="api-token"),
    path("v1/messages", views_messaging.CompositeSendView.as_view(), name="api-send-composite"),
    path("v1/destinations", views_admin.DestinationListView.as_view(), name="api-destinations"),
    path("v1/policies", views_admin.PolicyListView.as_view(), name="api-policies"),
    path("v1/policies/<segment:kind>/<segment:pattern>", views_admin.PolicyDetailView.as_view(),
         name="api-policy"),
    path("v1/audit", views_admin.AuditListView.as_view(), name="api-audit"),
    path("v1/virtual-destinations", views_virtual.VirtualDestinationListView.as_view(),
         name="api-virtual-destinations"),
    path("v1/connections", views_connections.ConnectionListView.as_view(), name="api-connections"),
    path("v1/connections/<segment:connection_id>", views_connections.ConnectionDetailView.as_view(),
         name="api-connection"),
    path("v1/connections/<segment:connection_id>/close", views_connections.ConnectionCloseView.as_view(),
         name="api-connection-close"),
    path("v1/maintenance/jobs", views_maintenance.MaintenanceJobsView.as_view(), name="api-maintenance-jobs"),
    # what the web console needs beyond the endpoints above (docs/api.md, Console)
    path("v1/console/overview", views_console.OverviewView.as_view(), name="api-console-overview"),
    path("v1/console/rates", views_rates.BrokerRatesView.as_view(), name="api-console-rates"),
    path("v1/console/<kind:kind>/<segment:name>/rates", views_rates.DestinationRatesView.as_view(),
         name="api-console-destination-rates"),
    path("v1/console/permissions", views_console.PermissionsView.as_view(), name="api-console-permissions"),
    path("v1/console/dead-letters", views_console.DeadLettersView.as_view(), name="api-console-dead-letters"),
    path("v1/console/node", views_node.NodeView.as_view(), name="api-console-node"),
    path("v1/console/<kind:kind>/<segment:name>/groups", views_console.GroupCountsView.as_view(),
         name="api-console-groups"),
    path("v1/topics/<segment:name>/subscriptions", views_topics.SubscriptionListView.as_view(),
         name="api-subscriptions"),
    path("v1/topics/<segment:name>/subscriptions/<segment:client_id>/<segment:subscription_name>",
         views_topics.DurableSubscriptionView.as_view(), name="api-durable-subscription"),
    path(D, views_admin.DestinationDetailView.as_view(), name="api-destination"),
    path(f"{D}/messages", views_messaging.DestinationMessagesView.as_view(), name="api-messages"),
    path(f"{D}/messages/<segment:message_id>", views_admin.MessageDetailView.as_view(), name="api-message"),
    *[path(f"{D}/messages/<segment:message_id>/{action}",
           views_admin.MessageActionView.as_view(action_name=action), name=f"api-message-{action}")
      for action in ("move", "copy", "retry")],
    *[path(f"{D}/{action}-matching", views_admin.MatchingActionView.as_view(action_name=action),
           name=f"api-{action}-matching") for action in ("move", "copy", "retry", "remove")],
    *[path(f"{D}/{action}", views_admin.DestinationActionView.as_view(action_name=action),
           name=f"api-{action}") for action in ("pause", "resume", "purge")],
    path(f"{D}/scheduled", views_admin.ScheduledView.as_view(), name="api-scheduled"),
    path(f"{D}/groups", views_admin.GroupsView.as_view(), name="api-groups"),
    path(f"{D}/groups/<segment:group_id>", views_admin.GroupDetailView.as_view(), name="api-group"),
    path(f"{D}/consumers", views_messaging.ConsumersView.as_view(), name="api-consumers"),
    path(CONSUMER, views_messaging.ConsumerDetailView.as_view(), name="api-consumer"),
    path(f"{CONSUMER}/receive", views_messaging.ReceiveView.as_view(), name="api-receive"),
    path(f"{CONSUMER}/ack", views_messaging.AckView.as_view(), name="api-ack"),
    path(f"{CONSUMER}/nack", views_messaging.NackView.as_view(), name="api-nack"),
    path(f"{CONSUMER}/heartbeat", views_messaging.HeartbeatView.as_view(), name="api-heartbeat"),
    path("message", compat.MessageServletRootView.as_view(), name="api-activemq-root"),
    # ActiveMQ's Jolokia agent, read side (a GET's parts escape `/` as `!/`, so the path is taken whole)
    # ([\s\S]: a path holding an encoded line end is still the agent's to answer, not a 404; not (?s),
    # which Django cannot reverse: every {% url %} of the site failed with it)
    re_path(r"^jolokia(?:/(?P<path>[\s\S]*))?$", jolokia.JolokiaView.as_view(), name="api-jolokia"),
    re_path(r"^message/(?P<path>.+)$", compat.MessageServletView.as_view(), name="api-activemq"),
]
