"""What the commands print: rich tables for people, JSON for scripts (`--json`)."""

from __future__ import annotations

import base64
import errno
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import click

from signalbox.cli.errors import Failure

# A column: heading, how to get the cell from a row, and whether it is a number (right-aligned).
Column = tuple[str, Callable[[dict[str, Any]], Any], bool]

# The standard streams the command was started without (`>&-`), which it reads and writes as /dev/null:
# `receive` takes no message it could only print into nothing.
CLOSED_AT_START: set[str] = set()

json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print JSON (for scripts) instead of text.")


@functools.cache
def console() -> Any:
    from rich.console import Console

    # Piped, rich would fold a wide table to 80 columns (or to any width given): a row is one line,
    # however wide, for grep and awk. (Tables are as wide as their content, not as the console.)
    return Console(width=None if sys.stdout.isatty() else 1_000_000)


@functools.cache
def err_console() -> Any:
    from rich.console import Console

    # (soft wrap: a line longer than the terminal, or than 80 columns when stderr is not one, stays one line)
    return Console(stderr=True, soft_wrap=True)


def print_json(data: Any, *, lines: bool = False) -> None:
    """JSON to stdout: indented, or one compact object per line for streams (`lines`)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":")) if lines else json.dumps(
        data, ensure_ascii=False, indent=2)
    click.echo(text)


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def build_table(columns: Sequence[Column], rows: Iterable[dict[str, Any]], title: str | None = None) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, box=None, header_style="bold", pad_edge=False)
    for heading, _, numeric in columns:
        table.add_column(heading, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        # Text, not str: rich reads a str as markup, and names, bodies and selectors may hold brackets
        # (`queue://q[red]x` would show as `qx`, a body `[/x]` would raise)
        table.add_row(*(Text(cell(get(row))) for _, get, _ in columns))
    return table


def print_table(columns: Sequence[Column], rows: Iterable[dict[str, Any]], title: str | None = None) -> None:
    console().print(build_table(columns, rows, title))


def say(text: str) -> None:
    """A human summary line (stdout; --json prints data instead): one line however long, for grep."""
    console().print(text, highlight=False, markup=False, soft_wrap=True)


# what writing to a file that cannot take more says (a full disk, a quota, a file size limit)
UNWRITABLE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def report_done(as_json: bool, data: Any, summary: str) -> None:
    """The outcome of a command that changed something: `data` as JSON, or the `summary` line. When
    standard output cannot take it (a full disk), the one error line says the change was made: only the
    report is lost (a script taking it for a failed send would send again)."""
    try:
        if as_json:
            print_json(data)
        else:
            say(summary)
        sys.stdout.flush()
    except OSError as e:
        if e.errno not in UNWRITABLE:
            raise
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - (what is left buffered goes nowhere at exit)
        raise Failure(f"{summary}, but cannot write to standard output: {e.strerror}") from None


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def body_preview(message: dict[str, Any], width: int = 60) -> str:
    if message.get("body") is None and message.get("body_base64") is not None:
        return f"<{len(base64.b64decode(message['body_base64']))} bytes>"
    text = (message.get("body") or "").replace("\n", "\\n")
    return text if len(text) <= width else text[:width - 1] + "…"


def relative_ms(epoch_ms: int | None) -> str:
    """`in 12 s` / `3 s ago` for a time in ms since the epoch."""
    if not epoch_ms:
        return "-"
    delta = (epoch_ms - time.time() * 1000) / 1000
    return f"in {delta:.0f} s" if delta >= 0 else f"{-delta:.0f} s ago"


def column(key: str, heading: str | None = None, numeric: bool = False) -> Column:
    return (heading or key, lambda row: row.get(key), numeric)
