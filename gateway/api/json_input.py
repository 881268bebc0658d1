"""Untrusted JSON in, with two limits the standard parser lacks: nesting depth and lone surrogates.

`json.loads` accepts `"\\ud800"` (a lone UTF-16 surrogate, which no UTF-8 encoder takes, so it failed later
in Redis' client as a 500) and recurses once per nesting level (a deep array raised RecursionError, a
500 too). `loads` refuses both with `InvalidJSON`, whose message names the place, before anything acts
on the document. Every JSON input path uses it: the REST bodies and the Message-Properties header
(`common.json_body`, the DRF parser, the hot path) and the JSON WebSocket protocol.

The checks walk the parsed document only when the raw text could hold a problem (more brackets than
the depth limit, or a surrogate escape or byte sequence), so an ordinary message costs two C-level scans.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_JSON_DEPTH = 32  # arrays and objects inside each other; the deepest legitimate request has 5
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# A surrogate escape (\ud800) or UTF-8-encoded surrogate bytes (json.loads decodes bytes with surrogatepass).
_MAY_HOLD_SURROGATE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_MAY_HOLD_SURROGATE_TEXT = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")


class InvalidJSON(ValueError):
    """The text is not JSON, or is JSON beyond the limits; the message says which and where."""


def _not_json(constant: str) -> Any:
    raise InvalidJSON(f"{constant} is not a JSON number")


def loads(raw: bytes | str) -> Any:
    try:
        value = json.loads(raw, parse_constant=_not_json)
    except InvalidJSON:
        raise
    except RecursionError:
        raise InvalidJSON(f"nested deeper than {MAX_JSON_DEPTH} levels (MAX_JSON_DEPTH)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidJSON(str(exc)) from None
    if isinstance(raw, bytes):
        brackets = raw.count(b"[") + raw.count(b"{")
        surrogates = _MAY_HOLD_SURROGATE_BYTES.search(raw) is not None
    else:
        brackets = raw.count("[") + raw.count("{")
        surrogates = _MAY_HOLD_SURROGATE_TEXT.search(raw) is not None
    if brackets > MAX_JSON_DEPTH or surrogates:
        check(value)
    return value


def check(value: Any) -> None:
    """Raise InvalidJSON for the first lone surrogate or the first nesting beyond MAX_JSON_DEPTH."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise InvalidJSON(f"{_where(path)}: a lone UTF-16 surrogate "
                                  f"({_first_surrogate(item)}) is not a character; JSON text must be Unicode")
            continue
        if not isinstance(item, dict | list):
            continue
        if depth >= MAX_JSON_DEPTH:
            raise InvalidJSON(f"{_where(path)}: nested deeper than {MAX_JSON_DEPTH} levels "
                              "(MAX_JSON_DEPTH)")
        if isinstance(item, dict):
            for key, inner in item.items():
                where = f"{path}.{key}" if path else key
                if _SURROGATE.search(key):
                    raise InvalidJSON(f"{_where(path)}: a member name holds a lone UTF-16 surrogate "
                                      f"({_first_surrogate(key)}); JSON text must be Unicode")
                stack.append((inner, depth + 1, where))
        else:
            stack.extend((inner, depth + 1, f"{path}[{i}]") for i, inner in enumerate(item))


def _where(path: str) -> str:
    return (path if len(path) <= 200 else path[:200] + "...") or "the document"


def _first_surrogate(text: str) -> str:
    match = _SURROGATE.search(text)
    return f"\\u{ord(match.group()):04x}" if match else ""
