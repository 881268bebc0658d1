"""What an operation yields: to the driver that runs it (drivers/loop.py) a script to run (`Eval`), a plain
Redis command (`Command`), a question (`Policy`) or a wait (`Sleep`); to the router (ops/router.py) the
cross-destination or cross-kind work its layer may not call itself (`Forward`: deliver a destination's
outbox; `Create`: create a destination on first use; `Settle`: finish a topic's sends). And the error a
script's reply turns into when the destination does not exist yet. Operations are generators
(broker_core/ops/); the one driver loop runs the same generator for Broker (blocking) and AsyncBroker
(asyncio), so each operation is written once."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from .destinations import Destination
from .errors import BrokerError


class Eval(NamedTuple):
    """Run script `script` (scripts/library.py) with these keys and arguments. A named tuple, where the other
    effects are frozen dataclasses: every send and ack makes one, and a frozen dataclass's __init__ (one
    object.__setattr__ a field) was 3 % of the instructions of an ack on the client side. The driver
    tells it apart by its type (`type(request) is Eval`), never as a tuple."""

    script: str
    keys: tuple[str, ...]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Command:
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Policy:
    """Ask the driver for the PolicyEntry that applies to a destination."""

    destination: Destination


@dataclass(frozen=True)
class Sleep:
    """Ask the driver to wait `ms` milliseconds; it replies with the clock's time."""

    ms: int


@dataclass(frozen=True)
class Forward:
    """Deliver what waits in `destination`'s outbox (its forwarding hash: dead letters, moves, virtual
    destinations' copies, advisories), written there by the operation that yields this. The router runs
    ops/forward.py for it, inline; the reply is how many records were delivered. A process that dies
    before leaves the records to maintenance, which yields the same."""

    destination: Destination
    now: int
    limit: int = 1_000


@dataclass(frozen=True)
class Create:
    """Create `destination` (idempotent: its policy, name, registry entry, virtual-topic index entry and
    creation advisory). The router runs ops/admin.py for it, inline."""

    destination: Destination
    now: int


@dataclass(frozen=True)
class Settle:
    """Finish what sends to the topic `destination` started when nobody read their replies (a transaction's
    commit runs them in one MULTI/EXEC): deliver its outbox, run each subscription's dispatch pass and the
    topic's unfinished fan-outs. The router runs ops/topics.py's `settle` for it, inline: the commit
    (ops/transactions.py) is a sibling of the topic operations in the layers, so it may not call them."""

    destination: Destination
    now: int


class NoDestination(BrokerError):
    """Raised by a script when the destination has no policy yet (first use)."""

    code = "no_destination"


T = TypeVar("T")

# An operation whose result is T (`Op` alone: any result).
Op = Generator[Eval | Command | Policy | Sleep | Forward | Create | Settle | list[Eval], Any, T]


def single(call: Eval) -> Op:
    """An operation of one script call, its reply as the result (for a caller outside ops/ that runs one
    script through the Broker's driver: the maintenance jobs, the event archive)."""
    return (yield call)
