"""LIKE patterns and Java regexes read into automata.Pattern (items of character sets with repetitions).

automata.py turns a Pattern into the DFAs the Lua evaluator runs. Only a subset of Java's regex syntax is
accepted; anything outside it is refused when the selector is parsed (RegexUnsupported, turned into
InvalidSelector by the parser). The supported subset, for REGEX, REPLACE and SPLIT:

- literal characters, including escaped metacharacters (`\\.`), `\\t \\n \\r \\f \\a \\e`, `\\xhh`,
  `\\x{h..}`, `\\uhhhh`, `\\0ooo`, `\\cX` and `\\Q...\\E` quoting;
- `.` (any character except `\\n` and `\\r`), `\\d \\D \\w \\W \\s \\S` (ASCII, as in Java's default),
  and bracket classes `[...]` / `[^...]` of ASCII characters, ranges and `\\d \\w \\s`;
- the quantifiers `* + ? {n} {n,} {n,m}` (counts up to MAX_REPEAT), and the lazy `*? +? {n}? {n,}?`;
- `^` / `\\A` at the start, and at the end `$` / `\\Z` (REGEX only: end of input or before a final line
  terminator) and `\\z` (end of input).

Refused: alternation `|`, groups and lookaround `( )`, back-references, `\\b \\B \\G \\p{..} \\h \\v \\R \\X`,
possessive quantifiers, `??`, lazy `{n,m}?`, class unions/intersections, non-ASCII characters inside
classes, and quantifiers other than `{n}` on a non-ASCII character. Java's `.` also stops at U+0085,
U+2028 and U+2029; Signalbox's does not.
"""

from __future__ import annotations

import string

from .automata import ANY, ASCII, CharSet, Item, Pattern
from .limits import MAX_REPEAT

_DIGITS = frozenset(range(ord("0"), ord("9") + 1))
_WORD = frozenset(ord(c) for c in string.ascii_letters + string.digits + "_")
_SPACE = frozenset(ord(c) for c in " \t\n\x0b\f\r")
_NEWLINES = frozenset((10, 13))
_NAMED_CLASSES = {"d": (_DIGITS, False), "D": (_DIGITS, True), "w": (_WORD, False), "W": (_WORD, True),
                  "s": (_SPACE, False), "S": (_SPACE, True)}
_SIMPLE_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "a": "\x07", "e": "\x1b"}
_UNSUPPORTED_ESCAPES = {
    "b": "word boundaries (\\b)", "B": "non-word boundaries (\\B)", "G": "\\G",
    "p": "Unicode classes (\\p{..})", "P": "Unicode classes (\\P{..})", "h": "\\h", "H": "\\H",
    "v": "\\v", "V": "\\V", "R": "\\R", "X": "\\X", "k": "named back-references (\\k)", "N": "\\N",
}


class RegexUnsupported(ValueError):
    """A regex outside the translatable subset; `index` is the 0-based offset in the regex text."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.message = message
        self.index = index


def _literal(ch: str) -> CharSet:
    if ch.isascii():
        return CharSet(frozenset((ord(ch),)))
    return CharSet(literal=ch.encode())


# -- LIKE --------------------------------------------------------------------------------------------------


def compile_like(pattern: str, escape: str | None) -> Pattern:
    """SQL LIKE as a Pattern anchored at both ends: `%` any run of characters, `_` any one (newlines
    included), and ESCAPE escaping only `_`, `%` or itself (ActiveMQ's LikeExpression)."""
    items: list[Item] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        escaped = i + 1 < len(pattern) and pattern[i + 1] in ("_", "%", escape)
        if escape is not None and c == escape and escaped:
            items.append(Item(_literal(pattern[i + 1]), 1, 1))
            i += 2
            continue
        if c == "%":
            if not items or items[-1] != Item(ANY, 0, None):  # `%%` is `%`
                items.append(Item(ANY, 0, None))
        elif c == "_":
            items.append(Item(ANY, 1, 1))
        else:
            items.append(Item(_literal(c), 1, 1))
        i += 1
    return Pattern(tuple(items), head=True, tail=True)


# -- Java regex ----------------------------------------------------------------------------------------------


class _RegexReader:
    def __init__(self, regex: str, spans: bool) -> None:
        self.s = regex
        self.i = 0
        self.spans = spans  # REPLACE/SPLIT need the matched span, not only whether there is one

    def fail(self, message: str, at: int | None = None) -> RegexUnsupported:
        return RegexUnsupported(message, self.i if at is None else at)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    # An escaped character (the backslash already consumed); returns a code point string or None when
    # the escape is not a single character.
    def escaped_char(self, start: int) -> str | None:
        c = self.peek()
        if c == "":
            raise self.fail("the pattern ends with an unfinished escape '\\'", start)
        if c in _SIMPLE_ESCAPES:
            self.i += 1
            return _SIMPLE_ESCAPES[c]
        if c == "x":
            self.i += 1
            if self.peek() == "{":
                close = self.s.find("}", self.i)
                digits = self.s[self.i + 1: close] if close > 0 else ""
                if not digits or any(d not in string.hexdigits for d in digits) or int(digits, 16) > 0x10FFFF:
                    raise self.fail("invalid \\x{...} escape", start)
                self.i = close + 1
                return chr(int(digits, 16))
            digits = self.s[self.i: self.i + 2]
            if len(digits) < 2 or any(d not in string.hexdigits for d in digits):
                raise self.fail("invalid \\x escape (two hex digits expected)", start)
            self.i += 2
            return chr(int(digits, 16))
        if c == "u":
            digits = self.s[self.i + 1: self.i + 5]
            if len(digits) < 4 or any(d not in string.hexdigits for d in digits):
                raise self.fail("invalid \\u escape (four hex digits expected)", start)
            self.i += 5
            code = int(digits, 16)
            if 0xD800 <= code <= 0xDBFF and self.s[self.i: self.i + 2] == "\\u":
                low_digits = self.s[self.i + 2: self.i + 6]
                if len(low_digits) == 4 and all(d in string.hexdigits for d in low_digits):
                    low = int(low_digits, 16)
                    if 0xDC00 <= low <= 0xDFFF:
                        self.i += 6
                        return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00))
            if 0xD800 <= code <= 0xDFFF:
                raise self.fail("a lone surrogate \\u escape is not supported", start)
            return chr(code)
        if c == "0":
            self.i += 1
            digits = ""
            limit = 3 if self.peek() in "0123" else 2
            while len(digits) < limit and self.peek() and self.peek() in "01234567":
                digits += self.peek()
                self.i += 1
            if not digits:
                raise self.fail("invalid octal escape \\0", start)
            return chr(int(digits, 8))
        if c == "c":
            ctrl = self.peek(1)
            if not ctrl:
                raise self.fail("invalid control escape \\c", start)
            self.i += 2
            return chr(ord(ctrl) ^ 64)
        if c.isascii() and c.isalpha():
            return None
        if c.isdigit():
            raise self.fail("back-references are not supported", start)
        self.i += 1
        return c


def _item(
    atom: CharSet, quantifier: str, lo: int, hi: int | None, lazy: bool, at: int
) -> Item:
    """The item for one atom and its quantifier ('' none, '*', '+', '?', '{}')."""
    if quantifier == "":
        lo, hi = 1, 1
    elif quantifier == "*":
        lo, hi = 0, None
    elif quantifier == "+":
        lo, hi = 1, None
    elif quantifier == "?":
        lo, hi = 0, 1
    if lazy and hi is not None and hi != lo:
        raise RegexUnsupported("lazy quantifiers other than *? +? and {n,}? are not supported", at)
    if atom.literal is not None and hi != lo:
        raise RegexUnsupported(
            f"a quantifier on the non-ASCII character {atom.literal.decode()!r} is not supported", at
        )
    return Item(atom, lo, hi, lazy and hi != lo)


def _set(codes: frozenset[int], negated: bool) -> CharSet:
    return CharSet(ASCII - codes, True) if negated else CharSet(codes)


_CR_LF = (Item(CharSet(frozenset((13,))), 0, 1), Item(CharSet(frozenset((10,))), 0, 1))


def java_regex(regex: str, *, spans: bool) -> Pattern:
    """The Pattern of the Java regex `regex`, or RegexUnsupported naming what is not supported."""
    r = _RegexReader(regex, spans)
    head = tail = False
    items: list[Item] = []
    n = len(regex)
    while r.i < n:
        start = r.i
        c = regex[r.i]
        atom: CharSet
        if c == "^":
            if start != 0:
                raise r.fail("'^' is only supported at the start of the pattern")
            head = True
            r.i += 1
            continue
        if c == "$":
            if start != n - 1:
                raise r.fail("'$' is only supported at the end of the pattern")
            if spans:
                raise r.fail("'$' is not supported in REPLACE and SPLIT (use \\z for the end of input)")
            items += _CR_LF  # Java's `$`: the end, or before a final line terminator
            tail = True
            r.i += 1
            continue
        if c == "|":
            raise r.fail("alternation '|' is not supported")
        if c in "()":
            raise r.fail("groups and lookaround '(...)' are not supported")
        if c in "*+?":
            raise r.fail(f"dangling quantifier {c!r} (nothing to repeat)")
        if c == "{":
            raise r.fail("'{' must be escaped as '\\{' when it is not a quantifier")
        if c == ".":
            r.i += 1
            atom = _set(_NEWLINES, True)
        elif c == "[":
            atom = _read_class(r)
        elif c == "\\":
            r.i += 1
            e = r.peek()
            if e == "Q":
                close = regex.find("\\E", r.i + 1)
                quoted = regex[r.i + 1: close if close >= 0 else n]
                r.i = close + 2 if close >= 0 else n
                items += (Item(_literal(ch), 1, 1) for ch in quoted)
                continue
            if e == "E":  # a stray \E is ignored by Java
                r.i += 1
                continue
            if e in ("A", "z", "Z"):
                r.i += 1
                if e == "A":
                    if start != 0:
                        raise r.fail("\\A is only supported at the start of the pattern", start)
                    head = True
                    continue
                if r.i != n:
                    raise r.fail(f"\\{e} is only supported at the end of the pattern", start)
                if e == "Z" and spans:
                    raise r.fail("\\Z is not supported in REPLACE and SPLIT (use \\z)", start)
                if e == "Z":
                    items += _CR_LF
                tail = True
                continue
            if e in _NAMED_CLASSES:
                r.i += 1
                atom = _set(*_NAMED_CLASSES[e])
            else:
                ch = r.escaped_char(start)
                if ch is None:
                    what = _UNSUPPORTED_ESCAPES.get(e, f"the escape \\{e}")
                    raise r.fail(f"{what} is not supported", start)
                atom = _literal(ch)
        else:
            r.i += 1
            atom = _literal(c)
        quantifier_start = r.i
        quantifier, lo, hi, lazy = _read_quantifier(r)
        items.append(_item(atom, quantifier, lo, hi, lazy, quantifier_start))
    return Pattern(tuple(items), head, tail)


def _read_quantifier(r: _RegexReader) -> tuple[str, int, int | None, bool]:
    c = r.peek()
    lo, hi = 1, 1
    if c in ("*", "+", "?") and c:
        quantifier = c
        r.i += 1
    elif c == "{":
        start = r.i
        close = r.s.find("}", r.i)
        spec = r.s[r.i + 1: close] if close > 0 else ""
        parts = spec.split(",")
        if close < 0 or len(parts) > 2 or not parts[0].isdigit() or (len(parts) == 2 and parts[1]
                                                                       and not parts[1].isdigit()):
            raise r.fail("invalid repetition '{' (write '\\{' for a literal brace)", start)
        lo = int(parts[0])
        hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
        if hi is not None and hi < lo:
            raise r.fail(f"invalid repetition {{{spec}}}: the maximum is below the minimum", start)
        if lo > MAX_REPEAT or (hi or 0) > MAX_REPEAT:
            raise r.fail(f"repetition counts above {MAX_REPEAT} are not supported (limit max_repeat)", start)
        quantifier = "{}"
        r.i = close + 1
    else:
        return "", 1, 1, False
    lazy = False
    if r.peek() == "?":
        lazy = True
        r.i += 1
        if quantifier == "?":
            raise r.fail("the lazy quantifier '??' is not supported", r.i - 2)
    elif r.peek() == "+":
        raise r.fail("possessive quantifiers are not supported")
    if quantifier == "{}" and hi == lo:
        lazy = False
    return quantifier, lo, hi, lazy


def _read_class(r: _RegexReader) -> CharSet:
    start = r.i
    r.i += 1  # '['
    negated = False
    if r.peek() == "^":
        negated = True
        r.i += 1
    codes: set[int] = set()
    first = True
    while True:
        c = r.peek()
        if c == "":
            raise r.fail("unclosed character class '['", start)
        if c == "]":
            if first:
                raise r.fail("write '\\]' for a ']' at the start of a character class")
            r.i += 1
            break
        first = False
        if c == "[":
            raise r.fail("nested character classes and unions are not supported")
        if c == "&" and r.peek(1) == "&":
            raise r.fail("character class intersections '&&' are not supported")
        low = _class_char(r, codes)
        if low is None:
            continue
        if r.peek() == "-" and r.peek(1) not in ("]", ""):
            dash = r.i
            r.i += 1
            high = _class_char(r, codes)
            if high is None:
                raise r.fail("a range cannot end with a class escape", dash)
            if ord(high) < ord(low):
                raise r.fail(f"invalid range {low}-{high} in a character class", dash)
            codes.update(range(ord(low), ord(high) + 1))
        else:
            codes.add(ord(low))
    return _set(frozenset(codes), negated)


def _class_char(r: _RegexReader, codes: set[int]) -> str | None:
    """One member of a bracket class: returns its character, or None after adding a \\d/\\w/\\s class."""
    at = r.i
    c = r.peek()
    if c == "\\":
        r.i += 1
        e = r.peek()
        if e in ("d", "w", "s"):
            r.i += 1
            codes.update(_NAMED_CLASSES[e][0])
            return None
        if e in ("D", "W", "S"):
            raise r.fail(f"\\{e} inside a character class is not supported", at)
        ch = r.escaped_char(at)
        if ch is None:
            what = _UNSUPPORTED_ESCAPES.get(e, "the escape \\" + e)
            raise r.fail(f"{what} is not supported", at)
    else:
        r.i += 1
        ch = c
    if not ch.isascii():
        raise r.fail(f"non-ASCII characters in a character class ({ch!r}) are not supported", at)
    return ch
