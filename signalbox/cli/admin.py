"""stat, purge, delete, move, retry-dlq, groups, consumers, scheduled and remove: the operator's commands."""

from __future__ import annotations

import sys
import time
from typing import Any
from urllib.parse import quote

import click

from signalbox.cli.api import api, destination_path, qualified, waiting_out_outages
from signalbox.cli.errors import USAGE, Failure
from signalbox.cli.output import (
    Column,
    body_preview,
    build_table,
    cell,
    column,
    console,
    json_option,
    plural,
    print_json,
    print_table,
    relative_ms,
    report_done,
    say,
)
from signalbox.cli.params import WATCH_SECONDS

# -- stat ---------------------------------------------------------------------------------------------

# ActiveMQ's `activemq dstat` columns, with what Signalbox adds (in flight, expired, dead-lettered, rates).
STAT_COLUMNS: list[Column] = [
    ("Name", lambda r: f"{r['kind']}://{r['name']}" if r.get("kind") == "topic" else r["name"], False),
    column("queue_size", "Queue Size", True),
    column("pending", "Pending", True),
    column("in_flight", "In Flight", True),
    column("consumer_count", "Consumer #", True),
    column("enqueued", "Enqueue #", True),
    column("dequeued", "Dequeue #", True),
    column("expired", "Expired #", True),
    column("deadlettered", "DLQ #", True),
    column("memory_percent_usage", "Memory %", True),
    column("enqueue_rate", "In/s", True),
    column("dequeue_rate", "Out/s", True),
]
DETAIL_KEYS = ["destination", "queue_size", "pending", "in_flight", "parked", "consumer_count",
               "group_count", "enqueued", "dequeued", "dispatched", "expired", "deadlettered", "purged",
               "moved", "duplicates", "paused", "memory_usage", "memory_limit", "memory_percent_usage",
               "blocked_sends"]
# a topic's own (GET /api/v1/topics/<t>): published to no subscription, durables by state. (A queue's
# answer has these keys too, zero, with an empty `subscriptions`: shown for a topic only.)
TOPIC_DETAIL_KEYS = ["no_subscription", "durable_active", "durable_offline"]
# A topic's subscriptions (the `subscriptions` of GET /api/v1/topics/<t>), ActiveMQ's durable and
# non-durable subscription views in one: a non-durable one has no client id or name, an offline durable
# one no consumer.
SUBSCRIPTION_COLUMNS: list[Column] = [
    column("subscription_name", "Name"),
    column("durable", "Durable"),
    column("active", "Active"),
    column("pending", "Pending", True),
    column("in_flight", "In Flight", True),
    column("enqueued", "Enqueue #", True),
    column("dequeued", "Dequeue #", True),
    column("expired", "Expired #", True),
    column("deadlettered", "DLQ #", True),
    column("client_id", "Client ID"),
    column("consumer_id", "Consumer"),
    column("selector", "Selector"),
    ("Offline Since", lambda r: relative_ms(r.get("offline_since")), False),
]


def destination_rows(kind: str | None, search: str | None, sort: str) -> list[dict[str, Any]]:
    params = {"limit": 1000, "ordering": sort, "kind": kind, "search": search}
    try:
        return list(api().pages("/api/v1/destinations", {k: v for k, v in params.items() if v}))
    except Failure as e:
        # the server knows the columns (the list below is its own): its refusal, as a usage error naming
        # the option the user typed, not the API's parameter
        problem = e.problem or {}
        if problem.get("parameter") != "ordering":
            raise
        columns = str(problem.get("detail") or "").removeprefix("ordering is one of ")
        raise click.BadParameter(f"{sort!r} is not a column; the columns: {columns}",
                                 param_hint="'--sort'") from None


@click.command()
@click.argument("destination", required=False)
@click.option("--kind", type=click.Choice(["queue", "topic"]), help="Only queues or only topics.")
@click.option("--search", help="Only destinations whose name contains this.")
@click.option("--sort", default="name", show_default=True, metavar="[-]COLUMN",
              help="Sort by a statistic (queue_size, pending, enqueued, deadlettered, enqueue_rate...; "
                   "the server names them all if one is wrong); - descends.")
@click.option("--watch", type=WATCH_SECONDS, is_flag=False, flag_value=2.0, default=None,
              metavar="[SECONDS]", help="Refresh every SECONDS (2 when not given) until Ctrl-C.")
@click.option("--times", type=click.IntRange(1), help="With --watch: stop after this many refreshes.")
@json_option
def stat(destination: str | None, kind: str | None, search: str | None, sort: str, watch: float | None,
         times: int | None, as_json: bool) -> None:
    """A table of destinations and their statistics, like `activemq dstat`; with DESTINATION, all of
    that destination's statistics."""
    if times is not None and watch is None:
        raise click.UsageError("--times counts the refreshes of --watch: give --watch too")
    if destination is not None:
        ctx = click.get_current_context()
        for name in ("kind", "search", "sort"):  # (the list's filters: with one destination, nothing to do)
            if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
                raise click.UsageError(f"'--{name}' is for the list of destinations (stat without "
                                       f"DESTINATION), not for {destination}")
        def fetch() -> Any:
            detail = api().call("GET", destination_path(destination))
            return {k: v for k, v in detail.items() if k != "policy"} if not as_json else detail

        def show(data: Any) -> Any:
            from rich.console import Group

            topic = data.get("kind") == "topic"
            parts = [detail_table(data, DETAIL_KEYS + TOPIC_DETAIL_KEYS if topic else DETAIL_KEYS)]
            if topic:  # its subscriptions, even none (that is worth seeing too)
                parts.append(build_table(SUBSCRIPTION_COLUMNS, data["subscriptions"], title="subscriptions")
                             if data["subscriptions"] else "no subscriptions")
            if data.get("consumers"):
                parts.append(build_table(CONSUMER_COLUMNS, data["consumers"], title="consumers"))
            return Group(*parts)
    else:
        def fetch() -> Any:
            return destination_rows(kind, search, sort)

        def show(data: Any) -> Any:
            return build_table(STAT_COLUMNS, data) if data else "no destinations"

    if watch is None:
        data = fetch()
        if as_json:
            print_json(data)
        else:
            console().print(show(data))
        return
    run_watch(fetch, show, watch, times, as_json)


def detail_table(data: dict[str, Any], keys: list[str]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for key in keys:
        if key in data:
            table.add_row(key, Text(cell(data[key])))  # (Text: a name's brackets are not markup)
    return table


def run_watch(fetch: Any, show: Any, every: float, times: int | None, as_json: bool) -> None:
    """Refresh until Ctrl-C (which ends a watch normally) or `times` refreshes: in place on a terminal,
    else one table (or one JSON line) per refresh. A moment when the broker is away (Redis restarting) is
    waited out, said once on stderr: a watch is what runs while something is wrong."""
    out = console()
    outage = [False]
    live = None
    if out.is_terminal and not as_json:
        from rich.live import Live

        live = Live(console=out, auto_refresh=False)
        live.start()
    shown = 0
    try:
        while True:
            data = waiting_out_outages(fetch, outage)
            if as_json:
                print_json(data, lines=True)
            elif live is not None:
                live.update(show(data), refresh=True)
            else:
                out.print(show(data))
                out.print()
            shown += 1
            if times is not None and shown >= times:
                return
            time.sleep(every)
    except KeyboardInterrupt:
        return
    finally:
        if live is not None:
            live.stop()


# -- purge, move, retry-dlq ---------------------------------------------------------------------------

@click.command()
@click.argument("destination")
@json_option
def purge(destination: str, as_json: bool) -> None:
    """Remove every message of DESTINATION: pending, parked and in flight (ActiveMQ's purge; docs/api.md)."""
    answer = api().call("POST", destination_path(destination) + "/purge")
    where = answer.get("destination", destination)
    report_done(as_json, answer, f"purged {plural(answer.get('removed', 0), 'message')} from {where}")


@click.command()
@click.argument("destination")
@click.option("--yes", is_flag=True, help="Do not ask (needed when standard input is not a terminal).")
@json_option
def delete(destination: str, yes: bool, as_json: bool) -> None:
    """Delete DESTINATION with every message in it; a topic with all its subscriptions, durable ones too
    (ActiveMQ's removeQueue / removeTopic; docs/api.md). Asks first unless --yes."""
    path = destination_path(destination)
    if not yes:
        if not sys.stdin.isatty():
            raise Failure(f"not deleting {destination} unasked: give --yes (standard input is not a "
                          "terminal)", USAGE)
        if not click.confirm(f"Delete {destination} and every message in it? This cannot be undone",
                             default=False, err=True):
            raise Failure(f"{destination} not deleted", USAGE)
    answer = api().call("DELETE", path)
    where = qualified(destination)
    report_done(as_json, answer, f"deleted {where}: {plural(answer.get('removed', 0), 'message')} removed")


def message_ids_option(verb: str) -> Any:
    return click.option("--message-id", "message_ids", multiple=True,
                        help=f"{verb} only this message (repeatable) instead of by selector.")


def by_id(path: str, message_ids: tuple[str, ...], action: str, doing: str, json: Any = None) -> int:
    """`…/messages/<id>/<action>` for each id, one call each: the messages counted. A refused id ends
    the command, saying how many went before it (they stay where they went), as send --count does."""
    client, done = api(), 0
    for message_id in message_ids:
        try:
            done += client.call("POST", f"{path}/messages/{quote(message_id, safe='')}/{action}",
                                json=json)["count"]
        except Failure as e:
            if done:
                e.message += f" (after {doing} {done} of {len(message_ids)} messages)"
            raise
    return done


@click.command()
@click.argument("source")
@click.argument("target")
@click.option("--selector", help="Only the messages matching this JMS selector (default: all).")
@click.option("-n", "--limit", type=click.IntRange(1), help="At most this many messages.")
@message_ids_option("Move")
@click.option("--copy", is_flag=True, help="Copy instead of move.")
@json_option
def move(source: str, target: str, selector: str | None, limit: int | None, message_ids: tuple[str, ...],
         copy: bool, as_json: bool) -> None:
    """Move (or --copy) the messages of SOURCE to TARGET, all, by selector, or by id."""
    client = api()
    path = destination_path(source)
    verb = "copy" if copy else "move"
    if message_ids:
        if selector or limit:
            raise click.UsageError("--message-id does not go with --selector or --limit")
        count = by_id(path, message_ids, verb, "copying" if copy else "moving", {"target": target})
    else:
        body: dict[str, Any] = {"target": target, "selector": selector or ""}
        if limit:
            body["limit"] = limit
        count = client.call("POST", f"{path}/{verb}-matching", json=body)["count"]
    source, target = qualified(source), qualified(target)
    report_done(as_json, {"count": count, "source": source, "target": target},
                f"{'copied' if copy else 'moved'} {plural(count, 'message')} from {source} to {target}")


@click.command("retry-dlq")
@click.argument("dlq", default="ActiveMQ.DLQ")
@click.option("--selector", help="Only the dead letters matching this JMS selector (default: all).")
@message_ids_option("Retry")
@json_option
def retry_dlq(dlq: str, selector: str | None, message_ids: tuple[str, ...], as_json: bool) -> None:
    """Send the dead letters of DLQ (default ActiveMQ.DLQ) back to where they came from."""
    client = api()
    path = destination_path(dlq)
    if message_ids:
        if selector:
            raise click.UsageError("--message-id does not go with --selector")
        count = by_id(path, message_ids, "retry", "retrying")
    else:
        count = client.call("POST", f"{path}/retry-matching", json={"selector": selector or ""})["count"]
    dlq = qualified(dlq)
    report_done(as_json, {"count": count, "dlq": dlq}, f"retried {plural(count, 'message')} from {dlq}")


# -- scheduled, remove --------------------------------------------------------------------------------

SCHEDULED_COLUMNS: list[Column] = [
    column("message_id", "ID"),
    ("Due", lambda r: relative_ms(r.get("due")), False),
    column("period", "Period (ms)", True),
    column("repeats_left", "Repeats Left", True),
    column("cron", "Cron"),
    ("Body", body_preview, False),
]


@click.command()
@click.argument("destination")
@click.option("-n", "--limit", type=click.IntRange(1), default=100, show_default=True,
              help="Show at most this many jobs.")
@json_option
def scheduled(destination: str, limit: int, as_json: bool) -> None:
    """The scheduled messages of DESTINATION, soonest due first: delayed, repeating and cron jobs
    (send --delay/--period/--repeat/--cron). Cancel one with `remove DESTINATION ID`."""
    rows = []
    for row in api().pages(destination_path(destination) + "/scheduled", {"limit": min(limit, 1000)},
                           rows="messages"):
        rows.append(row)
        if len(rows) >= limit:
            break
    if as_json:
        print_json(rows)
    elif rows:
        print_table(SCHEDULED_COLUMNS, rows)
    else:
        say("no scheduled messages")


@click.command()
@click.argument("destination")
@click.argument("message_ids", nargs=-1, required=True, metavar="MESSAGE_ID...")
@json_option
def remove(destination: str, message_ids: tuple[str, ...], as_json: bool) -> None:
    """Remove messages of DESTINATION by id (in flight too), or cancel scheduled jobs: no further
    deliveries (DELETE …/messages/<id>, admin). One call per id: when one is refused, the error says how
    many were removed before it."""
    client, path, done = api(), destination_path(destination), 0
    where = qualified(destination)
    for message_id in message_ids:
        try:
            client.call("DELETE", f"{path}/messages/{quote(message_id, safe='')}")
        except Failure as e:
            if done:
                e.message += f" (after removing {done} of {plural(len(message_ids), 'message')})"
            raise
        done += 1
    report_done(as_json, {"removed": done, "destination": where},
                f"removed {plural(done, 'message')} from {where}")


# -- groups, consumers --------------------------------------------------------------------------------

@click.group()
def groups() -> None:
    """Message groups of a queue: list, reset one, remove all."""


@groups.command("list")
@click.argument("destination")
@json_option
def groups_list(destination: str, as_json: bool) -> None:
    """The message groups of DESTINATION and the consumer owning each."""
    rows = list(api().pages(destination_path(destination) + "/groups", rows="groups"))
    if as_json:
        print_json(rows)
    elif rows:
        print_table([column("group_id", "Group"), column("owner", "Owner"),
                     ("Assigned", lambda r: relative_ms(r.get("assigned_at")), False)], rows)
    else:
        say("no message groups")


@groups.command("reset")
@click.argument("destination")
@click.argument("group")
@json_option
def groups_reset(destination: str, group: str, as_json: bool) -> None:
    """Free GROUP (removeMessageGroup): its next message picks an owner again."""
    answer = api().call("DELETE", f"{destination_path(destination)}/groups/{quote(group, safe='')}")
    report_done(as_json, answer, f"reset group {group} of {qualified(destination)}")


@groups.command("remove-all")
@click.argument("destination")
@json_option
def groups_remove_all(destination: str, as_json: bool) -> None:
    """Free every message group of DESTINATION (removeAllMessageGroups)."""
    answer = api().call("DELETE", destination_path(destination) + "/groups")
    report_done(as_json, answer,
                f"removed {plural(answer.get('count', 0), 'message group')} of {qualified(destination)}")


CONSUMER_COLUMNS: list[Column] = [
    column("consumer_id", "ID"),
    column("selector", "Selector"),
    column("ack_mode", "Ack"),
    column("prefetch", "Prefetch", True),
    column("in_flight", "In Flight", True),
    column("dispatched", "Dispatched", True),
    column("acked", "Acked", True),
    column("groups", "Groups", True),
    ("Lease", lambda r: relative_ms(r.get("lease_expires")), False),
    column("full", "Full"),
    column("slow", "Slow"),
]


@click.command()
@click.argument("destination")
@json_option
def consumers(destination: str, as_json: bool) -> None:
    """The consumers of DESTINATION with prefetch, in flight, acked, lease (needs admin)."""
    rows = api().call("GET", destination_path(destination) + "/consumers")
    if as_json:
        print_json(rows)
    elif rows:
        print_table(CONSUMER_COLUMNS, rows)
    else:
        say("no consumers")

