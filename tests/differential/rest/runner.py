"""The REST differential scenarios' interpreter: drives ActiveMQ's `/api/message` servlet (when recording)
or Signalbox's (when replaying) through one scenario over plain HTTP, with STOMP on the side where a fact
is only visible there (the JMS headers a POST set), and returns what it observed as facts, normalised as
the STOMP suite's (tests/differential/runner.py): message ids `<message-id:N>` by order of first
appearance (a POST's `messageID`, a GET's `id` and a STOMP `message-id` share the numbering, so "the
message that POST sent" is a fact), the run's unique names back to `{q}` / `{t}` / `{c}`, times `<time>`.

A scenario is data (tests/differential/rest/scenarios/<group>.json): steps.

- `["http", client, METHOD, path, {params}, {options}, fact]`: one request. `params` go in the query
  string (a list value repeats the parameter); options: `body` (text, sent as it is), `headers`
  (Content-Type included: none is added), `form` (fields sent as an application/x-www-form-urlencoded
  body), `json` (the answer is Jolokia's JSON: compared as JSON, `http_fact`), `auth` (`good`, default;
  `none`; `wrong`: the right user, a wrong password). `client` keeps its
  JSESSIONID cookie across requests, as a browser would; client `-` keeps none.
- `["stomp_subscribe", conn, destination]`: a STOMP connection subscribing (auto ack) to a destination,
  confirmed by a RECEIPT before the next step.
- `["stomp_send", conn, destination, {headers}, body]`; `["stomp_expect", conn, seconds, fact]`: the next
  MESSAGE within `seconds` (or `silent`).
- `["http_start", client, METHOD, path, {params}, {options}, fact]`: the same request in a thread of its
  own, for requests that overlap; `["http_wait", fact]` waits for it and records its answer.
- `["sleep", seconds]`.

An HTTP fact is the status, the headers a servlet sets (HEADER_IGNORED leaves out the server's and the
container's own; a Content-Type is a media type and a `charset` fact), whether the answer sets a
JSESSIONID cookie (`cookie`: `set`/`none`), and the body; an error's body is `<error body>` (ActiveMQ's
is Jetty's HTML page with a Java stack trace, Signalbox's a problem document: neither is comparable
text), with its content type kept.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlencode, urlsplit

from tests.differential.runner import Normaliser, Wire

# Headers of the container and the server rather than the servlet: framing, dates, security headers
# (ActiveMQ's jetty.xml and Django's middleware each add their own), DRF's Allow and Vary.
HEADER_IGNORED = frozenset({
    "date", "server", "content-length", "transfer-encoding", "connection", "keep-alive", "set-cookie",
    "x-frame-options", "x-xss-protection", "x-content-type-options", "referrer-policy",
    "cross-origin-opener-policy", "cross-origin-resource-policy", "strict-transport-security",
    "content-security-policy", "vary", "allow",
})
# Headers whose values are message ids.
ID_HEADERS = ("messageid", "id")


class Http:
    """One HTTP client: a connection per request, its own JSESSIONID (unless it keeps no cookie)."""

    def __init__(self, base: str, login: tuple[str, str], keeps_cookie: bool) -> None:
        parts = urlsplit(base)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.login = login
        self.keeps_cookie = keeps_cookie
        self.session: str | None = None

    def request(self, method: str, path: str, params: dict[str, Any], options: dict[str, Any],
                ) -> tuple[int, list[tuple[str, str]], bytes]:
        query = urlencode(params, doseq=True)
        target = path + ("?" + query if query else "")
        headers = dict(options.get("headers", {}))
        auth = options.get("auth", "good")
        if auth != "none":
            password = self.login[1] if auth == "good" else self.login[1] + "-wrong"
            token = base64.b64encode(f"{self.login[0]}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        if self.session is not None:
            headers["Cookie"] = f"JSESSIONID={self.session}"
        body: bytes | None = None
        if "form" in options:
            body = urlencode(options["form"]).encode()
            headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
        elif "body" in options:
            body = options["body"].encode()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.putrequest(method, target, skip_accept_encoding=True)
            for name, value in headers.items():
                conn.putheader(name, value)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            response = conn.getresponse()
            payload = response.read()
            answer_headers = response.getheaders()
        finally:
            conn.close()
        if self.keeps_cookie:
            for name, value in answer_headers:
                if name.lower() == "set-cookie":
                    cookie = SimpleCookie()
                    cookie.load(value)
                    if "JSESSIONID" in cookie:
                        self.session = cookie["JSESSIONID"].value
        return response.status, answer_headers, payload


def http_fact(norm: Normaliser, status: int, headers: list[tuple[str, str]],
              payload: bytes, as_json: bool = False) -> dict[str, Any]:
    """With `as_json` (a Jolokia answer), the body is the JSON it holds, its keys sorted, every
    `timestamp` `<time>` and every list of names sorted (a search's: Jolokia's order is a hash set's),
    and an Expires header (Jolokia's is an hour before the answer) `<date>`."""
    out: dict[str, Any] = {"status": status}
    cookie = "none"
    for name, value in headers:
        lowered = name.lower()
        if lowered == "set-cookie" and value.startswith("JSESSIONID="):
            cookie = "set"
        if lowered in HEADER_IGNORED or lowered in out:
            continue
        if lowered in ID_HEADERS:
            value = norm.id("message-id", value)
        elif lowered == "expires" and as_json:
            value = "<date>"
        elif lowered == "content-type":  # the media type and the charset are two facts
            media, _, charset = value.replace(" ", "").lower().partition(";charset=")
            out["charset"] = charset or "<none>"
            value = media
        out[lowered] = norm.text(value)
    out["cookie"] = cookie
    text = payload.decode("utf-8", "replace")
    if as_json and status < 400:
        text = json.dumps(_timeless(json.loads(text)), sort_keys=True)
    out["body"] = ("<error body>" if text else "") if status >= 400 else norm.text(text)
    return out


def _timeless(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "<time>" if k == "timestamp" else _timeless(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [_timeless(v) for v in value]
        return sorted(items) if all(isinstance(v, str) for v in items) else items
    return value


def run(scenario: dict[str, Any], base: str, stomp_url: str, login: tuple[str, str]) -> dict[str, Any]:
    """Run one scenario against the servlet at `base` (http://host:port) and the same broker's STOMP at
    `stomp_url`; returns {fact name: normalised observation}."""
    suffix = uuid.uuid4().hex[:8]
    names = {"q": f"rq{suffix}", "t": f"rt{suffix}", "c": f"rc{suffix}"}
    norm = Normaliser(names)
    facts: dict[str, Any] = {}
    clients: dict[str, Http] = {}
    wires: dict[str, Wire] = {}
    started: dict[str, Future] = {}
    pool = ThreadPoolExecutor(max_workers=4)

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return value.format(**names)
        if isinstance(value, list):
            return [fill(v) for v in value]
        if isinstance(value, dict):
            return {fill(k): fill(v) for k, v in value.items()}
        return value

    def stomp(conn: str) -> Wire:
        if conn not in wires:
            wire = wires[conn] = Wire(stomp_url)
            wire.send("CONNECT", [("accept-version", "1.2"), ("host", "localhost"), ("login", login[0]),
                                  ("passcode", login[1])])
            frame = wire.receive(5)
            if frame is None or frame.command != "CONNECTED":
                raise RuntimeError(f"STOMP connection {conn} refused: {frame!r}")
        return wires[conn]

    try:
        for step in scenario["steps"]:
            kind = step[0]
            if kind == "http":
                client, method, path, params, options, fact = step[1:]
                if client not in clients:
                    clients[client] = Http(base, login, keeps_cookie=client != "-")
                status, headers, payload = clients[client].request(method, fill(path), fill(params),
                                                                   fill(options))
                facts[fact] = http_fact(norm, status, headers, payload, bool(options.get("json")))
            elif kind == "http_start":
                client, method, path, params, options, fact = step[1:]
                if client not in clients:
                    clients[client] = Http(base, login, keeps_cookie=client != "-")
                started[fact] = pool.submit(clients[client].request, method, fill(path), fill(params),
                                            fill(options))
            elif kind == "http_wait":
                facts[step[1]] = http_fact(norm, *started.pop(step[1]).result(timeout=60))
            elif kind == "stomp_subscribe":
                wire = stomp(step[1])
                wire.send("SUBSCRIBE", [("id", "s"), ("destination", fill(step[2])), ("ack", "auto"),
                                        ("receipt", "sub")])
                frame = wire.receive(5)
                if frame is None or frame.command != "RECEIPT":
                    raise RuntimeError(f"SUBSCRIBE on {step[1]} not confirmed: {frame!r}")
            elif kind == "stomp_send":
                stomp(step[1]).send("SEND", [("destination", fill(step[2])), *fill(step[3]).items()],
                                    fill(step[4]).encode())
            elif kind == "stomp_expect":
                facts[step[3]] = norm.frame(stomp(step[1]).receive(step[2]))
            elif kind == "sleep":
                time.sleep(step[1])
            else:
                raise ValueError(f"unknown step {step!r}")
    finally:
        pool.shutdown(wait=True)
        for wire in wires.values():
            wire.close()
    return facts
