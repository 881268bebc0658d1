"""The clients bench/versus_activemq.py drives both brokers with: STOMP 1.2 over TCP or WebSocket and
plain HTTP/1.1, each as thin as it can be, so the figures are the brokers' and not a client library's.

The same client talks to ActiveMQ and to Signalbox; only addresses and credentials differ (`Target`).
"""

from __future__ import annotations

import base64
import http.client
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import websocket  # websocket-client, which stomp.py's WebSocket transport brings


@dataclass
class Target:
    """One broker the cases run against. `rest_native` is Signalbox's /api/v1 token (None for ActiveMQ,
    whose REST is the MessageServlet only); `ws_url` / `http_url` are None where the broker has no such
    endpoint (Debian's package alone: STOMP over TCP only)."""

    name: str
    stomp_port: int
    login: str
    passcode: str
    ws_url: str | None = None
    http_url: str | None = None
    rest_native: str | None = None
    signalbox: bool = False
    facts: dict[str, str] = field(default_factory=dict)
    redis_port: int | None = None  # Signalbox's embedded server's port (its children use its unix socket)
    # STOMP over WebSocket on the STOMP listener's own port (Signalbox; transport "wsport"); None: the
    # broker's one WebSocket endpoint, `ws_url`, serves that transport too (ActiveMQ's ws:// connector)
    ws_port_url: str | None = None


Frame = tuple[str, dict[str, str], bytes]


def encode(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    head = "".join(f"{k}:{v}\n" for k, v in headers.items())
    return f"{command}\n{head}\n".encode() + body + b"\x00"


class FrameBuffer:
    """STOMP frames out of a byte stream: a frame may span reads and one read may hold many (Signalbox may
    pack several frames into one WebSocket message; ActiveMQ sends one per message). Heart-beat EOLs
    between frames are skipped; a body ends at `content-length` when given, else at the first NUL."""

    def __init__(self) -> None:
        self.buf = b""
        self.pos = 0

    def feed(self, data: bytes) -> None:
        self.buf = self.buf[self.pos:] + data
        self.pos = 0

    def pop(self) -> Frame | None:
        buf, pos = self.buf, self.pos
        while pos < len(buf) and buf[pos] in (10, 13):
            pos += 1
        self.pos = pos
        end = buf.find(b"\n\n", pos)
        if end < 0:
            return None
        lines = buf[pos:end].decode().split("\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            key, sep, value = line.rstrip("\r").partition(":")
            if sep:
                headers.setdefault(key, value)  # STOMP 1.2: the first of repeated headers wins
        start = end + 2
        if "content-length" in headers:
            stop = start + int(headers["content-length"])
            if len(buf) <= stop:
                return None
        else:
            stop = buf.find(b"\x00", start)
            if stop < 0:
                return None
        self.pos = stop + 1
        return lines[0].rstrip("\r"), headers, buf[start:stop]


class Stomp:
    """A STOMP 1.2 connection over TCP (transport "tcp") or over WebSocket ("ws": the broker's `ws_url`;
    "wsport": its `ws_port_url` where it has one), subprotocol v12.stomp, one frame per text message."""

    def __init__(self, target: Target, transport: str, timeout: float = 60) -> None:
        self.frames = FrameBuffer()
        if transport == "tcp":
            self.sock: socket.socket | None = socket.create_connection(("127.0.0.1", target.stomp_port),
                                                                       timeout=timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.ws = None
        elif transport in ("ws", "wsport"):
            url = target.ws_port_url if transport == "wsport" and target.ws_port_url else target.ws_url
            if url is None:
                raise RuntimeError(f"{target.name} has no STOMP over WebSocket endpoint")
            self.sock = None
            # No Origin header, as a server-side client sends none (Signalbox checks Origin for browsers).
            self.ws = websocket.create_connection(url, subprotocols=["v12.stomp"], timeout=timeout,
                                                  suppress_origin=True,
                                                  sockopt=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        else:
            raise ValueError(f"unknown transport {transport!r}")
        self.frame("CONNECT", {"accept-version": "1.2", "host": "localhost", "login": target.login,
                               "passcode": target.passcode, "heart-beat": "0,0"})
        command, headers, _ = self.read()
        if command != "CONNECTED":
            raise RuntimeError(f"CONNECT refused by {target.name}: {command} {headers}")

    def send_bytes(self, data: bytes) -> None:
        """Raw encoded frames: over TCP any number at once, over WebSocket exactly one."""
        if self.sock is not None:
            self.sock.sendall(data)
        else:
            self.ws.send(data.decode(), opcode=websocket.ABNF.OPCODE_TEXT)

    def frame(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_bytes(encode(command, headers, body))

    def read(self) -> Frame:
        while True:
            frame = self.frames.pop()
            if frame is not None:
                return frame
            if self.sock is not None:
                data = self.sock.recv(1 << 20)
                if not data:
                    raise ConnectionError("closed")
            else:
                message = self.ws.recv()
                data = message.encode() if isinstance(message, str) else message
            self.frames.feed(data)

    def read_until(self, command: str) -> Frame:
        """The next `command` frame; an ERROR first raises with its message."""
        while True:
            frame = self.read()
            if frame[0] == command:
                return frame
            if frame[0] == "ERROR":
                raise RuntimeError(f"ERROR {frame[1].get('message', '')}: {frame[2][:200]!r}")

    def close(self) -> None:
        try:
            self.frame("DISCONNECT", {"receipt": "bye"})
            self.read_until("RECEIPT")
        except (OSError, RuntimeError, websocket.WebSocketException):
            pass
        if self.sock is not None:
            self.sock.close()
        else:
            self.ws.close()


class Http:
    """One keep-alive HTTP/1.1 connection (the standard library's http.client), with HTTP Basic or a token,
    and the JSESSIONID cookie kept as a browser would (the MessageServlet keeps a GET's consumer in the
    session it names)."""

    def __init__(self, base_url: str, authorization: str) -> None:
        parts = urlsplit(base_url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        self.authorization = authorization
        self.cookie: str | None = None

    @staticmethod
    def basic(login: str, passcode: str) -> str:
        return "Basic " + base64.b64encode(f"{login}:{passcode}".encode()).decode()

    def call(self, method: str, path: str, body: bytes | None = None,
             content_type: str = "text/plain") -> tuple[int, bytes]:
        headers = {"Authorization": self.authorization}
        if body is not None:
            headers["Content-Type"] = content_type
        if self.cookie:
            headers["Cookie"] = self.cookie
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        data = response.read()
        for value in response.headers.get_all("Set-Cookie") or ():
            pair = value.split(";", 1)[0].strip()
            if pair.upper().startswith("JSESSIONID="):
                self.cookie = pair
        return response.status, data

    def close(self) -> None:
        self.connection.close()
