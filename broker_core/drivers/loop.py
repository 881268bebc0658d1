"""The one driver loop: how an operation generator (broker_core/ops/) is run, written once for `Broker`
(blocking) and `AsyncBroker` (asyncio).

`Driver.drive(op)` is itself a generator. It feeds the operation its replies, throws a script's error reply
back into it as a typed error (NO_DESTINATION among them, which makes the operation ask for its write
policy and retry), runs a script by its function or its SHA and loads it when the server lacks it, and runs
a list of scripts as one MULTI/EXEC. Whatever needs the network it yields as one `Io` request; the brokers
only say how one request is done (`run` / `run_async` with the broker's `perform`): over direct.py's
connections or redis-py blocking, over multiplexed.py's connection or redis-py asyncio. So the logic
exists once and the two drivers differ in `perform` only (and the few lines of `run` / `run_async`, which
know nothing of Redis).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from .. import errors
from ..effects import Command, Eval, NoDestination, Op, Policy, Sleep
from ..scripts.library import call_args, is_missing, library, load_args, script, wants_functions

T = TypeVar("T")

# Script error replies start with a code; each maps to one typed error.
_ERRORS: dict[str, type[errors.BrokerError]] = {
    "NO_DESTINATION": NoDestination,
    "UNKNOWN_CONSUMER": errors.UnknownConsumer,
    "NOT_IN_FLIGHT": errors.NotInFlight,
    "NOT_DELIVERED": errors.NotInFlight,
    "INVALID_ACK": errors.NotInFlight,
    "IN_TRANSACTION": errors.TransactionError,  # (ack.lua: acknowledged in another open transaction)
    "CONSUMER_EXISTS": errors.InvalidConsumer,
    "TOO_MANY_CONSUMERS": errors.TooManyConsumers,
    "MESSAGE_TOO_LARGE": errors.MessageTooLarge,
    "TOO_MANY_PROPERTIES": errors.InvalidMessage,
    "NO_MESSAGE": errors.UnknownMessage,
    "IN_FLIGHT": errors.OperationRefused,
    "NOT_A_DLQ": errors.OperationRefused,
    "NO_ORIGINAL_DESTINATION": errors.OperationRefused,
    "SCHEDULED_JOB": errors.OperationRefused,
    "UNKNOWN_DESTINATION": errors.UnknownDestination,
    "DURABLE_IN_USE": errors.DurableSubscriptionInUse,
    "NO_SUBSCRIPTION": errors.UnknownSubscription,
    "REGISTRY_FULL": errors.ConnectionRegistryFull,
}


def typed_error(exc: redis.ResponseError) -> Exception:
    """The typed error a script's error reply stands for (the reply itself when it has no known code)."""
    text = str(exc)
    if errors.is_redis_maxmemory(text):
        return errors.RedisMaxMemory(errors.REDIS_MAXMEMORY_TEXT, scope="redis", limit="maxmemory",
                                     retry_after=errors.RETRY_AFTER_S)
    code, _, rest = text.partition(" ")
    kind = _ERRORS.get(code)
    return kind(rest) if kind else exc


def resumed(op: Op, request: Any, reply: Any = None) -> Op:
    """`yield from op` for an operation already started elsewhere: `request` is the one it yielded last
    (None: `reply` answers that one already; an error reply goes in as its typed error, as `run` does).
    Only hands requests and replies through. Used where the first call of an operation went out with others
    (AsyncBroker.stats_many's pipeline, a turn's ack in one MULTI/EXEC with the turn's end)."""
    try:
        if request is None:
            failed = isinstance(reply, redis.ResponseError)
            request = op.throw(typed_error(reply)) if failed else op.send(reply)
        while True:
            try:
                reply = yield request
            except Exception as exc:  # noqa: BLE001 - handed to the operation, which decides
                request = op.throw(exc)
            else:
                request = op.send(reply)
    except StopIteration as stop:
        return stop.value


# -- what the driver asks its broker to do: one `Io` at a time -----------------------------------------
# A tuple: one command over the broker's script connection (direct.py / multiplexed.py, else redis-py).
# Command: a plain command through the redis-py client. Policy: the destination's PolicyEntry.
# Sleep: wait, reply with the clock's time. Transaction: MULTI/EXEC, each reply or its error.
# Info: the server's INFO section (asked once, to choose functions or EVALSHA).


@dataclass(frozen=True)
class Transaction:
    commands: list[tuple]


@dataclass(frozen=True)
class Info:
    section: str


Io = tuple | Command | Policy | Sleep | Transaction | Info
Steps = Generator[Io, Any, T]


class Driver:
    """The per-broker state of the loop: whether the server runs the function library (asked once, on the
    first script call) and whether the library is known to be loaded."""

    def __init__(self) -> None:
        self.functions: bool | None = None
        self.library_loaded = False
        # per form (functions or not) and script, what its calls start with (FCALL and its function, or
        # EVALSHA and its SHA): made again on every call, it was two function calls and a lookup each
        self._heads: tuple[dict[str, tuple[str, str]], dict[str, tuple[str, str]]] = ({}, {})

    def drive(self, op: Op) -> Steps[Any]:
        """Run the operation to its result; a script error reply goes back into it as a typed error."""
        try:
            request = next(op)
            while True:
                try:
                    if type(request) is Eval:  # the common request, as eval() but a generator fewer per call
                        if self.functions is None:
                            yield from self.uses_functions()
                        head = (self._heads[1 if self.functions else 0].get(request.script)
                                or self._head(request.script))
                        try:
                            reply = yield (*head, len(request.keys), *request.keys, *request.args)
                        except redis.ResponseError as exc:
                            if not is_missing(exc):
                                raise
                            reply = yield from self.reload(request)
                    else:
                        reply = yield from self.step(request)
                except redis.ResponseError as exc:
                    request = op.throw(typed_error(exc))
                else:
                    request = op.send(reply)
        except StopIteration as stop:
            return stop.value

    def step(self, request: Any) -> Steps[Any]:
        """One request of an operation (an effect, or a list of Evals for one MULTI/EXEC) to its reply."""
        if type(request) is Eval:
            return (yield from self.eval(request))
        if type(request) is list:
            return (yield from self.transaction(request))
        return (yield request)  # Command, Policy, Sleep: the broker does them as they are

    def uses_functions(self) -> Steps[bool]:
        if self.functions is None:
            self.functions = wants_functions((yield Info("server")))
        return self.functions

    def eval(self, call: Eval) -> Steps[Any]:
        """A script by its function or SHA; loaded and called again when the server lacks it."""
        if self.functions is None:
            yield from self.uses_functions()
        try:
            return (yield self.command(call))
        except redis.ResponseError as exc:
            if not is_missing(exc):
                raise
        return (yield from self.reload(call))

    def command(self, call: Eval) -> tuple:
        """The command that calls the script (once `functions` is known)."""
        return call_args(script(call.script), self.functions, call.keys, call.args)

    def _head(self, name: str) -> tuple[str, str]:
        """`command`'s first two arguments for script `name` (once `functions` is known), kept."""
        functions = bool(self.functions)
        head = self._heads[1 if functions else 0][name] = call_args(script(name), functions, (), ())[:2]
        return head

    def reload(self, call: Eval) -> Steps[Any]:
        """Load the script (or the library) the server lacked, then call it again."""
        yield load_args(script(call.script), bool(self.functions))
        return (yield self.command(call))

    def load(self, names: Iterable[str]) -> Steps[bool]:
        """Make sure the server has these scripts (or the library) before a pipeline runs them."""
        functions = yield from self.uses_functions()
        if functions:
            if not self.library_loaded:
                # loaded only when missing: compiling the library again held Redis 10-30 ms, and a new
                # broker (the destination index's rebuild makes one each time) did it on its first pipeline
                if not (yield ("FUNCTION", "LIST", "LIBRARYNAME", library().name)):
                    yield load_args(None, True)
                self.library_loaded = True
        else:  # every script, so none of them meets NOSCRIPT half-way through a transaction
            for name in dict.fromkeys(names):
                yield load_args(script(name), False)
        return functions

    def transaction(self, calls: list[Eval | tuple]) -> Steps[list[Any]]:
        """Several scripts (and plain commands, as tuples) in one MULTI/EXEC; each reply or its error."""
        for _attempt in range(2):
            scripts = [call.script for call in calls if type(call) is Eval]
            functions = (yield from self.load(scripts)) if scripts else self.functions
            commands = [call if type(call) is tuple else call_args(script(call.script), functions, call.keys,
                                                                   call.args) for call in calls]
            replies = yield Transaction(commands)
            # One library: when it is missing (a server restarted) every script call failed and none
            # applied. A plain command did apply: such a block is not repeated, its caller runs its
            # scripts again (turns.settle).
            if not (functions and any(isinstance(r, Exception) and is_missing(r) for r in replies)):
                break
            self.library_loaded = False
            if any(type(call) is tuple for call in calls):
                break
        return replies


def run(steps: Steps[T], perform: Callable[[Io], Any]) -> T:
    """Run `steps` blocking: each Io done by `perform`, its reply (or its error) sent back."""
    try:
        io = next(steps)
        while True:
            try:
                reply = perform(io)
            except Exception as exc:
                io = steps.throw(exc)
            else:
                io = steps.send(reply)
    except StopIteration as stop:
        return stop.value


async def run_async(steps: Steps[T], perform: Callable[[Io], Awaitable[Any]]) -> T:
    """`run` for asyncio: the same, awaiting `perform`."""
    try:
        io = next(steps)
        while True:
            try:
                reply = await perform(io)
            except Exception as exc:
                io = steps.throw(exc)
            else:
                io = steps.send(reply)
    except StopIteration as stop:
        return stop.value
