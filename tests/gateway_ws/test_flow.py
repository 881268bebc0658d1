"""Flow and liveness of a WebSocket connection, in-process against the real broker: the bounded send
buffer, slow clients, leases renewed while the socket lives, a connection whose consumer was closed under
it, the per-connection subscription limit."""

from __future__ import annotations

import asyncio
import time

import pytest
from django.test import override_settings

from broker_core.messages import Message
from gateway import runtime
from gateway.stomp.frames import encode
from gateway.stomp.protocol import StompSession, Transport
from gateway.ws.link import LinkSettings, SendBuffer, SlowClient
from tests.helpers.stomp_channels import stomp

pytestmark = pytest.mark.usefixtures("ws_runtime", "stomp_user")


async def test_a_full_send_buffer_makes_put_wait_and_then_gives_up_on_a_slow_client():
    release = asyncio.Event()
    written: list[str] = []

    async def write(payload):
        await release.wait()
        written.append(payload)

    buffer = SendBuffer(write, max_bytes=20, slow_seconds=0.2)
    await buffer.put("x" * 8)  # taken by the writer, which blocks
    await asyncio.sleep(0.01)
    await buffer.put("y" * 8)
    start = time.monotonic()
    with pytest.raises(SlowClient):
        await buffer.put("z" * 8)
    assert time.monotonic() - start >= 0.2
    assert buffer.size == 16  # bounded: nothing more was taken in
    release.set()
    await asyncio.sleep(0.01)  # the writer takes its write back (a stuck client's flush returns at once)
    await buffer.flush(1)
    assert written == ["x" * 8, "y" * 8]
    await buffer.close()


async def test_the_writer_coalesces_queued_frames_into_one_websocket_message():
    gate = asyncio.Event()
    written: list[bytes] = []

    async def write(payload):
        await gate.wait()
        written.append(payload)

    buffer = SendBuffer(write, max_bytes=1000, slow_seconds=1, coalesce=True)
    for part in (b"a", b"b", b"c"):
        await buffer.put(part)
    gate.set()
    await buffer.flush(1)
    assert b"".join(written) == b"abc" and len(written) <= 2
    await buffer.close()


class StuckTransport(Transport):
    """A client that never reads: writes block forever."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.frames: list[bytes] = []
        self.stuck = False

    async def write(self, payload):
        data = payload.encode() if isinstance(payload, str) else payload
        self.frames.append(data)
        if self.stuck:
            await asyncio.Event().wait()

    async def close(self):
        self.closed.set()


async def test_a_client_that_stops_reading_holds_no_more_than_the_buffer_and_is_dropped_as_slow(ws_runtime):
    aio = runtime.async_broker()
    transport = StuckTransport()
    session = StompSession(transport, broker=aio, hub=runtime.wakeups(),
                           link_settings=LinkSettings(send_buffer_bytes=2048, slow_client_seconds=0.5))
    await session.start()
    await session.data_received(encode("CONNECT", [("accept-version", "1.2"), ("login", "alice"),
                                                   ("passcode", "secret")]))
    transport.stuck = True
    await session.data_received(encode("SUBSCRIBE", [("destination", "/queue/slow"), ("id", "s"),
                                                     ("ack", "client-individual")]))
    await aio.send("queue://slow", [Message(body="x" * 500) for _ in range(100)])
    await asyncio.wait_for(transport.closed.wait(), 5)
    assert len(transport.frames) < 10  # CONNECTED and a few MESSAGEs: the rest never left the broker
    await session.connection_lost()
    stats = await aio.stats("queue://slow")
    assert stats.consumer_count == 0
    assert stats.pending == 100  # every message went back


@override_settings(SIGNALBOX_WS_LEASE_MS=1000)
async def test_leases_are_renewed_while_the_socket_lives():
    aio = runtime.async_broker()
    async with stomp() as client:
        await client.connect()
        await client.send("SUBSCRIBE", {"destination": "/queue/leased", "id": "s", "receipt": "r"})
        await client.expect("RECEIPT")
        await asyncio.sleep(1.6)  # longer than a lease, idle
        assert await aio.reap_lapsed("queue://leased") == []
        (consumer,) = (await aio.stats("queue://leased")).consumers
        assert consumer.lease_expires > int(time.time() * 1000)
        await aio.send("queue://leased", Message(body="still subscribed"))
        assert (await client.expect("MESSAGE")).body == b"still subscribed"


@override_settings(SIGNALBOX_WS_LEASE_MS=1200)
async def test_a_connection_whose_consumer_was_closed_under_it_gets_an_error_and_closes():
    aio = runtime.async_broker()
    async with stomp() as client:
        await client.connect()
        await client.send("SUBSCRIBE", {"destination": "/queue/gone", "id": "s", "receipt": "r"})
        await client.expect("RECEIPT")
        (consumer,) = (await aio.stats("queue://gone")).consumers
        from broker_core.destinations import parse_destination
        from broker_core.model import ConsumerRef

        await aio.close_consumer(ConsumerRef(parse_destination("queue://gone"), consumer.consumer_id))
        error = await client.expect("ERROR", timeout=3)
        assert error.get("message") == "Connection lost its subscriptions"
        await client.expect_closed()


@override_settings(SIGNALBOX_WS_MAX_SUBSCRIPTIONS=2)
async def test_subscriptions_per_connection_are_limited():
    async with stomp() as client:
        await client.connect()
        for n in range(2):
            await client.send("SUBSCRIBE", {"destination": f"/queue/lim{n}", "id": f"s{n}", "receipt": "r"})
            await client.expect("RECEIPT")
        await client.send("SUBSCRIBE", {"destination": "/queue/lim3", "id": "s3"})
        assert (await client.expect("ERROR")).get("message") == "Too many subscriptions"


@override_settings(SIGNALBOX_STOMP_MAX_BODY=1000)
async def test_a_frame_over_the_size_limit_is_refused():
    async with stomp() as client:
        await client.connect()
        await client.send("SEND", {"destination": "/queue/big", "content-length": "2000"}, b"x" * 2000)
        assert (await client.expect("ERROR")).get("message") == "The maximum data length was exceeded"
        await client.expect_closed()
    assert (await runtime.async_broker().destinations()) == []


async def test_unacked_messages_go_back_when_the_socket_drops():
    aio = runtime.async_broker()
    async with stomp() as client:
        await client.connect()
        await client.send("SUBSCRIBE", {"destination": "/queue/drop", "id": "s", "ack": "client",
                                        "receipt": "r"})
        await client.expect("RECEIPT")
        await aio.send("queue://drop", Message(body="unacked"))
        await client.expect("MESSAGE")
    stats = await aio.stats("queue://drop")
    assert stats.consumer_count == 0 and stats.pending == 1


async def bodies(queue: str) -> list[str]:
    """Every message body of the queue, in order (page by page)."""
    broker, out, cursor = runtime.async_broker(), [], None
    while True:
        page = await broker.browse(queue, cursor=cursor, limit=100)
        out += [browsed.message.body for browsed in page.messages]
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


async def test_a_tcp_client_sending_faster_than_its_frames_are_handled_is_read_only_as_the_inbox_drains(
        monkeypatch):
    """STOMP over TCP hands what it reads to the session from the transport's callback
    (gateway/stomp/tcp.py): while the session's inbox is full the socket is not read, and reading resumes
    as the worker takes frames. Nothing is lost or reordered on the way."""
    from gateway.stomp import protocol, tcp

    monkeypatch.setattr(protocol, "INBOX_FRAMES", 10)
    paused: list[int] = []
    read_when_room = tcp.Connection._read_when_room

    async def noted(self, session):
        paused.append(len(session._inbox))
        await read_when_room(self, session)

    monkeypatch.setattr(tcp.Connection, "_read_when_room", noted)
    server = tcp.StompServer(tcp.Listener("127.0.0.1", 0))
    await server.start()
    writer = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(encode("CONNECT", [("accept-version", "1.2"), ("login", "alice"),
                                        ("passcode", "secret")]))
        # Two queues in turn, so no two SENDs in a row share a broker call: one call per frame, far slower
        # than the client writes them; 1.2 MB, more than one read takes.
        pad = b"." * 1000
        writer.write(b"".join(encode("SEND", [("destination", f"/queue/flood.{i % 2}")], b"%d%s" % (i, pad))
                              for i in range(1200))
                     + encode("SEND", [("destination", "/queue/flood.0"), ("receipt", "last")], b"end"))
        await writer.drain()
        received = b""
        while b"receipt-id:last" not in received:
            chunk = await asyncio.wait_for(reader.read(65536), 20)
            assert chunk, received
            received += chunk
        assert received.startswith(b"CONNECTED") and b"ERROR" not in received
        assert paused and min(paused) >= 10, paused  # the inbox filled, and the socket waited
        even, odd = await bodies("queue://flood.0"), await bodies("queue://flood.1")
        assert even == [f"{i}{pad.decode()}" for i in range(0, 1200, 2)] + ["end"]
        assert odd == [f"{i}{pad.decode()}" for i in range(1, 1200, 2)]
    finally:
        if writer is not None:
            writer.close()
        await server.stop()
