"""Exit codes and the one-line error every failure ends with.

    0  done
    1  the API refused (an HTTP error: its problem's title and detail are printed); also click's code
       when the reader of a pipe goes away (`signalbox receive q -n 100 | head -1`), and when standard
       output cannot be written (a full disk)
    2  usage: a bad option or argument, or a bad config file (click's own code for usage errors)
    3  Signalbox could not be reached (connection refused, DNS, timeout)
  130  interrupted (Ctrl-C); a consumer is closed first, so what it did not print goes back
  143  terminated (SIGTERM, e.g. by `timeout`): `receive` and `send --count` end as on Ctrl-C
"""

from __future__ import annotations

import sys
from typing import IO, Any

import click

API_ERROR = 1
USAGE = 2
UNREACHABLE = 3
INTERRUPTED = 130
TERMINATED = 143  # 128 + SIGTERM


class Failure(click.ClickException):
    """Ends the command with one line on stderr, `signalbox: <message>`, and its exit code."""

    def __init__(self, message: str, exit_code: int = API_ERROR, problem: dict[str, Any] | None = None):
        super().__init__(message)
        self.exit_code = exit_code
        self.problem = problem

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"signalbox: {self.format_message()}", file=file or click.get_text_stream("stderr"),
                   err=file is None)


def interrupted(message: str = "interrupted") -> Failure:
    """The failure a Ctrl-C ends a command with; on a terminal it starts a line of its own (after the ^C)."""
    if sys.stderr.isatty():
        click.echo(err=True)
    return Failure(message, INTERRUPTED)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be (`on_sigterm`), so that it takes the same
    way out: `receive` closes its consumer and says what it took, `send --count` how far it got."""


def on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated
