"""Fuzzing the live gateway: hypothesis-generated and mutated frames (bad commands, huge headers,
truncated bodies, invalid UTF-8; an undefined escape is no fault, as in ActiveMQ) sent over a real socket
after a good CONNECT. Each broken frame gets an ERROR frame and the connection closes; a frame that a
mutation left valid is processed (it asked for a receipt). Afterwards the gateway process still serves,
has logged no traceback, and the broker state that the fuzzing must not touch is intact."""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from gateway.java import JAVA_TRIM
from gateway.stomp.frames import CLIENT_COMMANDS, encode
from tests.helpers.stomp_client import RawStomp

pytestmark = pytest.mark.e2e

FUZZ_SETTINGS = settings(max_examples=40, deadline=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
RUN = uuid.uuid4().hex[:8]


def send_after_connect(gateway, data: bytes, quiet: float = 1.0) -> list:
    """CONNECT, send `data` as one WebSocket message, return the frames until the server closes (or goes
    quiet for `quiet` seconds)."""
    raw = RawStomp(gateway.stomp_url)
    frames = []
    try:
        raw.connect()
        raw.send_raw(data)
        while True:
            frames.append(raw.receive(timeout=quiet))
    except (ConnectionClosed, TimeoutError):
        pass
    finally:
        raw.close()
    return frames


bad_commands = st.text(st.characters(codec="utf-8", exclude_characters="\n\r\x00:"), min_size=1,
                       max_size=40).filter(lambda c: c.strip(JAVA_TRIM) not in CLIENT_COMMANDS and c != "")
invalid_utf8 = st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"])


@st.composite
def broken_frames(draw) -> bytes:
    kind = draw(st.sampled_from(["command", "huge_header", "many_headers", "truncated", "utf8"]))
    dest = f"/queue/fuzz.{RUN}"
    if kind == "command":
        return draw(bad_commands).encode() + b"\ndestination:" + dest.encode() + b"\n\nbody\x00"
    if kind == "huge_header":
        size = draw(st.integers(10 * 1024 + 1, 40 * 1024))
        return b"SEND\ndestination:" + dest.encode() + b"\nx:" + b"a" * size + b"\n\n\x00"
    if kind == "many_headers":
        count = draw(st.integers(1001, 1500))
        return b"SEND\n" + b"".join(b"h%d:v\n" % i for i in range(count)) + b"\n\x00"
    if kind == "truncated":
        body = draw(st.binary(max_size=50))
        missing = draw(st.integers(1, 100))
        return (b"SEND\ndestination:" + dest.encode() + b"\ncontent-length:%d\n\n" % (len(body) + missing)
                + body)
    junk = draw(invalid_utf8)
    where = draw(st.sampled_from(["command", "name", "value"]))
    if where == "command":
        return b"SE" + junk + b"ND\n\n\x00"
    if where == "name":
        return b"SEND\ndestination:" + dest.encode() + b"\nna" + junk + b"me:v\n\n\x00"
    return b"SEND\ndestination:" + dest.encode() + b"\nname:v" + junk + b"\n\n\x00"


@FUZZ_SETTINGS
@given(broken_frames())
def test_every_broken_frame_gets_an_error_frame_and_the_connection_closes(gateway, data):
    frames = send_after_connect(gateway, data)
    assert [f.command for f in frames] == ["ERROR"], frames
    assert frames[0].get("message") and frames[0].body


@st.composite
def mutated_frames(draw) -> bytes:
    command = draw(st.sampled_from(["SEND", "SUBSCRIBE", "BEGIN", "ACK"]))
    headers = [("destination", f"/queue/fuzz.{RUN}"), ("receipt", "fuzz"), ("id", "s1"),
               ("transaction", "t1"), *draw(st.lists(st.tuples(st.text(min_size=1, max_size=8),
                                                              st.text(max_size=8)), max_size=3))]
    body = draw(st.binary(max_size=30))
    if draw(st.booleans()):
        headers.append(("content-length", str(len(body))))
    raw = bytearray(encode(command, headers, body))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        at = draw(st.integers(0, len(raw) - 1)) if raw else 0
        if op == "flip" and raw:
            raw[at] = draw(st.integers(0, 255))
        elif op == "cut":
            del raw[at:]
        elif op == "delete" and raw:
            del raw[at]
        else:
            raw[at:at] = draw(st.sampled_from([b"\\", b"\x00", b"\n", b":", b"\xff", b"\\q", b"\r"]))
    return bytes(raw)


@FUZZ_SETTINGS
@given(mutated_frames())
def test_mutated_frames_are_processed_or_refused_never_crash(gateway, data):
    frames = send_after_connect(gateway, data, quiet=0.3)
    commands = [f.command for f in frames]
    assert "ERROR" in commands or "RECEIPT" in commands or data.strip(b"\r\n") == b"" or commands == [], \
        (data, frames)
    if "ERROR" in commands:
        assert commands[-1] == "ERROR"  # nothing after an ERROR: the connection closed


def test_after_the_fuzzing_the_gateway_serves_and_other_state_is_intact(gateway, clients, broker):
    queue = f"control.{RUN}"
    producer = clients()
    for i in range(3):
        producer.conn.send(f"/queue/{queue}", f"m{i}")
    producer.receipt(producer.conn.send, f"/queue/{queue}", "last")
    stats = broker.stats(f"queue://{queue}")
    assert (stats.queue_size, stats.consumer_count) == (4, 0)
    test_every_broken_frame_gets_an_error_frame_and_the_connection_closes(gateway)
    if f"queue://fuzz.{RUN}" in broker.destinations():  # every fuzzed connection's consumers were closed
        deadline = time.monotonic() + 5
        while broker.stats(f"queue://fuzz.{RUN}").consumer_count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert broker.stats(f"queue://fuzz.{RUN}").consumer_count == 0
    consumer = clients()
    consumer.receipt(consumer.conn.subscribe, f"/queue/{queue}", id="s")
    assert [m.body for m in consumer.messages(4)] == [b"m0", b"m1", b"m2", b"last"]
