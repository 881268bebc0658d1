"""STOMP 1.2 ack ids, in-process against the real broker (a StompSession on a recording transport): each
delivery's id is unique within the connection, an ACK of one touches nothing else, and the connection's
map of pending ack ids (Link.pending_acks, looked up per delivery and per ACK) holds exactly the messages
delivered and not yet acknowledged, nacked or given back, whatever ended them."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from django.test import override_settings

from gateway import runtime
from gateway.stomp.frames import Frame, FrameParser, encode
from gateway.stomp.protocol import StompSession, Transport

pytestmark = pytest.mark.usefixtures("ws_runtime", "stomp_user")


class Recorder(Transport):
    """A client socket that reads everything: the server's frames, parsed."""

    def __init__(self) -> None:
        self.parser = FrameParser("1.2")
        self.frames: list[Frame] = []
        self.arrived = asyncio.Event()
        self.closed = asyncio.Event()

    async def write(self, payload):
        data = payload.encode() if isinstance(payload, str) else payload
        self.frames += self.parser.feed(data)
        self.arrived.set()

    async def close(self):
        self.closed.set()

    async def take(self, command: str, count: int = 1, timeout: float = 5) -> list[Frame]:
        """The first `count` frames of `command`, in order, waiting for them (others stay; an ERROR fails)."""
        async with asyncio.timeout(timeout):
            while True:
                assert command == "ERROR" or not any(f.command == "ERROR" for f in self.frames), self.frames
                taken = [f for f in self.frames if f.command == command][:count]
                if len(taken) == count:
                    self.frames = [f for f in self.frames if not any(f is t for t in taken)]
                    return taken
                self.arrived.clear()
                await self.arrived.wait()


async def connected() -> tuple[StompSession, Recorder]:
    transport = Recorder()
    session = StompSession(transport, broker=runtime.async_broker(), hub=runtime.wakeups())
    await session.start()
    transport.parser.version = "1.2"
    await session.data_received(encode("CONNECT", [("accept-version", "1.2"), ("login", "alice"),
                                                   ("passcode", "secret")]))
    await transport.take("CONNECTED")
    return session, transport


async def frame(session: StompSession, transport: Recorder, command: str, **headers: str) -> None:
    """Send a frame with a receipt and wait for it (an ERROR fails the test)."""
    receipt = uuid.uuid4().hex[:8]
    await session.data_received(encode(command, [*headers.items(), ("receipt", receipt)]))
    while True:
        (answer,) = await transport.take("RECEIPT")
        if answer.get("receipt-id") == receipt:
            return


async def test_two_subscriptions_on_one_composite_topic_get_four_distinct_ack_ids_and_each_acks():
    """A composite send to two topics is one message id; two subscriptions of one connection on both
    topics receive it four times. Each delivery needs its own ack id: the second subscription's two copies
    once shared one (`<id>@<subscription>`), the second replacing the first, which was then never
    acknowledged and its ACK refused."""
    session, transport = await connected()
    topics = f"/topic/ids.{uuid.uuid4().hex[:8]}.a,/topic/ids.{uuid.uuid4().hex[:8]}.b"
    for key in ("s1", "s2"):
        await frame(session, transport, "SUBSCRIBE", destination=topics, id=key, ack="client-individual")
    await frame(session, transport, "SEND", destination=topics)
    messages = await transport.take("MESSAGE", 4)
    ack_ids = [m.get("ack") for m in messages]
    assert len(set(ack_ids)) == 4, ack_ids
    for ack_id in ack_ids:
        await frame(session, transport, "ACK", id=ack_id)
    assert session.link.pending_acks == {}
    await session.connection_lost()


async def test_the_pending_ack_map_empties_with_acks_nacks_transactions_unsubscribe_and_close():
    session, transport = await connected()
    aio = runtime.async_broker()
    base = f"pending.{uuid.uuid4().hex[:8]}"
    await frame(session, transport, "SUBSCRIBE", destination=f"/queue/{base}.c", id="c", ack="client")
    await frame(session, transport, "SUBSCRIBE", destination=f"/queue/{base}.i", id="i",
                ack="client-individual")
    await frame(session, transport, "SUBSCRIBE", destination=f"/queue/{base}.u", id="u", ack="client")
    for name in ("c", "i", "u"):
        await aio.send(f"queue://{base}.{name}", [_message(f"{name}{n}") for n in range(3)])
    messages = await transport.take("MESSAGE", 9)
    ack = {(m.get("subscription"), m.body.decode()): m.get("ack") for m in messages}
    pending = session.link.pending_acks
    assert sorted(pending) == sorted(ack.values())

    await frame(session, transport, "ACK", id=ack["c", "c1"])  # cumulative: c0 and c1
    assert ack["c", "c0"] not in pending and ack["c", "c1"] not in pending and ack["c", "c2"] in pending
    await frame(session, transport, "NACK", id=ack["i", "i0"])
    assert ack["i", "i0"] not in pending

    await frame(session, transport, "BEGIN", transaction="t1")
    await frame(session, transport, "ACK", id=ack["i", "i1"], transaction="t1")
    await frame(session, transport, "ABORT", transaction="t1")  # i1 is delivered still, its id valid again
    assert pending[ack["i", "i1"]].key == "i"
    await frame(session, transport, "BEGIN", transaction="t2")
    await frame(session, transport, "ACK", id=ack["i", "i1"], transaction="t2")
    await frame(session, transport, "COMMIT", transaction="t2")
    assert ack["i", "i1"] not in pending

    await frame(session, transport, "UNSUBSCRIBE", id="u")  # its three go back to the queue
    assert sorted(pending) == sorted([ack["c", "c2"], ack["i", "i2"]])
    await frame(session, transport, "BEGIN", transaction="t3")  # an ack still open at UNSUBSCRIBE...
    await frame(session, transport, "ACK", id=ack["i", "i2"], transaction="t3")
    await frame(session, transport, "UNSUBSCRIBE", id="i")
    await frame(session, transport, "ABORT", transaction="t3")  # ...goes with the subscription
    assert sorted(pending) == [ack["c", "c2"]]

    await session.connection_lost()
    assert pending == {}
    stats = {name: await aio.stats(f"queue://{base}.{name}") for name in ("c", "i", "u")}
    assert [(s.dequeued, s.pending) for s in stats.values()] == [(2, 1), (2, 1), (0, 3)]


def _message(body: str):
    from broker_core.messages import Message

    return Message(body=body)


@override_settings(SIGNALBOX_WS_LEASE_MS=1200)
async def test_a_subscription_the_broker_aborts_takes_its_ack_ids_out_of_the_map(ws_runtime, redis_client):
    """Consumer loss: an operator aborts the subscription's consumer (spec §8.4); the link notices at its
    next lease renewal, ends the subscription, and its messages go back: their ids leave the map (a late
    ACK of one is accepted and does nothing)."""
    from broker_core import maintenance
    from broker_core.broker import Broker
    from broker_core.destinations import parse_destination
    from broker_core.model import ConsumerRef

    session, transport = await connected()
    queue = f"aborted.{uuid.uuid4().hex[:8]}"
    await frame(session, transport, "SUBSCRIBE", destination=f"/queue/{queue}", id="a", ack="client")
    await frame(session, transport, "SUBSCRIBE", destination=f"/queue/{queue}.kept", id="k", ack="client")
    aio = runtime.async_broker()
    await aio.send(f"queue://{queue}", [_message("a0"), _message("a1")])
    await aio.send(f"queue://{queue}.kept", _message("k0"))
    messages = await transport.take("MESSAGE", 3)
    assert len(session.link.pending_acks) == 3
    (consumer,) = (await aio.stats(f"queue://{queue}")).consumers
    sync = Broker(redis_client, ws_runtime)
    await asyncio.to_thread(maintenance.abort_consumer, sync,
                            ConsumerRef(parse_destination(f"queue://{queue}"), consumer.consumer_id), "test")
    await transport.take("ERROR")  # the notice, the connection stays (abortConnection false)
    kept = [m.get("ack") for m in messages if m.get("subscription") == "k"]
    assert list(session.link.pending_acks) == kept
    late = next(m.get("ack") for m in messages if m.get("subscription") == "a")
    await frame(session, transport, "ACK", id=late)  # accepted, does nothing
    await session.connection_lost()
    assert session.link.pending_acks == {}
