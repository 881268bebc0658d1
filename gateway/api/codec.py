"""JSON <-> broker_core messages: the message envelope a producer posts and the delivery a consumer
gets. Hand-written rather than a DRF serializer because it runs once per message on the hot path;
`serializers.py` describes the same shapes for the OpenAPI schema.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from typing import Any

from broker_core.messages import Delivery, Message, TypedValue
from gateway.api.errors import NotSupportedYet, Problem

ENVELOPE_FIELDS = frozenset({
    "body", "body_base64", "content_type", "priority", "persistent", "ttl", "expiration", "correlation_id",
    "reply_to", "type", "group_id", "group_seq", "properties", "delay", "period", "repeat", "cron",
})
MESSAGE_FIELDS = frozenset(f.name for f in dataclasses.fields(Message))
_PROPERTY_TYPES = ("string", "boolean", "int", "long", "double")


class InvalidEnvelope(Problem):
    def __init__(self, detail: str, field: str, index: int | None = None) -> None:
        where = f"messages[{index}].{field}" if index is not None else field
        super().__init__(400, "invalid_message", "Invalid message", f"{where}: {detail}", field=where)


def _int(value: Any, name: str, index: int | None, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidEnvelope(f"must be an integer {low}..{high}, got {value!r}", name, index)
    return value


def _text(value: Any, name: str, index: int | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidEnvelope(f"must be a string, got {type(value).__name__}", name, index)
    return value


def parse_properties(raw: Any, index: int | None = None) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidEnvelope("must be an object of name: value", "properties", index)
    properties: dict[str, Any] = {}
    for name, value in raw.items():
        if isinstance(value, dict):
            kind, inner = value.get("type"), value.get("value")
            if kind not in _PROPERTY_TYPES or set(value) != {"type", "value"}:
                raise InvalidEnvelope(
                    f"a typed property is {{\"type\": one of {', '.join(_PROPERTY_TYPES)}, \"value\": ...}}",
                    f"properties.{name}", index)
            properties[name] = TypedValue(kind, inner)
        elif value is None or isinstance(value, list):
            raise InvalidEnvelope("must be a string, number or boolean", f"properties.{name}", index)
        else:
            properties[name] = value
    return properties


def parse_envelope(data: Any, now_ms: int, index: int | None = None, *,
                   user_id: str | None = None) -> Message:
    """One message from its JSON envelope. Raises a 400 problem naming the field."""
    if not isinstance(data, dict):
        raise InvalidEnvelope("a message is a JSON object", "message", index)
    unknown = set(data) - ENVELOPE_FIELDS
    if unknown:
        raise InvalidEnvelope(f"unknown field; the envelope has {', '.join(sorted(ENVELOPE_FIELDS))}",
                              sorted(unknown)[0], index)
    if "body" in data and "body_base64" in data:
        raise InvalidEnvelope("give body (text) or body_base64 (bytes), not both", "body_base64", index)
    body: str | bytes = ""
    if data.get("body_base64") is not None:
        raw = _text(data["body_base64"], "body_base64", index) or ""
        try:
            body = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidEnvelope("is not valid base64", "body_base64", index) from None
    elif data.get("body") is not None:
        body = _text(data["body"], "body", index) or ""
    if data.get("ttl") is not None and data.get("expiration") is not None:
        raise InvalidEnvelope("give ttl (ms from now) or expiration (ms since the epoch), not both",
                              "expiration", index)
    expiration = 0
    if data.get("ttl") is not None:
        ttl = _int(data["ttl"], "ttl", index, 0, 2**53)
        expiration = now_ms + ttl if ttl else 0
    elif data.get("expiration") is not None:
        expiration = _int(data["expiration"], "expiration", index, 0, 2**53)
    persistent = data.get("persistent", True)
    if not isinstance(persistent, bool):
        raise InvalidEnvelope(f"must be true or false, got {persistent!r}", "persistent", index)
    fields: dict[str, Any] = {
        "body": body,
        "content_type": _text(data.get("content_type"), "content_type", index),
        "priority": _int(data.get("priority", 4), "priority", index, 0, 9),
        "persistent": persistent,
        "expiration": expiration,
        "correlation_id": _text(data.get("correlation_id"), "correlation_id", index),
        "reply_to": _text(data.get("reply_to"), "reply_to", index),
        "type": _text(data.get("type"), "type", index),
        "group_id": _text(data.get("group_id"), "group_id", index),
        "group_seq": _int(data.get("group_seq", 0), "group_seq", index, -(2**31), 2**31 - 1),
        "properties": parse_properties(data.get("properties"), index),
        "user_id": user_id,
    }
    if data.get("delay") is not None:
        if "delay_ms" not in MESSAGE_FIELDS:
            raise NotSupportedYet("scheduled delivery (delay) is not yet supported by the broker",
                                  field="delay")
        fields["delay_ms"] = _int(data["delay"], "delay", index, 0, 2**53)
    # ActiveMQ's AMQ_SCHEDULED_PERIOD / REPEAT / CRON (broker_core reads the expression: broker_core/cron.py).
    for name, field_name in (("period", "period_ms"), ("repeat", "repeat"), ("cron", "cron")):
        if data.get(name) is None:
            continue
        if field_name not in MESSAGE_FIELDS:
            raise NotSupportedYet(f"scheduled delivery ({name}) is not yet supported by the broker",
                                  field=name)
        fields[field_name] = data[name] if name == "cron" else _int(data[name], name, index, 0, 2**53)
    return Message(**fields)


def property_json(value: Any) -> Any:
    return value.value if isinstance(value, TypedValue) else value


def render_delivery(delivery: Delivery) -> dict[str, Any]:
    """A delivered message as JSON (the `Delivery` schema)."""
    properties = {name: property_json(v) for name, v in delivery.properties.items()}
    if delivery.group_first_for_consumer:
        properties["JMSXGroupFirstForConsumer"] = True
    out: dict[str, Any] = {
        "message_id": delivery.message_id,
        "destination": delivery.destination,
    }
    if isinstance(delivery.body, bytes):
        out["body"] = None
        out["body_base64"] = base64.b64encode(delivery.body).decode()
    else:
        out["body"] = delivery.body
    out.update({
        "content_type": delivery.content_type,
        "priority": delivery.priority,
        "persistent": delivery.persistent,
        "timestamp": delivery.timestamp,
        "expiration": delivery.expiration,
        "correlation_id": delivery.correlation_id,
        "reply_to": delivery.reply_to,
        "type": delivery.type,
        "group_id": delivery.group_id,
        "group_seq": delivery.group_seq,
        "properties": properties,
        "redelivered": delivery.redelivered,
        "delivery_count": delivery.delivery_count,
        "group_first_for_consumer": delivery.group_first_for_consumer,
    })
    return out


def render_message(browsed: Any) -> dict[str, Any]:
    """A stored message as an operator sees it (browse, detail): the delivery fields without the
    consumer's flag, plus `state` (pending, parked, inflight), in flight the `consumer_id`, and the
    `original_destination` (a dead letter's origin: where Retry sends it; None when not recorded)."""
    delivery = getattr(browsed, "message", browsed)
    out = render_delivery(delivery)
    out.pop("group_first_for_consumer", None)
    out["original_destination"] = delivery.original_destination or None
    out["properties"].pop("JMSXGroupFirstForConsumer", None)
    state = getattr(browsed, "state", None)
    out["state"] = state
    out["consumer_id"] = delivery.consumer_id or None if state == "inflight" else None
    return out
