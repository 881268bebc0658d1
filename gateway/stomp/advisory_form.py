"""The form of an advisory's body for a STOMP subscriber, as its SUBSCRIBE's `transformation` asks:
ActiveMQ's STOMP writes advisories as JSON (`transformation:jms-advisory-json`) unless the subscription
asked for XML (`jms-xml` or `jms-advisory-xml`: `transformation:jms-advisory-xml` and an XML document).

The document is Signalbox's own (docs/broker_core.md, "Advisory topics"); the XML form holds the same
fields as the JSON one: the info (`ConsumerInfo`, `DestinationInfo`, `message`, ...) is the root element,
one child element per field (a list repeats its element, a null field is left out), and the event
(`event`) a child of the root, so that an XML document has one root and loses nothing.
"""

from __future__ import annotations

import json
import re
from typing import Any
from xml.sax.saxutils import escape, quoteattr

JSON = "jms-advisory-json"
XML = "jms-advisory-xml"
# SUBSCRIBE transformations that ask for XML advisories (ActiveMQ's JmsFrameTranslator maps jms-xml to
# jms-advisory-xml); any other value, or none, gets JSON.
_ASKING_FOR_XML = frozenset({"jms-xml", XML})
# A field name usable as an element name as it is; any other (a message property named `1a` or `a b`)
# becomes <field name="...">.
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")
# Characters XML 1.0 cannot hold even escaped (a copied message's body may have them)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def requested(transformation: str | None) -> str:
    """The advisory form a SUBSCRIBE's `transformation` header asks for."""
    return XML if transformation in _ASKING_FOR_XML else JSON


def as_xml(document: str) -> str:
    """An advisory's JSON document (`{"<Info>": {...}, "event": {...}}`) as XML, pretty-printed with
    two-space indents as ActiveMQ's XStream writer does."""
    parsed = json.loads(document)
    if not isinstance(parsed, dict) or not parsed:
        return _element("advisory", parsed, 0)
    root, *rest = parsed.items()
    fields = dict(root[1]) if isinstance(root[1], dict) else {"value": root[1]}
    fields.update(rest)
    return _element(root[0], fields, 0)


def _element(name: str, value: Any, depth: int) -> str:
    if isinstance(value, list):
        return "".join(_element(name, item, depth) for item in value if item is not None)
    indent = "  " * depth
    tag, end = (name, name) if _PLAIN_NAME.match(name) else (f"field name={quoteattr(name)}", "field")
    if isinstance(value, dict):
        children = "".join(_element(key, item, depth + 1) for key, item in value.items() if item is not None)
        return f"{indent}<{tag}>\n{children}{indent}</{end}>\n" if children else f"{indent}<{tag}/>\n"
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return f"{indent}<{tag}>{escape(_NOT_XML.sub(chr(0xFFFD), text))}</{end}>\n"
