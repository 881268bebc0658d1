"""Tokenizer for JMS selectors, following ActiveMQ's SelectorParser.jj token rules (spec §4.1).

Keywords are case-insensitive, identifiers are `[a-zA-Z_$][a-zA-Z0-9_$]*`, and numbers follow the
grammar's longest-match rules (so `09` is the octal `0` followed by `9`, a parse error, and `1e1` is a
float). Positions are 0-based offsets into the full selector text; errors report them 1-based.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidSelector

KEYWORDS = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "LIKE", "ESCAPE", "IN", "IS", "TRUE", "FALSE", "NULL", "XPATH", "XQUERY"}
)

_WHITESPACE = " \t\n\r\f"
_IDENT = re.compile(r"[a-zA-Z_$][a-zA-Z0-9_$]*")
_DECIMAL = re.compile(r"[1-9][0-9]*[lL]?")
_HEX = re.compile(r"0[xX][0-9a-fA-F]+")
_OCTAL = re.compile(r"0[0-7]*")
_FLOAT = re.compile(
    r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?"
    r"|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
    r"|[0-9]+[eE][+-]?[0-9]+"
)
_STRING = re.compile(r"'(?:''|[^'])*'")
_OPERATORS = ("<>", "<=", ">=", "<", ">", "=", "+", "-", "*", "/", "%", "(", ")", ",")


@dataclass(frozen=True, slots=True)
class Token:
    """One token. `kind` is 'kw', 'id', 'str', 'int', 'float', 'op' or 'eof'.

    `value` is the upper-cased keyword, the identifier, the decoded string, the int or float value,
    or the operator text. `start`/`end` are 0-based offsets into the selector text.
    """

    kind: str
    value: object
    start: int
    end: int
    text: str

    def describe(self) -> str:
        if self.kind == "eof":
            return "the end of the selector"
        shown = self.text if len(self.text) <= 24 else self.text[:21] + "..."
        return f"'{shown}'" if self.kind != "str" else shown


_SURROGATE = re.compile("[\ud800-\udfff]")


def _unexpected(text: str, i: int, offset: int) -> InvalidSelector:
    c = text[i]
    shown = repr(c) if c.isprintable() else f"U+{ord(c):04X}"
    hint = ""
    if text.startswith("!=", i):
        hint = " (write '<>' for not-equal)"
    elif c == "." and i > offset and (text[i - 1].isalnum() or text[i - 1] in "_$"):
        hint = " (identifiers cannot contain '.')"
    elif c == '"':
        hint = " (string literals use single quotes)"
    return InvalidSelector(f"unexpected character {shown}{hint}", position=i + 1, expected="a token")


def _number(text: str, at: int) -> tuple[str, re.Match[str]] | None:
    """Longest match among the number tokens; on a tie the one declared first in the grammar wins."""
    best: tuple[str, re.Match[str]] | None = None
    for kind, pattern in (("dec", _DECIMAL), ("hex", _HEX), ("oct", _OCTAL), ("float", _FLOAT)):
        m = pattern.match(text, at)
        if m and (best is None or m.end() > best[1].end()):
            best = (kind, m)
    return best


def tokenize(text: str, offset: int = 0) -> list[Token]:
    """Tokens of `text[offset:]`, ending with an 'eof' token. Raises InvalidSelector on a lexical error."""
    bad = _SURROGATE.search(text, offset)
    if bad:
        raise InvalidSelector("invalid character (a lone UTF-16 surrogate)", position=bad.start() + 1)
    tokens: list[Token] = []
    i, n = offset, len(text)
    while True:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n:
            tokens.append(Token("eof", None, n, n, ""))
            return tokens
        c = text[i]
        if text.startswith("--", i):
            # To the end of the line; unlike ActiveMQ (which then lexes '-' '-'), also to the end of input.
            while i < n and text[i] not in "\r\n":
                i += 1
            continue
        if text.startswith("/*", i):
            close = text.find("*/", i + 2)
            if close < 0:
                raise InvalidSelector("unterminated comment", position=i + 1, expected="'*/'")
            i = close + 2
            continue
        if c == "'":
            m = _STRING.match(text, i)
            if not m:
                raise InvalidSelector(
                    "unterminated string literal", position=i + 1, expected="a closing quote (')"
                )
            raw = m.group()
            tokens.append(Token("str", raw[1:-1].replace("''", "'"), i, m.end(), raw))
            i = m.end()
            continue
        if c.isascii() and (c.isdigit() or c == "."):
            found = _number(text, i)
            if found is None:  # a lone '.'
                raise _unexpected(text, i, offset)
            kind, m = found
            raw = m.group()
            if kind == "float":
                tokens.append(Token("float", float(raw), i, m.end(), raw))
            else:
                if kind == "dec":
                    value = int(raw.rstrip("lL"))
                elif kind == "hex":
                    value = int(raw[2:], 16)
                else:
                    value = int(raw, 8)
                if kind != "dec" and value > 2**63 - 1:
                    raise InvalidSelector(f"literal {raw} does not fit in a long", position=i + 1)
                tokens.append(Token("int", value, i, m.end(), raw))
            i = m.end()
            continue
        m = _IDENT.match(text, i)
        if m:
            word = m.group()
            if word.upper() in KEYWORDS:
                tokens.append(Token("kw", word.upper(), i, m.end(), word))
            else:
                tokens.append(Token("id", word, i, m.end(), word))
            i = m.end()
            continue
        for op in _OPERATORS:
            if text.startswith(op, i):
                tokens.append(Token("op", op, i, i + len(op), op))
                i += len(op)
                break
        else:
            raise _unexpected(text, i, offset)
