"""Untrusted JSON in, with two limits the standard parser lacks: nesting depth and lone surrogates.

`json.loads` accepts `"\\ud800"` (a lone UTF-16 surrogate, which no UTF-8 encoder takes, so it failed later
in Redis' client as a 500) and recurses once per nesting level (a deep array raised RecursionError, a
500 too). `loads` refuses both with `InvalidJSON`, whose message names the place, before anything acts
on the document. Every JSON input path uses it: the REST bodies and the Message-Properties header
(`common.json_body`, the DRF parser, the hot path) and the JSON WebSocket protocol.

The document is walked (to name the place) only when the text holds a surrogate escape or nests too
deep, both found by C-level scans of the text, so an ordinary request costs little beyond parsing.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_JSON_DEPTH = 32  # arrays and objects inside each other; the deepest legitimate request has 5
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class InvalidJSON(ValueError):
    """The text is not JSON, or is JSON beyond the limits; the message says which and where."""


def _not_json(constant: str) -> Any:
    raise InvalidJSON(f"{constant} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_not_json)  # one decoder: json.loads(..., **kw) builds one a call
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
_INNERMOST = re.compile(rb"\[\]|\{\}")


def loads(raw: bytes | str) -> Any:
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass") if isinstance(raw, bytes) else raw
        value = _DECODER.decode(text)
    except InvalidJSON:
        raise
    except RecursionError:
        raise InvalidJSON(f"nested deeper than {MAX_JSON_DEPTH} levels (MAX_JSON_DEPTH)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidJSON(str(exc)) from None
    try:
        data = text.encode()
        suspect = b"\\ud" in data or b"\\uD" in data  # an escape that may be a lone surrogate
    except UnicodeEncodeError:  # a surrogate itself, from bytes decoded with surrogatepass
        data, suspect = text.encode("utf-8", "surrogatepass"), True
    if suspect or _too_deep(data):
        check(value)  # names the place, or finds nothing wrong (a surrogate pair)
    return value


def _too_deep(data: bytes) -> bool:
    """Whether valid JSON nests deeper than MAX_JSON_DEPTH, with C-level scans only: the strings cut out
    (brackets inside them must neither add nor hide depth), the brackets kept, then one level of
    innermost pairs removed per round."""
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return False
    # Valid JSON has backslashes only inside strings: without the escaped backslashes and quotes, every
    # other quote-separated piece lies outside the strings.
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    skeleton = b"".join(unescaped.split(b'"')[::2]).translate(None, _NOT_BRACKETS)
    for _ in range(MAX_JSON_DEPTH):
        if not skeleton:
            return False
        skeleton = _INNERMOST.sub(b"", skeleton)  # one pass: "{[]}" loses one level, not two
    return bool(skeleton)


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
