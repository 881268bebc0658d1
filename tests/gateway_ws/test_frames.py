"""The pure STOMP frame codec: parsing, escaping per version, content-length, limits, negotiation."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.java import JAVA_TRIM
from gateway.stomp.frames import (
    Frame,
    FrameError,
    FrameParser,
    Limits,
    encode,
    encode_frame,
    escape,
    negotiate_heart_beat,
    negotiate_version,
    unescape,
)


def parse(data: bytes, version: str = "1.2", limits: Limits | None = None) -> list[Frame]:
    parser = FrameParser(version, limits)
    frames = parser.feed(data)
    parser.end_of_message()
    return frames


def test_a_frame_is_command_headers_blank_line_body_and_nul():
    (frame,) = parse(b"SEND\ndestination:/queue/a\nreceipt:7\n\nhello\x00")
    assert frame == Frame("SEND", (("destination", "/queue/a"), ("receipt", "7")), b"hello")
    assert frame.get("receipt") == "7" and "destination" in frame and frame.get("nope") is None


def test_heart_beat_eols_between_frames_yield_no_frames():
    assert parse(b"\n\r\n\n") == []
    frames = parse(b"\nSEND\ndestination:/queue/a\n\none\x00\n\r\nSEND\ndestination:/queue/a\n\ntwo\x00\n")
    assert [f.body for f in frames] == [b"one", b"two"]


def test_crlf_line_endings_are_accepted_in_1_2_and_in_connect():
    (frame,) = parse(b"SEND\r\ndestination:/queue/a\r\nx:1\r\n\r\nbody\x00")
    assert frame.header_dict() == {"destination": "/queue/a", "x": "1"}
    assert frame.body == b"body"
    (frame,) = parse(b"CONNECT\r\naccept-version:1.1\r\n\r\n\x00", "1.1")
    assert frame.get("accept-version") == "1.1"


def test_before_1_2_a_carriage_return_belongs_to_the_value():
    (frame,) = parse(b"SEND\r\nx:1\r\n\n\x00", "1.1")
    assert frame.command == "SEND" and frame.get("x") == "1\r"


def test_content_length_bodies_may_hold_nul_octets():
    (frame,) = parse(b"SEND\ndestination:/queue/a\ncontent-length:5\n\na\x00b\x00c\x00")
    assert frame.body == b"a\x00b\x00c"


@pytest.mark.parametrize("length", [" 3", "3 ", "+3", "03", "\t+003\t"])
def test_content_length_is_read_as_java_reads_an_int(length):
    """ActiveMQ reads content-length with Integer.parseInt of the trimmed value: a '+' sign and leading
    zeros are a number (differential 27_versions_odd_frames/content_length_forms)."""
    (frame,) = parse(b"SEND\ndestination:/q\ncontent-length:" + length.encode() + b"\n\na\x00b\x00")
    assert frame.body == b"a\x00b"


def test_without_content_length_the_body_ends_at_the_first_nul():
    frames = parse(b"SEND\ndestination:/q\n\nab\x00SEND\ndestination:/q\n\ncd\x00")
    assert [f.body for f in frames] == [b"ab", b"cd"]


def test_the_first_of_repeated_headers_wins():
    (frame,) = parse(b"MESSAGE\nfoo:World\nfoo:Hello\n\n\x00")
    assert frame.get("foo") == "World"
    assert frame.headers == (("foo", "World"), ("foo", "Hello"))
    assert frame.header_dict() == {"foo": "World"}


def test_header_values_keep_colons_after_the_first():
    (frame,) = parse(b"SEND\nselector:a = 'x:y'\n\n\x00", "1.0")
    assert frame.get("selector") == "a = 'x:y'"


@pytest.mark.parametrize(("version", "raw", "value"), [
    ("1.2", rb"a\nb\cc\\d\re", "a\nb:c\\d\re"),
    ("1.1", rb"a\nb\cc\\d", "a\nb:c\\d"),
    ("1.0", rb"a\nb\cc", r"a\nb\cc"),
])
def test_header_escapes_per_version(version, raw, value):
    (frame,) = parse(b"SEND\nk:" + raw + b"\n\n\x00", version)
    assert frame.get("k") == value


@pytest.mark.parametrize(("version", "raw", "value"), [
    ("1.1", rb"a\rb", "a\\rb"), ("1.2", rb"a\tb", "a\\tb"), ("1.2", b"a\\", "a\\"),
    ("1.2", rb"\\\t\c", "\\\\t:"), ("1.2", rb"\\\\\n", "\\\\\n"),
])
def test_undefined_escapes_stay_as_they_are(version, raw, value):
    """As ActiveMQ's StompWireFormat.decodeHeader: the backslash and the character after it are kept."""
    (frame,) = parse(b"SEND\nk:" + raw + b"\n\n\x00", version)
    assert frame.get("k") == value


@pytest.mark.parametrize(("command", "version"), [("SEND", "1.0"), ("CONNECT", "1.2"), ("STOMP", "1.2")])
def test_stomp_10_header_values_are_trimmed(command, version):
    """ActiveMQ trims 1.0 header values (Java's String.trim) and reads CONNECT as 1.0; names stay."""
    (frame,) = parse(command.encode() + b"\nack: client \r\nk :\t v w \n\n\x00", version)
    assert frame.headers == (("ack", "client"), ("k ", "v w"))
    (frame,) = parse(b"SEND\nack: client \n\n\x00", "1.2")
    assert frame.get("ack") == " client "


@pytest.mark.parametrize("head", [b" SEND \n", b"\tSEND\r\n", b"SEND \r\n"])
def test_the_command_line_is_trimmed(head):
    """ActiveMQ reads the command line with String.trim: spaces and control characters around it go."""
    (frame,) = parse(head + b"k:v\n\n\x00", "1.2")
    assert (frame.command, frame.headers) == ("SEND", (("k", "v"),))


@pytest.mark.parametrize("command", ["SE ND", "send-it", "subscribe", "NOT_A:COMMAND 2", "F" * 1024])
def test_any_other_command_line_is_a_command_for_the_session_to_refuse(command):
    """ActiveMQ answers any command line up to 1,024 characters with `Unknown STOMP action: <it>`."""
    (frame,) = parse(command.encode() + b"\nreceipt:r\n\n\x00", "1.2")
    assert (frame.command, frame.get("receipt")) == (command, "r")


@pytest.mark.parametrize("command", ["SUBSCRIBE", "ACK", "BEGIN", "DISCONNECT"])
def test_content_length_sizes_only_a_send(command):
    """As ActiveMQ's StompWireFormat: another frame's body ends at its NUL, whatever content-length says
    (a body-less SUBSCRIBE with content-length:5 must not wait for, and swallow, five more octets)."""
    frames = parse(command.encode() + b"\ncontent-length:5\n\n\x00SEND\ncontent-length:3\n\na\x00b\x00")
    assert [(f.command, f.body) for f in frames] == [(command, b""), ("SEND", b"a\x00b")]
    (frame,) = parse(command.encode() + b"\ncontent-length:lots\n\nxy\x00")
    assert frame.body == b"xy"


def test_a_header_line_without_a_colon_is_a_header_with_an_empty_value():
    (frame,) = parse(b"SEND\nflag\nk:v\n\n\x00", "1.2")
    assert frame.headers == (("flag", ""), ("k", "v"))


def test_connect_frames_are_never_unescaped():
    (frame,) = parse(b"CONNECT\nlogin:a\\cb\npasscode:p\n\n\x00", "1.2")
    assert frame.get("login") == "a\\cb"


def test_escaping_on_output_per_version():
    assert escape("a:b\nc\\d\re", "1.2") == r"a\cb\nc\\d\re"
    assert escape("a:b\nc\\d\re", "1.1") == "a\\cb\\nc\\\\d\re"
    assert escape("a:b\nc", "1.0") == "a:b c"
    assert escape("a:b\nc", "1.2", "CONNECTED") == "a:b c"
    assert encode("CONNECTED", [("version", "1.2")]) == b"CONNECTED\nversion:1.2\n\n\x00"
    assert encode("MESSAGE", [("k:1", "v\n")], b"x", "1.2") == b"MESSAGE\nk\\c1:v\\n\n\nx\x00"


def test_unescape_is_the_inverse_of_escape():
    text = "\\:\n\r plain ü"
    assert unescape(escape(text, "1.2"), "1.2") == text


@pytest.mark.parametrize(("data", "message"), [
    (b" \t\nk:v\n\n\x00", "Invalid command"),
    (b"S" * 1025 + b"\n\n\x00", "The maximum command length was exceeded"),
    (b"SEND\nk:\xff\xfe\n\n\x00", "Invalid UTF-8"),
    (b"\xc3\x28\n\n\x00", "Invalid UTF-8"),
    (b"SEND\ncontent-length:abc\n\n\x00", "Specified content-length is not a valid integer"),
    (b"SEND\ncontent-length:-1\n\n\x00", "Specified content-length is not a valid integer"),
    (b"SEND\ncontent-length:2\n\nabc\x00", "there was no trailing null byte"),
    (b"SEND\ncontent-length:10\n\nabc\x00", "Truncated frame"),
    (b"SEND\ndestination:/q\n\nno nul", "Truncated frame"),
    (b"SEND\ndestination:/q\n", "Truncated frame"),
])
def test_malformed_frames_raise_frame_error(data, message):
    with pytest.raises(FrameError, match=message):
        parse(data)


def test_limits_bound_headers_and_bodies():
    limits = Limits(max_body=10, max_headers=3, max_header_line=20)
    with pytest.raises(FrameError, match="The maximum number of headers was exceeded"):
        parse(b"SEND\na:1\nb:2\nc:3\nd:4\n\n\x00", limits=limits)
    with pytest.raises(FrameError, match="The maximum header length was exceeded"):
        parse(b"SEND\na:" + b"x" * 30 + b"\n\n\x00", limits=limits)
    with pytest.raises(FrameError, match="The maximum data length was exceeded"):
        parse(b"SEND\ncontent-length:11\n\n" + b"x" * 11 + b"\x00", limits=limits)
    with pytest.raises(FrameError, match="The maximum data length was exceeded"):
        FrameParser("1.2", limits).feed(b"SEND\n\n" + b"x" * 11)
    # a body without content-length that arrives whole, its NUL in the same read (a WebSocket message)
    with pytest.raises(FrameError, match="The maximum data length was exceeded") as whole:
        parse(b"SEND\n\n" + b"x" * 11 + b"\x00", limits=limits)
    assert "the body is 11 bytes, over the limit of 10" in whole.value.detail
    assert [f.body for f in parse(b"SEND\n\n" + b"x" * 10 + b"\x00", limits=limits)] == [b"x" * 10]
    with pytest.raises(FrameError, match="The maximum number of headers was exceeded"):
        FrameParser("1.2", limits).feed(b"SEND\n" + b"a:1\n" * 100)
    with pytest.raises(FrameError, match="The maximum header length was exceeded"):
        FrameParser("1.2", limits).feed(b"SEND\na:" + b"x" * 200)
    with pytest.raises(FrameError, match="The maximum command length was exceeded"):
        parse(b"S" * 30 + b"\n\n\x00", limits=limits)


def test_a_frame_may_arrive_in_pieces_when_fed_incrementally():
    data = b"SEND\ndestination:/q\ncontent-length:3\n\na\x00b\x00\n"
    parser = FrameParser()
    frames = []
    for i in range(len(data)):
        frames += parser.feed(data[i:i + 1])
    parser.end_of_message()
    assert frames == [Frame("SEND", (("destination", "/q"), ("content-length", "3")), b"a\x00b")]


def test_version_negotiation_picks_the_highest_common_version():
    assert negotiate_version(None) == "1.0"
    assert negotiate_version("1.0,1.1,1.2") == "1.2"
    assert negotiate_version("1.1, 1.0") == "1.1"
    assert negotiate_version("2.0") is None
    assert negotiate_version("") is None and negotiate_version(" ") is None  # ActiveMQ refuses it too


def test_heart_beats_are_answered_as_activemq_does_swapped_with_a_floor():
    beat = negotiate_heart_beat("4000,10000")
    assert (beat.send_every, beat.expect_every, beat.header) == (10000, 4000, "10000,4000")
    assert negotiate_heart_beat(None).header == "0,0"
    assert negotiate_heart_beat("0,0").send_every == 0
    assert negotiate_heart_beat("10,5", minimum_ms=100).header == "100,100"
    with pytest.raises(FrameError, match="Invalid heart-beat header:fast"):
        negotiate_heart_beat("fast")


# -- properties --------------------------------------------------------------------------------------

header_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
header_name = header_text.filter(bool)
commands = st.sampled_from(["SEND", "SUBSCRIBE", "ACK", "MESSAGE", "ERROR", "RECEIPT", "BEGIN"])


@st.composite
def frames(draw, version: str = "1.2") -> Frame:
    headers = draw(st.lists(st.tuples(header_name, header_text), max_size=6))
    if version == "1.0":  # 1.0 cannot carry these in headers
        headers = [(k.translate(_NO_10), v.translate(_NO_EOL).strip(JAVA_TRIM)) for k, v in headers]
        headers = [(k, v) for k, v in headers if k]
    headers = [(k, v) for k, v in headers if k != "content-length"]
    command = draw(commands)
    body = draw(st.binary(max_size=64))
    if command not in ("SEND", "MESSAGE"):  # content-length sizes only these (ActiveMQ's reading)
        body = body.replace(b"\x00", b"")
    headers.append(("content-length", str(len(body))))
    return Frame(command, tuple(headers), body)


_NO_10 = str.maketrans({"\n": "", "\r": "", ":": ""})
_NO_EOL = str.maketrans({"\n": "", "\r": ""})


@given(st.sampled_from(["1.0", "1.1", "1.2"]).flatmap(lambda v: st.tuples(st.just(v), st.lists(frames(v),
                                                                                              max_size=4))))
def test_encoded_frames_parse_back_to_themselves(case):
    version, original = case
    data = b"\n".join(encode_frame(f, version) for f in original)
    assert parse(data, version) == original


@given(st.lists(frames(), min_size=1, max_size=3), st.data())
def test_any_split_of_a_stream_parses_to_the_same_frames(original, data):
    stream = b"".join(encode_frame(f) for f in original)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=5)))
    parser = FrameParser()
    parsed = []
    start = 0
    for cut in [*cuts, len(stream)]:
        parsed += parser.feed(stream[start:cut])
        start = cut
    parser.end_of_message()
    assert parsed == original


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(st.lists(st.binary(max_size=80), max_size=6))
def test_arbitrary_bytes_give_frames_or_frame_errors_and_nothing_else(chunks):
    parser = FrameParser("1.2", Limits(max_body=64, max_headers=8, max_header_line=40))
    try:
        for chunk in chunks:
            for frame in parser.feed(chunk):
                assert isinstance(frame, Frame)
        parser.end_of_message()
    except FrameError as exc:
        assert exc.message and exc.detail


@settings(max_examples=300)
@given(frames(), st.data())
def test_mutated_frames_give_frames_or_frame_errors_and_nothing_else(frame, data):
    raw = bytearray(encode_frame(frame))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(0, len(raw) - 1)))
        if op == "flip" and raw:
            raw[at] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del raw[at:]
        else:
            raw[at:at] = data.draw(st.sampled_from([b"\\", b"\x00", b"\n", b":", b"\xff", b"\\q"]))
    with contextlib.suppress(FrameError):
        parse(bytes(raw))
