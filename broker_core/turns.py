"""Turns on a pull consumer that serves one request at a time, and the consumers a client keeps.

ActiveMQ's REST MessageServlet keeps one consumer per client and destination and refuses a second request
on a consumer that is busy ("Concurrent access to consumer is not supported"). The gateway's
ActiveMQ-compatible endpoint (gateway/api/compat.py) reproduces that with a *turn*: a key next to the
consumer's own keys (in the destination's hash tag), set if absent with an expiry, so a process that dies
during its turn blocks the client only until the expiry.

Within its turn a request leases at most one message (a prefetch-0 consumer, client-individual acks) and
settles it before the turn ends: acknowledged once its answer is written (the gateway's after_write.py), or
given back. So a message found
in flight with the consumer when a turn begins was left by a request that died holding it; `begin_turn`
says how many, and the caller gives them back (closing the consumer returns them, redelivered) before
it leases anything. That check replaces a marker key of the gateway's own.

`settle` acknowledges and ends the turn in one MULTI/EXEC (the ack's script call, then DEL): one write
and one round trip, run by Redis in that order, so the turn never ends before the ack (a new turn
cannot see the acknowledged message in flight and give it back).

A client's consumers (one per destination) are kept in one hash per client, named by the caller's opaque
key, so `action=unsubscribe` can close them all; it expires with the consumers' leases.

Costs: `begin_turn` one MULTI/EXEC (SET NX PX, ZCARD) for a queue's consumer (a topic's: the turn, then
its subscription and window), `settle` one MULTI/EXEC, both on the broker's multiplexed connection (with
redis-py's client or EVAL scripts, `settle` is two round trips). `begin_turn_receiving` takes the turn and
leases in one script call (receive.lua with its `turn ms` argument): the script leases nothing when the
turn is refused or messages are left in flight, so no message is leased only to be given back (giving
back raises its redelivery counter though no client saw it). A queue's GET that finds a message is then
two round trips: that call, and `settle` (the first of a broker also asks whether the function library is
loaded, `_settle_ready`, so that every `settle` is written the moment it is called).
"""

from __future__ import annotations

import redis

from .broker import AsyncBroker
from .destinations import parse_destination
from .drivers.loop import Transaction, resumed, run_async
from .effects import Eval, Op
from .errors import UnknownConsumer
from .messages import Delivery
from .model import ConsumerRef
from .resp import reply_text as _text
from .scripts.library import is_missing


def _turn_key(broker: AsyncBroker, consumer: ConsumerRef) -> str:
    """Next to the consumer's keys, in its destination's hash tag."""
    return f"{broker.ops.prefix(consumer.destination)}:c:{consumer.consumer_id}:turn"


async def _window_key(broker: AsyncBroker, consumer: ConsumerRef) -> str | None:
    """The consumer's in-flight window (K_CINF in scripts/lua/includes/base.lua), in its home (a queue, or a
    topic consumer's subscription); None for a topic consumer that does not exist (nothing in flight)."""
    if not consumer.destination.is_topic:
        return f"{broker.ops.prefix(consumer.destination)}:c:{consumer.consumer_id}:inflight"
    try:
        home = await broker._run(broker.ops.home(consumer))
    except UnknownConsumer:
        return None
    return f"{broker.ops.home_prefix(home)}:c:{consumer.consumer_id}:inflight"


async def begin_turn(broker: AsyncBroker, consumer: ConsumerRef, turn_ms: int) -> int | None:
    """Take the consumer's turn for at most `turn_ms`. None: another request has it. Else how many
    messages are in flight with the consumer, left by a request that died in its turn (usually 0)."""
    take = ("SET", _turn_key(broker, consumer), "1", "NX", "PX", int(turn_ms))
    if consumer.destination.is_queue:  # (the usual case: both in one MULTI/EXEC)
        replies = await broker._perform(Transaction([take, ("ZCARD", await _window_key(broker, consumer))]))
    else:  # a topic consumer's window is found through its subscription: after the turn is taken
        replies = [await broker._perform(take)]
        window = await _window_key(broker, consumer) if replies[0] else None
        replies.append(await broker._perform(("ZCARD", window)) if window else 0)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return int(replies[1]) if replies[0] else None


async def begin_turn_receiving(broker: AsyncBroker, consumer: ConsumerRef,
                               turn_ms: int) -> tuple[int | None, list[Delivery] | None]:
    """`begin_turn`, then, in the same script call, receive one message as AsyncBroker.receive does, unless
    messages are left in flight (scripts/lua/receive.lua, its `turn ms` argument). Returns (None, None):
    another request has the turn; (left, None): the turn is taken, nothing received (`left` messages to give
    back first; or a topic's consumer, taken as `begin_turn` takes it); (0, deliveries): the turn is taken
    and up to one message leased to the consumer. Raises UnknownConsumer with the turn taken."""
    if not consumer.destination.is_queue:
        return await begin_turn(broker, consumer, turn_ms), None
    try:
        turn = await broker._run(broker.ops.receive_turn(consumer, broker._now(), int(turn_ms)))
    except UnknownConsumer:  # (the caller makes the consumer, and may settle a message in this turn)
        await _settle_ready(broker)
        raise
    await _settle_ready(broker)
    if turn.busy:
        return None, None
    if turn.received is None:
        return turn.left, None
    return 0, turn.received.deliveries


async def end_turn(broker: AsyncBroker, consumer: ConsumerRef) -> None:
    await broker._perform(("DEL", _turn_key(broker, consumer)))


async def settle(broker: AsyncBroker, consumer: ConsumerRef, message_id: str) -> None:
    """Acknowledge the turn's message (individually), then end the turn, in one write and one round trip:
    the ack's script call and the DEL in one MULTI/EXEC (the DEL runs even if the ack is refused: the turn
    ends either way). Raises what the ack raised. Run by the broker's driver loop like any operation."""
    ack = broker.ops.ack(consumer, [message_id], "individual", broker._now())
    first = next(ack)  # a queue's: the ack script's call (a topic's: first its subscription)
    turn = ("DEL", _turn_key(broker, consumer))
    functions = await run_async(broker.driver.uses_functions(), broker._perform)
    if broker.link is None or not isinstance(first, Eval) or not functions:
        # (redis-py's pool may use two connections; EVAL scripts would be loaded first: one after the other)
        try:
            await broker._run(resumed(ack, first))
        finally:
            await broker._perform(turn)
        return
    await broker._run(_ack_ending_turn(ack, first, turn))


async def _settle_ready(broker: AsyncBroker) -> None:
    """Have the driver know the function library is loaded (it asks once per broker, before its first
    MULTI/EXEC of scripts: a round trip), so that `settle` writes its MULTI/EXEC the moment it is called:
    the gateway acknowledges after writing its answer and counts on the ack reaching Redis before anything
    it does for the client's next request (gateway/api/after_write.py). Asked on a turn's way, once."""
    if broker.driver.functions and not broker.driver.library_loaded:
        await broker._load([])


def _ack_ending_turn(ack: Op, first: Eval, turn: tuple) -> Op:
    """The ack operation with its script call `first` and the turn's end in one MULTI/EXEC (a list: the
    driver loop's transaction, drivers/loop.py)."""
    acked, ended = yield [first, turn]
    if isinstance(ended, Exception):
        raise ended
    if isinstance(acked, redis.ResponseError) and is_missing(acked):
        # the library is gone (a Redis restart) and the turn has ended: the ack alone, as the driver loop
        # runs a script (loading the library first)
        return (yield from resumed(ack, first))
    return (yield from resumed(ack, None, acked))


def _clients_key(broker: AsyncBroker, client: str) -> str:
    return f"{broker.namespace}:client-consumers:{client}"


async def remember_consumer(broker: AsyncBroker, client: str, consumer: ConsumerRef, ttl_ms: int) -> None:
    """Note that `client` (the caller's opaque key) has `consumer`; forgotten after `ttl_ms` unused."""
    key = _clients_key(broker, client)
    remember = [("HSET", key, consumer.destination.uri, consumer.consumer_id), ("PEXPIRE", key, int(ttl_ms))]
    for reply in await broker._perform(Transaction(remember)):
        if isinstance(reply, Exception):
            raise reply


async def client_consumers(broker: AsyncBroker, client: str, ack_mode: str) -> list[ConsumerRef]:
    """The consumers `remember_consumer` noted for `client`."""
    pairs = await broker._perform(("HGETALL", _clients_key(broker, client)))
    if isinstance(pairs, dict):  # (redis-py's reply, without the multiplexed connection)
        pairs = [x for pair in pairs.items() for x in pair]
    return [ConsumerRef(parse_destination(_text(pairs[i])), _text(pairs[i + 1]), ack_mode)
            for i in range(0, len(pairs), 2)]


async def forget_client(broker: AsyncBroker, client: str) -> None:
    await broker._perform(("DEL", _clients_key(broker, client)))
