"""A selector parsed and compiled to what the Lua scripts evaluate (the package docstring describes the
form), cached by its text."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

from ..errors import InvalidSelector
from .limits import MAX_CALL_EVALUATION_BYTES, MAX_EVALUATION_BYTES
from .parser import HEADER_IDENTIFIERS, parse

CONVERT_STRING_EXPRESSIONS_PREFIX = "convert_string_expressions:"
COMPILED_VERSION = 2
CACHE_SIZE = 1024  # ActiveMQ keeps 100; compiled selectors are small and consumers many


@dataclass(frozen=True)
class Selector:
    """A parsed selector. `compiled` is what the Lua scripts evaluate (see the module docstring)."""

    text: str
    convert_string_expressions: bool
    compiled: str
    identifiers: frozenset[str]

    @property
    def header_identifiers(self) -> frozenset[str]:
        """The JMS header names (JMSPriority, JMSXGroupID, ...) the selector reads."""
        return self.identifiers & HEADER_IDENTIFIERS

    @property
    def property_names(self) -> frozenset[str]:
        """The user property names the selector reads."""
        return self.identifiers - HEADER_IDENTIFIERS


def parse_selector(text: str, *, convert_string_expressions: bool = False) -> Selector:
    """Parse and type-check a JMS selector; raises InvalidSelector with a 1-based position.

    A text starting with `convert_string_expressions:` turns STOMP's coercion mode on, as ActiveMQ's
    SelectorParser does; positions in errors count from the start of `text` as given. An empty or
    blank selector is an error here; use compile_optional for "no selector".
    """
    if not isinstance(text, str):
        raise InvalidSelector(f"a selector must be a string, not {type(text).__name__}")
    return _parse_cached(text, bool(convert_string_expressions))


def compile_optional(text: str | None, *, convert_string_expressions: bool = False) -> Selector | None:
    """None for a missing or blank selector (JMS: no selector), else parse_selector(text)."""
    if text is None:
        return None
    body = text.removeprefix(CONVERT_STRING_EXPRESSIONS_PREFIX)
    if not body.strip():
        return None
    return parse_selector(text, convert_string_expressions=convert_string_expressions)


@lru_cache(maxsize=CACHE_SIZE)
def _parse_cached(text: str, convert: bool) -> Selector:
    offset = 0
    if text.startswith(CONVERT_STRING_EXPRESSIONS_PREFIX):
        convert = True
        offset = len(CONVERT_STRING_EXPRESSIONS_PREFIX)
    if not text[offset:].strip():
        raise InvalidSelector("the selector is empty", position=offset + 1, expected="an expression")
    root, identifiers = parse(text, offset)
    compiled = json.dumps(
        {"v": COMPILED_VERSION, "c": convert, "b": MAX_EVALUATION_BYTES, "B": MAX_CALL_EVALUATION_BYTES,
         "e": root.json},
        separators=(",", ":"), ensure_ascii=False, allow_nan=False,
    )
    return Selector(text, convert, compiled, identifiers)
