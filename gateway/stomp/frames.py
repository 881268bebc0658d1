"""The STOMP frame codec: bytes in, frames out, and back. Pure: no I/O, no Django, no broker.

Covers STOMP 1.0, 1.1 and 1.2 (https://stomp.github.io): header escaping per version (none in 1.0 and in
CONNECT/STOMP/CONNECTED frames; `\\n \\c \\\\` in 1.1; `\\r` too in 1.2), `content-length` bodies that may
hold NUL octets, heart-beat EOLs between frames, the first of repeated headers wins, and version and
heart-beat negotiation. Every malformed input raises `FrameError`, whose `message` is short enough for
an ERROR frame's `message` header and whose `detail` explains.

`FrameParser` is incremental: a WebSocket message may hold several frames, part of one, or only
heart-beat EOLs, so `feed` keeps what it cannot parse yet. Limits bound what it buffers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.java import JAVA_TRIM, java_trim

VERSIONS: tuple[str, ...] = ("1.0", "1.1", "1.2")
CLIENT_COMMANDS = frozenset(
    {"CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT",
     "DISCONNECT"})
SERVER_COMMANDS = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})
# These frames are never escaped, for compatibility with STOMP 1.0 (STOMP 1.2, "Value Encoding").
_RAW_COMMANDS = frozenset({"CONNECT", "STOMP", "CONNECTED"})
HEARTBEAT = b"\n"
# The frames whose `content-length` delimits the body. ActiveMQ's StompWireFormat reads it for these only;
# any other frame's body ends at its NUL whatever the header says (a SUBSCRIBE with `content-length:5`
# and no body would otherwise wait for five more octets, and take them from the next frame).
_SIZED_COMMANDS = frozenset({"SEND", "MESSAGE"})

MAX_COMMAND = 1024  # ActiveMQ's StompWireFormat.MAX_COMMAND_LENGTH
# A limit's ERROR `message` is ActiveMQ's text (StompWireFormat); the ERROR body names our limit.
_COMMAND_TOO_LONG = "The maximum command length was exceeded"
_HEADER_TOO_LONG = "The maximum header length was exceeded"
_TOO_MANY_HEADERS = "The maximum number of headers was exceeded"
_BODY_TOO_LARGE = "The maximum data length was exceeded"
_BLANK_LINE = re.compile(rb"\n\r?\n")
_HEART_BEAT = re.compile(r"\s*(\d{1,9})\s*,\s*(\d{1,9})\s*")
_UNESCAPE = {"1.1": {"n": "\n", "c": ":", "\\": "\\"}, "1.2": {"n": "\n", "c": ":", "\\": "\\", "r": "\r"}}
_ESCAPE = {
    "1.1": str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c"}),
    "1.2": str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c", "\r": "\\r"}),
}
_NO_EOL = str.maketrans({"\n": " ", "\r": " "})


class FrameError(Exception):
    """A frame that cannot be parsed (or a header value that is not valid). Fatal for the connection."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or message
        # The whole frames that came before the bad one in the same feed: they are handled before the
        # ERROR, as a stream's reader would (a SEND followed by garbage in one read is still sent).
        self.parsed: list[Frame] = []


@dataclass(frozen=True, init=False)
class Frame:
    """One STOMP frame. `headers` keeps order and repeats; `get` returns the first, as STOMP 1.2 says."""

    command: str
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""

    def __init__(self, command: str, headers: tuple[tuple[str, str], ...] = (), body: bytes = b"") -> None:
        # The fields written into the instance's dict (which the frozen __setattr__ does not guard): the
        # generated __init__'s object.__setattr__ per field took twice the instructions, on every frame
        fields = self.__dict__
        fields["command"], fields["headers"], fields["body"] = command, headers, body

    def get(self, name: str, default: str | None = None) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return default

    def __contains__(self, name: str) -> bool:
        return any(key == name for key, _ in self.headers)

    def header_dict(self) -> dict[str, str]:
        """Headers by name, the first occurrence of each."""
        result: dict[str, str] = {}
        for key, value in self.headers:
            if key not in result:
                result[key] = value
        return result


@dataclass(frozen=True)
class Limits:
    """What one frame may be. Defaults follow ActiveMQ's StompWireFormat (1000 headers of 10 KiB) with a
    body limit under the WebSocket server's message size. `named`: what a refusal names as the limit's
    source (the settings, or `before_connect` below)."""

    max_body: int = 10 * 1024 * 1024
    max_headers: int = 1000
    max_header_line: int = 10 * 1024
    named: str = "settings"

    @property
    def max_head(self) -> int:
        return (self.max_headers + 1) * (self.max_header_line + 2)

    def source(self, setting: str) -> str:
        """`(SIGNALBOX_STOMP_MAX_...)`, or what else set the limit."""
        return f"({setting})" if self.named == "settings" else f"({self.named})"

    def before_connect(self) -> Limits:
        """These limits, at most BEFORE_CONNECT's: what a connection not logged in yet may send (a CONNECT
        is a few short headers): each of the 1,000 connections a listener serves could otherwise hold
        10 MB unauthenticated."""
        most = BEFORE_CONNECT
        return Limits(min(self.max_body, most.max_body), min(self.max_headers, most.max_headers),
                      min(self.max_header_line, most.max_header_line), most.named)


BEFORE_CONNECT = Limits(max_body=64 * 1024, max_headers=32, max_header_line=10 * 1024,
                        named="the limit before CONNECT")


def unescape(text: str, version: str) -> str:
    """Undo STOMP header escaping. A backslash that starts no escape the version defines (`\\t`; `\\r` in
    1.1; one at the end) stays as it is, as ActiveMQ's StompWireFormat.decodeHeader keeps it: the STOMP
    spec calls it a fatal error, but a client whose header ActiveMQ takes must not lose its connection
    here. Done with str.split and str.replace (C loops): a character loop in Python took 0.14 s for a
    2.2 MB head of escapes, and any client may send one, before logging in too."""
    table = _UNESCAPE.get(version)
    if table is None or "\\" not in text:
        return text
    # An escaped backslash starts no other escape; what is left of each part pairs every backslash with
    # the character after it, so replacing the defined pairs one kind at a time reads it left to right.
    parts = text.split("\\\\")
    for key, value in table.items():
        if key != "\\":
            parts = [part.replace("\\" + key, value) if "\\" in part else part for part in parts]
    return "\\".join(parts)


def _needs_escape(text: str) -> bool:
    return "\\" in text or "\n" in text or ":" in text or "\r" in text


def escape(text: str, version: str, command: str = "") -> str:
    """Escape a header name or value for `version` (CONNECT/STOMP/CONNECTED and 1.0 frames are raw;
    there a line break cannot be sent and becomes a space)."""
    if not _needs_escape(text):
        return text  # the common case, checked at C speed
    if version == "1.0" or command in _RAW_COMMANDS:
        return text.translate(_NO_EOL)
    # str.replace runs at C speed; translate looks every character up in a dict. The backslash first,
    # so the escapes added after it are not escaped again.
    text = text.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
    return text.replace("\r", "\\r") if version == "1.2" else text


def encode(command: str, headers: Iterable[tuple[str, str]] = (), body: bytes = b"",
           version: str = "1.2") -> bytes:
    """One frame as bytes: command, escaped headers, blank line, body, NUL."""
    # Per header, the test for characters to escape is inline: this runs for every MESSAGE frame, and
    # most names and values need nothing (message ids, which hold ':', are the usual exception).
    lines = [command]
    for k, v in headers:
        if "\\" in k or "\n" in k or ":" in k or "\r" in k:
            k = escape(k, version, command)
        if "\\" in v or "\n" in v or ":" in v or "\r" in v:
            v = escape(v, version, command)
        lines.append(f"{k}:{v}")
    lines.append("\n")
    return "\n".join(lines).encode() + body + b"\x00"


def encode_frame(frame: Frame, version: str = "1.2") -> bytes:
    return encode(frame.command, frame.headers, frame.body, version)


class FrameParser:
    """Incremental parser for frames a client sends. Set `version` once CONNECT has negotiated it (CONNECT
    itself is parsed without escaping whatever the version)."""

    def __init__(self, version: str = "1.2", limits: Limits | None = None) -> None:
        self.version = version
        self.limits = limits or Limits()
        self._buf = bytearray()
        self._scan_from = 0
        # the parsed head of the frame whose body has not fully arrived: command, headers, body start,
        # content-length or None
        self._head: tuple[str, tuple[tuple[str, str], ...], int, int | None] | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def end_of_message(self) -> None:
        """A WebSocket message ended: like ActiveMQ's WebSocket transport, a frame must not span messages,
        so anything left but heart-beat EOLs is a truncated frame."""
        if self._head is None:
            self._skip_eols()
        if self._buf or self._head is not None:
            size = len(self._buf)
            self._buf.clear()
            self._head = None
            self._scan_from = 0
            raise FrameError("Truncated frame",
                             f"the WebSocket message ended inside a frame ({size} bytes without the end of "
                             "the frame); each message must hold whole frames")

    def feed(self, data: bytes) -> list[Frame]:
        """Add received bytes; return the frames they completed (heart-beat EOLs yield nothing)."""
        self._buf += data
        frames: list[Frame] = []
        try:
            while (frame := self._next()) is not None:
                frames.append(frame)
        except FrameError as exc:
            exc.parsed = frames
            raise
        return frames

    def _skip_eols(self) -> None:
        buf = self._buf
        if not buf or buf[0] not in b"\r\n":
            return  # (the usual case: a frame starts at once, or nothing is left)
        i, n = 0, len(buf)
        while i < n:
            if buf[i] == 0x0A:
                i += 1
            elif buf[i] == 0x0D and i + 1 < n and buf[i + 1] == 0x0A:
                i += 2
            else:
                break
        if i:
            del buf[:i]
            self._scan_from = 0

    def _next(self) -> Frame | None:
        if self._head is None:
            self._skip_eols()
            if not self._buf:
                return None
            match = _BLANK_LINE.search(self._buf, self._scan_from)
            if match is None:
                if len(self._buf) > self.limits.max_head:
                    # (ActiveMQ's texts, as for the limits below; the explanation names our limit)
                    many = self._buf.count(b"\n") > self.limits.max_headers
                    raise FrameError(_TOO_MANY_HEADERS if many else _HEADER_TOO_LONG,
                                     f"no end of headers within {self.limits.max_head} bytes "
                                     f"(at most {self.limits.max_headers} headers of "
                                     f"{self.limits.max_header_line} bytes) "
                                     + self.limits.source("SIGNALBOX_STOMP_MAX_HEADERS, _MAX_HEADER_LINE"))
                self._scan_from = max(0, len(self._buf) - 2)
                return None
            self._head = self._parse_head(bytes(self._buf[:match.start()]), match.end())
            self._scan_from = match.end()
        command, headers, start, length = self._head
        buf = self._buf
        if length is not None:
            if len(buf) < start + length + 1:
                return None
            if buf[start + length] != 0:
                raise FrameError("content-length bytes were read and there was no trailing null byte",
                                 f"content-length is {length} but the octet after that many body octets "
                                 "is not NUL")
            end = start + length
        else:
            end = buf.find(b"\x00", self._scan_from)
            if end < 0:
                if len(buf) - start > self.limits.max_body:
                    raise FrameError(_BODY_TOO_LARGE,
                                     f"the body exceeds {self.limits.max_body} bytes without a NUL "
                                     "terminator " + self.limits.source("SIGNALBOX_STOMP_MAX_BODY"))
                self._scan_from = max(start, len(buf))
                return None
            if end - start > self.limits.max_body:  # (its NUL came in the same read: a WebSocket message)
                raise FrameError(_BODY_TOO_LARGE,
                                 f"the body is {end - start} bytes, over the limit of {self.limits.max_body} "
                                 + self.limits.source("SIGNALBOX_STOMP_MAX_BODY"))
        body = bytes(buf[start:end])
        del buf[:end + 1]
        self._head = None
        self._scan_from = 0
        return Frame(command, headers, body)

    def _parse_head(self, head: bytes, body_start: int) -> tuple[str, tuple[tuple[str, str], ...], int,
                                                                  int | None]:
        """The usual head (valid UTF-8, no CR, shorter than one header line may be) decoded in one go;
        anything else goes through `_parse_head_lines`, which checks line by line and names the fault."""
        if b"\r" in head or len(head) > self.limits.max_header_line \
                or head.count(b"\n") > self.limits.max_headers:
            return self._parse_head_lines(head, body_start)
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            return self._parse_head_lines(head, body_start)
        lines = text.split("\n")
        command = lines[0]
        if command not in CLIENT_COMMANDS:
            command = _command(command)
        version = "1.0" if command in _RAW_COMMANDS else self.version
        escaped = "\\" in text  # (most heads have no escape at all: one look instead of one per line)
        trim = version == "1.0"
        headers: list[tuple[str, str]] = []
        content_length: str | None = None
        for line in lines[1:]:
            # (a line without ':' is a header with an empty value, as ActiveMQ reads it)
            name, _, value = line.partition(":")
            if escaped and "\\" in line:
                name, value = unescape(name, version), unescape(value, version)
            if trim:  # (ActiveMQ's StompWireFormat trims a 1.0 value: `destination: /queue/a`, as the
                # 1.0 spec's own examples write headers; CONNECT, read before a version is agreed, too)
                value = java_trim(value)
            if content_length is None and name == "content-length":
                content_length = value
            headers.append((name, value))
        length = (self._content_length(content_length)
                  if content_length is not None and command in _SIZED_COMMANDS else None)
        return command, tuple(headers), body_start, length

    def _content_length(self, value: str) -> int:
        # (as ActiveMQ's Integer.parseInt of the trimmed value: '+3' and '03' are 3; a negative length
        # is refused)
        digits = java_trim(value).removeprefix("+")
        if not digits.isdigit() or not digits.isascii():
            raise FrameError("Specified content-length is not a valid integer",
                             f"content-length must be a non-negative integer, got {value[:64]!r}")
        length = int(digits)
        if length > self.limits.max_body:
            raise FrameError(_BODY_TOO_LARGE,
                             f"content-length {length} exceeds the limit of {self.limits.max_body} bytes "
                             + self.limits.source("SIGNALBOX_STOMP_MAX_BODY"))
        return length

    def _parse_head_lines(self, head: bytes, body_start: int) -> tuple[str, tuple[tuple[str, str], ...], int,
                                                                        int | None]:
        lines = head.split(b"\n")
        if len(lines) - 1 > self.limits.max_headers:
            raise FrameError(_TOO_MANY_HEADERS,
                             f"{len(lines) - 1} headers; the limit is {self.limits.max_headers} "
                             + self.limits.source("SIGNALBOX_STOMP_MAX_HEADERS"))
        # STOMP 1.2 ends lines with LF or CR LF; before 1.2 a CR is part of the header value. The command
        # line, and CONNECT (sent before any version is agreed), accept CR LF always.
        connect = lines[0].strip(JAVA_TRIM.encode()) in (b"CONNECT", b"STOMP")
        crlf = self.version == "1.2" or connect
        decoded: list[str] = []
        for number, raw in enumerate(lines):
            if raw.endswith(b"\r") and (crlf or number == 0):
                raw = raw[:-1]
            if len(raw) > self.limits.max_header_line:
                what = "command line" if number == 0 else f"header line {number}"
                raise FrameError(_COMMAND_TOO_LONG if number == 0 else _HEADER_TOO_LONG,
                                 f"{what} is {len(raw)} bytes; the limit is {self.limits.max_header_line} "
                                 + self.limits.source("SIGNALBOX_STOMP_MAX_HEADER_LINE"))
            try:
                decoded.append(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                what = "the command" if number == 0 else f"header line {number}"
                raise FrameError("Invalid UTF-8", f"{what} is not valid UTF-8 ({exc.reason} at byte "
                                                  f"{exc.start})") from None
        command = _command(decoded[0])
        version = "1.0" if command in _RAW_COMMANDS else self.version
        headers: list[tuple[str, str]] = []
        for line in decoded[1:]:
            name, _, value = line.partition(":")
            value = unescape(value, version)
            headers.append((unescape(name, version), java_trim(value) if version == "1.0" else value))
        length: int | None = None
        for name, value in headers:
            if name == "content-length" and command in _SIZED_COMMANDS:
                length = self._content_length(value)
                break
        return command, tuple(headers), body_start, length


def _command(line: str) -> str:
    """The command of a command line, read as ActiveMQ reads it: trimmed (` SEND ` is SEND), and any other
    text is a command too, which the session answers with `Unknown STOMP action: <command>`."""
    command = java_trim(line)
    if not command:
        raise FrameError("Invalid command", "the command line is empty")
    if len(command) > MAX_COMMAND:
        raise FrameError(_COMMAND_TOO_LONG,
                         f"the command line is {len(command)} characters; the limit is {MAX_COMMAND} (as "
                         "ActiveMQ's)")
    return command


def negotiate_version(accept_version: str | None) -> str | None:
    """The highest version both sides speak: no `accept-version` means 1.0; None when there is none (an
    empty one names none, as ActiveMQ reads it). Spaces around the commas are allowed (ActiveMQ would not
    see a ` 1.2`, and answer 1.1 to `1.1, 1.2`; the client did offer 1.2)."""
    if accept_version is None:
        return "1.0"
    offered = {v.strip() for v in accept_version.split(",")}
    common = [v for v in VERSIONS if v in offered]
    return common[-1] if common else None


@dataclass(frozen=True)
class HeartBeat:
    """Negotiated heart-beating, in ms (0 = off): how often this side sends, how long it waits for the
    client's data before it declares the connection dead, and the CONNECTED `heart-beat` value."""

    send_every: int
    expect_every: int
    header: str


def parse_heart_beat(value: str | None) -> tuple[int, int]:
    """The client's `cx,cy`: it can send every cx ms, it wants to receive every cy ms (0: never)."""
    if value is None:
        return 0, 0
    match = _HEART_BEAT.fullmatch(value)
    if match is None:
        raise FrameError(f"Invalid heart-beat header:{value.strip()[:64]}",  # ActiveMQ's text
                         f"heart-beat must be two non-negative integers 'cx,cy', got {value[:64]!r}")
    return int(match.group(1)), int(match.group(2))


def negotiate_heart_beat(value: str | None, minimum_ms: int = 100) -> HeartBeat:
    """ActiveMQ's answer to `heart-beat: cx,cy` is `cy,cx`: the server sends as often as the client wants
    and expects the client as often as it offers. Intervals below `minimum_ms` are raised to it (in the
    reply too, so both sides compute the same periods: max(sx, cy) and max(cx, sy))."""
    cx, cy = parse_heart_beat(value)
    send = max(cy, minimum_ms) if cy else 0
    expect = max(cx, minimum_ms) if cx else 0
    return HeartBeat(send, expect, f"{send},{expect}")
