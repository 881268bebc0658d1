"""stomp.py's WebSocket transport as the tests use it: a connection whose listener queues every frame, so
a test reads MESSAGE / RECEIPT / ERROR frames in order with a timeout."""

from __future__ import annotations

import contextlib
import queue
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import stomp
from stomp.adapter.ws import WSStompConnection

from gateway.stomp.frames import Frame, FrameParser, encode


@dataclass
class Received:
    command: str
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None


class QueueListener(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.frames: queue.Queue[Received] = queue.Queue()
        self.heart_beats = 0
        self.disconnected = False
        self.connected: dict[str, str] = {}

    def on_connected(self, frame: Any) -> None:
        self.connected = dict(frame.headers)

    def on_message(self, frame: Any) -> None:
        self.frames.put(Received("MESSAGE", dict(frame.headers), frame.body))

    def on_receipt(self, frame: Any) -> None:
        self.frames.put(Received("RECEIPT", dict(frame.headers), frame.body))

    def on_error(self, frame: Any) -> None:
        self.frames.put(Received("ERROR", dict(frame.headers), frame.body))

    def on_heartbeat(self) -> None:
        self.heart_beats += 1

    def on_disconnected(self) -> None:
        self.disconnected = True
        self.frames.put(Received("DISCONNECTED"))


class Client:
    """One stomp.py connection: over WebSocket to a gateway's /stomp, or over TCP to a STOMP listener
    (`tcp=True`, stomp.py's default transport)."""

    def __init__(self, port: int, *, heartbeats: tuple[int, int] = (0, 0), binary_mode: bool = False,
                 tcp: bool = False) -> None:
        if tcp:
            self.conn: Any = stomp.Connection12([("127.0.0.1", port)], heartbeats=heartbeats,
                                                reconnect_attempts_max=1, auto_decode=False)
        else:
            self.conn = WSStompConnection([("127.0.0.1", port)], ws_path="/stomp", heartbeats=heartbeats,
                                          reconnect_attempts_max=1, auto_decode=False,
                                          binary_mode=binary_mode)
        self.listener = QueueListener()
        self.conn.set_listener("test", self.listener)

    def connect(self, login: str = "alice", passcode: str = "secret", **headers: str) -> Client:
        self.conn.connect(login, passcode, wait=True, headers=headers)
        return self

    def next(self, timeout: float = 5) -> Received:
        try:
            return self.listener.frames.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no frame within {timeout} s") from None

    def expect(self, command: str, timeout: float = 5) -> Received:
        frame = self.next(timeout)
        assert frame.command == command, f"expected {command}, got {frame}"
        return frame

    def messages(self, n: int, timeout: float = 5) -> list[Received]:
        return [self.expect("MESSAGE", timeout) for _ in range(n)]

    def silent(self, seconds: float = 0.3) -> bool:
        """Nothing arrives within `seconds`."""
        time.sleep(seconds)
        return self.listener.frames.empty()

    def receipt(self, send: Any, *args: Any, **kwargs: Any) -> Received:
        """Call a stomp.py method with a receipt and wait for it."""
        rid = f"r-{time.monotonic_ns()}"
        send(*args, receipt=rid, **kwargs)
        frame = self.expect("RECEIPT")
        assert frame.headers["receipt-id"] == rid
        return frame

    def close(self) -> None:
        try:
            if self.conn.is_connected():
                self.conn.disconnect()
        except Exception:
            pass


def goes_on(conn: RawStomp | RawTcp) -> bool:
    """The connection still answers after an ERROR (ActiveMQ's non-fatal errors): a BEGIN and an ABORT,
    each answered by its RECEIPT, and nothing else written."""
    for command, receipt in (("BEGIN", "goes-on-begin"), ("ABORT", "goes-on-abort")):
        conn.send(command, {"transaction": "goes-on", "receipt": receipt})
        answer = conn.receive()
        if answer.command != "RECEIPT" or answer.get("receipt-id") != receipt:
            return False
    return True


class RawStomp:
    """A hand-driven STOMP connection over the `websockets` client, for what stomp.py cannot send:
    STOMP 1.0/1.1, exact bytes, malformed frames, silence."""

    def __init__(self, url: str, version: str = "1.2", subprotocols: list[str] | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        from websockets.sync.client import connect

        from gateway.stomp.frames import FrameParser

        self.ws = connect(url, subprotocols=subprotocols, open_timeout=5, ssl=tls)  # type: ignore[arg-type]
        self.ws.__enter__()  # the sync client warns when not used as a context manager
        self.version = version
        self.parser = FrameParser(version)
        self.pending: list[Any] = []
        self.heart_beats = 0

    @property
    def subprotocol(self) -> str | None:
        return self.ws.subprotocol

    def send(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        from gateway.stomp.frames import encode

        self.ws.send(encode(command, list((headers or {}).items()), body, self.version))

    def send_raw(self, data: bytes) -> None:
        self.ws.send(data)

    def receive(self, timeout: float = 5) -> Any:
        while not self.pending:
            data = self.ws.recv(timeout)
            if isinstance(data, str):
                data = data.encode()
            if data.strip(b"\r\n") == b"":
                self.heart_beats += 1
                continue
            self.pending += self.parser.feed(data)
        return self.pending.pop(0)

    def expect(self, command: str, timeout: float = 5) -> Any:
        frame = self.receive(timeout)
        assert frame.command == command, f"expected {command}, got {frame}"
        return frame

    def connect(self, version: str | None = "1.2", **headers: str) -> Any:
        all_headers = {"login": "alice", "passcode": "secret", "host": "localhost"}
        if version is not None:
            all_headers["accept-version"] = version
        all_headers.update({k.replace("_", "-"): v for k, v in headers.items()})
        self.send("CONNECT", all_headers)
        frame = self.expect("CONNECTED")
        self.version = self.parser.version = frame.get("version") or "1.0"
        return frame

    def closed_within(self, timeout: float = 5) -> bool:
        """The server closes the socket within `timeout` (frames still arriving are skipped)."""
        from websockets.exceptions import ConnectionClosed

        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self.ws.recv(max(0.01, deadline - time.monotonic()))
        except ConnectionClosed:
            return True
        except TimeoutError:
            return False
        return False

    def close(self) -> None:
        self.ws.close()


class RawTcp:
    """A hand-driven STOMP 1.2 connection over a plain (or TLS) socket: exact bytes, split anywhere.
    Heart-beats are read and dropped; `timeout` is how long `expect` waits by default; `source` another
    loopback address to connect from (another client host, as the server sees it)."""

    def __init__(self, port: int, tls: ssl.SSLContext | None = None, *, login: str = "alice",
                 passcode: str = "secret", timeout: float = 5, source: str | None = None) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5,
                                        source_address=(source, 0) if source else None)
        self.sock = tls.wrap_socket(sock, server_hostname="localhost") if tls else sock
        self.parser = FrameParser("1.2")
        self.pending: list[Frame] = []
        self.login, self.passcode, self.timeout = login, passcode, timeout

    def send(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.sock.sendall(encode(command, list((headers or {}).items()), body))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, **headers: str) -> Frame:
        self.send("CONNECT", {"accept-version": "1.2", "login": self.login, "passcode": self.passcode,
                              "host": "x", **headers})
        return self.expect("CONNECTED")

    def receive(self, timeout: float | None = None) -> Frame:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.pending:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the server")
            self.pending += self._frames(data)
        return self.pending.pop(0)

    def _frames(self, data: bytes) -> list[Frame]:
        """The frames `data` completes (heart-beats dropped)."""
        return [f for f in self.parser.feed(data) if f.command]

    def expect(self, command: str, timeout: float | None = None) -> Frame:
        frame = self.receive(timeout)
        assert frame.command == command, f"expected {command}, got {frame}"
        return frame

    def closed_within(self, seconds: float) -> bool:
        """The server closes the socket within `seconds` (frames still queued are read and dropped)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if not self.sock.recv(65536):
                    return True
            except TimeoutError:
                return False
            except OSError:
                return True
        return False

    def close(self) -> None:
        self.sock.close()


class RawWsSocket(RawTcp):
    """A hand-driven STOMP 1.2 connection over WebSocket on a blocking socket of its own (websockets' sans-I/O
    client): nothing reads it in the background, so a client that stops calling `receive` leaves the data in
    the kernel, and `rcvbuf` (set before connecting: the window the socket offers) keeps that small. The
    same calls as RawTcp."""

    def __init__(self, port: int, *, rcvbuf: int | None = None, timeout: float = 5, path: str = "/stomp",
                 subprotocol: str | None = "v12.stomp") -> None:
        from websockets.client import ClientProtocol
        from websockets.protocol import State
        from websockets.typing import Subprotocol
        from websockets.uri import parse_uri

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(5)
        self.sock.connect(("127.0.0.1", port))
        protocols = [Subprotocol(subprotocol)] if subprotocol else None
        self.ws = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}{path}"), subprotocols=protocols,
                                 max_size=None)
        self.ws.send_request(self.ws.connect())
        self._send_pending()
        self.parser = FrameParser("1.2")
        self.pending: list[Frame] = []
        self.login, self.passcode, self.timeout = "alice", "secret", timeout
        while self.ws.handshake_exc is None and self.ws.state is State.CONNECTING:  # the server's answer
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the server during the handshake")
            self.ws.receive_data(data)
        if self.ws.handshake_exc is not None:
            raise self.ws.handshake_exc

    def _send_pending(self) -> None:
        for data in self.ws.data_to_send():
            if data:  # (b"": the protocol asks for a half-close, which the tests never need)
                self.sock.sendall(data)

    def send(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.send_text(encode(command, list((headers or {}).items()), body))

    def send_text(self, data: bytes) -> None:
        """One WebSocket text message (a STOMP frame, or a request of the JSON protocol at /ws/v1)."""
        self.ws.send_text(data)
        self._send_pending()

    def _frames(self, data: bytes) -> list[Frame]:
        from websockets.frames import Frame as WsFrame
        from websockets.frames import Opcode

        self.ws.receive_data(data)
        frames: list[Frame] = []
        for event in self.ws.events_received():
            if isinstance(event, WsFrame) and event.opcode in (Opcode.TEXT, Opcode.BINARY):
                frames += [f for f in self.parser.feed(bytes(event.data)) if f.command]
        with contextlib.suppress(OSError):  # (a pong, a close: the server may be gone)
            self._send_pending()
        return frames
