"""The JSON protocol at /ws/v1: one JSON object per WebSocket message, `type` says what it is.

Requests (each may carry `id`; the answer to a request with an id is `{"type": "ok", "id": ...}`):
`connect`, `subscribe`, `unsubscribe`, `send`, `ack`, `nack`, `begin`, `commit`, `abort`. The server
pushes `message` objects and answers problems with `{"type": "error", "code", "message", "id"}`; a request
error leaves the connection open, a failed `connect`, a lost subscription or the broker's store (Redis)
becoming unreachable (`broker_unavailable`) closes it. docs/websocket.md
describes every field.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from broker_core import scheduler
from broker_core.destinations import Destination, parse_composite
from broker_core.errors import BrokerError, ConnectionRegistryFull
from broker_core.maintenance import AbortNotice
from broker_core.messages import Delivery, Message
from broker_core.model import Consumer
from gateway import metrics
from gateway import unavailable as store
from gateway.api import json_input
from gateway.api.codec import parse_envelope, render_delivery
from gateway.api.errors import Problem
from gateway.logins import LoginRefused
from gateway.ws import auth
from gateway.ws.link import LinkError, SlowClient, Subscription
from gateway.ws.session import LinkedSession

logger = logging.getLogger(__name__)

ACK_MODES = ("auto", "client", "client-individual")
MAX_REQUEST_BYTES = 16 * 1024 * 1024
MAX_BATCH = 1000
# The REST consumer's options (gateway/api/serializers.ConsumerCreateSerializer) but the lease, which is
# the connection's; prefetch must be at least 1 since the socket is pushed to.
_CONSUMER_OPTIONS = {"prefetch": int, "priority": int, "exclusive": bool, "selector": str, "no_local": bool,
                     "client_id": str, "subscription_name": str, "retroactive": bool}
DEFAULT_ACK_MODE = "client-individual"  # the REST consumer's default
ANSWERED: Any = object()  # a handler that sent its own answer returns this


class RequestError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _field(request: dict[str, Any], name: str, kind: type | tuple[type, ...], required: bool = False,
           default: Any = None) -> Any:
    value = request.get(name, default)
    if value is None:
        if required:
            raise RequestError("invalid_request", f"{request.get('type')} needs {name!r}")
        return default
    if isinstance(value, bool) and kind in (int, float):
        raise RequestError("invalid_request", f"{name!r} must be {kind.__name__}, got a boolean")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise RequestError("invalid_request", f"{name!r} must be {names}, got {type(value).__name__}")
    return value


def _destinations(text: Any, subscribe: bool = False) -> list[Destination]:
    """`subscribe`: wildcards (`topic://orders.>`) are accepted, for broker_core to subscribe to or refuse."""
    if not isinstance(text, str):
        raise RequestError("invalid_request", "'destination' must be a string like 'queue://orders'")
    try:
        return parse_composite(text, allow_wildcards=subscribe)
    except BrokerError as exc:
        raise RequestError(exc.code, exc.message) from None


def message_object(sub: Subscription, delivery: Delivery) -> dict[str, Any]:
    """A pushed message: the REST API's Delivery object under `message`."""
    return {"type": "message", "subscription": sub.key, "message": render_delivery(delivery)}


class JsonSession(LinkedSession):
    protocol = "json"

    async def start(self) -> None:
        self.open_buffer(coalesce=False)
        if self.session_user is not None and getattr(self.session_user, "is_authenticated", False):
            try:
                await self.open_link(self.session_user)
                await self._connected()
            except store.STORE_ERRORS as exc:
                await self.error(store.CODE, store.explain(exc) + "; reconnect to go on", fatal=True)

    async def emit(self, obj: dict[str, Any], force: bool = False) -> None:
        assert self.buffer is not None
        await self.buffer.put(json.dumps(obj, separators=(",", ":")), force=force)

    async def deliver(self, sub: Subscription, consumer: Consumer, deliveries: list[Delivery]) -> None:
        assert self.link is not None
        for delivery in deliveries:
            if sub.ack_mode != "auto":
                self.link.track(sub, consumer, delivery)
            await self.emit(message_object(sub, delivery))

    async def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        try:
            await self._request(data)
        except SlowClient as exc:  # (an answer written outside `_request`'s own handler: a refusal's error)
            await self.shutdown(str(exc))

    async def _request(self, data: bytes) -> None:
        """One request: its answer, or the error that names what is wrong with it."""
        request_id = None
        label, outcome = "invalid", "error"  # the metrics' command label: a known type, else few values
        try:
            if len(data) > MAX_REQUEST_BYTES:
                raise RequestError("too_large", f"a request may be at most {MAX_REQUEST_BYTES} bytes")
            try:
                request = json_input.loads(data)
            except json_input.InvalidJSON as exc:
                raise RequestError("invalid_json", f"not a JSON object: {exc}") from None
            if not isinstance(request, dict):
                raise RequestError("invalid_json", "each message must be one JSON object")
            request_id = request.get("id")
            kind = request.get("type")
            label = kind if kind in _REQUESTS else "unknown"
            handler = getattr(self, f"on_{kind}", None) if kind in _REQUESTS else None
            if handler is None:
                raise RequestError("unknown_type", f"unknown request type {kind!r}; expected one of "
                                                   f"{', '.join(sorted(_REQUESTS))}")
            if kind != "connect" and self.link is None:
                raise RequestError("not_connected", "send a connect request first (or log in to the console)")
            result = await handler(request)
            outcome = "ok"
            if request_id is not None and result is not ANSWERED and not self.closing:
                await self.emit({"type": "ok", "id": request_id, **(result or {})})
        except RequestError as exc:
            await self.error(exc.code, exc.message, request_id)
        except LinkError as exc:
            await self.error(exc.code, exc.detail, request_id)
        except BrokerError as exc:
            await self.error(exc.code, exc.message, request_id)
        except Problem as exc:
            await self.error(exc.problem_code, str(exc.detail), request_id)
        except store.STORE_ERRORS as exc:  # the connection's consumers cannot go on either: it ends
            logger.warning("JSON WebSocket connection ends: Redis unavailable (%s)", exc)
            await self.error(store.CODE, store.explain(exc) + "; reconnect to go on", request_id, fatal=True)
        except Exception as exc:
            outcome = "internal_error"
            logger.exception("JSON request failed")
            await self.error("internal_error", str(exc), request_id)
        finally:
            metrics.frame("json", label, outcome)

    async def error(self, code: str, message: str, request_id: Any = None, fatal: bool = False) -> None:
        obj = {"type": "error", "code": code, "message": message}
        if request_id is not None:
            obj["id"] = request_id
        await self.emit(obj, force=fatal)
        if fatal:
            await self.shutdown(message)

    async def close_by_operator(self, reason: str) -> None:
        """The console's Close: a `connection_closed` error, then the close (unacked messages go back)."""
        if not self.closing:
            await self.error("connection_closed", f"an administrator closed this connection: {reason}",
                             fatal=True)

    async def _lost(self, reason: str, unavailable: bool = False) -> None:
        if not self.closing:
            await self.error(store.CODE if unavailable else "connection_lost", reason, fatal=True)

    async def _aborted(self, sub: Subscription, notice: AbortNotice) -> None:
        """A slow-consumer strategy or an operator aborted the subscription (spec §8.4): the link already
        closed it (its unacked messages went back). The client gets a `subscription_aborted` event; with
        abortConnection it is followed by a `consumer_aborted` error and the connection closes."""
        if self.closing:
            return
        await self.emit({"type": "subscription_aborted", "subscription": sub.key,
                         "destination": ",".join(d.uri for d in sub.destinations), "reason": notice.reason,
                         "strategy": notice.strategy, "abort_connection": notice.abort_connection},
                        force=notice.abort_connection)
        if notice.abort_connection:
            await self.error("consumer_aborted", notice.reason, fatal=True)

    # -- requests -------------------------------------------------------------------------------------

    async def on_connect(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.link is not None:
            raise RequestError("already_connected", "this connection is already authenticated")
        login = _field(request, "login", str)
        passcode = _field(request, "passcode", str) or _field(request, "token", str)
        try:
            user = await auth.authenticate(login, passcode, self.session_user, self.client_host)
        except LoginRefused as exc:
            await self.error("login_refused", exc.message, request.get("id"), fatal=True)
            return {}
        if user is None:
            await self.error("authentication_failed", f"User name [{login or ''}] or password is invalid.",
                             request.get("id"), fatal=True)
            return {}
        link = await self.open_link(user)
        if not await self._connected(request.get("id")):
            return {}
        return {"connection": link.connection_id, "user": auth.username(user)}

    async def _connected(self, request_id: Any = None) -> bool:
        """ActiveMQ.Advisory.Connection and the connection registry; a full registry ends the connection
        (its error names SIGNALBOX_CONNECTION_REGISTRY_LIMIT)."""
        try:
            await self.connected()
        except ConnectionRegistryFull as exc:
            await self.error(exc.code, exc.message, request_id, fatal=True)
            return False
        self.established = True
        return True

    async def _authorize(self, destinations: list[Destination], action: str) -> None:
        refusal = await self.refusal(destinations, action)
        if refusal is not None:
            raise self.refused(refusal)

    def refused(self, refusal: str) -> Exception:
        return RequestError("permission_denied", refusal)

    def _subscription(self, request: dict[str, Any]) -> Subscription:
        assert self.link is not None
        key = _field(request, "subscription", str, required=True)
        sub = self.link.subscriptions.get(key)
        if sub is None:
            raise RequestError("unknown_subscription", f"no subscription {key!r} on this connection (or the "
                                                       "broker aborted it: see subscription_aborted)")
        return sub

    async def on_subscribe(self, request: dict[str, Any]) -> Any:
        assert self.link is not None
        key = _field(request, "subscription", str, required=True)
        destinations = _destinations(request.get("destination"), subscribe=True)
        ack_mode = _field(request, "ack_mode", str, default=DEFAULT_ACK_MODE)
        if ack_mode not in ACK_MODES:
            raise RequestError("invalid_consumer", f"ack_mode must be one of {', '.join(ACK_MODES)}")
        options = {name: _field(request, name, kind) for name, kind in _CONSUMER_OPTIONS.items()}
        options = {k: v for k, v in options.items() if v is not None}
        if "prefetch" in options and options["prefetch"] < 1:
            raise RequestError("invalid_consumer", "prefetch must be 1..32767 on a WebSocket (messages are "
                                                   "pushed; there is no pull)")
        if "subscription_name" in options:
            if any(not d.is_topic for d in destinations):
                raise RequestError("invalid_consumer", "a durable subscription (subscription_name) is for "
                                                       "topics only")
            if not options.get("client_id"):
                raise RequestError("invalid_consumer", "a durable subscription needs 'client_id' with "
                                                       "'subscription_name'")
        await self._authorize(destinations, "read")
        spec = self.link.spec(ack_mode=ack_mode, **options)
        sub = await self.link.subscribe(key, destinations, spec, start=False)
        self.note_subscription(sub, spec.selector, sub.consumers[0].prefetch)  # the connection registry
        if request.get("id") is not None:  # the answer goes before the first message
            await self.emit({"type": "ok", "id": request["id"], "subscription": key,
                             "prefetch": sub.consumers[0].prefetch})
        self.link.start(sub)
        return ANSWERED

    async def on_unsubscribe(self, request: dict[str, Any]) -> dict[str, Any]:
        """Close a subscription (`subscription`), or remove a durable one with its messages
        (`subscription_name` + `client_id`, optional `destination`; this connection's subscription holding
        it ends first)."""
        assert self.link is not None
        name = _field(request, "subscription_name", str)
        if name is None:
            await self.link.unsubscribe(_field(request, "subscription", str, required=True))
            return {}
        client_id = _field(request, "client_id", str, required=True)
        if request.get("destination") is not None:
            topics = _destinations(request["destination"], subscribe=True)
        else:
            topics = [await self.link.durable_topic(client_id, name)]
        if any(not t.is_topic for t in topics):
            raise RequestError("invalid_request", "durable subscriptions are on topics only")
        await self._authorize(topics, "read")
        removed = 0
        for topic in topics:
            removed += await self.link.unsubscribe_durable(client_id, name, topic)
        return {"removed": removed}

    @staticmethod
    def _ack_ids(request: dict[str, Any]) -> list[str]:
        """The ids to ack or nack: `message_id`, or a `message_ids` list, which the link checks whole (an
        id the subscription does not hold, or one listed twice, refuses it all, as the REST API's ack
        and nack are) and acknowledges in one broker call per consumer."""
        ids = request.get("message_ids")
        if ids is None:
            return [_field(request, "message_id", str, required=True)]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise RequestError("invalid_request", "'message_ids' must be a non-empty list of strings")
        return ids

    async def on_ack(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.link is not None
        sub = self._subscription(request)
        count = await self.link.ack(sub, self._ack_ids(request), _field(request, "transaction", str))
        return {"acknowledged": count}

    async def on_nack(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.link is not None
        sub = self._subscription(request)
        count = await self.link.nack(sub, self._ack_ids(request), _field(request, "transaction", str))
        return {"dead_lettered": count}

    async def on_send(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.link is not None
        destinations = _destinations(request.get("destination"))
        await self._authorize(destinations, "write")
        messages = self._messages(request)
        if scheduler.is_management_send(destinations):  # (each in turn; none is delivered)
            jobs = await self.manage_scheduler(destinations, messages, _field(request, "transaction", str))
            return {"message_ids": [], "jobs": jobs}
        name = _field(request, "transaction", str)
        tx = await self.link.transaction_for_send(name, messages, [d.uri for d in destinations]) \
            if name is not None else None
        ids: list[str] = []
        for dest in destinations:
            ids += await self.broker.send(dest, messages, tx=tx)
        self.note_send(destinations, len(messages))  # the connection registry's producer rows
        return {"message_ids": ids}

    def _messages(self, request: dict[str, Any]) -> list[Message]:
        """`message` (one REST envelope) or `messages` (a list of them), as the REST API takes them."""
        assert self.link is not None
        now = self.broker.clock.now_ms()
        user = auth.username(self.user)
        if "messages" in request:
            raw = request["messages"]
            if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_BATCH:
                raise RequestError("invalid_message", f"'messages' is a list of 1..{MAX_BATCH} envelopes")
            envelopes = list(enumerate(raw))
        else:
            envelopes = [(None, _field(request, "message", dict, required=True))]
        messages = [parse_envelope(item, now, index, user_id=user) for index, item in envelopes]
        for message in messages:
            message.connection_id = self.link.connection_id  # for no_local subscribers
        return messages

    async def on_begin(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.link is not None
        await self.link.begin(_field(request, "transaction", str, required=True))
        return {}

    async def on_commit(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.link is not None
        await self.link.commit(_field(request, "transaction", str, required=True))
        return {}

    async def on_abort(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.link is not None
        await self.link.abort(_field(request, "transaction", str, required=True))
        return {}


_REQUESTS = frozenset({"connect", "subscribe", "unsubscribe", "send", "ack", "nack", "begin", "commit",
                       "abort"})
