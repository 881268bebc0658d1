"""JMX object names as Jolokia clients write them (`org.apache.activemq:type=Broker,brokerName=localhost`):
parsed, put in canonical form, and matched as patterns, for the management view (gateway/api/jolokia.py).

The grammar is javax.management.ObjectName's: `domain:key=value,...`. The domain holds no `:`; a key is not
empty and holds none of `:,=*?` nor a line end; an unquoted value holds none of `:,="` nor a line end, a
quoted one (`"..."`) escapes `"`, `\\`, `*`, `?` and `n` with a backslash. `*` and `?` in the domain or
in an unquoted value make a pattern (any run of characters, one character), and a `*` in place of a
property makes a property-list pattern (`type=Broker,*`: any other properties too). A quoted value is
compared as written (JMX's `k="v"` is another name than `k=v`). The canonical form lists the properties
sorted by key, which is how the view names MBeans in its answers. A refusal's text is ObjectName's own
(MalformedObjectNameException), which Jolokia's answers carry.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

MAX_OBJECT_NAME_LENGTH = 4096  # far beyond any destination's (names are at most 1,024 characters)
_KEY_FORBIDDEN = frozenset(":,=*?\n")
_VALUE_FORBIDDEN = frozenset(':,="\n')


class MalformedObjectName(ValueError):
    pass


@dataclass(frozen=True)
class ObjectName:
    domain: str
    properties: tuple[tuple[str, str], ...]  # as written; values quoted as written
    property_pattern: bool = False  # a `*` among the properties

    @property
    def is_pattern(self) -> bool:
        return (self.property_pattern or _wild(self.domain)
                or any(_wild(value) for _key, value in self.properties if not value.startswith('"')))

    @property
    def canonical(self) -> str:
        listed = ",".join(f"{key}={value}" for key, value in sorted(self.properties))
        if self.property_pattern:
            listed = f"{listed},*" if listed else "*"
        return f"{self.domain}:{listed}"

    def get(self, key: str) -> str | None:
        """A property's value, unquoted."""
        for name, value in self.properties:
            if name == key:
                return unquote(value)
        return None

    def matches(self, name: ObjectName) -> bool:
        """Whether `name` (no pattern) is one this name (a pattern, or not) designates."""
        if not _match(self.domain, name.domain):
            return False
        theirs = dict(name.properties)
        for key, value in self.properties:
            if key not in theirs:
                return False
            if value.startswith('"') or theirs[key].startswith('"') or not _wild(value):
                # (as written: JMX's `k="v"` is another name than `k=v`, and a quoted value is no
                # pattern here, so it designates only the same quoted value)
                if value != theirs[key]:
                    return False
            elif not _match(value, theirs[key]):
                return False
        return self.property_pattern or len(theirs) == len(self.properties)


def object_name(domain: str, properties: list[tuple[str, str]]) -> ObjectName:
    """A name made from values known to need no quoting (gateway/api/mbeans.py encodes them)."""
    return ObjectName(domain, tuple(properties))


def parse(text: str) -> ObjectName:
    """`text` as an ObjectName, or MalformedObjectName with ObjectName's own reason."""
    if len(text) > MAX_OBJECT_NAME_LENGTH:
        raise MalformedObjectName(f"name longer than {MAX_OBJECT_NAME_LENGTH} characters "
                                  "(MAX_OBJECT_NAME_LENGTH)")
    domain, _colon, rest = text.partition(":")
    if "\n" in domain:
        raise MalformedObjectName("Invalid character '\\n' in domain name")
    if not rest:  # (no colon too: ObjectName says the same)
        raise MalformedObjectName("Key properties cannot be empty")
    properties: list[tuple[str, str]] = []
    seen: set[str] = set()
    pattern = False
    i, n = 0, len(rest)
    while i < n:
        if rest[i] == "*" and (i + 1 == n or rest[i + 1] == ","):
            if pattern:
                raise MalformedObjectName("Cannot have several '*' characters in pattern property list")
            pattern = True
            i += 1
        else:
            equals = rest.find("=", i)
            if equals < 0:
                raise MalformedObjectName("Unterminated key property part")
            key = rest[i:equals]
            if not key:
                raise MalformedObjectName("Invalid key (empty)")
            if bad := next((c for c in key if c in _KEY_FORBIDDEN), None):
                raise MalformedObjectName(f"Invalid character '{_shown(bad)}' in key part of property")
            value, i = _value(rest, equals + 1)
            if key in seen:
                raise MalformedObjectName(f"key `{key}' already defined")
            seen.add(key)
            properties.append((key, value))
        if i < n:  # (a comma)
            i += 1
            if i == n:
                raise MalformedObjectName("Invalid ending comma")
    return ObjectName(domain, tuple(properties), pattern)


def _value(text: str, start: int) -> tuple[str, int]:
    """The value starting at `start` (as written) and the index after it."""
    if start < len(text) and text[start] == '"':
        i = start + 1
        while i < len(text):
            c = text[i]
            if c == "\\":
                if i + 1 >= len(text) or text[i + 1] not in '"\\*?n':
                    raise MalformedObjectName("Invalid escape sequence in quoted value")
                i += 2
                continue
            if c == '"':
                end = i + 1
                if end < len(text) and text[end] != ",":
                    raise MalformedObjectName("Invalid quote")
                return text[start:end], end
            if c == "\n":
                raise MalformedObjectName("Newline in quoted value")
            i += 1
        raise MalformedObjectName("Missing termination quote")
    end = text.find(",", start)
    end = len(text) if end < 0 else end
    value = text[start:end]
    if not value:
        raise MalformedObjectName("Invalid value (empty)")
    if bad := next((c for c in value if c in _VALUE_FORBIDDEN), None):
        raise MalformedObjectName(f"Invalid character '{_shown(bad)}' in value part of property")
    return value, end


def unquote(value: str) -> str:
    if not value.startswith('"'):
        return value
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value[1:-1])


def _wild(text: str) -> bool:
    return "*" in text or "?" in text


def _match(pattern: str, text: str) -> bool:
    """Whether `text` is one `pattern` (ObjectName's wildcards: `*` any run of characters, `?` one)
    designates. Not one regular expression of `.*` runs, which backtracks exponentially in the stars (14
    of them before a character the text lacks took seconds): the parts between stars have fixed lengths,
    so the first must start the text, the last end it, and each other is taken at its leftmost place after
    the one before (leftmost leaves the most room to the rest); each is one search in C, none retried, and
    at most one per character of the text succeeds (so at most that many parts are ever compiled)."""
    if not _wild(pattern):
        return pattern == text
    parts = _parts(pattern)
    if len(parts) == 1:  # (no star: `?` alone)
        return _compiled(pattern).fullmatch(text) is not None
    first, last = parts[0], parts[-1]
    end = len(text) - len(last)
    if (end < len(first) or _compiled(first).match(text) is None
            or _compiled(last).fullmatch(text, end) is None):
        return False
    at = len(first)
    for i in range(1, len(parts) - 1):
        found = _compiled(parts[i]).search(text, at, end)
        if found is None:
            return False
        at = found.end()
    return True


@functools.lru_cache(maxsize=256)
def _parts(pattern: str) -> tuple[str, ...]:
    """The parts between the stars, empty middle ones left out, taken apart once per pattern (a pattern
    is matched against every destination's name: splitting it for each made one of 1,000 stars cost 8
    times a plain one)."""
    if "*" not in pattern:
        return (pattern,)
    first, *middle, last = pattern.split("*")
    return (first, *(part for part in middle if part), last)


@functools.lru_cache(maxsize=4096)
def _compiled(part: str) -> re.Pattern[str]:
    """A part of a pattern between stars: `?` any one character, every other character itself."""
    return re.compile("".join("." if c == "?" else re.escape(c) for c in part), re.DOTALL)


def _shown(c: str) -> str:
    return "\\n" if c == "\n" else c
