"""`python manage.py signalbox_analytics --since … --until …`: archive, then run the PySpark jobs."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from analytics.archive import ArchiveError
from analytics.pipeline import TIME_FORMS, RangeError, attach_time_values


class Command(BaseCommand):
    help = ("Archive the lifecycle events, then run the analytics jobs over a time range "
            "(tables and summary in SIGNALBOX_ANALYTICS_OUTPUT, summary also in Redis for the console).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", help=f"start: {TIME_FORMS} "
                            "(default: SIGNALBOX_ANALYTICS_WINDOW_HOURS before --until)")
        parser.add_argument("--until", help="end, exclusive (default: now)")
        parser.add_argument("--destination", action="append", help="only this destination URI (repeatable)")
        parser.add_argument("--master", help="Spark master (default SIGNALBOX_SPARK_MASTER, else local[*])")
        parser.add_argument("--namespace", help="broker key namespace (default SIGNALBOX_NAMESPACE)")
        parser.add_argument("--no-archive", action="store_true", help="skip the archive run before the jobs")

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # Both the command line and call_command() parse through parse_args: `--since -6h` is attached
        # as `--since=-6h` there, or argparse would take -6h for an unknown option.
        parse_args = parser.parse_args
        parser.parse_args = lambda args=None, namespace=None: parse_args(attach_time_values(args), namespace)
        return parser

    def handle(self, *args, **options) -> None:
        from analytics import tasks
        from signalbox.tasks import broker, redis_client

        try:
            since_ms, until_ms = tasks.time_range(options["since"], options["until"])
            result = tasks.run(broker(options["namespace"]), str(since_ms), str(until_ms),
                               summary_client=redis_client(), archive_first=not options["no_archive"],
                               destinations=options["destination"],
                               master=options["master"])
        except (RangeError, ArchiveError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(result))
