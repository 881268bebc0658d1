"""A STOMP session over one connection (a WebSocket, or a TCP stream: gateway/stomp/tcp.py): frames from the
codec, calls to the broker through the link.

ActiveMQ's STOMP mapping (shared/spec/activemq-semantics.md Appendix A): `/queue/X` destinations and
composites, SUBSCRIBE's `activemq.*` headers, SEND headers to message fields (every other header a string
property), MESSAGE headers exactly as ActiveMQ writes them (the names and both header mappings are in
gateway/stomp/headers.py), ack modes `auto` / `client` (cumulative over the subscription) /
`client-individual`, NACK as a poison ack. Any error is an ERROR frame (`message` header, explanation in
the body, `receipt-id` when the frame asked for a receipt); the connection goes on after it, as
ActiveMQ's, except where ActiveMQ closes it too (a refused CONNECT, an unknown command, a frame the codec
rejects: `refuse`).
docs/websocket.md lists every header.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings

from broker_core import scheduler
from broker_core.destinations import Destination
from broker_core.errors import BrokerError, TransactionTooLarge
from broker_core.maintenance import AbortNotice
from broker_core.messages import Delivery, new_message_id
from broker_core.model import Consumer
from gateway import metrics
from gateway.logins import LoginRefused
from gateway.stomp import advisory_form, advisory_replay
from gateway.stomp.frames import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    VERSIONS,
    Frame,
    FrameError,
    FrameParser,
    Limits,
    encode,
    negotiate_heart_beat,
    negotiate_version,
)
from gateway.stomp.headers import (
    TEMP_LIMIT_SETTING,
    TEMP_PREFIXES,
    StompError,
    TempDestinations,
    int_value,
    is_advisory,
    java_bool,
    message_from_send,
    message_headers,
    stomp_destinations,
    stomp_name,
)
from gateway.unavailable import STORE_ERRORS, explain, retry_after
from gateway.ws import auth
from gateway.ws.link import LinkError, LinkSettings, SlowClient, Subscription
from gateway.ws.session import LinkedSession

logger = logging.getLogger(__name__)

SERVER_NAME = "Signalbox/0.1.0"
# ActiveMQ's WSServlet's, highest first (plain `stomp` last: the version then comes from CONNECT alone)
SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp", "stomp")
ACK_MODES = ("auto", "client", "client-individual")
DEFAULT_QUEUE_PREFETCH = 1000  # ActiveMQ's queue prefetch; None lets a destination policy replace it
GROUP_HEADERS = "signalbox.groupHeaders"
INBOX_FRAMES = 1000  # frames parsed but not handled yet, per connection...
INBOX_BYTES = 16 * 1024 * 1024  # ...and their bytes
SEND_BATCH = 500  # consecutive SENDs to one destination per broker call
# Bytes of MESSAGE frames per WebSocket message: measured with stomp.py (bench/ws_gateway.py), 8 KiB beat
# both one frame per message and whole 200-message batches by a wide margin.
MESSAGE_CHUNK = 8 * 1024


def _size(item: Frame | FrameError) -> int:
    if isinstance(item, FrameError):
        return 0
    return len(item.body) + sum([len(k) + len(v) + 2 for k, v in item.headers])  # (a list: no generator)


def choose_subprotocol(offered: list[str]) -> str | None:
    """The highest STOMP subprotocol the client offers; None when it offers none of them (stomp.py offers
    none; the version then comes from CONNECT's accept-version alone)."""
    for name in SUBPROTOCOLS:
        if name in offered:
            return name
    return None


@dataclass(frozen=True)
class StompSettings:
    heartbeat_min_ms: int = 100  # SIGNALBOX_STOMP_HEARTBEAT_MIN_MS
    heartbeat_grace: float = 1.5  # SIGNALBOX_STOMP_HEARTBEAT_GRACE: missing client beats tolerated x this
    connect_timeout: float = 30.0  # SIGNALBOX_STOMP_CONNECT_TIMEOUT: seconds to send CONNECT
    temp_destination_limit: int = 100  # SIGNALBOX_TEMP_DESTINATION_LIMIT: per connection
    limits: Limits = Limits()  # SIGNALBOX_STOMP_MAX_BODY, _MAX_HEADERS, _MAX_HEADER_LINE

    @classmethod
    def from_django(cls) -> StompSettings:
        def get(name: str, default: Any) -> Any:
            return getattr(django_settings, name, default)

        return cls(
            heartbeat_min_ms=int(get("SIGNALBOX_STOMP_HEARTBEAT_MIN_MS", cls.heartbeat_min_ms)),
            heartbeat_grace=float(get("SIGNALBOX_STOMP_HEARTBEAT_GRACE", cls.heartbeat_grace)),
            connect_timeout=float(get("SIGNALBOX_STOMP_CONNECT_TIMEOUT", cls.connect_timeout)),
            temp_destination_limit=int(get(TEMP_LIMIT_SETTING, cls.temp_destination_limit)),
            limits=Limits(
                max_body=int(get("SIGNALBOX_STOMP_MAX_BODY", Limits.max_body)),
                max_headers=int(get("SIGNALBOX_STOMP_MAX_HEADERS", Limits.max_headers)),
                max_header_line=int(get("SIGNALBOX_STOMP_MAX_HEADER_LINE", Limits.max_header_line)),
            ),
        )


def _int(frame: Frame, name: str, low: int, high: int, default: int | None = None) -> int | None:
    return int_value(frame.get(name), name, low, high, default)


class Transport:
    """What the session needs from the WebSocket: write one message, close. `text`: the transport tells
    text from binary messages (a WebSocket), so a frame that is valid UTF-8 goes as text; a byte stream
    takes the encoded frames as they are."""

    text = True
    # Optional: hand a payload over at once, or False when that would wait (SendBuffer, gateway/ws/link.py,
    # tries it for a frame that finds nothing queued before it). A byte stream has one; a WebSocket's send
    # goes through the ASGI server's coroutine, so there every frame goes through `write`.
    write_nowait: Callable[[bytes | str], bool] | None = None
    # Optional, together: how many bytes written are still in this process (the kernel's send buffer was
    # full), and wait until none are (False: the connection was lost first). With them a frame counts as
    # written only once its bytes left the process (SendBuffer `written`); without, once `write` returned.
    unsent: Callable[[], int] | None = None
    flush: Callable[[], Awaitable[bool]] | None = None

    async def write(self, payload: bytes | str) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    async def close(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class StompSession(LinkedSession):
    """One STOMP connection. `data_received` for every WebSocket message (or every read of a stream:
    `stream=True`), `connection_lost` at the end."""

    protocol = "stomp"
    checks_temporary = False  # (as `_authorize`: ActiveMQ checks no temporary destination)

    def __init__(self, transport: Transport, *, broker: Any, hub: Any, session_user: Any = None,
                 settings: StompSettings | None = None, link_settings: LinkSettings | None = None,
                 remote_address: str = "", stream: bool = False) -> None:
        super().__init__(transport, broker=broker, hub=hub, session_user=session_user,
                         link_settings=link_settings)
        # On a stream a frame may span reads; on a WebSocket each message must hold whole frames.
        self.stream = stream
        self._text = getattr(transport, "text", True)
        self.remote_address = remote_address  # ws://host:port of the client, named when its client-id clashes
        self.settings = settings or StompSettings.from_django()
        # until CONNECT is answered, at most what a CONNECT needs (on_connect lifts it)
        self.parser = FrameParser("1.2", self.settings.limits.before_connect())
        self.version = "1.0"
        self.established = False  # CONNECTED was sent: a CONNECT refused before that ends the connection
        self.client_id: str | None = None
        self.temps: TempDestinations | None = None  # the connection's temporary destinations, once connected
        self.last_read = time.monotonic()
        self._inbox: deque[Frame | FrameError] = deque()
        self._inbox_sizes: deque[int] = deque()  # each queued item's `_size`, counted once
        self._inbox_bytes = 0
        self._inbox_ready = asyncio.Event()
        self._inbox_room = asyncio.Event()
        # While an ACK or NACK that asked for a receipt is handled, MESSAGE frames wait (`deliver`): the room
        # the ack frees may dispatch the next message at once, and its push (Redis pub/sub) can reach this
        # process before the ack's own reply. The RECEIPT goes first, as ActiveMQ answers an ack (in its
        # transport thread) before the dispatch it allows (on the connection's task runner).
        self._receipts_first = 0
        self._receipts_written = asyncio.Event()
        self._receipts_written.set()
        # each handler returns True when it sent the frame's RECEIPT itself
        self._handlers: dict[str, Callable[[Frame], Awaitable[Any]]] = {
            "SEND": self.on_send, "SUBSCRIBE": self.on_subscribe, "UNSUBSCRIBE": self.on_unsubscribe,
            "ACK": self.on_ack, "NACK": self.on_nack, "BEGIN": self.on_begin, "COMMIT": self.on_commit,
            "ABORT": self.on_abort, "DISCONNECT": self.on_disconnect,
        }

    async def start(self) -> None:
        self.open_buffer(coalesce=True)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._connect_timeout()))
        self._tasks.append(loop.create_task(self._work()))

    # -- input ----------------------------------------------------------------------------------------

    async def data_received(self, data: bytes) -> None:
        """Parse a WebSocket message and queue its frames for the worker. The queue is bounded: when the
        worker falls behind this waits, and the client's socket with it."""
        if self.closing:
            return
        for item in self._parse(data):
            if self._inbox_full():
                await self.inbox_room()
            self._queue(item)

    def feed(self, data: bytes) -> bool:
        """`data_received` for a byte stream, called from the transport's callback (gateway/stomp/tcp.py):
        the frames of one read are queued at once, so the inbox may pass its bound by one read's frames
        (which the reader task held in memory as well while it waited for room); False says the inbox is
        full, and the caller reads nothing more until `inbox_room` returns."""
        if self.closing:
            return True
        for item in self._parse(data):
            self._queue(item)
        return not self._inbox_full()

    def _parse(self, data: bytes) -> list[Frame | FrameError]:
        self.last_read = time.monotonic()
        items: list[Frame | FrameError] = []
        try:
            items += self.parser.feed(data)
            if not self.stream:
                self.parser.end_of_message()
        except FrameError as exc:
            items += exc.parsed
            items.append(exc)
        return items

    def _inbox_full(self) -> bool:
        return len(self._inbox) >= INBOX_FRAMES or self._inbox_bytes >= INBOX_BYTES

    async def inbox_room(self) -> None:
        """Wait until the inbox has room for a frame (or the session is closing)."""
        while self._inbox_full() and not self.closing:
            self._inbox_room.clear()
            await self._inbox_room.wait()

    def _queue(self, item: Frame | FrameError) -> None:
        size = _size(item)
        self._inbox.append(item)
        self._inbox_sizes.append(size)
        self._inbox_bytes += size
        self._inbox_ready.set()

    async def _work(self) -> None:
        """Handle queued frames in order; consecutive SENDs to one destination go to the broker in one
        call (they arrive faster than one Redis round trip each)."""
        inbox = self._inbox
        while not self.closing:
            while not inbox:
                self._inbox_ready.clear()
                await self._inbox_ready.wait()
            item = self._take_item()
            if isinstance(item, FrameError):
                metrics.frame("stomp", "invalid", "error")
                await self.fail(item.message, item.detail)
                return
            batch = [item]
            destination = item.get("destination")
            if item.command == "SEND" and self.link is not None and "," not in (destination or ","):
                key = (destination, item.get("transaction"))
                while (inbox and len(batch) < SEND_BATCH and isinstance(inbox[0], Frame)
                       and inbox[0].command == "SEND"
                       and (inbox[0].get("destination"), inbox[0].get("transaction")) == key):
                    batch.append(self._take_item())
            self._inbox_room.set()
            try:
                if len(batch) > 1:
                    await self.handle_sends(batch)
                else:  # (one frame, the usual case when the client waits for each answer)
                    await self.handle(item)
            except SlowClient as exc:  # (an answer written outside `handle`'s own: a refusal's ERROR,
                await self.shutdown(str(exc))  # a batch's RECEIPTs) found the client reading nothing
                return

    def _take_item(self) -> Frame | FrameError:
        self._inbox_bytes -= self._inbox_sizes.popleft()
        return self._inbox.popleft()

    async def handle_sends(self, batch: list[Frame]) -> None:
        """SENDs to one destination in one broker call; anything wrong and they go one by one through
        `handle`, which reports the first bad frame exactly. A batch is refused before anything was
        written, except by a part refused after others were stored (broker_core flow.send_parts, its
        `sent`): those frames are answered as sent, and only the rest go one by one (each again would
        be a new message, stored twice)."""
        assert self.link is not None
        if len(batch) > 1:
            try:
                (dest,) = await self._send_destinations(batch[0])
                if scheduler.is_management(dest):
                    raise StompError("scheduler management")  # (each acts in turn: `on_send`)
                name = batch[0].get("transaction")
                messages = [message_from_send(frame, self.link.connection_id, self.temps) for frame in batch]
                tx = (await self.link.transaction_for_send(name, messages, [dest.uri]) if name is not None
                      else None)
                await self._create_temps()
                await self.broker.send(dest, messages, tx=tx)
                self.note_send([dest], len(messages))
            except (StompError, LinkError, BrokerError) as exc:  # the one-by-one path reports the first bad
                sent = int(getattr(exc, "details", {}).get("sent", 0))  # frame; `sent` were stored
                if sent:
                    self.note_send([dest], sent)
                    await self._sent(batch[:sent])
                    batch = batch[sent:]
            except STORE_ERRORS as exc:  # perhaps written: never sent again one by one
                await self.fail_unavailable(exc, batch[0].get("receipt"))
                return
            else:
                await self._sent(batch)
                return
        for frame in batch:
            await self.handle(frame)
            if self.closing:
                return

    async def _sent(self, batch: list[Frame]) -> None:
        metrics.frame("stomp", "SEND", "ok", len(batch))
        for frame in batch:
            receipt = frame.get("receipt")
            if receipt is not None:
                await self.send_frame("RECEIPT", [("receipt-id", receipt)])

    async def handle(self, frame: Frame) -> None:
        receipt = frame.get("receipt")
        outcome = "error"
        hold = receipt is not None and frame.command in ("ACK", "NACK")  # its RECEIPT (or ERROR) goes first
        if hold:
            self._receipts_first += 1
            self._receipts_written.clear()
        try:
            if frame.command in ("CONNECT", "STOMP"):
                await self.on_connect(frame)
                outcome = "ok"
                return
            if frame.command not in CLIENT_COMMANDS:
                raise StompError(f"Unknown STOMP action: {frame.command}",
                                 f"{frame.command!r} is not a client command of STOMP {self.version}",
                                 fatal=True)
            if self.link is None:
                raise StompError("Not connected.", f"{frame.command} before CONNECT; send CONNECT first")
            receipt_sent = await self._handlers[frame.command](frame)
            outcome = "ok"
            if receipt is not None and not receipt_sent and not self.closing:
                await self.send_frame("RECEIPT", [("receipt-id", receipt)])
            if frame.command == "DISCONNECT":  # done (and counted ok) before the close: over TCP the
                await self.shutdown("DISCONNECT")  # socket's end cancels this task while it waits there
        except (StompError, FrameError, LinkError, BrokerError) as exc:
            await self.refuse(frame, exc, receipt)
        except SlowClient as exc:
            await self.shutdown(str(exc))
        except STORE_ERRORS as exc:
            await self.fail_unavailable(exc, receipt)
        except Exception as exc:
            outcome = "internal_error"
            logger.exception("STOMP %s failed", frame.command)
            await self.fail("Internal error", f"{frame.command} failed: {exc}", receipt)
        finally:  # (a command outside STOMP's own is counted as `unknown`: labels stay few)
            metrics.frame("stomp", frame.command if frame.command in CLIENT_COMMANDS else "unknown", outcome)
            if hold:
                self._receipts_first -= 1
                if not self._receipts_first:
                    self._receipts_written.set()

    # -- output ---------------------------------------------------------------------------------------

    async def send_frame(self, command: str, headers: list[tuple[str, str]], body: bytes = b"",
                         force: bool = False) -> None:
        assert self.buffer is not None
        data = encode(command, headers, body, self.version)
        await self.buffer.put(self._payload(data), force=force)

    def _payload(self, data: bytes) -> bytes | str:
        """Encoded frames as the transport takes them: on a WebSocket text when they are valid UTF-8 (a
        binary body makes a binary message); on a stream the bytes themselves (no decoding and encoding
        again for every MESSAGE)."""
        if not self._text:
            return data
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data

    async def deliver(self, sub: Subscription, consumer: Consumer | None, deliveries: list[Delivery]) -> None:
        """A receive batch as WebSocket messages of about MESSAGE_CHUNK bytes each (text unless a body is
        binary): fewer, larger messages cost less per frame, but clients parse a message at a time."""
        assert self.buffer is not None
        if self._receipts_first:  # an ack's RECEIPT goes before what the ack let through (see __init__)
            await self._receipts_written.wait()
        # What is the same for every message of the subscription, looked up once per batch: a stream's
        # batch is up to a receive batch of messages, and this loop runs for each
        tracked = sub.ack_mode != "auto"
        with_ack = self.version == "1.2"
        subscription_id = sub.options.get("id")
        group_headers = sub.options.get("group_headers", False)
        advisory_transformation = sub.options.get("advisory_transformation", advisory_form.JSON)
        temps = self.temps
        chunk: list[bytes] = []
        size = 0
        for delivery in deliveries:
            # 1.2 acks by the ack header alone, unique in the connection (Link.track); 1.0/1.1 by message-id
            ack_id = self.link.track(sub, consumer, delivery) if tracked else None
            headers = message_headers(delivery, subscription_id, ack_id if with_ack else None, group_headers,
                                      temps, advisory_transformation)
            if advisory_transformation == advisory_form.XML and is_advisory(delivery):  # asked for XML
                body = advisory_form.as_xml(delivery.body if isinstance(delivery.body, str)
                                            else delivery.body.decode("utf-8")).encode("utf-8")
            else:
                body = delivery.body.encode("utf-8") if isinstance(delivery.body, str) else delivery.body
            if isinstance(delivery.body, bytes) or b"\x00" in body:
                headers.append(("content-length", str(len(body))))
            frame = encode("MESSAGE", headers, body, self.version)
            chunk.append(frame)
            size += len(frame)
            if size >= MESSAGE_CHUNK:
                await self._put_frames(chunk)
                chunk, size = [], 0
        if chunk:
            await self._put_frames(chunk)

    async def _put_frames(self, frames: list[bytes]) -> None:
        assert self.buffer is not None
        await self.buffer.put(self._payload(frames[0] if len(frames) == 1 else b"".join(frames)))

    async def refuse(self, frame: Frame, exc: StompError | FrameError | LinkError | BrokerError,
                     receipt: str | None) -> None:
        """A frame refused: ERROR, and the connection goes on, as ActiveMQ's ProtocolConverter ("a command
        can fail.. but that does not invalidate the connection"). It closes after the ERROR (`fail`) when
        the refusal is fatal there too: a CONNECT refused, an unknown command, a frame the codec rejects.
        A SEND or ACK of a transaction refused while nobody waited for its answer (no receipt) marks the
        transaction rollback-only (Link.mark_rollback_only), as ActiveMQ's TransportConnection does for
        an asynchronous command that fails."""
        if isinstance(exc, TransactionTooLarge):
            message, detail, headers = ("Transaction too large",
                                        f"transaction {frame.get('transaction')!r}: {exc.message}", ())
        elif isinstance(exc, BrokerError):
            message, detail, headers = exc.message.split("\n", 1)[0][:200], exc.message, ()
        else:
            message, detail, headers = exc.message, exc.detail, getattr(exc, "headers", ())
        refused_connect = frame.command in ("CONNECT", "STOMP") and not self.established
        if refused_connect or isinstance(exc, FrameError) or getattr(exc, "fatal", False):
            await self.fail(message, detail, receipt, headers)
            return
        name = frame.get("transaction")
        if (receipt is None and name is not None and self.link is not None
                and frame.command in ("SEND", "ACK", "NACK")):
            self.link.mark_rollback_only(name, f"its {frame.command} was refused ({message})")
        await self.send_error(message, detail, receipt, headers)

    async def send_error(self, message: str, detail: str, receipt: str | None,
                         headers: tuple[tuple[str, str], ...] = (), force: bool = False) -> None:
        """The ERROR frame: `message`, `receipt-id` when the frame asked for a receipt, the headers the
        refusal adds, the explanation as a text body."""
        body = (detail or message).encode("utf-8")
        error_headers = [("message", message), *headers, ("content-type", "text/plain"),
                         ("content-length", str(len(body)))]
        if receipt is not None:
            error_headers.insert(1, ("receipt-id", receipt))
        await self.send_frame("ERROR", error_headers, body, force=force)

    async def fail(self, message: str, detail: str = "", receipt: str | None = None,
                   headers: tuple[tuple[str, str], ...] = (), release_first: bool = True) -> None:
        """Send ERROR, then close the connection (a fatal refusal, `refuse`, or the broker's own end). The
        broker side is released first (subscriptions closed, unacknowledged messages back, the client id
        free), so a client that reconnects as soon as it reads the ERROR finds it so; not when Redis is
        unreachable (`release_first=False`), where that would only hold the ERROR back."""
        if self.closing:
            return
        self.closing = True
        if release_first:
            await self.release(message)
        with contextlib.suppress(Exception):
            await self.send_error(message, detail, receipt, headers, force=True)
        await self.shutdown(message)

    async def fail_unavailable(self, exc: BaseException, receipt: str | None = None) -> None:
        """Redis cannot be reached: ERROR `Broker unavailable` and the close. The client reconnects (after
        the `retry-after` seconds): CONNECT succeeds again as soon as Redis answers. Unacknowledged
        messages go back to the queue when this connection's consumers lapse."""
        logger.warning("STOMP connection ends: Redis unavailable (%s)", exc)
        await self.fail("Broker unavailable", explain(exc) + "; reconnect to go on", receipt,
                        (("retry-after", str(retry_after())),), release_first=False)

    async def close_by_operator(self, reason: str) -> None:
        """The console's Close: ERROR, then the close; `fail` releases first, so unacknowledged messages
        go back to their queues before the client reads the ERROR."""
        await self.fail("Connection closed by an administrator", reason)

    async def _lost(self, reason: str, unavailable: bool = False) -> None:
        if unavailable:
            await self.fail("Broker unavailable", f"{reason}; the broker's store (Redis) cannot be reached, "
                            "reconnect to go on", headers=(("retry-after", str(retry_after())),),
                            release_first=False)
            return
        await self.fail("Connection lost its subscriptions", reason)

    async def _aborted(self, sub: Subscription, notice: AbortNotice) -> None:
        """A slow-consumer strategy or an operator aborted the subscription (spec §8.4); the link already
        closed it and its unacked messages went back to the queue. ActiveMQ's STOMP converter drops the
        broker's ConsumerControl, so its client only notices that nothing arrives any more; the one
        unsolicited notice its STOMP mapping has is an ERROR that leaves the connection open
        (ProtocolConverter.handleException for an asynchronous ConnectionError). We send that, naming the
        subscription and the reason. With abortConnection the ERROR is followed by the close, as ever."""
        if self.closing:
            return
        headers: list[tuple[str, str]] = []
        if sub.options.get("id") is not None:
            headers.append(("subscription", sub.options["id"]))
        headers += [("destination", ",".join(stomp_name(d.uri) or "" for d in sub.destinations)),
                    ("abort-strategy", notice.strategy),
                    ("abort-connection", "true" if notice.abort_connection else "false")]
        if notice.abort_connection:
            await self.fail(notice.reason, f"The broker aborted subscription {sub.key} and closes this "
                            f"connection (abortConnection): {notice.reason}. Unacknowledged messages go to "
                            "other consumers.", headers=tuple(headers))
            return
        body = (f"The broker aborted subscription {sub.key}: {notice.reason}. Its unacknowledged messages go "
                "to other consumers. The connection stays open; SUBSCRIBE again to go on consuming.")
        data = body.encode("utf-8")
        await self.send_frame("ERROR", [("message", notice.reason), *headers, ("content-type", "text/plain"),
                                        ("content-length", str(len(data)))], data)

    # -- timers ---------------------------------------------------------------------------------------

    async def _connect_timeout(self) -> None:
        await asyncio.sleep(self.settings.connect_timeout)
        if self.link is None and not self.closing:
            await self.fail("No CONNECT frame", f"no CONNECT within {self.settings.connect_timeout:g} s")

    async def _send_heart_beats(self, every_ms: int) -> None:
        assert self.buffer is not None
        period = every_ms / 1000
        while not self.closing:
            await asyncio.sleep(period - min(period, time.monotonic() - self.buffer.last_write))
            if time.monotonic() - self.buffer.last_write >= period * 0.9 and not self.buffer.size:
                await self.buffer.put(self._payload(HEARTBEAT))

    async def _check_heart_beats(self, expect_ms: int) -> None:
        limit = expect_ms / 1000 * self.settings.heartbeat_grace
        while not self.closing:
            await asyncio.sleep(max(0.01, limit - (time.monotonic() - self.last_read)))
            if self._inbox_full():
                # nothing is read while the inbox is full (tcp.py pauses reading; the WebSocket path waits
                # for room): the client's beats wait on us, it is not silent. ActiveMQ's read check skips a
                # connection whose command is being received (AbstractInactivityMonitor.readCheck)
                self.last_read = time.monotonic()
            if time.monotonic() - self.last_read >= limit:
                await self.fail(f"Channel was inactive for too (>{int(limit * 1000)}) long",
                                f"no frame or heart-beat from the client for {limit:g} s; it promised one "
                                f"every {expect_ms} ms")
                return

    # -- frames ---------------------------------------------------------------------------------------

    async def on_connect(self, frame: Frame) -> None:
        if self.link is not None:
            raise StompError("Already connected.", "this connection sent CONNECT twice")
        version = negotiate_version(frame.get("accept-version"))
        if version is None:
            # ActiveMQ's text; the `version` header is the STOMP spec's
            raise StompError(f"Invalid Protocol version[{frame.get('accept-version')}], supported versions "
                             f"are: [{', '.join(reversed(VERSIONS))}]",
                             f"accept-version {frame.get('accept-version')!r} names no version this server "
                             "speaks", (("version", ",".join(VERSIONS)),))
        self.parser.version = version
        self.unique_ack_ids = version == "1.2"  # its ACK names the message by the ack header alone
        # as ActiveMQ, whatever the version: a 1.0 client that asks for heart-beats gets them
        beat = negotiate_heart_beat(frame.get("heart-beat"), self.settings.heartbeat_min_ms)
        login, passcode = frame.get("login"), frame.get("passcode")
        try:
            user = await auth.authenticate(login, passcode, self.session_user, self.client_host)
        except LoginRefused as exc:
            raise StompError(exc.message, "no password was checked; wait, then connect again",
                             (("retry-after", f"{exc.retry_after:.0f}"),)) from None
        if user is None:  # (the detail says what was wrong with what was given)
            raise StompError(f"User name [{login or ''}] or password is invalid.",
                             "the login and passcode given are neither a user's password nor an API token "
                             "of that user" if login and passcode else
                             "the passcode is no API token (and no login was given)" if passcode else
                             "CONNECT needs login and passcode: a user name and password, or an API token as "
                             "the passcode")
        self.client_id = frame.get("client-id")
        link = await self.open_link(user)
        self.temps = TempDestinations(link.connection_id, self.settings.temp_destination_limit)
        if self.client_id is not None:
            # one connection per client id, across gateway processes (ActiveMQ's InvalidClientIDException)
            await link.claim_client_id(self.client_id, self.remote_address)
        await self.connected()  # ActiveMQ.Advisory.Connection, once the connection stands
        headers = [("version", version), ("session", link.connection_id), ("server", SERVER_NAME),
                   ("heart-beat", beat.header)]
        # ActiveMQ answers CONNECT's `request-id` (else its `receipt`) in CONNECTED, under both names
        request_id = frame.get("request-id", frame.get("receipt"))
        if request_id is not None:
            headers += [("response-id", request_id), ("receipt-id", request_id)]
        self.parser.limits = self.settings.limits
        # frames go out in the version from CONNECTED on: a refused CONNECT's ERROR is STOMP 1.0's, as
        # ActiveMQ's (its wire format takes the version once CONNECTED is sent), so its header unescaped
        self.version = version
        self.established = True
        await self.send_frame("CONNECTED", headers)
        loop = asyncio.get_running_loop()
        if beat.send_every:
            self._tasks.append(loop.create_task(self._send_heart_beats(beat.send_every)))
        if beat.expect_every:
            self.last_read = time.monotonic()
            self._tasks.append(loop.create_task(self._check_heart_beats(beat.expect_every)))

    async def _authorize(self, destinations: list[Destination], action: str) -> None:
        # Temporary destinations are every user's, as ActiveMQ's without a tempDestinationAuthorizationEntry
        # (AuthorizationBroker: no ACLs, no check); who may consume is their owner check's.
        # (checks_temporary = False says so to the checks the sessions share)
        destinations = [d for d in destinations if not d.is_temporary]
        if not destinations:
            return
        refusal = await self.refusal(destinations, action)
        if refusal is not None:
            raise self.refused(refusal)

    def refused(self, refusal: str) -> Exception:
        return StompError(refusal)

    async def _create_temps(self) -> None:
        """Create the temporary destinations the last frame named for the first time (ActiveMQ's
        DestinationInfo ADD), so that other connections find them (Broker.temp_destination_refusal)."""
        while self.temps is not None and self.temps.new:
            await self.broker.ensure_destination(self.temps.new[0])
            self.temps.new.pop(0)

    async def _send_destinations(self, frame: Frame) -> list[Destination]:
        """Where a SEND goes, checked: another connection's temporary destination only while it exists and
        its connection lives (ActiveMQ: DestinationDoesNotExistException, naming it)."""
        assert self.link is not None
        destinations = stomp_destinations(frame.get("destination"), command="SEND", temps=self.temps)
        await self._create_temps()
        for dest in destinations:
            if dest.is_temporary and dest.temporary_owner != self.link.connection_id:
                refusal = await self.broker.temp_destination_refusal(dest)
                if refusal is not None:
                    raise StompError(f"temp-{dest.kind}://{dest.name}",  # ActiveMQ's text: the name alone
                                     f"Destination does not exist: cannot send to temp-{dest.kind}://"
                                     f"{dest.name}: {refusal} (a temporary destination is deleted with the "
                                     "connection that created it)")
        await self._authorize(destinations, "write")
        return destinations

    async def release(self, reason: str = "") -> None:
        """LinkedSession's release, then the connection's temporary destinations are deleted with their
        messages (ActiveMQ's removal of a connection's temp destinations), each counted
        (Broker.delete_temp_destination). A process that dies deletes none: its connections' leases lapse
        and maintenance deletes them (broker_core/maintenance.py)."""
        await super().release(reason)
        temps, self.temps = self.temps, None
        if temps is None:
            return
        for dest in temps.by_name.values():
            try:
                removed = await self.broker.delete_temp_destination(dest)
            except Exception as exc:  # left to maintenance, once this connection's lease lapses
                logger.warning("temporary destinations of %s not deleted (%s): maintenance deletes them",
                               temps.connection_id, exc)
                return  # (Redis away: the others would wait for it one by one)
            else:
                # a request/reply client has one per connection: a line per connection, DEBUG as the others;
                # replies deleted unread are worth telling
                logger.log(logging.INFO if removed else logging.DEBUG,
                           "temporary destination %s deleted with %d message%s: its connection ended (%s)",
                           dest.uri, removed, "" if removed == 1 else "s", reason or "closed")

    async def on_send(self, frame: Frame) -> None:
        assert self.link is not None
        destinations = await self._send_destinations(frame)
        message = message_from_send(frame, self.link.connection_id, self.temps)
        await self._create_temps()
        if scheduler.is_management_send(destinations):
            await self.manage_scheduler(destinations, [message], frame.get("transaction"))
            return
        name = frame.get("transaction")
        tx = await self.link.transaction_for_send(name, [message], [d.uri for d in destinations]) \
            if name is not None else None
        if len(destinations) == 1:
            await self.broker.send(destinations[0], message, tx=tx)
        else:
            # one message, one id (set here: a transaction stores each part on its own), for every part, in
            # one atomic step (broker_core's composite send, spec §10.1); each copy's original destination
            # is the composite, as in ActiveMQ
            message = dataclasses.replace(message, message_id=new_message_id())
            await self.broker.send(",".join(d.uri for d in destinations), message, tx=tx)
        self.note_send(destinations)  # the connection registry's producer rows

    async def on_subscribe(self, frame: Frame) -> bool:
        assert self.link is not None
        sub_id = frame.get("id")
        if sub_id is None and self.version != "1.0":
            # ActiveMQ subscribes nothing: from STOMP 1.1 on every MESSAGE must name its subscription
            raise StompError("SUBSCRIBE received without a subscription id!",
                             f"STOMP {self.version} SUBSCRIBE needs an id header; ACK and MESSAGE name it")
        destinations = stomp_destinations(frame.get("destination"), subscribe=True, command="SUBSCRIBE",
                                          temps=self.temps)
        # (another connection's temporary destination: the broker refuses the consumer, Router.add_consumer)
        await self._create_temps()
        browser = frame.get("browser") == "true"  # (ActiveMQ compares with "true" exactly: TRUE subscribes)
        if browser and self.version == "1.0":
            raise StompError("Queue Browser feature only valid for Stomp v1.1+ clients!",
                             "SUBSCRIBE with browser:true needs STOMP 1.1 or later")
        durable_name = frame.get("activemq.subscriptionName")
        if durable_name is not None and any(not d.is_topic for d in destinations):
            raise StompError("Invalid Subscription: cannot durably subscribe to a Queue destination!")
        if browser:
            return await self._browse(frame, destinations)
        ack = self._ack_mode(frame)
        prefetch = _int(frame, "activemq.prefetchSize", 1, 32767)
        priority = _int(frame, "activemq.priority", -128, 127, 0)
        # checked; the topic policy's pendingMessageLimitStrategy decides (ActiveMQ ignores the consumer's
        # value without a strategy, and broker_core takes the strategy's)
        _int(frame, "activemq.maximumPendingMessageLimit", -1, 2**31 - 1)
        await self._authorize(destinations, "read")
        key = sub_id if sub_id is not None else (frame.get("destination") or "")
        spec = self.link.spec(
            prefetch=prefetch, priority=priority or 0, exclusive=java_bool(frame.get("activemq.exclusive")),
            selector=frame.get("selector"), stomp_selector=True,
            no_local=java_bool(frame.get("activemq.noLocal")), client_id=self.durable_client_id(),
            ack_mode=ack, subscription_name=durable_name,
            retroactive=java_bool(frame.get("activemq.retroactive")))
        options = {"id": sub_id, "group_headers": java_bool(frame.get(GROUP_HEADERS)),
                   "advisory_transformation": advisory_form.requested(frame.get("transformation"))}
        receipt = frame.get("receipt")
        sub = await self.link.subscribe(key, destinations, spec, options, start=False)
        self.note_subscription(sub, spec.selector, sub.consumers[0].prefetch)  # the connection registry
        if receipt is not None:
            # ActiveMQ holds dispatch until the RECEIPT is out; the pumps start after it.
            await self.send_frame("RECEIPT", [("receipt-id", receipt)])
        self.link.start(sub)
        for dest in destinations:  # a new advisory subscriber first hears about the present (ActiveMQ's)
            replayed = await advisory_replay.replay(self.broker, dest)
            if replayed:
                await self.deliver(sub, None, replayed)
        return receipt is not None

    @staticmethod
    def _ack_mode(frame: Frame) -> str:
        ack = frame.get("ack", "auto") or "auto"
        if ack not in ACK_MODES:
            raise StompError("Invalid ack mode", f"ack must be one of {', '.join(ACK_MODES)}, got {ack!r}")
        return ack

    async def _browse(self, frame: Frame, destinations: list[Destination]) -> bool:
        """SUBSCRIBE browser:true, ActiveMQ's queue browser (StompQueueBrowserSubscription): the messages on
        the queue now as MESSAGE frames (Link.browse), then one MESSAGE with `browser:end` (`_browsed`).
        The subscription stays, receiving nothing more, until UNSUBSCRIBE. Its messages stay on the queue:
        an ACK of one only forgets it, a NACK is refused (ActiveMQ's texts)."""
        assert self.link is not None
        (dest, *more) = destinations
        if more or not dest.is_queue or dest.is_wildcard:
            # (ActiveMQ fails such a browser with a ClassCastException's text; ours names the rule)
            raise StompError("Queue Browser feature only valid for a single queue",
                             f"browser:true browses one queue; {frame.get('destination')!r} is not one")
        ack = self._ack_mode(frame)
        # ActiveMQ's browser prefetch (DEFAULT_QUEUE_BROWSER_PREFETCH) unless the client gives one
        prefetch = _int(frame, "activemq.prefetchSize", 1, 32767, 500)
        assert prefetch is not None
        await self._authorize(destinations, "read")
        sub_id = frame.get("id")
        assert sub_id is not None  # (required from STOMP 1.1 on: on_subscribe)
        selector = frame.get("selector")
        # STOMP's string coercion, as every STOMP selector (ActiveMQ's convert_string_expressions: prefix)
        stomp_selector = f"convert_string_expressions:{selector}" if selector and selector.strip() else None
        sub = await self.link.browse(sub_id, dest, stomp_selector, ack, {"id": sub_id}, prefetch)
        self.note_subscription(sub, selector, None)
        receipt = frame.get("receipt")
        if receipt is not None:  # before the messages, as ActiveMQ's
            await self.send_frame("RECEIPT", [("receipt-id", receipt)])
        self.link.start(sub)
        return receipt is not None

    async def _browsed(self, sub: Subscription) -> None:
        """A queue browser gave all it will: ActiveMQ's end frame, with these headers in this order (seen
        on ActiveMQ 5.17.2) and no body."""
        assert self.temps is not None
        name = self.temps.name_of if self.temps.own else stomp_name
        await self.send_frame("MESSAGE", [
            ("browser", "end"), ("destination", name(sub.destinations[0].uri) or ""),
            ("message-id", "0"), ("subscription", sub.options["id"])])

    def durable_client_id(self) -> str:
        """The client id durable subscriptions are kept under: CONNECT's client-id, else (as ActiveMQ)
        the connection's own id, which makes a subscription no later connection can take up again."""
        assert self.link is not None
        return self.client_id or self.link.connection_id

    async def on_unsubscribe(self, frame: Frame) -> None:
        assert self.link is not None
        if frame.get("id") is None and self.version != "1.0":
            raise StompError("UNSUBSCRIBE received without a subscription id!",
                             f"STOMP {self.version} UNSUBSCRIBE names the subscription by its id header")
        if frame.get("id") is None and frame.get("destination") is None:
            raise StompError("Must specify the subscriptionId or the destination you are unsubscribing from")
        durable_name = frame.get("activemq.subscriptionName")
        if durable_name is not None:
            # ActiveMQ's RemoveSubscriptionInfo: delete the durable subscription and its messages. While a
            # consumer holds it (this connection's own included) it is in use and stays, as in ActiveMQ:
            # UNSUBSCRIBE the id first, then UNSUBSCRIBE with the name.
            client_id = self.durable_client_id()
            if frame.get("destination"):
                topics = stomp_destinations(frame.get("destination"), subscribe=True, command="UNSUBSCRIBE")
            else:
                topics = [await self.link.durable_topic(client_id, durable_name)]
            if any(not topic.is_topic for topic in topics):
                raise StompError("Invalid Subscription: cannot durably subscribe to a Queue destination!")
            await self._authorize(topics, "read")
            for topic in topics:
                await self.link.unsubscribe_durable(client_id, durable_name, topic, end_own=False)
            return
        key = frame.get("id")
        if key is None:
            key = self._unsubscribe_key_by_destination(frame.get("destination") or "")
        await self.link.unsubscribe(key)

    def _unsubscribe_key_by_destination(self, destination: str) -> str:
        """STOMP 1.0's UNSUBSCRIBE by `destination`: the subscription made without an id on that
        destination (keyed by it), else the first one of the connection on the same destinations, with an
        id or not, as ActiveMQ's onStompUnsubscribe matches a subscription by its destination."""
        assert self.link is not None
        if destination in self.link.subscriptions:
            return destination
        known = self.temps.by_name if self.temps is not None else {}
        # a temporary name this connection never used has no subscription, and resolving it would make one
        if any(part.strip().startswith(TEMP_PREFIXES) and part.strip() not in known
               for part in destination.split(",")):
            return destination
        try:
            wanted = stomp_destinations(destination, subscribe=True, command="UNSUBSCRIBE", temps=self.temps)
        except StompError:
            return destination  # (no such subscription: link.unsubscribe says so)
        return next((sub.key for sub in self.link.subscriptions.values() if sub.destinations == wanted),
                    destination)

    def _ack_target(self, frame: Frame) -> tuple[Subscription, str] | None:
        """The subscription and ack id an ACK/NACK names; None for a message of a subscription that was
        unsubscribed or aborted since, named by its ack id alone (1.2's `id`, 1.0's `message-id` without
        `subscription`): it went back to the queue, ActiveMQ answers such a late ack with a RECEIPT and
        does nothing, and acknowledging late is not the client's error. One that names the subscription
        (1.1) is refused, as ActiveMQ's, which looks only in the subscriptions still open."""
        assert self.link is not None
        name = "id" if self.version == "1.2" else "message-id"
        ack_id = frame.get(name)
        sub_key = frame.get("subscription")
        # ActiveMQ's texts, by version (its NACK words them differently from its ACK)
        if ack_id is None and self.version == "1.2":
            raise StompError("ACK received without a ack id for acknowledge!" if frame.command == "ACK"
                             else "NACK received without an ack header to acknowledge!",
                             f"STOMP 1.2 {frame.command} names the message by the id header (the MESSAGE's "
                             "ack header)")
        if sub_key is None and self.version == "1.1" and frame.command == "NACK":  # ActiveMQ asks this first
            raise StompError("NACK received without a subscription id for acknowledge!",
                             "STOMP 1.1 NACK needs the subscription header")
        if ack_id is None:
            raise StompError(f"{frame.command} received without a message-id to acknowledge!",
                             f"STOMP {self.version} {frame.command} names the message by its message-id")
        if sub_key is None and self.version == "1.1":
            raise StompError(f"{frame.command} received without a subscription id for acknowledge!",
                             f"STOMP 1.1 {frame.command} needs the subscription header")
        if sub_key is None or self.version == "1.2":
            # 1.2 names the delivery alone (a subscription header is not read, as ActiveMQ's); 1.0 without
            # one: the subscription holding it
            sub = self.link.find(ack_id)
            if sub is None and self.link.was_ended(ack_id):
                return None
            where = "no subscription of this connection holds"
            held = self.link.transaction_of(ack_id) if sub is None else None
        else:
            # Before 1.2 the subscription named is the only one looked in, as ActiveMQ's: a message another
            # subscription delivered, or one of this subscription unsubscribed since, is refused
            sub = named = self.link.subscriptions.get(sub_key)
            if sub is not None and ack_id not in sub.unacked:
                sub = None
            where = f"subscription {sub_key!r} of this connection does not hold"
            held = self.link.transaction_of(ack_id, named) if sub is None and named is not None else None
        if sub is None:
            raise StompError(f"Unexpected {frame.command} received for message-id [{ack_id}]",
                             self.link.acknowledged_in(ack_id, held) if held is not None
                             else f"{where} an unacknowledged message {ack_id}")
        return sub, ack_id

    async def on_ack(self, frame: Frame) -> None:
        assert self.link is not None
        target = self._ack_target(frame)
        if target is not None:
            sub, ack_id = target
            await self.link.ack(sub, [ack_id], frame.get("transaction"))

    async def on_nack(self, frame: Frame) -> None:
        assert self.link is not None
        if self.version == "1.0":
            raise StompError("NACK received but connection is in v1.0 mode.", "NACK exists from STOMP 1.1 on")
        target = self._ack_target(frame)
        if target is not None:
            sub, ack_id = target
            if sub.browser is not None:
                raise StompError("Cannot Nack a message on a Queue Browser Subscription.",
                                 "a browsed message stays on the queue; there is nothing to give back")
            await self.link.nack(sub, [ack_id], frame.get("transaction"))

    def _transaction_name(self, frame: Frame) -> str:
        name = frame.get("transaction")
        if name is None:  # ActiveMQ's texts (its ABORT borrows COMMIT's)
            verb = "beginning" if frame.command == "BEGIN" else "committing"
            raise StompError(f"Must specify the transaction you are {verb}",
                             f"{frame.command} needs a transaction header")
        return name

    async def on_begin(self, frame: Frame) -> None:
        assert self.link is not None
        await self.link.begin(self._transaction_name(frame))

    async def on_commit(self, frame: Frame) -> None:
        assert self.link is not None
        await self.link.commit(self._transaction_name(frame))

    async def on_abort(self, frame: Frame) -> None:
        assert self.link is not None
        await self.link.abort(self._transaction_name(frame))

    async def on_disconnect(self, frame: Frame) -> None:
        """Close the subscriptions (unacked messages go back) and send the RECEIPT; `handle` then closes."""
        assert self.link is not None
        await self.release("DISCONNECT")
        receipt = frame.get("receipt")
        if receipt is not None:
            await self.send_frame("RECEIPT", [("receipt-id", receipt)], force=True)
