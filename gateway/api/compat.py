"""ActiveMQ's REST MessageServlet (`/api/message/<name>`), reproduced so its clients move over by
changing only the host (spec §15.1).

What matches ActiveMQ 5.17: destination from `destination` or the path (`/` -> `.`), `type` (absent
means topic), POST parameters (JMSCorrelationID, JMSReplyTo, JMSType, JMSDeliveryMode, JMSPriority
default 5, JMSTimeToLive; every other single-valued parameter a string property; JMSXGroupID/Seq the
group), `body` or the raw body up to 100000 bytes, `200 Message sent` with a `messageID` header;
GET/DELETE receive one message with `readTimeout` (negative or above 20000 ms: 20000), `204` on
timeout, headers `destination`, `id` and one per property, the `<?...?>` prolog removed, the content
type rules, consumers kept per client (`clientId`, else the `JSESSIONID` cookie) and per destination,
the `selector` header used when the consumer is created, `oneShot`, `action=unsubscribe`, and
"Concurrent access to consumer is not supported" for a second request on a busy consumer.

Where Signalbox differs, on purpose: the consumer pulls (prefetch 0) instead of prefetching 1000
messages that other consumers then cannot see, and it holds a lease, so an abandoned REST client's
consumer lapses (SIGNALBOX_COMPAT_LEASE_MS, default 5 minutes) instead of living as long as its HTTP
session. Errors are problem details with their proper status (ActiveMQ answers 500 for most). Topics
answer 501 until broker_core has them. Logging in is HTTP Basic (as ActiveMQ's own), or a token: never
the console's session cookie, since a GET here consumes and a cross-site link would carry the cookie.

A GET acknowledges only once its answer has been written: within the consumer's turn (one request at a
time, broker_core/turns.py) the consumer leases one message (client-individual acks), the answer is built
(status, headers, body) and handed, with its settlement, to the ASGI handler, which writes it and only
then acknowledges the message and ends the turn in one round trip (after_write.py). A process that dies
between the write and the ack leaves the message leased: the lease gives it back, redelivered (at least
once; acknowledging first lost it). If building fails, the request is cancelled (its client gone, even
while the turn's call or the long poll leases the message), the answer is not the one written or was
dropped because the client had gone, or the ack fails, the message is negatively acknowledged (back to the
queue with its redelivery counter raised, to the dead-letter queue past maximumRedeliveries), as a JMS
consumer's rollback. A message found in flight when a turn begins was left by a request that died holding
it (a crashed gateway): the GET closes the consumer first, which gives it back, redelivered. The client's
next GET does not wait for the ack: this process's ack is in Redis before the next request can be read
(one multiplexed connection, in order); one served by another process asks for a turn found taken a few
more times, about 20 ms in all, before refusing it as concurrent. Redis round trips of a GET that finds a
message on a queue: two (take the turn and lease, one script call that leases nothing unless the turn is
taken and nothing is left in flight; ack and end the turn), the second after the answer is out.

The state of the servlet's consumers (turns, each client's consumers) is kept by broker_core
(broker_core/turns.py); this module touches no Redis key itself. The plain requests (cached
credentials, a message there at once) skip Django's request machinery (compat_hot.py).

Properties become headers as ActiveMQ's setResponseHeaders does, but only safely (compat_headers.py):
ActiveMQ copies every property name and value into a header unchecked.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import hashlib
import logging
import re
import secrets
from typing import Any

import redis
from django.http import HttpResponse
from django.utils.http import parse_header_parameters
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request

from broker_core import turns
from broker_core.destinations import Destination, parse_destination
from broker_core.errors import BrokerError, InvalidConsumer, NotInFlight, UnknownConsumer
from broker_core.messages import Message, jms_priority
from broker_core.model import ConsumerRef, ConsumerSpec
from gateway import connections, runtime
from gateway.api import after_write
from gateway.api.auth import BasicAuthentication, TokenAuthentication
from gateway.api.base import GatewayView
from gateway.api.common import decimal_integer, setting, topics_supported
from gateway.api.compat_headers import OMITTED_HEADER, header_value, omitted_header, property_headers
from gateway.api.errors import Problem, topics_not_supported
from gateway.api.views_messaging import long_poll, problem_doc, problems
from gateway.java import java_equals_ignore_case, java_trim
from gateway.paths import from_segment

MAX_MESSAGE_SIZE = 100_000
DEFAULT_PRIORITY = 5
MAXIMUM_READ_TIMEOUT_MS = 20_000
SESSION_COOKIE = "JSESSIONID"
# Not message properties: the servlet's own parameters (JMSCorrelationID & co. are taken out first).
_NOT_PROPERTIES = {"destination", "type", "body", "JMSDeliveryMode", "JMSPriority", "JMSTimeToLive",
                   "JMSCorrelationID", "JMSExpiration", "JMSReplyTo", "JMSType"}
_PROLOG = re.compile(r"^<\?.*?\?>", re.DOTALL)
_SESSION = re.compile(r"[A-Za-z0-9_-]{8,64}")  # a JSESSIONID this servlet made (secrets.token_urlsafe)
# The consumer acknowledges each message itself, once the answer carrying it is written.
ACK_MODE = "client-individual"
log = logging.getLogger(__name__)


def _parameters(request: Request) -> dict[str, list[str]]:
    """The servlet's parameter map: query string and form fields together."""
    params: dict[str, list[str]] = {k: request.query_params.getlist(k) for k in request.query_params}
    media = (request.content_type or "").split(";")[0].strip().lower()
    if request.method == "POST" and media == "application/x-www-form-urlencoded":
        form = request._request.POST
        for key in form:
            params.setdefault(key, []).extend(form.getlist(key))
    return params


def _first(params: dict[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    return values[0] if values else None


def compat_destination(path: str, params: dict[str, list[str]]) -> Destination:
    """The destination of a servlet request. `path` is the routing path after /api/message/
    (gateway/paths.py), decoded whole as Jetty decodes it for ActiveMQ, %2F included, so every `/` is a
    separator: a name holding `/` is reached through `destination` only, as in ActiveMQ."""
    name = _first(params, "destination") or from_segment(path).strip("/").replace("/", ".")
    if not name:
        raise Problem(400, "no_destination", "No destination",
                      "no destination given: use /api/message/<name> or ?destination=<name>")
    lowered = name.lower()
    if lowered.startswith("topic://"):
        kind, name = "topic", name[len("topic://"):]
    elif lowered.startswith("queue://"):
        kind, name = "queue", name[len("queue://"):]
    elif lowered.startswith("channel://"):
        kind, name = "queue", name[len("channel://"):]
    else:
        type_ = _first(params, "type")
        # ActiveMQ's servlet init-param `topic` defaults to true: no type means a topic.
        kind = "topic" if type_ is None or java_equals_ignore_case(type_, "topic") else "queue"
    destination = parse_destination(name, kind)  # type: ignore[arg-type]
    if destination.is_topic and not topics_supported():
        raise topics_not_supported(f"{destination.uri}; ActiveMQ's /api/message defaults to a topic when "
                                   "no type is given, add type=queue")
    return destination


def _long(params: dict[str, list[str]], name: str, default: int) -> int:
    raw = _first(params, name)
    if raw is None or raw == "":
        return default
    try:
        return decimal_integer(raw)
    except ValueError:
        raise Problem(400, "invalid_parameter", "Invalid parameter", f"{name} must be a number, got {raw!r}",
                      parameter=name) from None


def _too_large() -> Problem:
    return Problem(413, "message_too_large", "Message too large",
                   f"the maximum message size of {MAX_MESSAGE_SIZE} is exceeded", limit=MAX_MESSAGE_SIZE)


def _lease_ms() -> int:
    return int(setting("SIGNALBOX_COMPAT_LEASE_MS", 300_000))


def _refuse_cross_site(request: Request) -> None:
    """A browser also sends Basic credentials it remembers with a request another site's page makes (a
    link, an image, a form): refuse what the browser itself marks as coming from another origin's page
    (Fetch Metadata). ActiveMQ's clients, curl and scripts send no Sec-Fetch-Site."""
    site = request.META.get("HTTP_SEC_FETCH_SITE")
    if site is not None and site not in ("same-origin", "none"):
        raise Problem(403, "cross_site_request", "Cross-site request",
                      f"/api/message does not serve requests made by another site's page "
                      f"(Sec-Fetch-Site: {site[:40]}); a GET here consumes a message")


class MessageServletView(GatewayView):
    # No SessionAuthentication: a GET consumes, and a cross-site link would carry the console's cookie.
    authentication_classes = [BasicAuthentication, TokenAuthentication]
    throttle_scope = "compat"
    # No HEAD: its answer goes without a body, so a HEAD answered as a GET (Django's, and the servlet's
    # doHead) would take a message and send none of it; refused (405) instead, the message left queued.
    http_method_names = ["get", "post", "delete", "options"]

    # -- POST: send ---------------------------------------------------------------------------------

    @extend_schema(
        operation_id="activemq_send", tags=["activemq"],
        summary="ActiveMQ MessageServlet: send a text message (type=queue; no type means a topic)",
        parameters=[OpenApiParameter("type", str, enum=["queue", "topic"]),
                    OpenApiParameter("destination", str), OpenApiParameter("body", str),
                    OpenApiParameter("JMSPriority", int), OpenApiParameter("JMSTimeToLive", int),
                    OpenApiParameter("JMSDeliveryMode", str), OpenApiParameter("JMSCorrelationID", str),
                    OpenApiParameter("JMSReplyTo", str), OpenApiParameter("JMSType", str),
                    OpenApiParameter("JMSXGroupID", str), OpenApiParameter("JMSXGroupSeq", int)],
        request={"text/plain": str},
        responses={200: OpenApiResponse(str, description="Message sent (header messageID)"),
                   **problems(400, 401, 403, 413, 501, 503)})
    async def post(self, request: Request, path: str = "") -> HttpResponse:
        _refuse_cross_site(request)
        params = _parameters(request)
        if _first(params, "action") == "unsubscribe" and _first(params, "clientId"):
            await unsubscribe(request.user.pk, "c:" + (_first(params, "clientId") or ""))
            return HttpResponse(b"", content_type="text/plain")
        destination = compat_destination(path, params)
        await self.require(request, destination, "write")
        media = (request.content_type or "").split(";")[0].strip().lower()
        raw = b"" if _first(params, "body") is not None or media == FORM else request._request.body
        text = message_text(params, raw, request._request.encoding or "utf-8")
        message_id = await send_message(request.user, destination, params, text)
        response = HttpResponse(b"Message sent", content_type="text/plain")
        response["messageID"] = message_id
        return response

    # -- GET / DELETE: receive one ------------------------------------------------------------------

    @extend_schema(
        operation_id="activemq_receive", tags=["activemq"],
        summary="ActiveMQ MessageServlet: one message, acknowledged once its answer is written; 204 if none",
        parameters=[OpenApiParameter("type", str, enum=["queue", "topic"]),
                    OpenApiParameter("destination", str), OpenApiParameter("readTimeout", int),
                    OpenApiParameter("clientId", str), OpenApiParameter("oneShot", bool),
                    OpenApiParameter("json", bool), OpenApiParameter("xml", bool),
                    OpenApiParameter("selector", str, OpenApiParameter.HEADER)],
        responses={200: OpenApiResponse(str, description="The message body; headers destination, id, "
                                                         "one per property"),
                   204: OpenApiResponse(description="No message within readTimeout"),
                   **problems(400, 401, 403, 501)} | problem_doc(409, "Consumer busy"))
    async def get(self, request: Request, path: str = "") -> HttpResponse:
        return await self._receive(request, path)

    @extend_schema(operation_id="activemq_receive_delete", tags=["activemq"],
                   summary="ActiveMQ MessageServlet: DELETE receives like GET",
                   responses={200: OpenApiResponse(str), 204: OpenApiResponse(description="No message"),
                              **problems(400, 401, 403, 501)})
    async def delete(self, request: Request, path: str = "") -> HttpResponse:
        return await self._receive(request, path)

    async def _receive(self, request: Request, path: str) -> HttpResponse:
        _refuse_cross_site(request)
        params = _parameters(request)
        destination = compat_destination(path, params)
        await self.require(request, destination, "read")
        client, new_cookie = client_key(params, request.COOKIES.get(SESSION_COOKIE))
        who = (request.user.get_username(), f"http://{request.META.get('REMOTE_ADDR', '')}")
        taken = await take_one(request.user.pk, client, destination, params,
                               request.META.get("HTTP_SELECTOR"), _http_response, request.scope, who=who)
        response = taken if taken is not None else _no_cache(HttpResponse(status=204))
        if new_cookie:
            response.set_cookie(SESSION_COOKIE, new_cookie, **COOKIE_ATTRIBUTES)
        return response


def _http_response(answer: Answer) -> HttpResponse:
    content_type, body, headers = answer
    response = HttpResponse(body, content_type=content_type)
    for name, value in headers:
        response[name] = value
    return response


# -- the servlet's operations, shared by the view and the lean path (compat_hot.py) ----------------------

FORM = "application/x-www-form-urlencoded"
COOKIE_ATTRIBUTES = {"httponly": True, "samesite": "Lax", "path": "/api/message"}
# As the servlet's writeResponse sets them (Expires by setDateHeader(0): an HTTP date, as RFC 9111 asks).
NO_CACHE_HEADERS = (("Cache-Control", "no-cache, no-store, must-revalidate"), ("Pragma", "no-cache"),
                    ("Expires", "Thu, 01 Jan 1970 00:00:00 GMT"))
# (content type, body, headers after Content-Type) of a GET's answer with a message
Answer = tuple[str, bytes, list[tuple[str, str]]]


def message_text(params: dict[str, list[str]], raw: bytes, encoding: str) -> str:
    """The message's text: the `body` parameter, else the request's body (empty for a form)."""
    body = _first(params, "body")
    if body is None:
        if len(raw) > MAX_MESSAGE_SIZE:
            raise _too_large()
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError as exc:  # (U+FFFD in their place: another text than the one sent)
            named = "UTF-8" if codecs.lookup(encoding).name == "utf-8" else encoding
            raise Problem(400, "invalid_body", "Invalid body",
                          f"the body is not {named} text (byte {exc.start}: {raw[exc.start]:#04x}); send it "
                          "in UTF-8, or name its charset in Content-Type") from None
    if len(body.encode()) > MAX_MESSAGE_SIZE:
        raise _too_large()
    return body


async def send_message(user: Any, destination: Destination, params: dict[str, list[str]], text: str) -> str:
    """Send the POST's message (the servlet's parameters as JMS headers and properties); its id."""
    broker = runtime.async_broker()
    now = broker.clock.now_ms()
    mode = _first(params, "JMSDeliveryMode")
    ttl = _long(params, "JMSTimeToLive", 0)
    priority = _long(params, "JMSPriority", DEFAULT_PRIORITY)
    if not -(2**31) <= priority < 2**31:  # the servlet's Integer.parseInt refuses it
        raise Problem(400, "invalid_parameter", "Invalid parameter",
                      f"JMSPriority must be a 32-bit integer, got {priority}", parameter="JMSPriority")
    reply_to = _first(params, "JMSReplyTo")
    message = Message(
        body=text,
        priority=jms_priority(priority),  # out of 0..9 it wraps and is clamped, as ActiveMQ's
        persistent=mode is None or java_equals_ignore_case(java_trim(mode), "persistent"),  # (trimmed)
        expiration=now + ttl if ttl > 0 else 0,
        correlation_id=_first(params, "JMSCorrelationID"),
        reply_to=parse_destination(reply_to).uri if reply_to else None,
        type=_first(params, "JMSType"),
        user_id=user.get_username(),
        connection_id=f"http:{user.pk}",
    )
    for name, values in params.items():
        if name in _NOT_PROPERTIES or len(values) != 1:
            continue  # ActiveMQ drops multi-valued parameters
        if name == "JMSXGroupID":
            message.group_id = values[0]
        elif name == "JMSXGroupSeq":
            message.group_seq = _long(params, name, 0)
        else:
            message.properties[name] = values[0]
    [message_id] = await broker.send(destination, message)
    return message_id


def client_key(params: dict[str, list[str]], session: str | None) -> tuple[str, str | None]:
    """(client key, new session cookie to set or None): `clientId`, else the JSESSIONID cookie."""
    client_id = _first(params, "clientId")
    if client_id:
        return "c:" + client_id, None
    if session and _SESSION.fullmatch(session):
        return "s:" + session, None
    session = secrets.token_urlsafe(18)
    return "s:" + session, session


def _client(user_pk: Any, client: str) -> str:
    """The client's opaque name for broker_core.turns (its consumers' registry)."""
    return "amq:" + hashlib.sha256(f"{user_pk}|{client}".encode()).hexdigest()[:24]


@functools.lru_cache(maxsize=4096)  # (pure; a client asks for the same consumer on every GET)
def consumer_ref(user_pk: Any, client: str, destination: Destination) -> ConsumerRef:
    digest = hashlib.sha256(f"{user_pk}|{client}|{destination.uri}".encode()).hexdigest()
    # amqc: the client-individual consumer (amq- ones acked on receipt)
    return ConsumerRef(destination, f"amqc-{digest[:24]}", ACK_MODE)


def read_timeout_ms(params: dict[str, list[str]]) -> int:
    timeout_ms = _long(params, "readTimeout", -1)
    return MAXIMUM_READ_TIMEOUT_MS if timeout_ms < 0 or timeout_ms > MAXIMUM_READ_TIMEOUT_MS else timeout_ms


async def take_one(user_pk: Any, client: str, destination: Destination, params: dict[str, list[str]],
                   selector: str | None, build: Any, scope: dict[str, Any], *, wait: bool = True,
                   who: tuple[str, str] = ("", "")) -> Any:
    """The GET: within the consumer's turn (broker_core.turns), lease one message and `build` its answer
    from `answer(delivery, params)`; the answer goes to the ASGI handler with its settlement
    (after_write.hand_over), which acknowledges the message and ends the turn once the answer is written. If
    building fails, or the request is cancelled, the message is given back (nack). None: no message within
    readTimeout (or at once, without `wait`), the turn ended."""
    ref = consumer_ref(user_pk, client, destination)
    broker = runtime.async_broker()
    timeout_ms = read_timeout_ms(params)
    waiting = timeout_ms / 1000 if wait else 0.0
    one_shot = java_equals_ignore_case(_first(params, "oneShot"), "true")
    left, deliveries = await (_begin_cancellable(broker, ref, timeout_ms) if wait
                              else _begin(broker, ref, timeout_ms))
    handed_over = False
    try:
        if left:  # a request that died in its turn held these: closing the consumer gives them back
            await _close(ref)
        connections.touch_rest(ref.consumer_id, _lease_ms())  # its Connections entry lives with it
        if deliveries is None or (not deliveries and waiting > 0):
            deliveries = await _poll(user_pk, client, ref, selector, waiting, who)
        elif not deliveries:  # nothing at once, no wait: as long_poll ends a pull that found nothing
            await broker.cancel_pull(ref)
        if not deliveries:
            if one_shot:
                await _close(ref)
            return None
        delivery = deliveries[0]
        handed_over = True  # from here on the settlement, or giving back, ends the turn
        return await after_write.hand_over(scope, lambda: build(answer(delivery, params)),
                                           functools.partial(_settle, ref, delivery.message_id, one_shot),
                                           functools.partial(_give_back, ref, delivery.message_id))
    finally:
        if not handed_over:
            await asyncio.shield(turns.end_turn(broker, ref))


# A turn found taken may belong to a request that has answered and whose settlement (which ends the turn)
# is still on its way to Redis: from another process (this process's own is in Redis first,
# after_write.py). So the turn is asked for again a few times, about 20 ms in all, before the GET is
# refused as ActiveMQ refuses a busy consumer.
TURN_RETRY_PAUSES_S = (0.002, 0.004, 0.006, 0.008)


async def _begin(broker: Any, ref: ConsumerRef, timeout_ms: int) -> tuple[int, list[Any] | None]:
    """The consumer's turn (turns.begin_turn_receiving: with, for a queue's consumer with nothing left in
    flight, the lease of a message there at once): (messages left in flight, deliveries or None when the
    consumer is yet to be made or nothing was received). 409 when the turn stays taken."""
    for pause in (*TURN_RETRY_PAUSES_S, None):
        try:
            left, deliveries = await turns.begin_turn_receiving(broker, ref, timeout_ms + 30_000)
        except UnknownConsumer:  # the turn is taken; the consumer is made by _poll
            return 0, None
        except (BrokerError, redis.ResponseError):
            if ref.destination.is_queue:  # receive.lua refuses only after it took the turn: end it
                await asyncio.shield(turns.end_turn(broker, ref))
            raise
        if left is not None:
            return left, deliveries
        if pause is not None:
            await asyncio.sleep(pause)
    raise Problem(409, "concurrent_access", "Consumer busy",
                  "Concurrent access to consumer is not supported", consumer_id=ref.consumer_id)


async def _begin_cancellable(broker: Any, ref: ConsumerRef, timeout_ms: int) -> tuple[int, list[Any] | None]:
    """`_begin` for Django's path, whose request is cancelled when its client leaves: cancelled while the
    call is under way, the turn it took is ended and a message it leased given back, not left in flight
    until the client's next GET (or the lease, minutes) with the turn held until it expires. (The lean path
    is never cancelled, and spares the task.)"""
    call = asyncio.ensure_future(_begin(broker, ref, timeout_ms))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):  # (a refusal took no turn; Redis away: the turn expires)
            _left, deliveries = await call
            try:
                if deliveries:
                    await broker.nack(ref, [d.message_id for d in deliveries])
            finally:
                await turns.end_turn(broker, ref)
        raise


async def _settle(ref: ConsumerRef, message_id: str, one_shot: bool) -> None:
    """The answer carrying the message is written: acknowledge it and end the turn (one round trip), then
    close a oneShot consumer (closing first would give the message back)."""
    await turns.settle(runtime.async_broker(), ref, message_id)
    if one_shot:
        await _close(ref)


async def _give_back(ref: ConsumerRef, message_id: str) -> None:
    """The answer carrying the message was not written (or its ack failed): back to the queue, redelivered
    (a JMS consumer's rollback), and the turn ended."""
    broker = runtime.async_broker()
    try:
        with contextlib.suppress(NotInFlight, UnknownConsumer):
            await broker.nack(ref, message_id)
    finally:
        await turns.end_turn(broker, ref)


async def _poll(user_pk: Any, client: str, ref: ConsumerRef, selector: str | None, wait: float,
                who: tuple[str, str]) -> list[Any]:
    for _ in range(2):
        try:
            return await long_poll(ref, 1, wait, pull=True)
        except UnknownConsumer:
            await _create(user_pk, client, ref, selector, who)
    return []


async def _create(user_pk: Any, client: str, ref: ConsumerRef, selector: str | None,
                  who: tuple[str, str]) -> None:
    """Register the client's consumer on first use; the selector header counts only now. `who`: the user's
    name and address, for the console's Connections page, which lists it."""
    hub = runtime.wakeups()
    await hub.start()
    spec = ConsumerSpec(prefetch=0, selector=selector or None, ack_mode=ACK_MODE, lease_ms=_lease_ms(),
                        notify=hub.channel, connection_id=f"http:{user_pk}", client_id=client[2:][:200])
    broker = runtime.async_broker()
    try:
        await broker.add_consumer(ref.destination, spec, ref.consumer_id)
    except InvalidConsumer as exc:
        if "exists" not in exc.message.lower() and "CONSUMER_EXISTS" not in str(exc):
            raise
    await turns.remember_consumer(broker, _client(user_pk, client), ref, _lease_ms() * 2)
    await connections.register_rest(ref.consumer_id, ref.destination.uri, ack_mode=ACK_MODE,
                                    lease_ms=_lease_ms(), user=who[0], client_id=client[2:][:200],
                                    address=who[1], selector=spec.selector, prefetch=0)


async def _close(ref: ConsumerRef) -> None:
    with contextlib.suppress(UnknownConsumer):
        await runtime.async_broker().close_consumer(ref)
    await connections.forget_rest(ref.consumer_id)
    runtime.wakeups().forget(ref.consumer_id)


async def unsubscribe(user_pk: Any, client: str) -> None:
    """`action=unsubscribe`: close every consumer the client has."""
    broker = runtime.async_broker()
    name = _client(user_pk, client)
    for ref in await turns.client_consumers(broker, name, ACK_MODE):
        await _close(ref)
    await turns.forget_client(broker, name)


def answer(delivery: Any, params: dict[str, list[str]]) -> Answer:
    """The answer carrying a delivery: content type, body, then headers (destination, id, the properties,
    the group, no-cache), as the servlet's."""
    text = delivery.body if isinstance(delivery.body, str) else ""
    if text.startswith("<?"):
        text = _PROLOG.sub("", text, count=1)
    if java_equals_ignore_case(_first(params, "xml"), "true"):
        content_type = "application/xml"
    elif java_equals_ignore_case(_first(params, "json"), "true"):
        content_type = "application/json"
    elif setting("SIGNALBOX_COMPAT_DEFAULT_CONTENT_TYPE", ""):
        content_type = setting("SIGNALBOX_COMPAT_DEFAULT_CONTENT_TYPE", "")
    else:
        content_type = "application/xml" if text.startswith("<") else "text/plain"
    content_type, encoding = _with_charset(content_type)
    headers = [("destination", header_value(delivery.destination)), ("id", header_value(delivery.message_id))]
    properties, omitted = property_headers(delivery.properties)
    headers += properties
    if omitted:
        headers.append((OMITTED_HEADER, omitted_header(omitted)))
    if delivery.group_id is not None:
        headers.append(("JMSXGroupID", header_value(delivery.group_id)))
    if delivery.group_first_for_consumer:
        headers.append(("JMSXGroupFirstForConsumer", "true"))
    headers += NO_CACHE_HEADERS
    return content_type, text.encode(encoding, "replace"), headers


@functools.lru_cache(maxsize=64)  # (a few values: the three fixed ones and the setting's)
def _with_charset(content_type: str) -> tuple[str, str]:
    """(Content-Type, the body's encoding). A text type (text/*, XML) names its charset: without one a
    client reads text/* as ISO-8859-1 (ActiveMQ's Jetty declares ISO-8859-1 and writes what it cannot
    encode as '?'), so the body is UTF-8 and says so, unless SIGNALBOX_COMPAT_DEFAULT_CONTENT_TYPE names
    a charset: then the body is written in that one (what its clients decode it with), '?' for what it
    lacks, as Jetty writes it. Other types (JSON, UTF-8 by definition; binary ones) go as they are."""
    media, params = parse_header_parameters(content_type)
    charset = params.get("charset")
    if charset:
        try:
            return content_type, codecs.lookup(charset).name
        except LookupError:  # (a name Python does not know: the body could not be written in it)
            log.warning("SIGNALBOX_COMPAT_DEFAULT_CONTENT_TYPE names an unknown charset %r: answering in "
                        "UTF-8", charset)
            content_type = media + "".join(f"; {k}={v}" for k, v in params.items() if k != "charset")
    if media.startswith("text/") or media == "application/xml" or media.endswith("+xml"):
        content_type += ";charset=utf-8"
    return content_type, "utf-8"


def _no_cache(response: HttpResponse) -> HttpResponse:
    """A 204 without content, so without a Content-Type, but not to be cached: a 204 is cacheable by
    default (RFC 9110 15.3.5), and a stored one would hide the messages that arrive later."""
    del response["Content-Type"]
    for name, value in NO_CACHE_HEADERS:
        response[name] = value
    return response


class MessageServletRootView(MessageServletView):
    """`/api/message?destination=...`: the same servlet, left out of the schema (one path is enough)."""

    schema = None
