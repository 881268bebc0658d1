"""Topic subscriptions over HTTP (issue 5): list a topic's subscriptions, remove a durable one.

Consuming from a topic is the same HTTP consumer as for a queue (`POST /api/v1/topics/<t>/consumers`,
with `client_id` + `subscription_name` for a durable subscription); deleting that consumer takes a
durable subscription offline, where it keeps collecting messages until it is removed here.
"""

from __future__ import annotations

import dataclasses

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from gateway import runtime
from gateway.api import serializers as s
from gateway.api.base import GatewayView, on_existing, stats_or_404
from gateway.api.schema import problem_doc, problems

TOPIC = OpenApiParameter("name", str, OpenApiParameter.PATH, description="The topic's name")


class SubscriptionSerializer(serializers.Serializer):
    key = serializers.CharField()
    durable = serializers.BooleanField()
    client_id = serializers.CharField(allow_null=True)
    subscription_name = serializers.CharField(allow_null=True)
    selector = serializers.CharField(allow_null=True)
    no_local = serializers.BooleanField()
    consumer_id = serializers.CharField(allow_null=True, help_text="None while a durable one is offline")
    active = serializers.BooleanField()
    offline_since = serializers.IntegerField(allow_null=True)
    created = serializers.IntegerField()
    pending = serializers.IntegerField(help_text="Waiting for the subscriber (PendingQueueSize)")
    in_flight = serializers.IntegerField(help_text="Dispatched, not yet acknowledged")
    parked = serializers.IntegerField(help_text="Waiting for a redelivery delay or a scheduled time")
    enqueued = serializers.IntegerField()
    dispatched = serializers.IntegerField()
    dequeued = serializers.IntegerField()
    evicted = serializers.IntegerField(help_text="Given up by the eviction strategy (DiscardedCount)")
    dropped = serializers.IntegerField(help_text="Dropped by a pending-message limit of 0")
    expired = serializers.IntegerField()
    deadlettered = serializers.IntegerField()
    discarded = serializers.IntegerField(help_text="Dead letters the dead-letter strategy dropped")
    prefetch = serializers.IntegerField()
    slow_since = serializers.IntegerField(allow_null=True, help_text="Epoch ms the subscriber became slow")
    retroactive = serializers.BooleanField(
        help_text="Its consumer replayed the recovery policy when it attached (retroactive, or a non-durable "
                  "subscription on an alwaysRetroactive topic)")
    pending_message_limit = serializers.IntegerField(
        help_text="The pending-message limit in force: the strategy's constant or prefetch × multiplier, or "
                  "the consumer's smaller maximumPendingMessageLimit; -1 = unlimited (always for durables)")


class SubscriptionListView(GatewayView):
    @extend_schema(operation_id="subscription_list", summary="A topic's subscriptions with their counters",
                   parameters=[TOPIC],
                   responses={200: SubscriptionSerializer(many=True), **problems(401, 403, 404)})
    async def get(self, request: Request, name: str) -> Response:
        topic = await self.destination(request, "topics", name, "read")
        await stats_or_404(topic)
        subscriptions = await runtime.async_broker().subscriptions(topic)
        return Response([dataclasses.asdict(sub) for sub in subscriptions])


class DurableSubscriptionView(GatewayView):
    @extend_schema(operation_id="durable_subscription_remove",
                   summary="Remove an offline durable subscription and its messages (JMS unsubscribe)",
                   parameters=[TOPIC, OpenApiParameter("client_id", str, OpenApiParameter.PATH),
                               OpenApiParameter("subscription_name", str, OpenApiParameter.PATH)],
                   responses={200: s.RemovedSerializer, **problems(401, 403, 404)}
                   | problem_doc(409, "The durable subscription has an active consumer"))
    async def delete(self, request: Request, name: str, client_id: str, subscription_name: str) -> Response:
        topic = await self.destination(request, "topics", name, "read")

        async def remove() -> Response:
            removed = await runtime.async_broker().unsubscribe(topic, client_id=client_id,
                                                               subscription_name=subscription_name)
            return Response({"removed": int(removed or 0)})

        return await on_existing(self, request, topic, "remove_durable_subscription", remove,
                                 f"{client_id}:{subscription_name}")
