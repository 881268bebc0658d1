"""Text read as ActiveMQ's Java code reads it, for the adapters that mimic it (the STOMP frame parser,
the REST MessageServlet)."""

from __future__ import annotations

# What Java's String.trim takes off both ends: every character up to U+0020 (control characters
# included) and nothing else. Python's str.strip() differs both ways: it also takes Unicode whitespace
# (U+00A0, U+2003, ...) and leaves control characters that are not whitespace to it (U+0001 ...).
JAVA_TRIM = "".join(map(chr, range(0x21)))


def java_trim(text: str) -> str:
    """`text.trim()` in Java."""
    return text.strip(JAVA_TRIM)


def java_equals_ignore_case(text: str | None, other: str) -> bool:
    """`other.equalsIgnoreCase(text)` in Java: the same length, and each pair of characters equal, or equal
    once each is upper-cased, or once each is then lower-cased — one character to one, as Java's
    Character.toUpperCase and toLowerCase map them (a character Python maps to several, 'ß' to 'SS',
    stays itself there). So 'ſ' (long s) equals 's' and 'K' (Kelvin) equals 'k', which str.lower()
    comparisons miss. None equals nothing, as Java's null."""
    if text is None or len(text) != len(other):
        return False
    return all(a == b or _upper(a) == _upper(b) or _lower(_upper(a)) == _lower(_upper(b))
               for a, b in zip(text, other, strict=True))


def _upper(c: str) -> str:
    mapped = c.upper()
    return mapped if len(mapped) == 1 else c


def _lower(c: str) -> str:
    if c == "\u0130":  # İ: Java's (Unicode's simple) lower case is 'i'; Python's full one is 'i' + U+0307
        return "i"
    mapped = c.lower()
    return mapped if len(mapped) == 1 else c
