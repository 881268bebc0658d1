"""Producing and consuming over HTTP: send (one, a batch, raw, composite, idempotent), HTTP consumers
with leases (create, long-poll receive, ack, nack, heartbeat, delete). Never ack-on-dispatch: a
message is acknowledged only when the client says so (or, for `auto` consumers, once the answer carrying
it has been written, after_write.py), and a consumer that stops renewing its lease lapses and its
messages go back.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response

from broker_core import scheduler
from broker_core.destinations import Destination
from broker_core.errors import NotInFlight, UnknownConsumer
from broker_core.messages import Message, new_message_id
from broker_core.model import ConsumerRef, ConsumerSpec
from gateway import connections, permissions, runtime
from gateway.api import after_write, json_input
from gateway.api import serializers as s
from gateway.api.base import GatewayView, browse
from gateway.api.codec import parse_envelope, render_delivery
from gateway.api.common import (
    Idempotency,
    composite,
    destination_from_url,
    float_param,
    int_param,
    json_body,
    max_wait,
    message_ids_for,
    reap_now_and_then,
    topics_supported,
)
from gateway.api.consumer_ids import HttpConsumer, new_consumer_id, parse_consumer_id
from gateway.api.errors import Problem
from gateway.api.render import consumer_json
from gateway.api.schema import KIND_PARAM, problem_doc, problems
from gateway.paths import to_segment
from gateway.permissions import contents_allowed

MAX_BATCH = 1000
# -- producing --------------------------------------------------------------------------------------

_HEADER_FIELDS = {
    "HTTP_MESSAGE_PRIORITY": ("priority", int), "HTTP_MESSAGE_PERSISTENT": ("persistent", "bool"),
    "HTTP_MESSAGE_TTL": ("ttl", int), "HTTP_MESSAGE_EXPIRATION": ("expiration", int),
    "HTTP_MESSAGE_CORRELATION_ID": ("correlation_id", str), "HTTP_MESSAGE_REPLY_TO": ("reply_to", str),
    "HTTP_MESSAGE_TYPE": ("type", str), "HTTP_MESSAGE_GROUP_ID": ("group_id", str),
    "HTTP_MESSAGE_GROUP_SEQ": ("group_seq", int), "HTTP_MESSAGE_DELAY": ("delay", int),
    "HTTP_MESSAGE_PERIOD": ("period", int), "HTTP_MESSAGE_REPEAT": ("repeat", int),
    "HTTP_MESSAGE_CRON": ("cron", str),
}


def _raw_envelope(request: Request) -> dict[str, Any]:
    """A raw body with its headers (`Message-Priority: 7`, `Message-Properties: {"a": 1}`...)."""
    meta = request.META
    envelope: dict[str, Any] = {}
    for header, (name, kind) in _HEADER_FIELDS.items():
        raw = meta.get(header)
        if raw is None:
            continue
        if kind == "bool":
            if raw.lower() not in ("true", "false"):
                raise Problem(400, "invalid_message", "Invalid message",
                              f"header Message-Persistent must be true or false, got {raw!r}")
            envelope[name] = raw.lower() == "true"
        elif kind is int:
            try:
                envelope[name] = int(raw)
            except ValueError:
                header_name = header[5:].replace("_", "-").title()
                raise Problem(400, "invalid_message", "Invalid message",
                              f"header {header_name} must be an integer, got {raw!r}") from None
        else:
            envelope[name] = raw
    if "HTTP_MESSAGE_PROPERTIES" in meta:
        try:
            envelope["properties"] = json_input.loads(meta["HTTP_MESSAGE_PROPERTIES"])
        except json_input.InvalidJSON as exc:
            raise Problem(400, "invalid_message", "Invalid message",
                          f"header Message-Properties must be a JSON object: {exc}") from None
    content_type = request.content_type or "application/octet-stream"
    body = request._request.body
    media = content_type.split(";")[0].strip().lower()
    textual = media.startswith("text/") or media in ("application/xml", "application/javascript")
    if textual:
        try:
            envelope["body"] = body.decode(request._request.encoding or "utf-8")
        except (UnicodeDecodeError, LookupError):
            envelope["body_base64"] = base64.b64encode(body).decode()
    else:
        envelope["body_base64"] = base64.b64encode(body).decode()
    envelope["content_type"] = content_type
    return envelope


def _is_json(request: Request) -> bool:
    media = (request.content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def parse_messages(data: dict[str, Any], now_ms: int, user_name: str) -> list[Message]:
    """The messages of a JSON send body: one envelope, or `{"messages": [envelopes]}`."""
    if "messages" in data:
        raw = data["messages"]
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_BATCH or len(data) != 1:
            raise Problem(400, "invalid_message", "Invalid message",
                          f"a batch is {{\"messages\": [1..{MAX_BATCH} envelopes]}} and nothing else")
        return [parse_envelope(item, now_ms, i, user_id=user_name) for i, item in enumerate(raw)]
    return [parse_envelope(data, now_ms, user_id=user_name)]


async def send_parsed(user: Any, destinations: list[Destination], messages: list[Message],
                      ids: list[str | None]) -> dict[str, Any]:
    """Send parsed messages to every destination; the 201 body. The one send of the REST API (the
    views and the lean path of gateway/api/hot_path.py)."""
    # An HTTP "connection" is the user: a noLocal HTTP consumer skips what the same user sent over HTTP.
    connection_id = f"http:{user.pk}"
    for message, message_id in zip(messages, ids, strict=True):
        message.connection_id = connection_id
        if message_id:
            message.message_id = message_id
    broker = runtime.async_broker()
    if scheduler.is_management_send(destinations):
        jobs = await manage_scheduler(user, destinations, messages)
        return {"message_ids": [], "statuses": [], "destinations": [d.uri for d in destinations],
                "jobs": jobs}
    sent: list[str] = []
    for destination in destinations:
        sent = await broker.send(destination, messages)
    return {"message_ids": [str(i) for i in sent], "statuses": [getattr(i, "status", "ok") for i in sent],
            "destinations": [d.uri for d in destinations]}


async def manage_scheduler(user: Any, destinations: list[Destination], messages: list[Message]) -> list[int]:
    """Messages sent to ActiveMQ.Scheduler.Management: the broker's scheduler management (docs/api.md),
    delivered to nobody; as the WebSocket sessions' (gateway/ws/session.py), with the REST API's rights
    (read to browse a destination's jobs, admin to cancel them, write on a BROWSE's reply-to). Every
    message of a batch is checked before any acts: a bad one changes nothing."""
    requests = scheduler.scheduler_requests(destinations, messages)
    for request in requests:
        if request.reply_to is not None:
            refusal = await permissions.reply_to_refusal(user, request.reply_to)
            if refusal is not None:
                raise exceptions.PermissionDenied(refusal)

    async def may(dest: Destination, action: str) -> bool:
        return await contents_allowed(user, dest, action)  # type: ignore[arg-type]

    broker = runtime.async_broker()
    return [await broker.manage_scheduler(request, may) for request in requests]


async def send_messages(view: GatewayView, request: Request, destinations: list[Destination]) -> Response:
    await view.require(request, destinations, "write")
    now = runtime.async_broker().clock.now_ms()
    user = request.user.get_username()
    if _is_json(request):
        messages = parse_messages(json_body(request, required=True), now, user)
    else:
        messages = [parse_envelope(_raw_envelope(request), now, user_id=user)]

    idempotency_key = request.META.get("HTTP_IDEMPOTENCY_KEY")
    record = None
    if idempotency_key:
        if len(idempotency_key) > 255:
            raise Problem(400, "invalid_idempotency_key", "Invalid Idempotency-Key",
                          "the Idempotency-Key header is at most 255 characters")
        body_digest = hashlib.sha256(request._request.body).hexdigest()
        fingerprint = "|".join(d.uri for d in destinations) + "|" + request.content_type + "|" + body_digest
        record = Idempotency(request, idempotency_key, fingerprint)
        stored = await record.begin()
        if stored is not None:
            response = Response(stored["body"], status=stored["status"])
            response["Idempotent-Replayed"] = "true"
            return response
        ids: list[str | None] = list(message_ids_for(record.id_prefix, len(messages)))
    else:
        # One id per message across a composite's parts, as ActiveMQ copies one message to each.
        ids = [new_message_id() for _ in messages] if len(destinations) > 1 else [None] * len(messages)
    try:
        body = await send_parsed(request.user, destinations, messages, ids)
    except Exception:
        if record:
            await record.abandon()
        raise
    if record:
        await record.finish(201, body)
    return Response(body, status=status.HTTP_201_CREATED)


SEND_DOC = dict(
    request={"application/json": s.SendRequestSerializer, "text/plain": OpenApiTypes.STR,
             "application/octet-stream": OpenApiTypes.BINARY},
    responses={201: s.SendResultSerializer, **problems(400, 401, 403, 413, 429, 501, 503)},
    parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER,
                                 description="Retries with the same key and request send nothing again.")],
)


class DestinationMessagesView(GatewayView):
    """POST: send to one queue. GET: browse it (see views_admin.browse)."""

    @extend_schema(operation_id="send", summary="Send one message, a batch, or a raw body",
                   **{**SEND_DOC, "parameters": [KIND_PARAM, *SEND_DOC["parameters"]]})
    async def post(self, request: Request, kind: str, name: str) -> Response:
        return await send_messages(self, request, [url_destination(kind, name)])

    @extend_schema(operation_id="browse", summary="Browse messages (selector, cursor paging)",
                   parameters=[KIND_PARAM,
                               OpenApiParameter("selector", str, description="JMS selector"),
                               OpenApiParameter("cursor", str), OpenApiParameter("limit", int)],
                   responses={200: s.BrowsePageSerializer, **problems(400, 401, 403, 404, 501)})
    async def get(self, request: Request, kind: str, name: str) -> Response:
        return await browse(self, request, destination_from_url(kind, name))


class CompositeSendView(GatewayView):
    @extend_schema(operation_id="send_composite",
                   summary="Send to a composite destination (A,B,topic://C)", **{
                       **SEND_DOC, "parameters": [
                           OpenApiParameter(
                               "destination", str, required=True,
                               description="Destination or composite, e.g. orders,audit (queues; "
                                           "topic:// parts answer 501 until topics exist)",
                               pattern=None if topics_supported() else r"^[^:/{}?\s]+$"),
                           *SEND_DOC["parameters"]]})
    async def post(self, request: Request) -> Response:
        text = request.query_params.get("destination", "")
        if not text:
            raise Problem(400, "invalid_parameter", "Invalid parameter",
                          "give the destination as ?destination=A,B", parameter="destination")
        return await send_messages(self, request, composite(text))


# -- consuming --------------------------------------------------------------------------------------

LEASE_DEFAULT_MS = 30_000


class ConsumersView(GatewayView):
    @extend_schema(operation_id="consumer_create", summary="Create an HTTP consumer",
                   parameters=[KIND_PARAM], request=s.ConsumerCreateSerializer,
                   responses={201: s.HttpConsumerSerializer, **problems(400, 401, 403, 501),
                              **problem_doc(409, "too_many_consumers: the queue has SIGNALBOX_MAX_CONSUMERS "
                                                 "consumers (the detail names the limit)")})
    async def post(self, request: Request, kind: str, name: str) -> Response:
        destination = destination_from_url(kind, name)
        await self.require(request, destination, "read")
        serializer = s.ConsumerCreateSerializer(data=json_body(request))
        serializer.is_valid(raise_exception=True)
        options = serializer.validated_data
        if options.get("subscription_name") is not None and not destination.is_topic:
            raise Problem(400, "invalid_consumer", "Invalid consumer",
                          "subscription_name makes a durable topic subscription; a queue has none",
                          field="subscription_name")
        hub = runtime.wakeups()
        await hub.start()
        consumer_id = new_consumer_id(destination, options["ack_mode"], options["lease_ms"], request.user.pk,
                                      pull=options.get("prefetch") == 0)
        spec = ConsumerSpec(
            prefetch=options.get("prefetch"), priority=options["priority"], exclusive=options["exclusive"],
            selector=options.get("selector") or None, no_local=options["no_local"],
            connection_id=f"http:{request.user.pk}", client_id=options.get("client_id") or None,
            ack_mode=options["ack_mode"], lease_ms=options["lease_ms"], notify=hub.channel,
            subscription_name=options.get("subscription_name"),
            retroactive=options["retroactive"] and destination.is_topic)
        consumer = await runtime.async_broker().add_consumer(destination, spec, consumer_id)
        await connections.register_rest(  # the console's Connections page lists it
            consumer_id, destination.uri, ack_mode=options["ack_mode"], lease_ms=options["lease_ms"],
            user=request.user.get_username(), client_id=options.get("client_id"),
            address=f"http://{request.META.get('REMOTE_ADDR', '')}", selector=options.get("selector") or None,
            prefetch=consumer.prefetch, durable=options.get("subscription_name"))
        base = request.build_absolute_uri(f"/api/v1/{kind}/{to_segment(name)}/consumers/{consumer_id}")
        body = {
            "consumer_id": consumer_id, "destination": destination.uri, "ack_mode": options["ack_mode"],
            "prefetch": consumer.prefetch, "lease_ms": options["lease_ms"],
            "selector": options.get("selector") or None, "priority": options["priority"],
            "exclusive": options["exclusive"], "no_local": options["no_local"],
            "client_id": options.get("client_id") or None,
            "subscription_name": options.get("subscription_name"),
            "links": {name_: f"{base}/{name_}" for name_ in ("receive", "ack", "nack", "heartbeat")}
            | {"self": base},
        }
        response = Response(body, status=status.HTTP_201_CREATED)
        response["Location"] = base
        return response

    @extend_schema(operation_id="consumer_list", summary="Consumers of a destination with their statistics",
                   parameters=[KIND_PARAM],
                   responses={200: s.ConsumerStatsSerializer(many=True), **problems(401, 403, 404, 501)})
    async def get(self, request: Request, kind: str, name: str) -> Response:
        destination = destination_from_url(kind, name)
        await self.require(request, destination, "admin")
        stats = await runtime.async_broker().stats(destination)
        return Response([consumer_json(c) for c in stats.consumers])


# A client sends to and acks on the same few URLs: parsing a destination name checks every character,
# and a consumer id's MAC is an HMAC-SHA256, so both are remembered (both are pure; failures raise or
# are None and are parsed again).
url_destination = functools.lru_cache(maxsize=4096)(destination_from_url)
_consumer_from_id = functools.lru_cache(maxsize=4096)(parse_consumer_id)


def parse_own_consumer(user: Any, kind: str, name: str, consumer_id: str) -> HttpConsumer:
    """The user's own HTTP consumer named by the URL (404 for anyone else's: ids are not to be guessed
    or shared); permissions not checked yet."""
    destination = url_destination(kind, name)
    consumer = _consumer_from_id(destination, consumer_id)
    if consumer is None or consumer.user_id != user.pk:
        raise Problem(404, "unknown_consumer", "Unknown consumer",
                      f"no HTTP consumer {consumer_id} of yours on {destination.uri}",
                      consumer_id=consumer_id, destination=destination.uri)
    return consumer


async def own_consumer(view: GatewayView, request: Request, kind: str, name: str,
                       consumer_id: str) -> HttpConsumer:
    """The caller's own HTTP consumer, once the caller may read its destination."""
    consumer = parse_own_consumer(request.user, kind, name, consumer_id)
    connections.touch_rest(consumer_id, consumer.lease_ms)  # the registry entry lives with the consumer
    await view.require(request, consumer.destination, "read")
    return consumer


async def _gone(consumer: HttpConsumer) -> Problem:
    """404 for a consumer that is gone, or 410 with the reason when a slow-consumer strategy or an
    operator aborted it (issue 8: the REST consumer answers its next call with 410 and the reason)."""
    notice = await runtime.abort_notice(runtime.async_broker(), consumer.ref)
    if notice is not None:
        return Problem(410, "consumer_aborted", "Consumer aborted",
                       f"consumer {consumer.consumer_id} was aborted: {notice.reason}",
                       consumer_id=consumer.consumer_id, destination=consumer.destination.uri,
                       strategy=notice.strategy, aborted_at=notice.at)
    return Problem(404, "unknown_consumer", "Unknown consumer",
                   f"consumer {consumer.consumer_id} is gone: it was closed or its lease lapsed",
                   consumer_id=consumer.consumer_id, destination=consumer.destination.uri)


async def long_poll(ref: ConsumerRef, max_messages: int, wait: float, *, pull: bool,
                    unacked: bool = False) -> list[Any]:
    """Receive up to max_messages; with none there, wait up to `wait` seconds for dispatch to wake us.
    `unacked`: an ack-mode-auto consumer's messages are left for the caller to acknowledge once written
    (AsyncBroker.receive_unacked).

    Waits are sliced (1 s) so a consumer created through another gateway process, whose wake-ups go
    to that process, is still served; each slice also renews the lease and reaps lapsed peers.
    Raises UnknownConsumer when the consumer is gone."""
    broker = runtime.async_broker()
    hub = runtime.wakeups()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    try:
        while True:
            if unacked or wait > 0:
                deliveries = await _received(broker, ref, max_messages, unacked)
            else:  # (the lean path's receive, which nothing cancels: no task of its own)
                deliveries = await broker.receive(ref, max_messages)
            remaining = deadline - loop.time()
            if deliveries or remaining <= 0:
                break
            await hub.start()
            await reap_now_and_then(ref.destination)
            await hub.wait(ref.consumer_id, min(remaining, 1.0))
        if not deliveries and pull:
            await broker.cancel_pull(ref)  # a pull consumer's request must not outlive the request
    except UnknownConsumer:
        hub.forget(ref.consumer_id)
        raise
    return deliveries


async def _received(broker: Any, ref: ConsumerRef, max_messages: int, unacked: bool) -> list[Any]:
    """AsyncBroker.receive (receive_unacked: `unacked`), given back if the request is cancelled (its client
    gone: Django's handler cancels a long poll then) while the call is under way: its messages are leased
    once Redis ran it, and no later receive is handed them again, so they would stay in flight, never seen,
    until the consumer closes or lapses (ActiveMQ's GET: its lease, minutes), and a client-mode consumer's
    cumulative ack would even acknowledge them."""
    async def give_back(leased: list[Any]) -> None:
        if leased:  # (the consumer gone, Redis away: closing or lapsing gives back)
            await broker.nack(ref, [d.message_id for d in leased])

    return await runtime.uncancelled(broker.receive_unacked(ref, max_messages) if unacked
                                     else broker.receive(ref, max_messages), give_back)


class ConsumerDetailView(GatewayView):
    @extend_schema(operation_id="consumer_detail", summary="One consumer's statistics",
                   parameters=[KIND_PARAM],
                   responses={200: s.ConsumerStatsSerializer, **problems(401, 403, 404, 501)})
    async def get(self, request: Request, kind: str, name: str, consumer_id: str) -> Response:
        destination = destination_from_url(kind, name)
        mine = parse_consumer_id(destination, consumer_id)
        if mine is None or mine.user_id != request.user.pk:
            await self.require(request, destination, "admin")
        else:
            await self.require(request, destination, "read")
        stats = await runtime.async_broker().stats(destination)
        for consumer in stats.consumers:
            if consumer.consumer_id == consumer_id:
                return Response(consumer_json(consumer))
        raise Problem(404, "unknown_consumer", "Unknown consumer",
                      f"no consumer {consumer_id} on {destination.uri}", consumer_id=consumer_id)

    @extend_schema(operation_id="consumer_delete",
                   summary="Close a consumer: its unacknowledged messages are redelivered",
                   parameters=[KIND_PARAM], responses={204: None, **problems(401, 403, 404, 501)})
    async def delete(self, request: Request, kind: str, name: str, consumer_id: str) -> Response:
        destination = destination_from_url(kind, name)
        mine = parse_consumer_id(destination, consumer_id)
        broker = runtime.async_broker()
        if mine is not None and mine.user_id == request.user.pk:
            await self.require(request, destination, "read")
            try:
                await broker.close_consumer(mine.ref)
            except UnknownConsumer:
                raise await _gone(mine) from None
            finally:
                await connections.forget_rest(consumer_id)
            runtime.wakeups().forget(consumer_id)
            return Response(status=status.HTTP_204_NO_CONTENT)
        await self.require(request, destination, "admin")

        async def close() -> Response:
            try:
                await broker.close_consumer(ConsumerRef(destination, consumer_id), "closed by administrator")
            except UnknownConsumer:
                raise Problem(404, "unknown_consumer", "Unknown consumer",
                              f"no consumer {consumer_id} on {destination.uri}",
                              consumer_id=consumer_id) from None
            return Response(status=status.HTTP_204_NO_CONTENT)

        return await self.audited(request, "close_consumer", destination.uri, consumer_id, {}, close)


class ReceiveView(GatewayView):
    @extend_schema(operation_id="consumer_receive",
                   summary="Receive up to max_messages, waiting up to `wait` seconds (long poll)",
                   parameters=[KIND_PARAM, OpenApiParameter("max_messages", int, description="1-1000"),
                               OpenApiParameter("wait", float, description="seconds, capped at 20")],
                   request=None,
                   responses={200: s.ReceiveResultSerializer, **problems(400, 401, 403, 404, 501)})
    async def post(self, request: Request, kind: str, name: str, consumer_id: str) -> Response:
        consumer = await own_consumer(self, request, kind, name, consumer_id)
        if request._request.body.strip():
            json_body(request)
        count, wait = receive_params(request)
        return await receive_messages(consumer, count, wait, Response, request.scope)


def receive_params(params: Any) -> tuple[int, float]:
    """(max_messages, wait) of a receive, from the query string or the JSON body."""
    return int_param(params, "max_messages", 1, 1, 1000), float_param(params, "wait", 0.0, 0.0, max_wait())


async def receive_messages(consumer: HttpConsumer, count: int, wait: float, build: Any,
                           scope: dict[str, Any]) -> Any:
    """The one receive of the REST API (the view and the lean path of gateway/api/hot_path.py): the answer
    `build` makes of {"messages": [...]}. An ack-mode-auto consumer's messages are acknowledged once that
    answer is written, not before (after_write.py): a process that dies in between leaves them in flight,
    and they come back, redelivered, when the consumer is closed or lapses."""
    auto = consumer.ack_mode == "auto"
    try:
        deliveries = await long_poll(consumer.ref, count, wait, pull=consumer.pull, unacked=auto)
    except UnknownConsumer:
        raise await _gone(consumer) from None
    result = {"messages": [render_delivery(d) for d in deliveries]}
    if not (auto and deliveries):
        return build(result)
    ids = [d.message_id for d in deliveries]
    broker = runtime.async_broker()

    async def settle() -> None:
        await broker.ack(consumer.ref, ids, mode="individual")

    async def give_back() -> None:
        with contextlib.suppress(UnknownConsumer, NotInFlight):
            await broker.nack(consumer.ref, ids)

    return await after_write.hand_over(scope, lambda: build(result), settle, give_back)


def _message_ids(data: dict[str, Any]) -> list[str]:
    ids = data.get("message_ids")
    if ids is None and "message_id" in data:
        ids = [data["message_id"]]
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) and i for i in ids):
        raise Problem(400, "invalid_body", "Invalid body",
                      "give message_ids: a non-empty list of message ids (or message_id)")
    if len(ids) > 1000:
        raise Problem(400, "invalid_body", "Invalid body", "at most 1000 message ids per request")
    return ids


class AckView(GatewayView):
    @extend_schema(operation_id="consumer_ack",
                   summary="Acknowledge (individual, cumulative or delivered); optionally receive the next",
                   parameters=[KIND_PARAM], request=s.AckRequestSerializer,
                   responses={200: s.AckResultSerializer, **problems(400, 401, 403, 404, 501)}
                   | problem_doc(409, "Not in flight"))
    async def post(self, request: Request, kind: str, name: str, consumer_id: str) -> Response:
        consumer = await own_consumer(self, request, kind, name, consumer_id)
        data = json_body(request, required=True)
        ids, mode, receive = ack_params(request, data)
        return Response(await acknowledge(consumer, ids, mode, receive))


def ack_params(params: Any, data: dict[str, Any]) -> tuple[list[str], str | None, int]:
    """(message ids, mode, how many to receive after) of an ack request; 400 naming what is wrong."""
    ids = _message_ids(data)
    mode = data.get("mode")
    if mode is not None and mode not in ("individual", "cumulative", "delivered"):
        raise Problem(400, "invalid_body", "Invalid body",
                      f"mode must be individual, cumulative or delivered, got {mode!r}")
    return ids, mode, int_param(params, "receive", 0, 0, 1000)


async def acknowledge(consumer: HttpConsumer, ids: list[str], mode: str | None,
                      receive: int) -> dict[str, Any]:
    """The one ack (and ack-then-receive) of the REST API (the view and the lean path of
    gateway/api/hot_path.py)."""
    broker = runtime.async_broker()
    try:
        if receive:
            deliveries = await broker.ack_and_receive(consumer.ref, ids, receive, mode=mode)
            return {"acknowledged": None, "messages": [render_delivery(d) for d in deliveries]}
        count = await broker.ack(consumer.ref, ids, mode=mode)
    except UnknownConsumer:
        raise await _gone(consumer) from None
    return {"acknowledged": count, "messages": []}


class NackView(GatewayView):
    @extend_schema(operation_id="consumer_nack",
                   summary="Negative acknowledgement: redeliver with the policy's delay, or dead-letter",
                   parameters=[KIND_PARAM], request=s.NackRequestSerializer,
                   responses={200: s.NackResultSerializer, **problems(400, 401, 403, 404, 501)}
                   | problem_doc(409, "Not in flight"))
    async def post(self, request: Request, kind: str, name: str, consumer_id: str) -> Response:
        consumer = await own_consumer(self, request, kind, name, consumer_id)
        data = json_body(request, required=True)
        ids = _message_ids(data)
        poison = data.get("poison", False)
        if not isinstance(poison, bool):
            raise Problem(400, "invalid_body", "Invalid body", "poison must be true or false")
        broker = runtime.async_broker()
        try:
            dead_lettered, redelivered = await broker.nack(consumer.ref, ids, poison=poison)
        except UnknownConsumer:
            raise await _gone(consumer) from None
        return Response({"dead_lettered": dead_lettered, "redelivered": redelivered})


class HeartbeatView(GatewayView):
    @extend_schema(operation_id="consumer_heartbeat", summary="Renew the consumer's lease",
                   parameters=[KIND_PARAM], request=None,
                   responses={200: s.HeartbeatSerializer, **problems(401, 403, 404, 501)})
    async def post(self, request: Request, kind: str, name: str, consumer_id: str) -> Response:
        consumer = await own_consumer(self, request, kind, name, consumer_id)
        broker = runtime.async_broker()
        gone = await broker.renew_leases(consumer.destination, [consumer.consumer_id], consumer.lease_ms)
        if consumer.consumer_id in gone:
            raise await _gone(consumer)
        return Response({"consumer_id": consumer.consumer_id,
                         "lease_expires": broker.clock.now_ms() + consumer.lease_ms})
