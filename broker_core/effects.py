"""What an operation yields to the driver that runs it (drivers/loop.py): a script to run (`Eval`), a plain
Redis
command (`Command`), or a question for the driver (`Policy`), and the error a script's reply turns into
when the destination does not exist yet. Operations are generators (operations.py); the one driver loop
runs the same generator for Broker (blocking) and AsyncBroker (asyncio), so each operation is written once."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from .destinations import Destination
from .errors import BrokerError


@dataclass(frozen=True)
class Eval:
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


class NoDestination(BrokerError):
    """Raised by a script when the destination has no policy yet (first use)."""

    code = "no_destination"


T = TypeVar("T")

# An operation whose result is T (`Op` alone: any result).
Op = Generator[Eval | Command | Policy, Any, T]
