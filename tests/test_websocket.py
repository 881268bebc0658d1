"""The WebSocket ping consumer, driven through the project's ASGI app and the Redis channel layer."""

from __future__ import annotations

import pytest

from tests.helpers.channels import assert_silent, connect_refused, websocket

pytestmark = pytest.mark.usefixtures("channel_layer_cleanup")


async def test_text_frames_come_back_through_the_channel_layer():
    async with websocket("/ws/ping") as communicator:
        await communicator.send_to(text_data="ping 1")
        assert await communicator.receive_from() == "ping 1"
        await communicator.send_to(text_data="ping 2")
        assert await communicator.receive_from() == "ping 2"
        await assert_silent(communicator)


async def test_binary_frames_come_back_unchanged():
    async with websocket("/ws/ping") as communicator:
        await communicator.send_to(bytes_data=b"\x00\x01\xfe\xff")
        response = await communicator.receive_output(3)
        assert response == {"type": "websocket.send", "bytes": b"\x00\x01\xfe\xff"}


async def test_the_channel_layer_is_the_redis_one(settings):
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    assert type(layer).__module__ == "channels_redis.core"
    (host,) = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]
    assert host["address"] == settings.REDIS_URL
    # Reads must outlast the layer's blocking pop, or idle consumers die (see settings).
    assert host["socket_timeout"] > layer.brpop_timeout


@pytest.mark.e2e
async def test_an_idle_connection_survives_the_channel_layers_blocking_pop():
    from channels.layers import get_channel_layer

    idle = get_channel_layer().brpop_timeout + 1.5
    async with websocket("/ws/ping") as communicator:
        # Nothing to read for longer than one BZPOPMIN round: the consumer must still be there.
        assert await communicator.receive_nothing(idle, interval=0.1)
        await communicator.send_to(text_data="still here")
        assert await communicator.receive_from() == "still here"


async def test_clients_without_an_origin_header_are_accepted():
    # Broker clients (STOMP over WebSocket, scripts) send no Origin; browsers always do.
    async with websocket("/ws/ping", headers=[]) as communicator:
        await communicator.send_to(text_data="hello")
        assert await communicator.receive_from() == "hello"


async def test_a_browser_on_an_allowed_host_is_accepted():
    async with websocket("/ws/ping", headers=[(b"origin", b"http://127.0.0.1:8000")]) as communicator:
        await communicator.send_to(text_data="hello")
        assert await communicator.receive_from() == "hello"


async def test_a_cross_site_browser_page_is_refused():
    await connect_refused("/ws/ping", headers=[(b"origin", b"https://evil.example")])


async def test_an_unknown_path_is_refused():
    with pytest.raises(ValueError, match="No route found for path 'ws/nowhere'"):
        await connect_refused("/ws/nowhere")


async def test_the_anonymous_probe_is_bounded():
    # /ws/ping is anonymous like /healthz (docs/api.md), so it takes only small frames, and few of them.
    from gateway.consumers import PingConsumer

    async with websocket("/ws/ping") as communicator:
        await communicator.send_to(text_data="x" * (PingConsumer.MAX_PING_BYTES + 1))
        closed = await communicator.receive_output(3)
        assert closed["type"] == "websocket.close" and closed["code"] == 1009
        assert "MAX_PING_BYTES" in closed["reason"]
    async with websocket("/ws/ping") as communicator:
        for i in range(PingConsumer.MAX_PINGS):
            await communicator.send_to(text_data=str(i))
            assert await communicator.receive_from() == str(i)
        await communicator.send_to(text_data="one too many")
        closed = await communicator.receive_output(3)
        assert closed["type"] == "websocket.close" and closed["code"] == 1008
