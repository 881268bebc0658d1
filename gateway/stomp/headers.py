"""The STOMP header <-> broker_core message mapping, used by every STOMP session (WebSocket and TCP share
gateway/stomp/protocol.py): a SEND frame's headers to a `Message`'s fields (every other header a string
property), a `Delivery` to a MESSAGE frame's headers exactly as ActiveMQ's FrameTranslator writes them, and
ActiveMQ's STOMP destination names (`/queue/X`, composites) to and from broker destinations
(shared/spec/activemq-semantics.md Appendix A). A header the mapping refuses raises StompError, which the
session turns into an ERROR frame.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from typing import Any

from broker_core.broker import advisory
from broker_core.destinations import (
    TEMP_NAME,
    Destination,
    parse_destination,
    split_composite,
    temporary_name,
)
from broker_core.errors import BrokerError
from broker_core.messages import (
    SCHEDULE_PROPERTIES,
    SCHEDULED_JOB_ID,
    Delivery,
    Message,
    TypedValue,
    jms_priority,
)
from gateway.stomp import advisory_form
from gateway.stomp.frames import Frame

# Headers of a SEND frame that are not message properties (ActiveMQ strips or maps them).
NOT_PROPERTIES = frozenset({
    "destination", "transaction", "receipt", "content-length", "content-type", "message-id", "redelivered",
    "subscription", "JMSXUserID", "JMSXDeliveryCount", "persistent", "priority", "expires", "timestamp",
    "type", "correlation-id", "reply-to", "JMSXGroupID", "JMSXGroupSeq", "JMSRedelivered",
    "AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_PERIOD", "AMQ_SCHEDULED_REPEAT", "AMQ_SCHEDULED_CRON",
})
# SEND's numeric headers: (name, lowest, highest, the value without the header)
_NUMBER_HEADER_RANGES: tuple[tuple[str, int, int, int | None], ...] = (
    ("expires", -(2**63), 2**63 - 1, 0), ("timestamp", 0, 2**63 - 1, None),
    ("JMSXGroupSeq", -(2**31), 2**31 - 1, 0), ("priority", -(2**31), 2**31 - 1, 4),
    ("AMQ_SCHEDULED_DELAY", 0, 2**63 - 1, None), ("AMQ_SCHEDULED_PERIOD", 0, 2**63 - 1, None),
    ("AMQ_SCHEDULED_REPEAT", 0, 2**31 - 1, 0))
_NUMBER_HEADERS = frozenset(name for name, *_ in _NUMBER_HEADER_RANGES)
_NUMBER_DEFAULTS = tuple(default for *_, default in _NUMBER_HEADER_RANGES)
# SEND headers named after a JMS header field set that field, not a property, as ActiveMQ's
# setObjectProperty does with every header its translator left (so `JMSPriority:8` is priority 8, and wins
# over `priority`). JMSRedelivered and JMSXDeliveryCount, delivery state, are the broker's: left out.
_JMS_FIELD_HEADERS = frozenset({"JMSPriority", "JMSType", "JMSCorrelationID", "JMSDeliveryMode",
                                "JMSExpiration", "JMSReplyTo", "JMSTimestamp"})
ADVISORY_PREFIX = f"topic://{advisory.PREFIX}"
ADVISORY_BROKER_URL = "stomp://localhost"  # originBrokerURL: the broker, not this gateway's address


class StompError(Exception):
    """A frame the session refuses: `message` for the ERROR header, `detail` for its body. `fatal`: the
    connection closes after the ERROR (ActiveMQ's fatal ProtocolException); otherwise it goes on."""

    def __init__(self, message: str, detail: str = "", headers: tuple[tuple[str, str], ...] = (),
                 fatal: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or message
        self.headers = headers
        self.fatal = fatal



def java_bool(value: str | None) -> bool:
    """Boolean.parseBoolean: 'true' in any case is true, everything else false."""
    return value is not None and value.strip().lower() == "true"



# An integer header as Java's Integer.parseInt / Long.parseLong read it (ActiveMQ's FrameTranslator): an
# optional sign and ASCII digits, nothing around them. Python's int() takes more (' 5', '1_0', Arabic-Indic
# digits) that ActiveMQ refuses; a STOMP 1.0 value has been trimmed by the frame parser already.
_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+")


def int_value(value: str | None, name: str, low: int, high: int, default: int | None = None) -> int | None:
    if value is None:
        return default
    if _JAVA_INTEGER.fullmatch(value) is None:
        raise StompError(f"Invalid {name} header", f"{name} must be an integer, got {value[:64]!r}")
    number = int(value)
    if not low <= number <= high:
        raise StompError(f"Invalid {name} header", f"{name} must be {low}..{high}, got {number}")
    return number



TEMP_PREFIXES = ("/temp-queue/", "/temp-topic/")
REMOTE_TEMP_PREFIXES = ("/remote-temp-queue/", "/remote-temp-topic/")
TEMP_LIMIT_SETTING = "SIGNALBOX_TEMP_DESTINATION_LIMIT"


class TempDestinations:
    """One connection's temporary destinations, as ActiveMQ's ProtocolConverter keeps them
    (createTempDestination): `/temp-queue/<name>` and `/temp-topic/<name>` each stand for one temporary
    queue or topic of this connection, made on first use (`resolve`; the session creates what `new` holds
    before using it) and named ActiveMQ's way, `ID:<connection id>:<n>` (broker_core.destinations
    TEMP_NAME). MESSAGE frames show this connection its own by the name it gave (`own`), other
    connections as `/remote-temp-queue/<id>` (stomp_name). At most `limit` per connection."""

    def __init__(self, connection_id: str, limit: int) -> None:
        self.connection_id = connection_id
        self.limit = limit
        self.by_name: dict[str, Destination] = {}
        self.own: dict[str, str] = {}  # destination uri -> the STOMP name this connection gave it
        self.new: list[Destination] = []  # resolved, not created yet
        self._number = 0

    def resolve(self, name: str) -> Destination:
        dest = self.by_name.get(name)
        if dest is not None:
            return dest
        kind: Any = "topic" if name.startswith("/temp-topic/") else "queue"
        if len(name) <= len(f"/temp-{kind}/"):
            raise StompError("Invalid destination", f"{name!r} names no temporary destination: "
                             f"/temp-{kind}/<name>")
        if len(self.by_name) >= self.limit:
            raise StompError(f"Too many temporary destinations: this connection holds {self.limit} "
                             f"({TEMP_LIMIT_SETTING})",
                             f"{name}: a connection may create at most {self.limit} temporary destinations "
                             f"({TEMP_LIMIT_SETTING}); they are deleted when the connection ends")
        self._number += 1
        dest = Destination(kind, temporary_name(self.connection_id, self._number))
        self.by_name[name] = dest
        self.own[dest.uri] = name
        self.new.append(dest)
        return dest

    def name_of(self, uri: str | None) -> str | None:
        """A destination uri as this connection's MESSAGE frames name it."""
        if uri is None:
            return None
        return self.own.get(uri) or stomp_name(uri)


def stomp_destinations(text: str | None, subscribe: bool = False, command: str = "",
                       temps: TempDestinations | None = None) -> list[Destination]:
    """`/queue/A` or a composite `/queue/A,/queue/B` as broker destinations (ActiveMQ's STOMP names).
    `subscribe`: wildcards (`/topic/orders.>`) are accepted, for broker_core to subscribe to or refuse.
    `temps`: the connection's temporary destinations, which `/temp-queue/<name>` resolves in.
    The errors are ActiveMQ's texts: a SEND without the header, any frame with an empty one."""
    if text is None and command == "SEND":
        raise StompError("SEND received without a Destination specified!",
                         "SEND needs a destination header, such as destination:/queue/orders")
    if text is None or not text.strip():
        raise StompError("Invalid empty or 'null' Destination header",
                         f"{command or 'this frame'} needs a destination header, such as /queue/orders")
    if "/temp-" in text:  # (a connection's own names: not cached across connections)
        return _parse_parts(text, subscribe, temps)
    return list(_parse_stomp_destinations(text, subscribe))


@functools.lru_cache(maxsize=4096)
def _parse_stomp_destinations(text: str, wildcards: bool = False) -> tuple[Destination, ...]:
    # Cached: a connection sends to the same few destinations, and validating a name looks at each
    # character (errors are not cached: lru_cache does not keep exceptions).
    return tuple(_parse_parts(text, wildcards, None))


def _parse_parts(text: str, wildcards: bool, temps: TempDestinations | None) -> list[Destination]:
    result: list[Destination] = []
    for part in (p.strip() for p in text.split(",")):
        kind = next((k for k in ("queue", "topic") if part.startswith(f"/{k}/")), None)
        if part.startswith(TEMP_PREFIXES):
            if temps is None:
                raise StompError("Invalid destination", f"{part}: a temporary destination needs a connection")
            dest = temps.resolve(part)
        elif part.startswith(REMOTE_TEMP_PREFIXES):
            # ActiveMQ's name for another connection's temporary destination (LegacyFrameTranslator)
            qualifier = "temp-topic" if part.startswith("/remote-temp-topic/") else "temp-queue"
            try:
                dest = parse_destination(f"{qualifier}://" + part[len(qualifier) + 9:])
            except BrokerError as exc:
                raise StompError("Invalid destination", exc.message) from None
        elif kind is not None:
            try:
                dest = parse_destination(f"{kind}://" + part[len(kind) + 2:], allow_wildcards=wildcards)
            except BrokerError as exc:
                raise StompError("Invalid destination", exc.message) from None
        else:
            # ActiveMQ's fallback (spec Appendix A): any other name is a queue of that literal name, so
            # `bare` is /queue/bare and `/foo/bar` is the queue "/foo/bar" (/queue//foo/bar in MESSAGEs)
            try:
                dest = parse_destination("queue://" + part)
            except BrokerError as exc:
                raise StompError("Invalid destination", exc.message) from None
        if dest.is_temporary and not part.startswith(TEMP_PREFIXES + REMOTE_TEMP_PREFIXES):
            # the name scheme is the temporary destinations' own: /queue/ID:ws-… would pass by their checks
            raise StompError("Invalid destination", f"{part}: names of the form ID:<connection id>:<n> are "
                             "temporary destinations; name one as /remote-temp-queue/<id> (or -topic)")
        if dest not in result:
            result.append(dest)
    return result


@functools.lru_cache(maxsize=4096)
def stomp_name(uri: str | None) -> str | None:
    """queue://X -> /queue/X (anything else unchanged); a temporary destination as ActiveMQ shows another
    connection's, /remote-temp-queue/<id> (its own connection's: TempDestinations.name_of). A composite
    as ActiveMQ's STOMP writes it: the first part as a STOMP name, the others qualified
    (queue://a,b,topic://c -> /queue/a,queue://b,topic://c). Cached: every MESSAGE names its destination,
    and a connection's are few."""
    if uri is None:
        return None
    if "," in uri:
        with contextlib.suppress(BrokerError):
            parts = split_composite(uri)
            if parts:
                first, *rest = parts
                return ",".join([f"/{first.kind}/{first.name}", *(part.uri for part in rest)])
    for kind in ("queue", "topic"):
        if uri.startswith(f"{kind}://"):
            name = uri[len(kind) + 3:]
            if name.startswith("ID:") and TEMP_NAME.fullmatch(name):
                return f"/remote-temp-{kind}/{name}"
            return f"/{kind}/{name}"
    return uri


def _property_text(value: Any) -> str:
    if isinstance(value, TypedValue):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def is_advisory(delivery: Delivery) -> bool:
    """Whether a delivery is an advisory, written as ActiveMQ writes those (headers and body form)."""
    return delivery.type == "Advisory" and delivery.destination.startswith(ADVISORY_PREFIX)


def message_headers(delivery: Delivery, subscription_id: str | None, ack_id: str | None,
                    group_headers: bool, temps: TempDestinations | None = None,
                    advisory_transformation: str = advisory_form.JSON) -> list[tuple[str, str]]:
    """MESSAGE headers as ActiveMQ's FrameTranslator writes them, then the properties as strings; the
    group fields only when the subscriber asked for them (ActiveMQ never sends them over STOMP). `temps`:
    the receiving connection's temporary destinations, which it sees by its own names;
    `advisory_transformation`: the advisory body's form the subscription asked for (advisory_form)."""
    d = delivery
    if is_advisory(d):
        return _advisory_headers(d, subscription_id, ack_id, advisory_transformation)
    name = temps.name_of if temps is not None and temps.own else stomp_name
    headers = [("message-id", d.message_id), ("destination", name(d.destination) or "")]
    if d.correlation_id is not None:
        headers.append(("correlation-id", d.correlation_id))
    headers.append(("expires", str(d.expiration)))
    if d.redelivered:
        headers.append(("redelivered", "true"))
    headers.append(("priority", str(d.priority)))
    if d.reply_to is not None:
        headers.append(("reply-to", name(d.reply_to) or ""))
    headers.append(("timestamp", str(d.timestamp)))
    if d.type is not None:
        headers.append(("type", d.type))
    if d.user_id is not None:
        headers.append(("JMSXUserID", d.user_id))
    if d.original_destination is not None:
        headers.append(("original-destination", name(d.original_destination) or ""))
    if d.persistent:
        headers.append(("persistent", "true"))
    if subscription_id is not None:
        headers.append(("subscription", subscription_id))
    if ack_id is not None:
        headers.append(("ack", ack_id))
    if d.content_type is not None:
        headers.append(("content-type", d.content_type))
    headers += [(name, _property_text(value)) for name, value in d.properties.items()]
    if group_headers:
        headers += [("JMSXGroupID", d.group_id or ""), ("JMSXGroupSeq", str(d.group_seq)),
                    ("JMSXGroupFirstForConsumer", "true" if d.group_first_for_consumer else "false")]
    return headers


def _advisory_headers(d: Delivery, subscription_id: str | None, ack_id: str | None,
                      transformation: str) -> list[tuple[str, str]]:
    """An advisory as ActiveMQ's STOMP translator for advisory topics writes it: priority and timestamp
    0 (the advisory's own fields: ActiveMQ sets neither), `transformation` (`jms-advisory-json`, or
    `jms-advisory-xml` when the subscription asked for XML), the origin broker's id and URL, and no
    content-type; the body is Signalbox's document (docs/broker_core.md) in that form."""
    headers = [("message-id", d.message_id), ("destination", stomp_name(d.destination) or ""),
               ("expires", "0"), ("priority", "0"), ("timestamp", "0"), ("type", "Advisory"),
               ("transformation", transformation), ("originBrokerId", f"ID:{advisory.BROKER_NAME}"),
               ("originBrokerURL", ADVISORY_BROKER_URL)]
    if subscription_id is not None:
        headers.append(("subscription", subscription_id))
    if ack_id is not None:
        headers.append(("ack", ack_id))
    headers += [(name, _property_text(value)) for name, value in d.properties.items()]
    return headers


def _is_text(message_type: str | None, content_length: bool) -> bool:
    """Whether a SEND's body is text (ActiveMQ's TextMessage) or bytes: `amq-msg-type` says which, in any
    case ('text' or 'bytes'), and stays a property as in ActiveMQ; without it, a body with content-length
    is bytes. Any other type is refused, with ActiveMQ's text."""
    if message_type is None:
        return not content_length
    kind = message_type.lower()
    if kind not in ("text", "bytes"):
        raise StompError(f"Unsupported message type '{message_type}'",
                         f"amq-msg-type must be text or bytes, got {message_type[:64]!r}")
    return kind == "text"


def _jms_fields(headers: dict[str, str]) -> dict[str, Any]:
    """The Message fields that headers named after JMS fields set (_JMS_FIELD_HEADERS), converted as
    ActiveMQ converts a string property: numbers as Java reads them, JMSDeliveryMode a number (2 is
    persistent) or PERSISTENT / NON_PERSISTENT in any case, JMSReplyTo a destination name (queue unless
    it says topic://: `/queue/r` is the queue named `/queue/r`, as in ActiveMQ)."""
    fields: dict[str, Any] = {}
    get = headers.get
    if (value := get("JMSPriority")) is not None:
        fields["priority"] = jms_priority(int_value(value, "JMSPriority", -(2**31), 2**31 - 1) or 0)
    if (value := get("JMSExpiration")) is not None:
        fields["expiration"] = max(int_value(value, "JMSExpiration", -(2**63), 2**63 - 1) or 0, 0)
    if (value := get("JMSTimestamp")) is not None:
        fields["timestamp"] = int_value(value, "JMSTimestamp", 0, 2**63 - 1)
    if (value := get("JMSType")) is not None:
        fields["type"] = value
    if (value := get("JMSCorrelationID")) is not None:
        fields["correlation_id"] = value
    if (value := get("JMSDeliveryMode")) is not None:
        mode = value.upper()
        if mode in ("PERSISTENT", "NON_PERSISTENT"):
            fields["persistent"] = mode == "PERSISTENT"
        else:
            fields["persistent"] = int_value(value, "JMSDeliveryMode", -(2**31), 2**31 - 1) == 2
    if (value := get("JMSReplyTo")) is not None:
        try:
            fields["reply_to"] = parse_destination(value).uri
        except BrokerError as exc:
            raise StompError("Invalid JMSReplyTo header", f"JMSReplyTo: {exc.message}") from None
    return fields


def message_from_send(frame: Frame, connection_id: str | None = None,
                      temps: TempDestinations | None = None) -> Message:
    """A SEND frame as a message (ActiveMQ's copyStandardHeadersFromFrameToMessage): a body with
    content-length is bytes (ActiveMQ's BytesMessage), without it text; `persistent` only when 'true'.
    `temps`: the sender's temporary destinations (a reply-to of /temp-queue/<name> makes one)."""
    # One pass over the headers (the first of a repeated header wins, as STOMP says), then dict lookups:
    # this runs for every SEND.
    headers = frame.header_dict()
    get = headers.get
    body: str | bytes = frame.body
    if _is_text(get("amq-msg-type"), "content-length" in headers):
        try:
            body = frame.body.decode("utf-8")
        except UnicodeDecodeError:
            body = frame.body
    # The numeric headers, checked in _NUMBER_HEADER_RANGES's order (the first bad one is reported); the
    # scheduler's are ActiveMQ's ScheduledMessage (the broker parks the message, or repeats it): a delay or
    # period absent stays None, and one given, 0 included, makes the message a job (Message.delay_ms, the
    # broker's rule for every adapter). Most SENDs have none of them.
    # A message carrying a job's id is not scheduled again (SchedulerBroker.send asks for AMQ_SCHEDULED_ID;
    # Message.pack keeps its AMQ_SCHEDULED_* properties as they are): its schedule headers are properties.
    fired = SCHEDULED_JOB_ID in headers
    if _NUMBER_HEADERS.isdisjoint(headers):
        expires, timestamp, group_seq, priority, delay, period, repeat = _NUMBER_DEFAULTS
    else:
        expires, timestamp, group_seq, priority, delay, period, repeat = (
            int_value(None if fired and name in SCHEDULE_PROPERTIES else get(name), name, low, high, default)
            for name, low, high, default in _NUMBER_HEADER_RANGES)
    properties: dict[str, Any] = {name: value for name, value in headers.items()
                                  if name not in NOT_PROPERTIES or fired and name in SCHEDULE_PROPERTIES}
    # JMSReplyTo is a destination (queue://X, as selectors compare it) only when reply-to names a STOMP
    # queue or topic; anything else stays a string property, as ActiveMQ's translator leaves it
    # (ActiveMQ's translator makes a /temp-queue/ reply-to the connection's temporary queue, and takes a
    # /remote-temp-queue/ one as that temporary queue)
    reply_to = get("reply-to")
    if reply_to is not None and reply_to.startswith(TEMP_PREFIXES + REMOTE_TEMP_PREFIXES):
        try:
            reply_to = _parse_parts(reply_to, False, temps)[0].uri
        except StompError as exc:  # (the temporary destinations' limit keeps its own message)
            if exc.message != "Invalid destination":
                raise
            raise StompError("Invalid reply-to header", f"reply-to: {exc.detail}") from None
    elif reply_to is not None and not reply_to.startswith(("/queue/", "/topic/")):
        properties["reply-to"] = reply_to
        reply_to = None
    elif reply_to is not None:
        kind, _, name = reply_to[1:].partition("/")
        if not name:  # (ActiveMQ ends the connection: its translator's error is no ProtocolException)
            raise StompError("Invalid reply-to header",
                             f"reply-to {reply_to!r} names no {kind}: /{kind}/<name>")
        reply_to = f"{kind}://{name}"
    priority = jms_priority(priority) if priority is not None else 4
    persistent = get("persistent") == "true"  # ActiveMQ's "true".equals, so 'TRUE' is not
    expiration = max(expires or 0, 0)  # ActiveMQ's isExpired takes any value <= 0 as never
    correlation_id, jms_type = get("correlation-id"), get("type")
    if not _JMS_FIELD_HEADERS.isdisjoint(headers):  # (rare: one look for most SENDs)
        jms = _jms_fields(headers)
        for name in _JMS_FIELD_HEADERS:
            properties.pop(name, None)
        priority = jms.get("priority", priority)
        persistent = jms.get("persistent", persistent)
        expiration = jms.get("expiration", expiration)
        timestamp = jms.get("timestamp", timestamp)
        correlation_id = jms.get("correlation_id", correlation_id)
        jms_type = jms.get("type", jms_type)
        reply_to = jms.get("reply_to", reply_to)
    # Every field by position, in _MESSAGE_FIELDS's order: matching 17 keyword arguments to Message's 20
    # parameters took more instructions than the rest of building it (13 k against 5 k a SEND)
    return Message(
        body,  # body
        get("content-type"),  # content_type
        priority,  # priority
        persistent,  # persistent
        timestamp,  # timestamp
        expiration,  # expiration
        correlation_id,  # correlation_id
        reply_to,  # reply_to
        jms_type,  # type
        properties,  # properties
        get("JMSXGroupID"),  # group_id
        group_seq or 0,  # group_seq
        connection_id,  # connection_id
        None,  # user_id
        None,  # message_id
        None,  # original_destination
        delay,  # delay_ms
        period,  # period_ms
        repeat or 0,  # repeat
        None if fired else get("AMQ_SCHEDULED_CRON"),  # cron
    )


# The order message_from_send passes Message's fields in; a Message whose fields moved fails here, at import.
_MESSAGE_FIELDS = ("body", "content_type", "priority", "persistent", "timestamp", "expiration",
                   "correlation_id", "reply_to", "type", "properties", "group_id", "group_seq",
                   "connection_id", "user_id", "message_id", "original_destination", "delay_ms", "period_ms",
                   "repeat", "cron")
if tuple(f.name for f in dataclasses.fields(Message)) != _MESSAGE_FIELDS:
    raise ImportError("broker_core.messages.Message's fields changed: update message_from_send's order")

