"""ActiveMQ's MessageServlet answers a GET with one header per message property (setResponseHeaders),
unchecked: a property could break the answer (CR, LF, NUL) or forge it (Content-Length, Set-Cookie,
Transfer-Encoding, id). This is the safe mapping the compat servlet uses (docs/api.md, Properties as
headers): names that may be headers, values in a form every HTTP implementation carries unchanged.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from gateway.api.codec import property_json

# A property becomes a header when its name is an RFC 9110 token that names no header with a meaning of
# its own: those this endpoint sets, hop-by-hop ones, and those a client, cache, proxy or browser acts on.
# Compared case-insensitively; a name with one of the prefixes is refused as well.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
RESERVED_HEADERS = frozenset({
    # set by this endpoint, Django or DRF on the answer
    "destination", "id", "jmsxgroupid", "jmsxgroupfirstforconsumer", "cache-control", "pragma", "expires",
    "set-cookie", "set-cookie2", "vary", "allow", "date", "server", "x-frame-options",
    "x-content-type-options", "referrer-policy", "strict-transport-security",
    # hop-by-hop and framing
    "connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "http2-settings",
    # acted on by clients, caches, proxies or browsers
    "accept-ranges", "age", "alt-svc", "authorization", "clear-site-data", "cookie", "etag", "expect",
    "forwarded", "host", "last-modified", "link", "location", "nel", "permissions-policy",
    "feature-policy", "refresh", "report-to", "reporting-endpoints", "retry-after",
    "service-worker-allowed", "sourcemap", "timing-allow-origin", "via", "warning", "www-authenticate",
    "x-xss-protection", "x-dns-prefetch-control", "x-permitted-cross-domain-policies", "x-sendfile",
    "x-lighttpd-send-file", "x-powered-by", "expect-ct", "public-key-pins", "origin-agent-cluster",
    "accept-ch",
})
RESERVED_PREFIXES = ("content-", "proxy-", "access-control-", "cross-origin-", "sec-", "x-forwarded-",
                     "x-accel-", "signalbox-")
# A value goes out as it is when it is printable ASCII without surrounding blanks; otherwise (control
# characters such as CR, LF or NUL, non-ASCII text, surrounding blanks) as an RFC 8187 ext-value,
# UTF-8''<percent-encoded UTF-8>. A plain value that starts with UTF-8'' is encoded too, so a client
# can always tell. One header's value is at most MAX_PROPERTY_HEADER_BYTES once encoded.
MAX_PROPERTY_HEADER_BYTES = 8192
EXT_VALUE_PREFIX = "UTF-8''"
_PLAIN_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?)?")
_ATTR_CHARS = "!#$&+-.^_`|~"  # RFC 8187 attr-char besides letters and digits
OMITTED_HEADER = "Signalbox-Omitted-Properties"
_MAX_OMITTED_BYTES = 2048


def header_value(text: str) -> str:
    """The header form of a value (see above)."""
    if _PLAIN_VALUE.fullmatch(text) and text[:7].upper() != EXT_VALUE_PREFIX.upper():
        return text
    return EXT_VALUE_PREFIX + quote(text.encode("utf-8", "surrogatepass"), safe=_ATTR_CHARS)


def _header_text(value: Any) -> str:
    value = property_json(value)
    if isinstance(value, bool):
        return "true" if value else "false"  # Java's Boolean.toString, as ActiveMQ sends it
    return str(value)


def property_headers(properties: dict[str, Any]) -> tuple[list[tuple[str, str]], list[str]]:
    """(headers for the properties that may be headers, names of those that may not)."""
    headers: list[tuple[str, str]] = []
    omitted: list[str] = []
    for name, raw in properties.items():
        lowered = name.lower()
        if (not _TOKEN.fullmatch(name) or lowered in RESERVED_HEADERS
                or lowered.startswith(RESERVED_PREFIXES)):
            omitted.append(name)
            continue
        value = header_value(_header_text(raw))
        if len(value) > MAX_PROPERTY_HEADER_BYTES:
            omitted.append(name)
            continue
        headers.append((name, value))
    return headers, omitted


def omitted_header(names: list[str]) -> str:
    """The omitted names, comma-separated, each percent-encoded as needed; cut with `...` past 2 KiB."""
    out, size = [], 0
    for name in names:
        encoded = quote(name.encode("utf-8", "surrogatepass"), safe=_ATTR_CHARS + "'*")
        if size + len(encoded) + 1 > _MAX_OMITTED_BYTES:
            out.append("...")
            break
        out.append(encoded)
        size += len(encoded) + 1
    return ",".join(out)
