"""`/api/jolokia`: the read side of ActiveMQ's Jolokia agent (protocol 7.2, as ActiveMQ 5.17 ships it), so
the tools that watch an ActiveMQ broker through it (autoscalers reading a queue's QueueSize, Telegraf's
jolokia2 input, scripts) watch Signalbox by changing only the host.

Requests: `read` (an MBean's attributes, one, several or all; an MBean pattern reads every match),
`search` (the names matching a pattern) and `version`, by GET (`/api/jolokia/read/<mbean>[/<attribute>[,
<attribute>...][/<path>]]`, `/search/<pattern>`, `/version`; `!/` stands for a `/` inside a part, `!!`
for `!`) or POST (one request as a JSON object, or a list of them answered by a list). The MBeans are
gateway/api/mbeans.py's. Answers are Jolokia's: HTTP 200 with `status` in the body (200, or 400, 403,
404 with `error_type` and `error`, as Jolokia names Java's exceptions), `request` (the MBean in canonical
form), `value` and `timestamp` (seconds); `text/plain;charset=utf-8` unless `mimeType=application/json`.

What differs from ActiveMQ's agent, on purpose: it is read-only (`exec`, `write`, `list` and
notifications answer a SecurityException, 403, naming the REST endpoint to use instead: ActiveMQ's
agent lets any logged-in user purge a queue through it); a user sees the destinations they may read
(per-destination permissions, gateway/permissions.py), the broker's totals over those; answers naming
more than SIGNALBOX_JOLOKIA_MAX_OBJECTS MBeans in one HTTP request (a POST's requests together) are
refused with that name (Jolokia's maxObjects cuts the answer off silently); a POST holds at most
MAX_REQUESTS requests of MAX_BODY_BYTES in all.
Logging in: HTTP Basic (as ActiveMQ's) or an API token.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import time
from typing import Any

from django.http import HttpResponse
from django.utils.http import http_date
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request

from broker_core.destinations import Destination, parse_destination
from gateway import permissions, runtime
from gateway.api import json_input, mbeans
from gateway.api.auth import BasicAuthentication, TokenAuthentication
from gateway.api.base import GatewayView
from gateway.api.common import LoopShare, setting
from gateway.api.destination_index import index, totals
from gateway.api.object_names import MalformedObjectName, ObjectName, parse
from gateway.api.schema import problems
from gateway.db_steps import db
from gateway.paths import from_segment
from signalbox import health

PROTOCOL = "7.2"
AGENT = "1.7.1"  # the Jolokia agent whose protocol this answers (ActiveMQ 5.17.2's)
MAX_REQUESTS = 100  # requests in one POST
MAX_BODY_BYTES = 1024 * 1024
MIME_TYPES = ("text/plain", "application/json")
READ_ONLY = ("exec", "write", "list", "notification")
TYPES = ("read", "search", "version", *READ_ONLY)  # Jolokia's request types
INSTEAD = {"exec": "the REST API's actions (POST /api/v1/queues/<name>/purge, /pause, /resume, message "
                   "moves and removals: docs/api.md)",
           "write": "the destination policies (PUT /api/v1/policies/<pattern>)",
           "list": "search, and read with no attribute (every attribute of an MBean)",
           "notification": "the console's live feed or the metrics (docs/metrics.md)"}


class JolokiaError(Exception):
    """One request's refusal, answered in its place (the others of a POST go on)."""

    def __init__(self, error_type: str, message: str, status: int) -> None:
        super().__init__(message)
        self.error_type, self.message, self.status = error_type, message, status


def _illegal(message: str) -> JolokiaError:
    return JolokiaError("java.lang.IllegalArgumentException", message, 400)


def _not_found(message: str) -> JolokiaError:
    return JolokiaError("javax.management.InstanceNotFoundException", message, 404)


def split_path(text: str) -> list[str]:
    """A GET path's parts: split at `/`, where `!x` stands for `x` (Jolokia's escape)."""
    parts, current, chars = [], [], iter(text)
    for char in chars:
        if char == "!":
            current.append(next(chars, "!"))
        elif char == "/":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def from_path(path: str) -> dict[str, Any]:
    """A GET request as the JSON request it stands for."""
    parts = split_path(path.strip("/")) if path.strip("/") else []
    if not parts:
        return {"type": "version"}
    kind, args = parts[0], parts[1:]
    request: dict[str, Any] = {"type": kind}
    if kind.lower() in ("read", "search") and args:
        request["mbean"] = args[0]
        if kind.lower() == "read" and len(args) > 1 and args[1]:
            names = args[1].split(",")
            request["attribute"] = names if len(names) > 1 else names[0]
            if len(args) > 2:  # (escaped again, as Jolokia echoes it: a `/` inside one key stays `!/`)
                request["path"] = "/".join(part.replace("!", "!!").replace("/", "!/") for part in args[2:])
    return request


class Reader:
    """Answers the requests of one HTTP request for one user (their readable destinations looked up
    once). The MBeans its answers name, together, are at most SIGNALBOX_JOLOKIA_MAX_OBJECTS: each request
    of a POST under it alone let a bulk of 100 pattern reads over 5,000 queues make 227 MB in 47 s."""

    def __init__(self, user: Any, patterns: list[Destination] | None) -> None:
        self.user, self.patterns = user, patterns
        self.broker = runtime.async_broker()
        self.max_objects = int(setting("SIGNALBOX_JOLOKIA_MAX_OBJECTS"))
        self.spent = 0  # MBeans named by the answers so far
        self._broker_values: dict[str, Any] | None = None
        self._listing: list[tuple[Destination, ObjectName]] | None = None
        self.pause = LoopShare().pause  # (between the steps of a scan: common.SLICE_SECONDS)

    def charge(self, count: int, what: str) -> None:
        """Count `count` more MBeans named in the answers, or refuse `what` with the limit's name."""
        if self.spent + count > self.max_objects:
            raise _illegal(f"{what} designates more than the {self.max_objects - self.spent} MBeans left of "
                           f"{self.max_objects} for one HTTP request (SIGNALBOX_JOLOKIA_MAX_OBJECTS): name "
                           "fewer, or attributes without the broker's lists")
        self.spent += count

    async def answer(self, request: Any) -> dict[str, Any]:
        echo: dict[str, Any] | None = None
        try:
            if not isinstance(request, dict):
                raise _illegal("Invalid JSON request: each request is an object")
            kind = request.get("type")
            if not isinstance(kind, str) or not kind:
                raise _illegal("No type given")
            kind = kind.lower()
            if kind in READ_ONLY:
                raise JolokiaError("java.lang.SecurityException",
                                   f"Signalbox's Jolokia view is read-only: {kind} is not served; use "
                                   f"{INSTEAD[kind]}", 403)
            if kind == "version":
                return _ok({"type": "version"}, version())
            if kind not in TYPES:
                raise _illegal(f"No type with name '{request.get('type')}' exists")
            mbean = request.get("mbean")
            if mbean is None:
                raise _illegal("Objectname can not be null")
            if not isinstance(mbean, str) or not mbean:
                raise _illegal("No MBean name given")
            try:
                name = parse(mbean)
            except MalformedObjectName as exc:
                raise _illegal(f"Invalid object name. {exc}") from None
            if kind == "search":
                echo = {"mbean": name.canonical, "type": kind}
                return _ok(echo, [bean.name.canonical for bean in await self.beans(name)])
            # (checked before the request is echoed: Jolokia refuses these as it builds the request)
            attributes = _attributes(request.get("attribute"))
            path = request.get("path")
            if path is not None and not isinstance(path, str):
                raise _illegal("path is a string")
            _path_steps(path)
            echo = {"mbean": name.canonical, "type": kind}
            if attributes:
                echo["attribute"] = attributes[0] if len(attributes) == 1 else attributes
            if path:  # (an empty one is none, as Jolokia echoes it)
                echo["path"] = path
            return _ok(echo, await self.read(name, mbean, request.get("attribute"), attributes, path))
        except JolokiaError as exc:
            return _error(echo, exc)

    async def beans(self, name: ObjectName) -> list[mbeans.Bean]:
        """The MBeans `name` designates that the user may see: the broker's, and destinations'."""
        found = [mbeans.Bean(bean) for bean in (mbeans.BROKER, mbeans.HEALTH) if name.matches(bean)]
        written = name.get("destinationName") or ""
        # (a `_` stands for any of four characters, and `&amp;`, `&qe;`, `&ast;` are also names as written:
        # such a name may designate several destinations, looked for among them all; any other name
        # without a pattern designates the one destination it decodes to, if any: no listing)
        if not name.is_pattern and "_" not in written and "&" not in written:
            exact = mbeans.named_destination(name)
            if exact is not None:
                if not permissions.visible(self.patterns, exact):
                    raise JolokiaError("java.lang.SecurityException",
                                       f"user {self.user.get_username()!r} has no read permission on "
                                       f"{exact.uri}", 403)
                # (only if it exists: a search names what is there, and ActiveMQ's finds nothing for it)
                summary = (await self.broker.summaries([exact]))[0]
                if summary is not None:
                    found.append(mbeans.Bean(mbeans.destination_bean(exact), exact, summary))
        elif name.domain == mbeans.DOMAIN or name.is_pattern:
            left = self.max_objects - self.spent
            for i, (destination, bean) in enumerate(await self.listing()):
                if i % 32 == 31:
                    await self.pause()
                if name.matches(bean):
                    found.append(mbeans.Bean(bean, destination))
                    if len(found) > left:  # (refused as soon as known, before reading any value)
                        break
        self.charge(len(found), name.canonical)
        return found

    async def listing(self) -> list[tuple[Destination, ObjectName]]:
        """The destinations the user may read, with their MBean names: listed once per HTTP request (a
        POST's patterns share it)."""
        if self._listing is None:
            self._listing = []
            for i, uri in enumerate(await self.broker.destinations()):  # (ZSCAN pages: no call reads all)
                if i % 32 == 31:
                    await self.pause()
                destination = parse_destination(uri)
                if permissions.visible(self.patterns, destination):
                    self._listing.append((destination, mbeans.destination_bean(destination)))
        return self._listing

    async def read(self, name: ObjectName, written: str, asked: Any, attributes: list[str],
                   path: str | None) -> Any:
        beans = await self.beans(name)
        if attributes and name.is_pattern:  # (one with none of them is not read: the health's checks)
            beans = [b for b in beans if b.attributes is None or not b.attributes.isdisjoint(attributes)]
        values = await self.values(beans)
        if not name.is_pattern:
            if not values:
                raise _not_found(written)
            chosen = _choose(next(iter(values.values())), attributes, strict=True)
            self.charge(_listed(chosen), name.canonical)
            value = chosen if isinstance(asked, list) or len(attributes) != 1 else chosen[attributes[0]]
            return _walk(value, path)
        out = {}
        wanted = frozenset(attributes)  # (once, not per MBean)
        for i, (bean_name, all_values) in enumerate(values.items()):
            if i % 32 == 31:
                await self.pause()
            chosen = _choose(all_values, wanted if attributes else [], strict=False)
            if chosen:
                self.charge(_listed(chosen), name.canonical)
                out[bean_name] = chosen
        if not out:
            raise _not_found(f"No MBean with pattern {written} found for reading attributes")
        return _walk(out, path)  # (Jolokia's: the path starts at the MBean names)

    async def values(self, beans: list[mbeans.Bean]) -> dict[str, dict[str, Any]]:
        """Each bean's attributes by its canonical name (a destination gone meanwhile left out)."""
        by_uri = {bean.summary.destination: bean.summary for bean in beans if bean.summary is not None}
        destinations = [bean.destination for bean in beans
                        if bean.destination is not None and bean.destination.uri not in by_uri]
        summaries = await self.broker.summaries(destinations) if destinations else []
        by_uri.update((summary.destination, summary) for summary in summaries if summary is not None)
        out: dict[str, dict[str, Any]] = {}
        for i, bean in enumerate(beans):
            if i % 32 == 31:
                await self.pause()
            if bean.name == mbeans.BROKER:
                out[bean.name.canonical] = await self.broker_values()
            elif bean.name == mbeans.HEALTH:
                out[bean.name.canonical] = await self.health_values()
            elif bean.destination is not None and (summary := by_uri.get(bean.destination.uri)) is not None:
                out[bean.name.canonical] = mbeans.destination_attributes(summary, bean.destination)
        return out

    @staticmethod
    async def health_values() -> dict[str, Any]:
        """/healthz's checks (bounded by HEALTH_CHECK_TIMEOUT) and Redis's memory against maxmemory."""
        checks = await health.run_checks()
        return mbeans.health_attributes(checks, *await _store())

    async def broker_values(self) -> dict[str, Any]:
        """The broker's attributes, once per HTTP request (a pass over every destination's row)."""
        if self._broker_values is None:
            # (one index for both: the totals and the lists of one answer from the same pass)
            current = await index(self.broker)
            sums = await totals(self.broker, self.patterns, current)
            # the lists name every readable destination: made in slices (5,000 queues held the loop 25 ms)
            listed: dict[tuple[str, bool], list[dict[str, str]]] = {}
            for i, uri in enumerate(current.rows if current else ()):
                if i % 64 == 63:
                    await self.pause()
                destination = parse_destination(uri)
                if permissions.visible(self.patterns, destination):
                    listed.setdefault((destination.kind, destination.is_temporary), []).append(
                        {"objectName": mbeans.destination_bean(destination).canonical})
            self._broker_values = mbeans.broker_attributes(
                sums, listed, await self.broker.memory(), await _store(),
                await self.broker.connection_counts(), signalbox_version())
        return self._broker_values


async def _store() -> tuple[int, int]:
    """Redis's memory, the store's: (used_memory, maxmemory; 0 when it has none)."""
    memory = await runtime.async_redis().info("memory")
    return int(memory.get("used_memory", 0)), int(memory.get("maxmemory", 0))


def _listed(values: dict[str, Any]) -> int:
    """The MBeans an answer's attributes name (the broker's Queues, Topics, ...: lists of names)."""
    return sum(len(value) for value in values.values() if isinstance(value, list))


def _attributes(asked: Any) -> list[str]:
    if asked is None:
        return []
    names = [asked] if isinstance(asked, str) else asked
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise _illegal("attribute is a name or a list of names")
    return names


def _choose(values: dict[str, Any], attributes: list[str] | frozenset[str], strict: bool) -> dict[str, Any]:
    """The attributes asked for (all when none is named); with `strict`, an unknown one is an error."""
    if not attributes:
        return values
    if strict:
        for name in attributes:
            if name not in values:
                raise JolokiaError("javax.management.AttributeNotFoundException",
                                   f"No such attribute: {name}", 404)
    # (over the MBean's few attributes, not the list asked: a pattern calls this for every MBean it
    # matches, and a POST may name 100,000 attributes)
    asked = attributes if isinstance(attributes, frozenset) else frozenset(attributes)
    return {name: value for name, value in values.items() if name in asked}


def _walk(value: Any, path: str | None) -> Any:
    """The part of a value an inner path names (Jolokia's: keys of a map, indexes of a list, `*` each of
    them, those where the rest finds nothing left out); null when there is no such part."""
    return _steps(value, _path_steps(path))


def _path_steps(path: str | None) -> list[str]:
    steps = split_path(path) if path else []
    if steps and steps[-1] == "*":
        raise _illegal(f"Path '{path}' must not end with a wildcard")
    return steps


def _steps(value: Any, steps: list[str]) -> Any:
    for i, step in enumerate(steps):
        if step == "*":
            rest = steps[i + 1:]
            if isinstance(value, dict):
                found: Any = {k: v for k, inner in value.items() if (v := _steps(inner, rest)) is not None}
            elif isinstance(value, list):
                found = [v for inner in value if (v := _steps(inner, rest)) is not None]
            else:
                return None
            return found or None
        if isinstance(value, dict):
            value = value.get(step)
        elif isinstance(value, list) and _INDEX.fullmatch(step) and int(step) < len(value):
            value = value[int(step)]
        else:
            return None
    return value


# a list index as Java's Integer.parseInt reads one (`00` is 0), not negative; str.isdigit takes `²`,
# which int() refuses
_INDEX = re.compile(r"\+?\d+")


def _ok(echo: dict[str, Any], value: Any) -> dict[str, Any]:
    return {"request": echo, "value": value, "timestamp": int(time.time()), "status": 200}


def _error(echo: dict[str, Any] | None, exc: JolokiaError) -> dict[str, Any]:
    out: dict[str, Any] = {} if echo is None else {"request": echo}
    out.update(error_type=exc.error_type, error=f"{exc.error_type} : {exc.message}", status=exc.status)
    return out


def signalbox_version() -> str:
    try:
        return importlib.metadata.version("signalbox")
    except importlib.metadata.PackageNotFoundError:  # (a checkout not installed)
        return "unknown"


def version() -> dict[str, Any]:
    return {"agent": AGENT, "protocol": PROTOCOL,
            "info": {"product": "signalbox", "vendor": "Signalbox", "version": signalbox_version()}}


def answers(description: str) -> dict[tuple[int, str], OpenApiResponse]:
    """The 200 answers' documentation: JSON as text/plain (Jolokia's default) or, asked for with
    `mimeType`, application/json."""
    body = {"oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}]}
    return {(200, mime): OpenApiResponse(body, description=description) for mime in MIME_TYPES}


class JolokiaView(GatewayView):
    authentication_classes = [BasicAuthentication, TokenAuthentication]
    http_method_names = ["get", "post", "options"]

    @extend_schema(operation_id="jolokia_get", tags=["activemq"],
                   summary="ActiveMQ's Jolokia agent, read side: /read/<mbean>[/<attributes>], "
                           "/search/<pattern>, /version",
                   responses={**answers("Jolokia's answer (its status inside)"), **problems(401)})
    async def get(self, request: Request, path: str = "") -> HttpResponse:
        reader = await self._reader(request)
        # (the gateway routes on the path with %2F and %25 still encoded, gateway/paths.py; Jolokia reads
        # the servlet's, decoded whole: a %2F is a separator there, unless escaped by a `!`)
        decoded = from_segment(path or "")
        asked = from_path(decoded)
        if asked["type"].lower() in ("read", "search") and "mbean" not in asked:
            return _respond(request, _error(None, _illegal(
                f"Invalid arguments in pathinfo /{decoded} for command {asked['type'].upper()}")))
        return _respond(request, await reader.answer(asked))

    @extend_schema(operation_id="jolokia_post", tags=["activemq"],
                   summary="ActiveMQ's Jolokia agent, read side: a request object, or a list of them",
                   request={"application/json": {"oneOf": [{"type": "object"},
                                                            {"type": "array", "items": {"type": "object"}}]}},
                   responses={**answers("Jolokia's answer, or a list of them for a list"), **problems(401)})
    async def post(self, request: Request, path: str = "") -> HttpResponse:
        body = request._request.body
        if len(body) > MAX_BODY_BYTES:
            return _respond(request, _error(None, _illegal(
                f"the request body is {len(body)} bytes, more than {MAX_BODY_BYTES} (MAX_BODY_BYTES)")))
        try:
            parsed = json_input.loads(body)  # (the project's limits: nesting depth, lone surrogates)
        except json_input.InvalidJSON as exc:
            return _respond(request, _error(None, _illegal(f"Invalid JSON request: {exc}")))
        if isinstance(parsed, list) and len(parsed) > MAX_REQUESTS:
            return _respond(request, _error(None, _illegal(
                f"{len(parsed)} requests in one POST, more than {MAX_REQUESTS} (MAX_REQUESTS)")))
        if isinstance(parsed, list):
            for item in parsed:  # (Jolokia reads a bulk whole first: one request without a type fails it all)
                if not isinstance(item, dict) or not isinstance(item.get("type"), str) or not item["type"]:
                    return _respond(request, _error(None, _illegal("No type given")))
                if item["type"].lower() not in TYPES:  # (nor one of an unknown type)
                    return _respond(request, _error(None, _illegal(
                        f"No type with name '{item['type']}' exists")))
        reader = await self._reader(request)
        if isinstance(parsed, list):
            return _respond(request, [await reader.answer(item) for item in parsed])
        return _respond(request, await reader.answer(parsed))

    @staticmethod
    async def _reader(request: Request) -> Reader:
        return Reader(request.user, await db(permissions.readable_patterns, request.user, "read"))


def encode(answer: Any) -> bytes:
    """An answer's body, made on the event loop in one go (bench/adversarial.py's Jolokia cases time it)."""
    return json.dumps(answer).encode()


def _respond(request: Request, answer: Any) -> HttpResponse:
    mime = request.query_params.get("mimeType") or "text/plain"
    response = HttpResponse(encode(answer),
                            content_type=f"{mime if mime in MIME_TYPES else 'text/plain'};charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["Pragma"] = "no-cache"
    response["Expires"] = http_date(time.time() - 3600)  # (Jolokia's: an hour before the answer)
    return response
