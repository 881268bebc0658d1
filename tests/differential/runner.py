"""The differential scenarios' interpreter: drives a STOMP server (ActiveMQ when recording, Signalbox when
replaying) through one scenario and returns what it observed as facts, normalised so that two brokers can
be compared: message ids and sessions become `<message-id:N>` / `<session:N>` by order of first
appearance within the scenario (so that "the same message again" stays a fact), ack ids `<ack>`, times
`<time>`, frames that must not arrive `silent`.

A scenario is data (tests/differential/scenarios/<group>.json): named connections and steps. Steps:

- `["connect", conn, {headers}]`: open connection `conn` (CONNECT accept-version 1.2 unless given); the
  CONNECTED frame is a fact named `<conn>.connected`.
- `["frame", conn, COMMAND, {headers}, body]`: send a frame. Header values may name an earlier value
  with `$name` (set by `save`).
- `["expect", conn, fact]`: the next frame on `conn` is fact `fact` (command, then headers).
- `["expect_sorted", conn, n, fact]`: the next `n` frames, in an order-free form (sorted).
- `["silent", conn, seconds, fact]`: whether nothing arrives within `seconds` (`silent`, or the frame).
- `["collect", conn, seconds, fact]`: every frame until none arrives for `seconds`, in order.
- `["drain", conn, seconds]`: read and forget every frame until none arrives for `seconds` (what an
  advisory topic replays of the broker's earlier state, which differs between brokers and runs).
- `["save", conn, fact, header, name]`: keep a header of a recorded frame under `$name`.
- `["header", fact, header, name]`: the value of a header of a recorded frame as fact `name` (`absent`
  when it has none), for a header left out of comparison in general (`heart-beat`: what a CONNECTED
  answers to the client's own `heart-beat` is behaviour; the default is each server's choice).
- `["open", conn]`: open connection `conn` and send nothing (for frames before CONNECT).
- `["raw", conn, text]`: send `text` (UTF-8, names filled in as above) exactly as written, for what the
  frame encoder would not write (STOMP 1.0 spaces after the colon, undefined escapes, CR LF, ...).
  `["raw", conn, text, {"<mark>": [piece, n]}]` first writes `piece` n times in place of `<mark>`, each
  `<n>` in it the count from 0 (for frames over a limit, or many SENDs in one write; names are filled in
  the pieces too).
- `["close", conn]`: drop the connection without DISCONNECT; `["sleep", seconds]`.

Each destination name written `{q}` / `{t}` (and client id `{c}`) is made unique per run, so runs do not
see each other; `{future}` is an expiry ten minutes ahead, `{soon}` one second after the step that names it
(for messages that must expire while the scenario waits), `{login}` / `{passcode}` the run's credentials
(for a CONNECT or STOMP frame the scenario writes itself). Advisory bodies are each broker's own document
(ActiveMQ's XStream JSON, Signalbox's documented JSON): only their presence and form (`<advisory>`, or
`<advisory xml>` for an XML document) are facts.
"""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from typing import Any

from gateway.stomp.frames import Frame, FrameParser, encode

# Headers whose values vary per run; replaced by stable placeholders.
ID_HEADERS = ("message-id", "session")
TIME_HEADERS = ("timestamp", "expires")
# Headers left out of comparison: framing (content-length is ActiveMQ's choice to always send), the
# server's name, the text/plain ERROR type, and the ERROR body (ActiveMQ's is a Java stack trace).
IGNORED = frozenset({"content-length", "server", "content-type-error", "heart-beat"})


class Wire:
    """One STOMP connection over TCP (`tcp://host:port`) or WebSocket (`ws://...`)."""

    def __init__(self, url: str) -> None:
        self.parser = FrameParser("1.2")
        self.pending: list[Frame] = []
        self.ws: Any = None
        self.sock: socket.socket | None = None
        self.closed = False
        if url.startswith("tcp://"):
            host, port = url[6:].rsplit(":", 1)
            self.sock = socket.create_connection((host, int(port)), timeout=5)
        else:
            from websockets.sync.client import connect

            self.ws = connect(url, open_timeout=5)
            self.ws.__enter__()

    def send(self, command: str, headers: list[tuple[str, str]], body: bytes = b"") -> None:
        self.send_bytes(encode(command, headers, body, "1.2"))

    def send_bytes(self, data: bytes) -> None:
        try:
            if self.sock is not None:
                self.sock.sendall(data)
            else:
                self.ws.send(data)
        except Exception:
            self.closed = True

    def receive(self, timeout: float) -> Frame | None:
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                return None
            try:
                if self.sock is not None:
                    self.sock.settimeout(left)
                    data = self.sock.recv(65536)
                    if not data:
                        self.closed = True
                        return None
                else:
                    data = self.ws.recv(left)
                    if isinstance(data, str):
                        data = data.encode()
            except TimeoutError:
                return None
            except Exception:
                self.closed = True
                return None
            self.pending += self.parser.feed(data)
        return self.pending.pop(0)

    def close(self) -> None:
        try:
            if self.sock is not None:
                self.sock.close()
            else:
                self.ws.close()
        except Exception:
            pass


class Normaliser:
    """Per scenario: the same id gets the same placeholder wherever it appears."""

    def __init__(self, names: dict[str, str] | None = None) -> None:
        self.ids: dict[str, str] = {}
        self.names = {value: f"{{{key}}}" for key, value in (names or {}).items()
                      if key not in ("future", "soon", "login", "passcode")}

    def text(self, value: str) -> str:
        """The run's unique names back to their placeholders, wherever they appear."""
        for name, placeholder in self.names.items():
            value = value.replace(name, placeholder)
        return value

    def id(self, kind: str, value: str) -> str:
        """`<kind:N>`: N counts the distinct values of that kind (message ids, sessions) in the run."""
        key = f"{kind}\0{value}"
        if key not in self.ids:
            self.ids[key] = f"<{kind}:{sum(k.startswith(kind + chr(0)) for k in self.ids) + 1}>"
        return self.ids[key]

    def frame(self, frame: Frame | None) -> dict[str, Any] | str:
        if frame is None:
            return "silent"
        out: dict[str, Any] = {"command": frame.command}
        for name, value in frame.headers:
            if name in IGNORED or name in out:
                continue
            if frame.command == "ERROR" and name == "content-type":
                continue
            if name == "ack":  # opaque: ActiveMQ makes one per delivery, Signalbox uses the message id
                value = "<ack>"
            elif name in ID_HEADERS:
                value = self.id(name, value)
            elif name in ("originBrokerId", "originBrokerURL"):
                value = "<broker>"
            elif name in TIME_HEADERS and value != "0":
                value = "<time>"
            out[name] = self.text(value)
        if frame.command == "MESSAGE" and "ActiveMQ.Advisory." in (frame.get("destination") or ""):
            # the document's form (XML when the subscription asked for it), not its content
            out["body"] = ("<advisory xml>" if frame.body.lstrip().startswith(b"<") else "<advisory>") \
                if frame.body else ""
        elif frame.command != "ERROR" and frame.command != "CONNECTED":
            out["body"] = self.text(frame.body.decode("utf-8", "replace"))
        return out


def run(scenario: dict[str, Any], url: str, login: tuple[str, str], wait: float = 0.4) -> dict[str, Any]:
    """Run one scenario against the server at `url`; returns {fact name: normalised observation}."""
    suffix = uuid.uuid4().hex[:8]
    names = {"q": f"dq{suffix}", "t": f"dt{suffix}", "c": f"dc{suffix}",
             "future": str(int(time.time() * 1000) + 600_000), "login": login[0], "passcode": login[1]}
    wires: dict[str, Wire] = {}
    saved: dict[str, str] = {}
    norm = Normaliser(names)
    facts: dict[str, Any] = {}
    raw: dict[str, Frame | None] = {}

    def fill(text: str) -> str:
        names["soon"] = str(int(time.time() * 1000) + 1000)
        text = text.format(**names)
        return re.sub(r"\$(\w+)", lambda m: saved.get(m.group(1), m.group(0)), text)

    def record(fact: str, frame: Frame | None) -> None:
        raw[fact] = frame
        facts[fact] = norm.frame(frame)

    try:
        for step in scenario["steps"]:
            kind = step[0]
            if kind == "connect":
                conn, headers = step[1], dict(step[2] if len(step) > 2 else {})
                wire = wires[conn] = Wire(url)
                all_headers = {"accept-version": "1.2", "host": "localhost", "login": login[0],
                               "passcode": login[1]}
                all_headers.update({k: fill(v) for k, v in headers.items()})
                wire.send("CONNECT", list(all_headers.items()))
                record(f"{conn}.connected", wire.receive(5))
            elif kind == "open":
                wires[step[1]] = Wire(url)
            elif kind == "frame":
                conn, command, headers = step[1], step[2], step[3]
                body = fill(step[4]).encode() if len(step) > 4 else b""
                wires[conn].send(command, [(k, fill(v)) for k, v in headers.items()], body)
            elif kind == "expect":
                record(step[2], wires[step[1]].receive(5))
            elif kind == "expect_sorted":
                frames = [wires[step[1]].receive(5) for _ in range(step[2])]
                values = [norm.frame(f) for f in frames]
                facts[step[3]] = sorted(values, key=lambda v: json.dumps(v, sort_keys=True))
            elif kind == "collect":
                frames = []
                while (frame := wires[step[1]].receive(step[2])) is not None:
                    frames.append(frame)
                facts[step[3]] = [norm.frame(f) for f in frames]
            elif kind == "drain":
                while wires[step[1]].receive(step[2]) is not None:
                    pass
            elif kind == "silent":
                record(step[3], wires[step[1]].receive(step[2]))
            elif kind == "save":
                frame = raw.get(step[2])
                if frame is not None and frame.get(step[3]) is not None:
                    saved[step[4]] = frame.get(step[3]) or ""
            elif kind == "header":
                frame = raw.get(step[1])
                value = frame.get(step[2]) if frame is not None else None
                facts[step[3]] = "absent" if value is None else norm.text(value)
            elif kind == "raw":
                text = step[2]
                for mark, (piece, times) in (step[3] if len(step) > 3 else {}).items():
                    text = text.replace(mark, "".join(piece.replace("<n>", str(n)) for n in range(times)))
                wires[step[1]].send_bytes(fill(text).encode())
            elif kind == "close":
                wires.pop(step[1]).close()
            elif kind == "sleep":
                time.sleep(step[1])
            else:
                raise ValueError(f"unknown step {step!r}")
    finally:
        for wire in wires.values():
            wire.close()
    return facts


def flatten(facts: dict[str, Any]) -> dict[str, Any]:
    """One observable fact per frame header (and per frame that must not arrive): what is counted and
    compared."""
    flat: dict[str, Any] = {}
    for name, value in facts.items():
        if isinstance(value, dict):
            for header, v in value.items():
                flat[f"{name}.{header}"] = v
            flat[f"{name}.headers"] = sorted(value)
        elif isinstance(value, list):
            flat[f"{name}.count"] = len(value)
            for n, item in enumerate(value):
                if isinstance(item, dict):
                    for header, v in item.items():
                        flat[f"{name}[{n}].{header}"] = v
                    # (which headers, as for one frame: a header only one broker sends is a difference;
                    # golden files recorded before this lack these facts and are not compared on them)
                    flat[f"{name}[{n}].headers"] = sorted(item)
                else:
                    flat[f"{name}[{n}]"] = item
        else:
            flat[name] = value
    return flat
