"""The `signalbox` command: the group, its connection options, and `token`."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from signalbox.cli import admin, messaging
from signalbox.cli.api import Session
from signalbox.cli.errors import API_ERROR, INTERRUPTED, TERMINATED, USAGE, Failure, Terminated, interrupted
from signalbox.cli.output import CLOSED_AT_START, UNWRITABLE, print_json, say
from signalbox.cli.params import Seconds


def show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    import importlib.metadata  # here, not at start: it costs a third of the command's start-up

    try:
        version = importlib.metadata.version("signalbox")
    except importlib.metadata.PackageNotFoundError:
        version = "(not installed)"
    click.echo(f"signalbox {version}")
    ctx.exit()


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2


class App(click.Group):
    """Every error ends with one line on stderr and its exit code (signalbox/cli/errors.py): click's
    usage errors too, which it would print as four lines with the usage."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        # Started with stdout or stderr closed (`signalbox send q x >&-`), Python has None there: what
        # would be printed goes nowhere, rather than a traceback after the work was done (a send stored).
        # A closed stdin (`<&-`) reads as empty, as /dev/null does, rather than ending in a traceback.
        for name, mode in (("stdin", "r"), ("stdout", "w"), ("stderr", "w")):
            if getattr(sys, name) is None:
                setattr(sys, name, open(os.devnull, mode))  # noqa: SIM115 - for the process's life
                CLOSED_AT_START.add(name)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except NO_ARGS_IS_HELP as e:  # `signalbox groups` alone: the help, as click shows it
            e.show()
            sys.exit(USAGE)
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx else "signalbox"
            Failure(f"{group_option_misplaced(e) or e.format_message()} (see '{where} --help')", USAGE).show()
            sys.exit(USAGE)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except OSError as e:  # (click handles EPIPE, the reader of a pipe gone, itself: exit 1, no message)
            # stdout on a full disk, say (`receive q --json > out.jsonl`): what was not written was not
            # acknowledged. What is left in stdout's buffer goes nowhere, not into a second error at exit.
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the process's life
            Failure(f"cannot write to standard output: {e.strerror or e}" if e.errno in UNWRITABLE
                    else f"{type(e).__name__}: {e}").show()
            sys.exit(API_ERROR)
        except click.Abort:  # Ctrl-C in a prompt (click's, which has ended the prompt's line)
            Failure("interrupted", INTERRUPTED).show()
            sys.exit(INTERRUPTED)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        # Ctrl-C outside a command's own handling: here, not as click's Abort, before which click writes
        # an empty line to stderr whether or not it is a terminal (the error is one line)
        try:
            return super().invoke(ctx)
        except Terminated:
            raise Failure("terminated", TERMINATED) from None
        except KeyboardInterrupt:
            raise interrupted() from None


def group_option_misplaced(error: click.UsageError) -> str | None:
    """For `signalbox stat --token T`: that the group's option goes before the command (click would say
    only that the command has no such option, suggesting one of its own: --times for --timeout)."""
    if not isinstance(error, click.NoSuchOption) or error.ctx is None or error.ctx.parent is None:
        return None
    name = error.option_name.partition("=")[0]
    if not any(name in option.opts for option in app.params if isinstance(option, click.Option)):
        return None
    command = error.ctx.command_path.removeprefix(error.ctx.find_root().command_path).strip()
    return (f"'{name}' is an option of signalbox itself: give it before the command "
            f"(signalbox {name} ... {command})")


@click.group(cls=App, context_settings=CONTEXT)
@click.option("--url", help="The server, e.g. http://127.0.0.1:8000 (else SIGNALBOX_URL, else the config "
                            "file).")
@click.option("--token", help="API token (else SIGNALBOX_TOKEN, else the config file).")
@click.option("--config", type=click.Path(dir_okay=False),
              help="Config file (else SIGNALBOX_CONFIG, else ~/.config/signalbox/cli.toml).")
@click.option("--timeout", type=Seconds(0, above=True),
              help="Seconds to wait for an answer (default 30).")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=show_version,
              help="Show the version and exit.")
@click.pass_context
def app(ctx: click.Context, url: str | None, token: str | None, config: str | None,
        timeout: float | None) -> None:
    """Signalbox from the command line, over its REST API.

    Exit codes: 0 done, 1 the API refused, 2 usage or config error, 3 server unreachable,
    130 interrupted (Ctrl-C), 143 terminated (SIGTERM)."""
    ctx.obj = Session(url, token, config, timeout)


@app.command()
@click.option("-u", "--username", required=True)
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@click.option("--json", "as_json", is_flag=True, help="Print {\"token\": ...}.")
@click.pass_obj
def token(session: Session, username: str, password_stdin: bool, as_json: bool) -> None:
    """Get your API token (POST /api/v1/auth/token); put it in SIGNALBOX_TOKEN or the config file."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif sys.stdin.isatty():
        password = click.prompt("Password", hide_input=True)
    else:
        raise Failure("no terminal to ask the password on: give --password-stdin", USAGE)
    answer = session.api().call("POST", "/api/v1/auth/token",
                                json={"username": username, "password": password})
    if as_json:
        print_json(answer)
    else:
        say(answer["token"])


app.add_command(messaging.send)
app.add_command(messaging.receive)
app.add_command(messaging.receive, "consume")
app.add_command(messaging.browse)
app.add_command(admin.stat)
app.add_command(admin.purge)
app.add_command(admin.delete)
app.add_command(admin.move)
app.add_command(admin.retry_dlq)
app.add_command(admin.groups)
app.add_command(admin.consumers)
app.add_command(admin.scheduled)
app.add_command(admin.remove)
