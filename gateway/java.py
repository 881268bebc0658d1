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
