"""Advisory topics (spec §11): ActiveMQ's names, and the advisory messages built from lifecycle events.

The scripts decide which events are advised (scripts/lua/includes/advisory.lua: the event types ActiveMQ
advises about, gated by the destination's policy flags as ActiveMQ gates them) and record each one in
the destination's forwarding hash (its outbox) in the same atomic step as the event; ops/forward.py then
calls `build` and publishes the result on the advisory topic, which is an ordinary topic: subscribe to it
like any other. An advisory is only recorded while its topic exists (someone has subscribed to it), since a
topic message without subscriptions is dropped anyway.

Two advisories are not JSON documents about an event: NoConsumer (`sendAdvisoryIfNoConsumers`) is the
message itself, recorded by the send scripts (`no_consumer_copy`), and Connection advisories come from the
gateway's sessions (`connection_changed`). Those with no destination whose outbox could hold them (a
connection's, a deleted destination's) are recorded in the advisory topic's own outbox and delivered from
there like the others, so a process that dies in between leaves the record to maintenance.

The topics, the events they come from, their properties and their policy gates are listed in
docs/broker_core.md (Advisory topics).

`<T>` is `Queue` or `Topic`, for a temporary queue or topic too (ActiveMQTempQueue.isQueue(): its consumers'
advisories are on ActiveMQ.Advisory.Consumer.Queue.ID:…), except that a temporary destination's creation
and deletion are advised on ActiveMQ.Advisory.TempQueue / .TempTopic (`destination_topic`), and advisories
name it by its qualified uri, `temp-queue://ID:…`.

ActiveMQ's advisory carries a data structure (ConsumerInfo, RemoveInfo, the message copy); Signalbox
sends it as a JSON text body (`{"ConsumerInfo": {...}}`, `{"message": {...}}`), the form ActiveMQ gives
STOMP clients that ask for JSON. A message copy has no body unless the policy's
`includeBodyForAdvisory`. Advisory messages are non-persistent, of JMSType `Advisory`, and are never
generated about advisory topics.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from typing import Any

import msgpack

from ..destinations import Destination, matches, parse_destination
from ..effects import Command, Forward, Op
from ..keys import due_key, wildcards_key
from ..messages import Message, TypedValue, forward_copy, unpack_delivery
from ..resp import reply_text as _str
from .context import Context

PREFIX = "ActiveMQ.Advisory."
# ActiveMQ's brokerName: the advisories' originBrokerName, the STOMP frames' originBrokerId, the client-id
# refusal's text. Read from the environment (not Django's settings) because every process that runs a script
# may build an advisory: the web and STOMP processes, the worker, beat, each started by `run` with its own.
BROKER_NAME = os.environ.get("SIGNALBOX_BROKER_NAME") or "localhost"
KINDS = ("Consumer", "Expired", "MessageDLQd", "SlowConsumer", "FULL", "FastProducer", "MessageDiscarded",
         "MessageDelivered", "MessageConsumed", "MessageDispatched", "NoConsumer")


def is_advisory(destination: str | Destination) -> bool:
    dest = destination if isinstance(destination, Destination) else parse_destination(destination)
    return dest.is_topic and dest.name.startswith(PREFIX)


def topic(kind: str, destination: str | Destination) -> Destination:
    """The advisory topic of `kind` (one of KINDS) about `destination`, e.g.
    topic("Consumer", "queue://orders") -> topic://ActiveMQ.Advisory.Consumer.Queue.orders."""
    if kind not in KINDS:
        raise ValueError(f"unknown advisory kind {kind!r}; one of {', '.join(KINDS)}")
    dest = destination if isinstance(destination, Destination) else parse_destination(destination)
    return Destination("topic", f"{PREFIX}{kind}.{'Topic' if dest.is_topic else 'Queue'}.{dest.name}")


# ActiveMQ.Advisory.Connection: connections opened (ConnectionInfo) and closed (RemoveInfo).
CONNECTION_TOPIC = Destination("topic", f"{PREFIX}Connection")


def destination_topic(destination: Destination) -> Destination:
    """ActiveMQ.Advisory.Queue or ActiveMQ.Advisory.Topic: destinations created and removed; a temporary
    one's on ActiveMQ.Advisory.TempQueue or ActiveMQ.Advisory.TempTopic instead
    (AdvisorySupport.getDestinationAdvisoryTopic: one topic per destination type)."""
    return Destination("topic", PREFIX + DESTINATION_TOPICS[destination.kind, destination.is_temporary])


# The destination-advisory topic's name after PREFIX, by (kind, temporary).
DESTINATION_TOPICS = {("queue", False): "Queue", ("topic", False): "Topic",
                      ("queue", True): "TempQueue", ("topic", True): "TempTopic"}


def advisable(ops: Context, topic: Destination) -> Op:
    """Whether an advisory for `topic` is worth publishing: the topic exists, or a wildcard subscription's
    pattern matches it (the Python side of includes/advisory.lua's check)."""
    if (yield Command(("EXISTS", f"{ops.prefix(topic)}:meta"))):
        return True
    patterns = yield Command(("SMEMBERS", wildcards_key(ops.namespace)))
    return any(matches(Destination("topic", _str(p)), topic) for p in patterns)


def destination_changed(ops: Context, dest: Destination, now: int, added: bool) -> Op:
    """The DestinationInfo advisory for a destination just created (`added`) or deleted, if anybody
    subscribed to it. A creation's advisory goes through the new destination's outbox like the others; a
    deletion's through the advisory topic's own, since the destination and its outbox are gone."""
    if is_advisory(dest):
        return
    topic = destination_topic(dest)
    if not (yield from advisable(ops, topic)):  # exists, or a wildcard subscription matches
        return
    advisory_id = f"ID:advisory:{dest.tag}:{'add' if added else 'remove'}:{uuid.uuid4().hex[:12]}"
    kind = "destination_add" if added else "destination_remove"
    event = msgpack.packb({"advisory": "Destination", "type": kind, "uri": dest.uri, "fields": {}, "ts": now})
    if not added:
        yield from ops.ensure(topic, now)  # listed in the maintenance index, so a record left there is found
    yield from record(ops, dest if added else topic, topic, advisory_id, event, now)


def record(ops: Context, outbox: Destination, topic: Destination, advisory_id: str, packed_event: bytes,
           now: int) -> Op:
    """Write the advisory for `packed_event` as a record in `outbox`'s forwarding hash and have it delivered
    to `topic` (`Forward`). One HSET: a process that dies after it leaves the record for maintenance (or the
    next forward there), which builds and publishes it then, exactly once (ops/forward.py). As the scripts
    do when they record one (includes/forward.lua), the outbox's entry in the maintenance index is brought
    forward first, so the tick looks there should this process die before delivering."""
    yield Command(("ZADD", due_key(ops.namespace), "LT", now, ops.prefix(outbox)))
    yield Command(("HSET", f"{ops.prefix(outbox)}:fwd", f"{advisory_id}|{topic.uri}",
                   msgpack.packb([topic.uri, "advisory", packed_event, b"", 0])))
    yield Forward(outbox, now)


def connection_changed(ops: Context, info: dict[str, str], now: int, added: bool) -> Op:
    """ActiveMQ.Advisory.Connection (AdvisoryBroker.addConnection / removeConnection): a ConnectionInfo
    when a connection is established, a RemoveInfo when it ends, if anybody subscribed to the topic.
    `info`: `connection` (its id), and for an added one `client` (client id), `user`, `address`,
    `protocol`; for a removed one `reason`. A connection is not a destination, so the record goes to the
    advisory topic's own outbox (`record`)."""
    if not (yield from advisable(ops, CONNECTION_TOPIC)):
        return
    number = yield Command(("INCR", f"{ops.namespace}:advseq"))  # broker-wide, as advisory.lua's ids
    advisory_id = f"ID:advisory:connection:{number}"
    kind = "connection_add" if added else "connection_remove"
    event = msgpack.packb({"advisory": "Connection", "type": kind, "uri": "",
                           "fields": {k: v for k, v in info.items() if v is not None}, "ts": now})
    yield from ops.ensure(CONNECTION_TOPIC, now)  # in the maintenance index: a record left there is found
    yield from record(ops, CONNECTION_TOPIC, CONNECTION_TOPIC, advisory_id, event, now)


def _message_json(message_id: str, source: str, blob: bytes, include_body: bool) -> dict[str, Any]:
    """The message copy an advisory carries, as JSON (no body unless includeBodyForAdvisory)."""
    if not blob:
        return {"messageId": message_id, "destination": source}
    d = unpack_delivery(message_id, source, "", blob, 0, False)
    props = {k: (v.value if isinstance(v, TypedValue) else v) for k, v in d.properties.items()}
    out: dict[str, Any] = {
        "messageId": message_id, "destination": source, "priority": d.priority, "persistent": d.persistent,
        "timestamp": d.timestamp, "expiration": d.expiration, "correlationId": d.correlation_id,
        "type": d.type, "groupId": d.group_id, "groupSeq": d.group_seq,
        "originalDestination": d.original_destination, "properties": props,
    }
    if include_body:
        out["body"] = d.body if isinstance(d.body, str) else base64.b64encode(d.body).decode()
        out["bodyEncoding"] = "text" if isinstance(d.body, str) else "base64"
    return out


def no_consumer_copy(blob: bytes, source: str) -> bytes:
    """The NoConsumer advisory (BaseDestination.onMessageWithNoConsumers): the message itself, same id,
    body and properties, no advisory properties. ActiveMQ sets the copy's original destination to the
    destination it was sent to only when it already had one (a message routed before, e.g. by a
    virtual destination), and leaves it unset otherwise. It is sent when the message reaches the
    destination: a repeating message's firing (lifecycle.lua fire_scheduled), a delayed message once due
    (scheduled_arrived), each leaves without its schedule, as the message ActiveMQ's scheduler re-sends
    does (messages.forward_copy): a target would schedule it again."""
    record = msgpack.unpackb(blob, raw=True)
    return forward_copy(blob, source if len(record) > 16 and record[16] else "", arrived=True)


def build(advisory_id: str, packed_event: bytes, blob: bytes, now: int) -> bytes:
    """The packed advisory message for an event the scripts recorded (see the module docstring)."""
    event = msgpack.unpackb(packed_event, raw=False)
    kind, source, fields = event["advisory"], event["uri"], event.get("fields") or {}
    if kind == "NoConsumer":
        return no_consumer_copy(blob, source)
    if isinstance(fields, list):  # an empty Lua table packs as an array
        fields = {}
    if source:  # a temporary destination by ActiveMQ's qualified name, temp-queue://ID:… (its type's)
        source = parse_destination(source, allow_wildcards=True).qualified_uri
    include_body = bool(event.get("body"))
    props: dict[str, Any] = {"originBrokerName": BROKER_NAME}
    msg_id = fields.get("msg")
    if kind == "Destination":
        body = {"DestinationInfo": {"destination": source, "operationType":
                                    0 if event["type"] == "destination_add" else 1}}
    elif kind == "Connection":
        if event["type"] == "connection_add":  # the password is never sent (ActiveMQ blanks it)
            body = {"ConnectionInfo": {"connectionId": fields.get("connection"),
                                       "clientId": fields.get("client") or None,
                                       "userName": fields.get("user") or None, "password": "",
                                       "clientIp": fields.get("address") or None,
                                       "protocol": fields.get("protocol") or None}}
        else:
            body = {"RemoveInfo": {"objectId": fields.get("connection"),
                                   "reason": fields.get("reason") or None}}
    elif kind == "Consumer":
        props["consumerCount"] = TypedValue("int", int(event.get("count", 0)))
        if event["type"] == "consumer_add":
            info = {"consumerId": fields.get("consumer"), "destination": source,
                    "prefetchSize": _int(fields.get("prefetch")), "priority": _int(fields.get("priority")),
                    "exclusive": fields.get("exclusive") in ("1", "true"),
                    "selector": fields.get("selector") or None,
                    # a queue browser (ActiveMQ's ConsumerInfo.browser): Broker.open_browser
                    "browser": fields.get("browser") == "1"}
            body: dict[str, Any] = {"ConsumerInfo": info}
        else:
            body = {"RemoveInfo": {"objectId": fields.get("consumer"), "destination": source,
                                   "reason": fields.get("reason")}}
    elif kind == "SlowConsumer":
        props["consumerId"] = fields.get("consumer", "")
        body = {"ConsumerInfo": {"consumerId": fields.get("consumer"), "destination": source}}
    elif kind == "FULL":
        # AdvisoryBroker.isFull gets the destination's own child usage, also when its parent (the broker's
        # limit) is the full one: name it and count its bytes; the body says which limit refused.
        usage = f"{source}:memory"
        props["usageName"] = usage
        props["usageCount"] = TypedValue("long", _int(fields.get("mem", fields.get("used"))))
        body = {"usage": {"name": usage, "used": _int(fields.get("used")), "limit": _int(fields.get("limit")),
                          "need": _int(fields.get("need")), "scope": fields.get("scope")}}
    elif kind == "FastProducer":
        props["producerId"] = ""  # producers are not tracked by broker_core
        body = {"ProducerInfo": {"destination": source}}
    else:  # a message event: the advisory carries a copy of the message
        props["orignalMessageId"] = msg_id or ""
        if kind in ("MessageDiscarded", "MessageDelivered", "MessageConsumed", "MessageDispatched"):
            props["orignalDestination"] = source
        consumer_id = fields.get("consumer") or fields.get("sub")  # the scripts name the consumer
        if kind in ("MessageDiscarded", "MessageDispatched", "MessageConsumed") and consumer_id:
            props["consumerId"] = consumer_id
        if kind == "MessageDLQd":
            props = {"originBrokerName": BROKER_NAME}  # ActiveMQ adds nothing else to this one
        body = {"message": _message_json(msg_id or "", source, blob, include_body)}
    body["event"] = {"type": event["type"], "time": event.get("ts"), **fields}
    message = Message(body=json.dumps(body, separators=(",", ":")), content_type="application/json",
                      type="Advisory", persistent=False, message_id=advisory_id, properties=props,
                      timestamp=int(event.get("ts") or now))
    return message.pack(now)[1]


def _int(value: Any) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return 0
