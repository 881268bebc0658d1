"""Run a selector against one message inside Redis (scripts/lua/selector_match.lua): the console's "test
this selector" and the tests use it, so they exercise the very Lua the dispatch scripts run."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from ..errors import BrokerError
from ..scripts.calls import SelectorMatch
from ..scripts.library import script
from .compiled import parse_selector

ERROR_PREFIX = "SELECTOR_ERROR "
TYPE_CODES = {"string": "s", "boolean": "b", "byte": "y", "short": "h", "int": "i", "long": "l",
              "float": "f", "double": "d"}
_CODES = frozenset(TYPE_CODES.values())
EXACT_DOUBLE = 2**53


class SelectorEvaluationError(BrokerError):
    """A selector failed while evaluating (ActiveMQ throws here, e.g. `'a' * 2`): it does not match."""

    code = "selector_evaluation_error"


def _number(value: int | float) -> int | float | str:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, int) and abs(value) > EXACT_DOUBLE:
        return str(value)  # Lua keeps longs beyond 2^53 exact as decimal strings
    return value


def _property(name: str, value: Any) -> list[Any]:
    if isinstance(value, list | tuple) and len(value) == 2 and value[0] in _CODES:
        code, raw = value
    elif hasattr(value, "type") and hasattr(value, "value"):  # broker_core.messages.TypedValue
        code, raw = TYPE_CODES[value.type], value.value
    elif isinstance(value, bool):
        code, raw = "b", value
    elif isinstance(value, int):
        code, raw = ("i" if -(2**31) <= value < 2**31 else "l"), value
    elif isinstance(value, float):
        code, raw = "d", value
    elif isinstance(value, str):
        code, raw = "s", value
    else:
        raise TypeError(f"property {name!r}: unsupported value {value!r}")
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        raw = _number(raw)
    return [code, raw]


def message_json(fields: Mapping[str, Any]) -> str:
    """The JSON selector_match.lua reads: the message fields of the Lua contract (id, dest, orig_dest,
    reply_to, type, corr_id, user_id, producer_tx, broker_path, priority, timestamp, expiration,
    redelivery, group_id, group_seq, group_first, broker_in, broker_out, persistent) and `props`, a map
    of name to [typecode, value], a TypedValue, or a plain Python value (str, bool, int, float)."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if value is None:
            continue
        if key == "props":
            out["props"] = {name: _property(name, v) for name, v in value.items() if v is not None}
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = _number(value)
        else:
            out[key] = value
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _compiled(selector: Any) -> str:
    compiled = getattr(selector, "compiled", None)
    if isinstance(compiled, str):
        return compiled
    return parse_selector(selector).compiled


def _raise_evaluation_error(exc: ResponseError) -> None:
    message = str(exc)
    if message.startswith(ERROR_PREFIX):
        raise SelectorEvaluationError(message[len(ERROR_PREFIX):]) from None


def evaluate_in_redis(redis_client: Any, selector: Any, message_fields: Mapping[str, Any]) -> bool | None:
    """The three-valued result (True, False or None for NULL) of `selector` (a Selector or its text) on
    one message, computed by the Lua evaluator. Raises SelectorEvaluationError on a runtime error."""
    call = SelectorMatch.call(_compiled(selector), message_json(message_fields))
    s = script(call.script)
    try:
        try:
            reply = redis_client.evalsha(s.sha, 0, *call.args)
        except NoScriptError:
            reply = redis_client.eval(s.source, 0, *call.args)
    except ResponseError as exc:
        _raise_evaluation_error(exc)
        raise
    return SelectorMatch.parse(reply)


async def evaluate_in_redis_async(
    redis_client: Any, selector: Any, message_fields: Mapping[str, Any]
) -> bool | None:
    """evaluate_in_redis for a redis.asyncio client."""
    call = SelectorMatch.call(_compiled(selector), message_json(message_fields))
    s = script(call.script)
    try:
        try:
            reply = await redis_client.evalsha(s.sha, 0, *call.args)
        except NoScriptError:
            reply = await redis_client.eval(s.source, 0, *call.args)
    except ResponseError as exc:
        _raise_evaluation_error(exc)
        raise
    return SelectorMatch.parse(reply)
