"""STOMP over WebSocket on the STOMP listener's own port (gateway/stomp/ws_port.py, ActiveMQ's ws://
connector) with real sockets: what the WebSocket adds to the session every transport shares
(tests/gateway_ws/test_stomp_protocol.py runs every stomp.py test over it as well): the handshake and its
subprotocols, messages split into fragments or holding many frames, text and binary messages, the limits,
pings and the close, a slow reader. The WebSocket framing is fuzzed from a raw socket. The connection
limit, TLS (wss) and a listener killed mid-stream: tests/gateway_ws/test_stomp_tcp.py, over both. The
message limits before and after login run against the web server's /stomp and /ws/v1 too."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import ssl
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode

from gateway.stomp.frames import BEFORE_CONNECT, FrameParser, encode
from gateway.ws.message_limits import MAX_MESSAGE, MAX_MESSAGE_BEFORE_LOGIN
from tests.helpers.stomp_client import RawStomp

pytestmark = pytest.mark.e2e


@pytest.fixture
def raw(stomp_listener, closing):
    """Factory of hand-driven connections to the listener's WebSocket port, closed at the end."""

    def make(path: str = "/stomp", subprotocols: list[str] | None = None) -> RawStomp:
        return closing(RawStomp(f"ws://127.0.0.1:{stomp_listener.ws_port}{path}", subprotocols=subprotocols))

    return make


def _q() -> str:
    return f"/queue/wsport{uuid.uuid4().hex[:10]}"


# -- the handshake ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("offered", "chosen"), [
    (["v10.stomp", "v11.stomp"], "v11.stomp"), (["stomp", "v12.stomp"], "v12.stomp"), (["stomp"], "stomp"),
    (None, None), (["mqtt"], None)])
def test_the_highest_stomp_subprotocol_offered_is_chosen(raw, offered, chosen):
    conn = raw(subprotocols=offered)
    assert conn.subprotocol == chosen
    assert conn.connect().get("version") == "1.2"


@pytest.mark.parametrize("path", ["/", "/stomp", "/any/path?x=1"])
def test_any_path_is_served(raw, path):
    """ActiveMQ maps its WebSocket servlet at "/": clients written for it name any path."""
    assert raw(path).connect().get("session", "").startswith("ws-")  # named for its transport


def _raw_socket(port: int, tls: ssl.SSLContext | None = None,
                receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket()
    if receive_buffer is not None:  # (set before connecting: the window offered)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    return tls.wrap_socket(sock, server_hostname="localhost") if tls is not None else sock


def _read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    """What the server writes until it closes the connection (a reset counts as closed: a server that closes
    with bytes it has not read resets); TimeoutError when it does not within `timeout`."""
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /stomp HTTP/1.1\r\nHost: localhost\r\n\r\n", b"426"),  # plain HTTP: "Upgrade Required"
    (b"POST /stomp HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n", None),
    (b"\x00\x16\x03\x01garbage\r\n\r\n", None),  # (a TLS hello, or noise)
    (b"GET /" + b"x" * 70_000 + b" HTTP/1.1\r\n\r\n", None),  # a request line past websockets' limit
])
def test_a_request_that_is_no_websocket_upgrade_is_refused_and_closed(stomp_listener, request_bytes, status):
    sock = _raw_socket(stomp_listener.ws_port)
    try:
        with contextlib.suppress(OSError):  # (the server may close before it has read all)
            sock.sendall(request_bytes)
        answer = _read_until_closed(sock, 5)  # (a timeout here: never closed)
        assert b" 101 " not in answer.partition(b"\r\n")[0], answer[:200]
        if status is not None:
            assert answer.startswith(b"HTTP/1.1 " + status + b" "), answer[:200]
    finally:
        sock.close()


def test_a_client_that_never_finishes_its_handshake_is_cut_off(listener):
    server = listener(SIGNALBOX_STOMP_CONNECT_TIMEOUT="1")
    sock = _raw_socket(server.ws_port)
    try:
        sock.sendall(b"GET /stomp HTTP/1.1\r\nHost: localh")  # slow loris: a request that never ends
        began = time.monotonic()
        assert _read_until_closed(sock, 6) == b""
        assert time.monotonic() - began < 5
    finally:
        sock.close()


# -- messages and frames ------------------------------------------------------------------------------

class RawWs:
    """A WebSocket client from a raw socket: the handshake by hand, then masked frames written as bytes, cut
    anywhere (what a client's writes and the network may do to them)."""

    def __init__(self, port: int, receive_buffer: int | None = None, path: str = "/stomp",
                 subprotocol: str | None = "v12.stomp") -> None:
        self.sock = _raw_socket(port, receive_buffer=receive_buffer)
        key = base64.b64encode(os.urandom(16)).decode()
        offer = f"Sec-WebSocket-Protocol: {subprotocol}\r\n" if subprotocol else ""
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
                          f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                          f"{offer}\r\n".encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self.sock.recv(65536)
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 "), head
        assert not subprotocol or f"Sec-WebSocket-Protocol: {subprotocol}".encode() in head, head
        self.parser = FrameParser("1.2")
        self.frames: list = []

    @staticmethod
    def frame(opcode: Opcode, data: bytes, fin: bool = True) -> bytes:
        return Frame(opcode, data, fin).serialize(mask=True, extensions=[])

    def receive(self, timeout: float = 5):
        """The next STOMP frame (and the opcode of the WebSocket message it came in)."""
        self.sock.settimeout(timeout)
        while not self.frames:
            while True:
                opcode, payload, used = _server_frame(self.buffer)
                if used:
                    break
                chunk = self.sock.recv(65536)
                assert chunk, "the server closed the connection"
                self.buffer += chunk
            self.buffer = self.buffer[used:]
            if opcode in (Opcode.TEXT, Opcode.BINARY) and payload.strip(b"\n"):
                self.frames += [(opcode, f) for f in self.parser.feed(payload)]
        return self.frames.pop(0)

    def receive_payload(self, timeout: float = 5) -> tuple[Opcode | None, bytes]:
        """The next WebSocket message's opcode and payload, as they came."""
        self.sock.settimeout(timeout)
        while True:
            opcode, payload, used = _server_frame(self.buffer)
            if used:
                self.buffer = self.buffer[used:]
                return opcode, payload
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the connection"
            self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


def _server_frame(data: bytes) -> tuple[Opcode | None, bytes, int]:
    """One unmasked frame from the server at the start of `data`: (opcode, payload, bytes used); used 0 while
    it is not all there."""
    if len(data) < 2:
        return None, b"", 0
    length, start = data[1] & 0x7F, 2
    if length == 126:
        length, start = int.from_bytes(data[2:4], "big"), 4
    elif length == 127:
        length, start = int.from_bytes(data[2:10], "big"), 10
    if len(data) < start + length:
        return None, b"", 0
    return Opcode(data[0] & 0x0F), data[start:start + length], start + length


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=10),
       bodies=st.lists(st.binary(max_size=60), min_size=1, max_size=5),
       fragment=st.integers(min_value=1, max_value=80))
def test_frames_in_fragmented_messages_cut_anywhere_arrive_whole_and_in_order(stomp_listener, cuts, bodies,
                                                                              fragment):
    """SENDs in WebSocket messages split into fragments (continuation frames), with pings between, the bytes
    written in pieces cut anywhere: the same messages, in order; text and binary bodies come back in text
    and binary messages."""
    ws = RawWs(stomp_listener.ws_port)
    try:
        dest = _q()
        stream = [ws.frame(Opcode.TEXT, encode("CONNECT", [("accept-version", "1.2"), ("login", "alice"),
                                                             ("passcode", "secret")]))]
        for body in bodies:
            data = encode("SEND", [("destination", dest), ("content-length", str(len(body)))], body)
            pieces = [data[i:i + fragment] for i in range(0, len(data), fragment)]
            for n, piece in enumerate(pieces):
                opcode = Opcode.BINARY if n == 0 else Opcode.CONT
                stream.append(ws.frame(opcode, piece, fin=n == len(pieces) - 1))
            stream.append(ws.frame(Opcode.PING, b"between"))  # (allowed between fragments too; not here)
        stream.append(ws.frame(Opcode.TEXT, encode("SUBSCRIBE", [("destination", dest), ("id", "s"),
                                                                  ("receipt", "sub")])))
        data, start = b"".join(stream), 0
        for cut in cuts:
            ws.sock.sendall(data[start:start + cut])
            start += cut
            time.sleep(0.001)
        ws.sock.sendall(data[start:])
        assert ws.receive()[1].command == "CONNECTED"
        assert ws.receive()[1].command == "RECEIPT"
        got = [ws.receive() for _ in bodies]
        assert [frame.body for _, frame in got] == bodies
        # A message that is all UTF-8 goes as text, one with any other byte as binary (the headers are ASCII:
        # the bodies decide; several MESSAGE frames may share one WebSocket message).
        utf8 = [body.decode("utf-8", "replace").encode("utf-8") == body for body in bodies]
        assert all(opcode == Opcode.BINARY for (opcode, _), ok in zip(got, utf8, strict=True) if not ok)
        if all(utf8):
            assert {opcode for opcode, _ in got} == {Opcode.TEXT}
    finally:
        ws.close()


def test_several_frames_in_one_message_are_each_handled(raw):
    conn = raw()
    conn.connect()
    dest = _q()
    conn.send_raw(encode("SEND", [("destination", dest)], b"one")
                  + encode("SEND", [("destination", dest)], b"two")
                  + encode("SUBSCRIBE", [("destination", dest), ("id", "s"), ("receipt", "sub")]))
    conn.expect("RECEIPT")
    assert [conn.expect("MESSAGE").body for _ in range(2)] == [b"one", b"two"]


def test_a_frame_over_the_body_limit_is_refused_with_an_error_that_names_it(raw):
    conn = raw()
    conn.connect()
    big = 11 * 1024 * 1024
    conn.send_raw(encode("SEND", [("destination", _q())], b"x" * big))
    error = conn.expect("ERROR")
    assert "(SIGNALBOX_STOMP_MAX_BODY)" in error.body.decode()
    assert conn.closed_within(5)


def _login(ws: RawWs, endpoint: str) -> None:
    """Log in over a raw WebSocket, then show a message over the limit before login is taken."""
    body = "x" * (MAX_MESSAGE_BEFORE_LOGIN + 1)
    if endpoint == "json":
        ws.sock.sendall(ws.frame(Opcode.TEXT, json.dumps({"type": "connect", "id": "c", "login": "alice",
                                                         "passcode": "secret"}).encode()))
        assert json.loads(ws.receive_payload()[1])["type"] == "ok"
        send = {"type": "send", "id": "big", "destination": f"queue://{_q()[7:]}", "message": {"body": body}}
        ws.sock.sendall(ws.frame(Opcode.TEXT, json.dumps(send).encode()))
        answer = json.loads(ws.receive_payload()[1])
        assert (answer["type"], answer["id"], len(answer["message_ids"])) == ("ok", "big", 1), answer
        return
    connect = encode("CONNECT", [("accept-version", "1.2"), ("login", "alice"), ("passcode", "secret")])
    ws.sock.sendall(ws.frame(Opcode.TEXT, connect))
    assert ws.receive()[1].command == "CONNECTED"
    # (within STOMP's limits)
    send = encode("SEND", [("destination", _q()), ("receipt", "big")], body.encode())
    ws.sock.sendall(ws.frame(Opcode.TEXT, send))
    assert ws.receive()[1].command == "RECEIPT"


@pytest.mark.parametrize("connected", [True, False])
@pytest.mark.parametrize("endpoint", ["listener", "stomp", "json"])
def test_a_message_over_the_largest_closes_the_connection_as_too_big(stomp_listener, gateway, endpoint,
                                                                     connected):
    """Refused from the frame's length, before its payload is read: a close frame with 1009 ("message too
    big"), then the close. Before login the largest is what a STOMP CONNECT within its limits may take (no
    unauthenticated connection holds megabytes); after, 16 MiB. On the listener's port, on the web server's
    /stomp and on its JSON protocol at /ws/v1."""
    limits = BEFORE_CONNECT
    connect_at_its_limits = limits.max_body + limits.max_headers * limits.max_header_line
    assert connect_at_its_limits <= MAX_MESSAGE_BEFORE_LOGIN
    if endpoint == "listener":
        ws = RawWs(stomp_listener.ws_port)
    elif endpoint == "stomp":
        ws = RawWs(gateway.port)
    else:
        ws = RawWs(gateway.port, path="/ws/v1", subprotocol=None)
    try:
        largest = MAX_MESSAGE_BEFORE_LOGIN
        if connected:
            _login(ws, endpoint)
            largest = MAX_MESSAGE
        # FIN + text, masked, a 64-bit length one over the largest, the mask; no payload follows
        ws.sock.sendall(b"\x81\xff" + (largest + 1).to_bytes(8, "big") + os.urandom(4))
        data = _read_until_closed(ws.sock, 5)
        data = ws.buffer + data
        opcode, payload, used = _server_frame(data)
        assert (opcode, int.from_bytes(payload[:2], "big"), data[used:]) == (Opcode.CLOSE, 1009, b"")
    finally:
        ws.close()


def test_a_ping_is_answered_and_a_close_ends_the_session_and_its_consumers(raw, stomp_listener, redis_client):
    from broker_core.broker import Broker

    conn = raw()
    conn.connect()
    dest = _q()
    conn.send("SUBSCRIBE", {"destination": dest, "id": "s", "receipt": "sub"})
    conn.expect("RECEIPT")
    assert conn.ws.ping(b"are you there").wait(5)  # (the pong)
    broker = Broker(redis_client, stomp_listener.namespace)
    name = dest.removeprefix("/queue/")
    assert len(broker.stats(name).consumers) == 1
    conn.ws.close()
    deadline = time.monotonic() + 10
    while broker.stats(name).consumers and time.monotonic() < deadline:
        time.sleep(0.05)
    assert broker.stats(name).consumers == []


def test_a_slow_auto_ack_reader_cut_off_loses_nothing(listener, gateway_data, redis_client):
    """ack:auto, a client that reads nothing (a 4 KiB receive window): the listener cuts it off as too slow,
    as over TCP. A message is acknowledged only once its bytes left the process (WsTransport's `unsent`);
    what waited in the send buffer goes back to the queue: every message acknowledged or back, some of a
    batch cut in the middle perhaps delivered too (at least once, never lost)."""
    from broker_core.broker import Broker

    server = listener(SIGNALBOX_WS_SLOW_CLIENT_SECONDS="2", SIGNALBOX_WS_SEND_BUFFER_BYTES="262144")
    dest = _q()
    name = dest.removeprefix("/queue/")
    reader = RawWs(server.ws_port, receive_buffer=4096)
    connect = encode("CONNECT", [("accept-version", "1.2"), ("login", "alice"), ("passcode", "secret")])
    subscribe = encode("SUBSCRIBE", [("destination", dest), ("id", "s"), ("ack", "auto")])
    reader.sock.sendall(reader.frame(Opcode.TEXT, connect) + reader.frame(Opcode.TEXT, subscribe))
    time.sleep(0.5)  # subscribed
    producer = RawStomp(f"ws://127.0.0.1:{server.ws_port}/stomp")
    producer.connect()
    total = 3000
    for n in range(total):
        producer.send("SEND", {"destination": dest, "persistent": "false",
                               **({"receipt": "last"} if n == total - 1 else {})}, b"x" * 4096)
    assert producer.expect("RECEIPT", timeout=30).get("receipt-id") == "last"
    broker = Broker(redis_client, gateway_data[1])
    deadline = time.monotonic() + 30
    while broker.stats(name).consumer_count and time.monotonic() < deadline:  # cut off, consumer closed
        time.sleep(0.2)
    assert broker.stats(name).consumer_count == 0
    received = 0
    try:
        while True:
            received += reader.receive()[1].command == "MESSAGE"
    except (AssertionError, OSError):  # closed (or reset), or nothing more within the timeout
        pass
    finally:
        reader.close()
        producer.close()
    stats = broker.stats(name)
    assert 0 < stats.dequeued <= received < total, (stats, received)
    assert stats.queue_size + stats.dequeued == total, stats
