"""send, receive (consume) and browse."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import click

from signalbox.cli.api import Api, api, destination_path, waiting_out_outages
from signalbox.cli.errors import INTERRUPTED, TERMINATED, USAGE, Failure, Terminated, interrupted, on_sigterm
from signalbox.cli.output import (
    CLOSED_AT_START,
    body_preview,
    console,
    err_console,
    json_option,
    plural,
    print_json,
    print_table,
    report_done,
)
from signalbox.cli.params import LEASE, MILLIS, PROPERTY, Seconds

MAX_BATCH = 1000  # the API's largest batch


# -- send ---------------------------------------------------------------------------------------------

def read_body(body: str | None, file: str | None) -> bytes | str:
    if body is not None and file is not None:
        raise Failure("give the body as an argument or with --file, not both", USAGE)
    if body is not None:
        # the argument's own bytes (Python decoded them with surrogateescape): not UTF-8, it goes as bytes
        return os.fsencode(body)
    if file is None:
        if sys.stdin.isatty():
            raise Failure("no body: give it as an argument, with --file PATH, or on standard input", USAGE)
        # Read because no body was given, an empty input is more likely a producer that failed
        # (`producer | signalbox send q`) or a job with no input than an empty message meant.
        data = sys.stdin.buffer.read()
        if not data:
            raise Failure("no body: standard input was empty, nothing sent (an empty body on purpose: "
                          "--file - or '')", USAGE)
        return data
    if file == "-":
        return sys.stdin.buffer.read()
    try:
        with open(file, "rb") as f:
            return f.read()
    except OSError as e:
        raise Failure(f"--file {file}: {e.strerror}", USAGE) from None


def envelope_of(body: bytes | str, fields: dict[str, Any],
                properties: list[tuple[str, Any]]) -> dict[str, Any]:
    """The API's message envelope: text bodies as `body`, anything not UTF-8 as `body_base64`."""
    envelope: dict[str, Any] = {}
    if isinstance(body, bytes):
        try:
            envelope["body"] = body.decode("utf-8")
        except UnicodeDecodeError:
            envelope["body_base64"] = base64.b64encode(body).decode()
    else:
        envelope["body"] = body
    envelope.update({k: v for k, v in fields.items() if v is not None})
    if properties:
        twice = next((name for name, n in Counter(name for name, _ in properties).items() if n > 1), None)
        if twice is not None:  # (a dict would keep the last value, unsaid)
            raise click.BadParameter(f"property {twice!r} is given twice", param_hint="'-p' / '--property'")
        envelope["properties"] = dict(properties)
    return envelope


def send_path(destination: str) -> tuple[str, dict[str, str] | None]:
    """A composite (`orders,audit`) goes to /api/v1/messages?destination=...; one destination to its own."""
    if "," in destination:
        return "/api/v1/messages", {"destination": destination}
    return destination_path(destination) + "/messages", None


@click.command()
@click.argument("destination")
@click.argument("body", required=False)
@click.option("-f", "--file", help="Read the body from a file ('-' for standard input).")
@click.option("-p", "--property", "properties", type=PROPERTY, multiple=True,
              help="NAME=VALUE (string) or NAME:=JSON (number, boolean, typed); repeatable.")
@click.option("--priority", type=click.IntRange(0, 9), help="0-9 (the server's default is 4).")
@click.option("--ttl", type=MILLIS, help="Time to live: ms, or 30s, 5m, 2h...")
@click.option("--delay", type=MILLIS, help="Deliver after this long (AMQ_SCHEDULED_DELAY).")
@click.option("--period", type=MILLIS,
              help="With --repeat: the time between deliveries (AMQ_SCHEDULED_PERIOD).")
@click.option("--repeat", type=click.IntRange(0), help="Deliver this many times more (AMQ_SCHEDULED_REPEAT).")
@click.option("--cron", help="Deliver at the times of this cron expression, in UTC (AMQ_SCHEDULED_CRON).")
@click.option("--correlation-id", help="JMSCorrelationID.")
@click.option("--type", "type_", help="JMSType.")
@click.option("--reply-to", help="JMSReplyTo, a destination.")
@click.option("--group", help="JMSXGroupID: the message group.")
@click.option("--group-seq", type=int, help="JMSXGroupSeq.")
@click.option("--content-type", help="The body's content type.")
@click.option("--non-persistent", is_flag=True, help="Send as non-persistent.")
@click.option("-n", "--count", type=click.IntRange(1), default=1, show_default=True,
              help="Send the message this many times (in batches, with a progress bar on a terminal).")
@click.option("--batch", type=click.IntRange(1, MAX_BATCH), default=100, show_default=True,
              help="Messages per request with --count (halved while over the server's request limit).")
@json_option
def send(destination: str, body: str | None, file: str | None, properties: tuple[tuple[str, Any], ...],
         priority: int | None, ttl: int | None, delay: int | None, period: int | None, repeat: int | None,
         cron: str | None, correlation_id: str | None,
         type_: str | None, reply_to: str | None, group: str | None, group_seq: int | None,
         content_type: str | None, non_persistent: bool, count: int, batch: int, as_json: bool) -> None:
    """Send a message to DESTINATION (a queue, queue://name, topic://name, or a composite A,B).

    The body is BODY, a file (--file), or standard input when neither is given (an empty one is refused
    then; --file - or '' sends an empty body)."""
    fields = {"priority": priority, "ttl": ttl, "delay": delay, "period": period, "repeat": repeat,
              "cron": cron, "correlation_id": correlation_id,
              "type": type_, "reply_to": reply_to, "group_id": group, "group_seq": group_seq,
              "content_type": content_type, "persistent": False if non_persistent else None}
    envelope = envelope_of(read_body(body, file), fields, list(properties))
    path, params = send_path(destination)
    client = api()
    result: dict[str, Any] = {"message_ids": [], "statuses": [], "destinations": []}
    if count > 1:  # SIGTERM (`timeout`) ends a long send as Ctrl-C does: saying how far it got
        signal.signal(signal.SIGTERM, on_sigterm)
    with progress_bar(count, "sending") as advance:
        while len(result["message_ids"]) < count:
            n = min(batch, count - len(result["message_ids"]))
            payload = envelope if count == 1 else {"messages": [envelope] * n}
            try:
                answer = client.call("POST", path, params=params, json=payload)
            except Failure as e:
                if n > 1 and (e.problem or {}).get("code") == "request_too_large":
                    # the copies are over the server's request limit together, not one by one: a refused
                    # request stores nothing, so the same messages go again in smaller requests
                    batch = n // 2
                    continue
                if result["message_ids"]:
                    e.message += f" (after sending {len(result['message_ids'])} of {count})"
                raise
            except KeyboardInterrupt as e:  # (the batch in flight may have been stored: it is not counted)
                sent = len(result["message_ids"])
                if isinstance(e, Terminated):
                    raise Failure(f"terminated after sending {sent} of {count}", TERMINATED) from None
                raise interrupted(f"interrupted after sending {sent} of {count}") from None
            result["message_ids"] += answer["message_ids"]
            result["statuses"] += answer["statuses"]
            result["destinations"] = answer["destinations"]
            advance(n)
    where = ", ".join(result["destinations"])
    tally = Counter(result["statuses"])
    others = ", ".join(f"{n} {status}" for status, n in sorted(tally.items()))
    note = "" if set(tally) <= {"ok"} else f" ({others})"
    what = result["message_ids"][0] if count == 1 else f"{count} messages"
    report_done(as_json, result, f"sent {what} to {where}{note}")


@contextlib.contextmanager
def progress_bar(total: int, what: str) -> Iterator[Callable[[int], None]]:
    """`advance(n)`: a rich progress bar on stderr when it is a terminal and there is more than one
    message, else nothing."""
    if total <= 1 or not err_console().is_terminal:
        yield lambda n: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err_console()) as progress:
        task = progress.add_task(what, total=total)
        yield lambda n: progress.advance(task, n)


# -- receive ------------------------------------------------------------------------------------------

ACK_MODES = {"individual": "client-individual", "client": "client", "auto": "auto"}
MAX_WAIT = 20.0  # the server caps one long poll at SIGNALBOX_MAX_RECEIVE_WAIT (20 s by default)


def show_message(message: dict[str, Any], as_json: bool, verbose: bool) -> None:
    """A received message: its body on a line (bytes as they are), or a JSON line."""
    if as_json:
        print_json(message, lines=True)
        return
    if verbose:
        header = {k: message.get(k) for k in ("message_id", "destination", "priority", "redelivered",
                                              "delivery_count", "group_id", "correlation_id", "type")}
        header = {k: v for k, v in header.items() if v not in (None, "", False)}
        if message.get("properties"):
            header["properties"] = message["properties"]
        click.echo("# " + json.dumps(header, ensure_ascii=False))
    if message.get("body_base64") is not None and message.get("body") is None:
        data = base64.b64decode(message["body_base64"])
    else:
        data = (message.get("body") or "").encode()
    # Written as bytes: click.echo would strip escape sequences from text going to a pipe or a file, and
    # the message is acknowledged once printed, so what is printed must be the body.
    out = click.get_binary_stream("stdout")
    out.write(data + b"\n")
    out.flush()


@click.command()
@click.argument("destination")
@click.option("--ack", "ack_mode", type=click.Choice(list(ACK_MODES)), default="individual",
              show_default=True,
              help="individual: each printed message by id; client: cumulatively, up to the last printed; "
                   "auto: the server acknowledges as it hands messages over.")
@click.option("--selector", help="A JMS selector, e.g. \"region = 'eu' AND n > 3\".")
@click.option("-n", "--count", type=click.IntRange(1),
              help="Stop after N messages (default: 1, or no limit with --follow).")
@click.option("-f", "--follow", is_flag=True, help="Keep receiving until Ctrl-C (or --count).")
@click.option("--wait", type=Seconds(0), default=5.0, show_default=True,
              help="Without --follow: seconds to wait for a message before stopping.")
@click.option("--prefetch", type=click.IntRange(0, 32767),
              help="Messages the broker may dispatch ahead (default: 0 with a --count, each receive pulling "
                   "exactly what is missing; 100 with --follow alone).")
@click.option("--lease", type=LEASE, default="30s", show_default=True,
              help="How long the server keeps the consumer, and the messages it holds, when this command "
                   "dies without closing it (kill -9, a lost network); renewed while the command runs. "
                   "1s to 1h.")
@click.option("-v", "--verbose", is_flag=True,
              help="Print a header line (# {id, priority, ...}) before each message.")
@json_option
def receive(destination: str, ack_mode: str, selector: str | None, count: int | None, follow: bool,
            wait: float, prefetch: int | None, lease: int, verbose: bool, as_json: bool) -> None:
    """Receive messages from DESTINATION and print them (bodies, or JSON lines with --json).

    A leased consumer is created, each printed message is acknowledged after it is printed, and the
    consumer is closed on exit (Ctrl-C too), so what was not printed goes back to the queue."""
    if "stdout" in CLOSED_AT_START:  # (each message would be acknowledged once "printed")
        raise Failure("standard output is closed: no message taken, as it could not be printed", USAGE)
    limit = count if count is not None else (None if follow else 1)
    if prefetch is None:
        # A bounded receive pulls: nothing is dispatched to it that it will not print and ack.
        prefetch = 0 if limit else 100
    client = api()
    path = destination_path(destination)
    spec: dict[str, Any] = {"ack_mode": ACK_MODES[ack_mode], "prefetch": prefetch, "lease_ms": lease}
    if selector:
        spec["selector"] = selector
    consumer, base, keeper = open_consumer(client, path, spec, follow)
    tally = [0]  # messages printed (receive_loop counts them: an interrupted loop returns nothing)
    # SIGTERM (`timeout`, a service stopped) ends the command as Ctrl-C does: the consumer closed and what
    # it took said, exiting 143 rather than 130.
    signal.signal(signal.SIGTERM, on_sigterm)
    stopped: KeyboardInterrupt | None = None
    try:
        try:
            while True:
                try:
                    receive_loop(client, base, ack_mode, limit, follow, wait, as_json, verbose, tally)
                    break
                except Failure as e:
                    # Following, a consumer the server no longer has (its lease lapsed while the machine
                    # slept, an operator closed it) is made again, as `tail -F` opens a file again.
                    if not follow or (e.problem or {}).get("code") != "unknown_consumer":
                        raise
                    keeper.stop()
                    err_console().print(
                        f"signalbox: {e.message}: following with a new consumer (what the old one had not "
                        "acknowledged went back to the queue and may be printed again)",
                        highlight=False, markup=False)
                    time.sleep(0.5)  # (at most two a second, should the server drop each one at once)
                    consumer, base, keeper = open_consumer(client, path, spec, follow)
        except KeyboardInterrupt as e:
            stopped = e
    except BaseException as e:  # also when the reader of a pipe goes away (BrokenPipeError)
        keeper.stop()
        not_closed = close_consumer(client, base)
        if not_closed is not None and isinstance(e, Failure):  # one line: the error, then the close's
            e.message += "; " + close_failed(not_closed, too=True)
        elif not_closed is not None:
            Failure(close_failed(not_closed)).show()
        raise
    keeper.stop()
    not_closed = close_consumer(client, base)
    if stopped is not None and not isinstance(stopped, Terminated) and sys.stderr.isatty():
        click.echo(err=True)  # (a line of its own after the ^C)
    why = "" if stopped is None else " (terminated)" if isinstance(stopped, Terminated) else " (interrupted)"
    # (on stderr, --json or not: stdout holds the messages alone)
    err_console().print(f"received {plural(tally[0], 'message')} from {consumer['destination']}{why}",
                        highlight=False, markup=False)
    if not_closed is not None:
        Failure(close_failed(not_closed)).show()
    if stopped is not None:
        raise SystemExit(TERMINATED if isinstance(stopped, Terminated) else INTERRUPTED)


def open_consumer(client: Api, path: str, spec: dict[str, Any], follow: bool
                  ) -> tuple[dict[str, Any], str, LeaseKeeper]:
    """A new consumer on the destination at `path`: the API's answer, its path, and the started thread
    that keeps its lease. Following, a broker away is waited for (a service may start before it is back)."""
    consumer = patiently(follow, [False], client, f"{path}/consumers", json=spec)
    base = f"{path}/consumers/{quote(consumer['consumer_id'], safe='')}"
    keeper = LeaseKeeper(client, base, consumer.get("lease_ms", spec["lease_ms"]))
    keeper.start()
    return consumer, base, keeper


class LeaseKeeper(threading.Thread):
    """Renews the consumer's lease (`…/heartbeat`) every third of it until stopped. The receive loop renews
    it with each long poll, but printing blocks for as long as the reader of a pipe is busy (`receive q |
    slow-program`): past the lease the server would give the messages being printed to another consumer
    and refuse their acknowledgement. With its own client: the loop's may be in a long poll."""

    def __init__(self, client: Api, base: str, lease_ms: int) -> None:
        super().__init__(name="lease", daemon=True)
        self.client, self.base, self.every = Api(client.settings), base, lease_ms / 3000
        self.stopped = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopped.wait(self.every):
                with contextlib.suppress(Exception):  # (the loop's next call says what went wrong)
                    self.client.call("POST", f"{self.base}/heartbeat", timeout=self.every)
        finally:
            self.client.close()

    def stop(self) -> None:
        self.stopped.set()


def close_failed(reason: str, too: bool = False) -> str:
    """What is said when `close_consumer` could not close it (`too`: after another error)."""
    return (f"closing the consumer failed{' too' if too else ''}: {reason} "
            "(its lease returns its messages when it lapses)")


def receive_loop(client: Api, base: str, ack_mode: str, limit: int | None, follow: bool, wait: float,
                 as_json: bool, verbose: bool, tally: list[int]) -> None:
    """Receive, print and acknowledge until `limit` messages or, unless following, `wait` seconds without
    one; tally[0] counts the messages printed and acknowledged."""
    deadline = time.monotonic() + wait
    outage = [False]  # (said once per outage)
    while limit is None or tally[0] < limit:
        want = min(limit - tally[0], MAX_BATCH) if limit else 100
        slice_ = MAX_WAIT if follow else max(0.0, min(MAX_WAIT, deadline - time.monotonic()))
        answer = patiently(follow, outage, client, f"{base}/receive",
                           params={"max_messages": want, "wait": f"{slice_:.3f}"},
                           timeout=client.settings.timeout + slice_)
        messages = answer["messages"]
        if not messages:
            if follow or time.monotonic() < deadline:
                continue
            break
        for message in messages:
            show_message(message, as_json, verbose)
        sys.stdout.flush()
        ids = [m["message_id"] for m in messages]
        if ack_mode != "auto":  # client: cumulative, the last acknowledges everything before it
            acked = ids if ack_mode == "individual" else ids[-1:]
            patiently(follow, outage, client, f"{base}/ack", json={"message_ids": acked})
        tally[0] += len(messages)
        deadline = time.monotonic() + wait


def patiently(follow: bool, outage: list[bool], client: Api, path: str, **options: Any) -> Any:
    """`client.call("POST", path, **options)`; following (`--follow`: until Ctrl-C), through a moment when
    the broker is away (`waiting_out_outages`): the consumer lives in Redis and is there again with it."""
    def call() -> Any:
        return client.call("POST", path, **options)

    return waiting_out_outages(call, outage) if follow else call()


def close_consumer(client: Api, base: str) -> str | None:
    """Close the consumer; its unacknowledged messages go back. None when closed, or already gone (lapsed,
    aborted: nothing to give back); else why it could not be (the caller says so: not hidden)."""
    try:
        client.call("DELETE", base)
    except Failure as e:
        if (e.problem or {}).get("status") not in (404, 410):
            return e.message
    return None


# -- browse -------------------------------------------------------------------------------------------

BROWSE_COLUMNS = [
    ("ID", lambda m: m["message_id"], False),
    ("State", lambda m: m.get("state"), False),
    ("Pri", lambda m: m.get("priority"), True),
    ("Deliveries", lambda m: m.get("delivery_count"), True),
    ("Group", lambda m: m.get("group_id"), False),
    ("Properties", lambda m: json.dumps(m["properties"], ensure_ascii=False) if m.get("properties") else None,
     False),
    ("Body", body_preview, False),
]


@click.command()
@click.argument("destination")
@click.option("--selector", help="Only messages matching this JMS selector.")
@click.option("-n", "--limit", type=click.IntRange(1), default=100, show_default=True,
              help="Show at most this many messages.")
@json_option
def browse(destination: str, selector: str | None, limit: int, as_json: bool) -> None:
    """List the messages of DESTINATION without consuming them (pending, parked and in flight)."""
    client = api()
    path = destination_path(destination) + "/messages"
    found: list[dict[str, Any]] = []
    cursor = None
    while len(found) < limit:
        params = {"limit": min(limit - len(found), MAX_BATCH), "selector": selector, "cursor": cursor}
        page = client.call("GET", path, params={k: v for k, v in params.items() if v is not None})
        found += page["messages"]
        cursor = page.get("next_cursor")
        if not cursor:
            break
    found = found[:limit]
    if as_json:
        print_json(found)
    elif found:
        print_table(BROWSE_COLUMNS, found)
    else:
        console().print("no messages", highlight=False)
