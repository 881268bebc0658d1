"""The STOMP consumer in-process (Channels' WebsocketCommunicator over the project's ASGI stack, real
Redis): connection, authentication, errors and the frames that change broker state."""

from __future__ import annotations

import asyncio

import pytest

from gateway import runtime
from tests.helpers.stomp_channels import stomp

pytestmark = pytest.mark.usefixtures("ws_runtime", "stomp_user")


async def test_connect_with_password_gives_connected_with_version_session_and_heart_beat():
    async with stomp(subprotocols=["v10.stomp", "v11.stomp", "v12.stomp"]) as client:
        assert client.subprotocol == "v12.stomp"
        frame = await client.connect(heart_beat="0,0")
        assert frame.get("version") == "1.2"
        assert frame.get("session", "").startswith("ws-")
        assert frame.get("heart-beat") == "0,0"
        assert frame.get("server", "").startswith("Signalbox/")


async def test_a_queue_round_trip_in_auto_mode():
    async with stomp() as client:
        await client.connect()
        await client.send("SUBSCRIBE", {"destination": "/queue/a", "id": "s1", "receipt": "r1"})
        assert (await client.expect("RECEIPT")).get("receipt-id") == "r1"
        await client.send("SEND", {"destination": "/queue/a", "persistent": "true", "x-note": "hi"}, b"hello")
        message = await client.expect("MESSAGE")
        assert message.body == b"hello"
        headers = message.header_dict()
        assert headers["destination"] == "/queue/a"
        assert headers["subscription"] == "s1"
        assert headers["persistent"] == "true"
        assert headers["priority"] == "4"
        assert headers["x-note"] == "hi"
        assert "ack" not in headers  # auto mode
        stats = await runtime.async_broker().stats("queue://a")
        assert stats.queue_size == 0


async def test_bad_credentials_get_activemqs_error_and_the_connection_closes():
    async with stomp() as client:
        await client.send("CONNECT", {"accept-version": "1.2", "login": "alice", "passcode": "wrong"})
        error = await client.expect("ERROR")
        assert error.get("message") == "User name [alice] or password is invalid."
        # the body says what was wrong with what was given, not that something was missing
        assert error.body.decode() == ("the login and passcode given are neither a user's password nor an "
                                       "API token of that user"), error.body
        await client.expect_closed()


async def test_an_api_token_is_accepted_as_passcode(stomp_user):
    _, token = stomp_user
    async with stomp() as client:
        assert (await client.connect(login="", passcode=token)).get("version") == "1.2"


async def test_a_cross_site_browser_page_cannot_open_the_stomp_endpoint():
    from tests.helpers.channels import connect_refused

    await connect_refused("/stomp", headers=[(b"origin", b"https://evil.example")])


async def test_a_browser_page_of_an_allowed_host_connects_with_its_session_login():
    async with stomp(headers=[(b"origin", b"http://127.0.0.1:8000")],
                     subprotocols=["v12.stomp"]) as client:
        assert (await client.connect()).get("version") == "1.2"


async def test_a_client_without_credentials_or_session_is_refused():
    async with stomp() as client:
        await client.send("CONNECT", {"accept-version": "1.2"})
        error = await client.expect("ERROR")
        assert error.get("message") == "User name [] or password is invalid."
        assert error.body.decode() == ("CONNECT needs login and passcode: a user name and password, or an "
                                       "API token as the passcode"), error.body
        await client.expect_closed()


async def test_a_logged_in_browser_session_connects_without_credentials(stomp_user):
    from gateway.stomp.frames import FrameParser, encode
    from gateway.stomp.protocol import StompSession, Transport

    user, _ = stomp_user
    written: list[bytes] = []

    class Recorder(Transport):
        async def write(self, payload):
            written.append(payload.encode() if isinstance(payload, str) else payload)

        async def close(self):
            pass

    session = StompSession(Recorder(), broker=runtime.async_broker(), hub=runtime.wakeups(),
                           session_user=user)
    await session.start()
    await session.data_received(encode("CONNECT", [("accept-version", "1.2")]))
    for _ in range(100):
        if written:
            break
        await asyncio.sleep(0.01)
    (frame,) = FrameParser().feed(b"".join(written))
    assert frame.command == "CONNECTED"
    await session.connection_lost()


async def test_large_messages_waiting_come_in_several_receives_without_a_lull():
    """Ten of 200 KiB waiting: a receive hands over about 512 KiB (docs/broker_core.md "The byte budget"),
    fewer than the pump's batch, and the wake-up it publishes sends the pump back at once (without it the
    pump would wait for its lease renewal, 10 s): every message, in order, each within the expect timeout."""
    from broker_core.messages import Message

    body = "x" * (200 * 1024)
    for i in range(10):
        await runtime.async_broker().send("queue://big", Message(body=body, message_id=f"big-{i}"))
    async with stomp() as client:
        await client.connect()
        await client.send("SUBSCRIBE", {"destination": "/queue/big", "id": "s1", "ack": "client-individual"})
        got = []
        for _ in range(10):
            message = await client.expect("MESSAGE")
            assert len(message.body) == len(body)
            got.append(message.get("message-id"))
        assert got == [f"big-{i}" for i in range(10)]
