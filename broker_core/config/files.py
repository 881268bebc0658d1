"""The TOML configuration file: each top-level table belongs to one part of Signalbox ([policy],
[systemUsage], [virtualDestinations])."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from broker_core.errors import InvalidPolicy

T = TypeVar("T")


def read_config_table(path: str | Path, table: str, parse: Callable[[Any], T]) -> T:
    """Parse one top-level table of the TOML configuration file with `parse` (given {} when the file has
    no such table). The file's other tables belong to other parts of Signalbox ([policy] here,
    [systemUsage] in flow.py, [virtualDestinations] in virtual.py). Errors name the file, then what
    `parse` found wrong."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise InvalidPolicy(f"configuration file {str(path)!r} does not exist", file=str(path)) from None
    except tomllib.TOMLDecodeError as error:
        raise InvalidPolicy(f"{path}: not valid TOML: {error}", file=str(path)) from None
    raw = data.get(table, {})
    if not isinstance(raw, Mapping):
        raise InvalidPolicy(f"{path}: {table!r} must be a table ([{table}])", file=str(path))
    try:
        return parse(raw)
    except InvalidPolicy as error:
        raise InvalidPolicy(f"{path}: {error.message}", **{**error.details, "file": str(path)}) from None
