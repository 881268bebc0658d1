"""A return_owed call looks at a bounded number of closed consumers (session 30): however many closed at
once while holding messages (a gateway's connections dropped together), each call returns its chunk from at
most lifecycle.lua CLOSING_LOOKS of them and counts the rest as owed, and the fence lifts once no closed
consumer's window holds a message, read from the set of those that do (`<queue>:closing:held`), not from
every closed consumer."""

from __future__ import annotations

import pytest

from broker_core.destinations import parse_destination
from broker_core.effects import Eval
from broker_core.keys import Home
from broker_core.messages import Message
from broker_core.model import ConsumerSpec

from .test_chunked_close import calls

# counts what the server ran (INFO commandstats): on a server of its own (tests/conftest.py redis_url)
pytestmark = pytest.mark.private_redis

CLOSED = 300
HELD = 3  # each closed consumer's messages: the close returns 1 (chunk 1), 2 are owed
LOOKS = 100  # lifecycle.lua CLOSING_LOOKS


def command_calls(client, name: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


def closed_owing(broker, queue: str) -> list[str]:
    """CLOSED consumers each received HELD messages and closed; each close's first call returned one, and
    the process driving it died there: the rest are owed. Returns the messages' ids."""
    consumers = [broker.add_consumer(queue, ConsumerSpec(prefetch=HELD), consumer_id=f"c{i}")
                 for i in range(CLOSED)]
    ids = [f"m{i}" for i in range(CLOSED * HELD)]
    for start in range(0, len(ids), 100):
        broker.send(queue, [Message(body="x", message_id=m) for m in ids[start:start + 100]])
    for c in consumers:
        assert len(broker.receive(c, HELD)) == HELD
    broker.ops.return_chunk = 1
    for c in consumers:
        for name, _reply in calls(broker, broker.ops.close_consumer(c, broker._now(), "closed")):
            if name == "consumer_close":
                break
    return ids


def return_owed_once(broker, queue: str) -> int:
    op = broker.ops.return_owed(Home(parse_destination(queue)), broker._now())
    request = next(op)
    assert isinstance(request, Eval) and request.script == "return_owed"
    reply = broker._step(request)
    op.close()
    return reply


def test_a_call_looks_at_a_bounded_number_of_closed_consumers(broker, redis_client):
    ids = closed_owing(broker, "gone")
    p = f"{broker.namespace}:{{q:gone}}"
    assert redis_client.hlen(f"{p}:closing") == CLOSED
    assert redis_client.hget(f"{p}:meta", "fence") is not None
    broker.ops.return_chunk = 50
    looks = command_calls(redis_client, "zcard")
    return_owed_once(broker, "gone")
    looks = command_calls(redis_client, "zcard") - looks
    # (a ZCARD of each closed consumer's window: in the loop, then in the fence's check; every one was read)
    assert looks <= 2 * LOOKS + 10
    # and the rest, call after call: each message back once, the fence lifted, all delivered again
    broker._run(broker.ops.return_owed(Home(parse_destination("gone")), broker._now()))
    assert redis_client.hlen(f"{p}:closing") == 0
    assert redis_client.scard(f"{p}:closing:held") == 0
    assert redis_client.hget(f"{p}:meta", "fence") is None
    other = broker.add_consumer("gone", ConsumerSpec(prefetch=len(ids)), consumer_id="other")
    got = broker.receive(other, len(ids))
    assert sorted(d.message_id for d in got) == sorted(ids)
    assert {d.redelivery_count for d in got} == {1}
