"""`manage.py signalbox_job <job> [--destination D]`: run one maintenance job once, by hand, in this
process (no Celery worker needed), on one destination or on all of them. `--list` describes the jobs.

The jobs are broker_core.maintenance's; they take the same Redis leases as the workers' runs, so running
one while the workers are up is safe (a job a worker holds is skipped and reported as not run)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from broker_core import maintenance
from broker_core.broker import Broker
from broker_core.destinations import parse_destination
from broker_core.errors import BrokerError
from gateway import runtime

Job = Callable[[Broker, str], Any]

JOBS: dict[str, tuple[str, Job]] = {
    "recover": ("close consumers whose lease lapsed (their messages are redelivered), finish dead-letter "
                "and move forwards a crashed process left behind, dispatch parked messages that came due",
                maintenance.run_recovery),
    "expire": ("an expiry sweep over the whole destination, now, whatever expireMessagesPeriod says",
               lambda broker, uri: maintenance.run_expiry_sweep(broker, uri, max_pages=None, force=True)),
    "slow": ("one run of the policy's slowConsumerStrategy (not before checkPeriod has passed since the "
             "last run)", maintenance.run_slow_consumer_check),
    "tick": ("the dispatcher: every job that is due (what Celery beat sends every second)",
             lambda broker, uri: maintenance.run_due(broker, [uri])),
}


class Command(BaseCommand):
    help = "Run a maintenance job once by hand on one destination or all of them (--list: the jobs)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", nargs="?", help=f"one of {', '.join(JOBS)}")
        parser.add_argument("--destination", "-d", help="queue://name or topic://name (no scheme: a queue); "
                                                        "default: every destination")
        parser.add_argument("--list", dest="list_jobs", action="store_true",
                            help="describe the jobs and exit")

    def handle(self, *args: Any, job: str | None = None, destination: str | None = None,
               list_jobs: bool = False, **options: Any) -> None:
        if list_jobs:
            for name, (description, _run) in JOBS.items():
                self.stdout.write(f"{name:8} {description}")
            return
        if job is None:
            raise CommandError(f"name a job: {', '.join(JOBS)} (--list describes them)")
        if job not in JOBS:
            raise CommandError(f"unknown job {job!r}: the jobs are {', '.join(JOBS)} (--list describes them)")
        broker = runtime.broker()
        known = broker.destinations()
        if destination is not None:
            try:
                uri = parse_destination(destination).uri
            except BrokerError as exc:
                raise CommandError(f"invalid destination {destination!r}: {exc.message}") from None
            if uri not in known:
                raise CommandError(f"no destination {uri} in namespace {settings.SIGNALBOX_NAMESPACE!r} "
                                   "(GET /api/v1/destinations lists them)")
            targets = [uri]
        else:
            targets = sorted(known)
        run = JOBS[job][1]
        for uri in targets:
            result = run(broker, uri)
            plain = dataclasses.asdict(result) if dataclasses.is_dataclass(result) else result
            self.stdout.write(f"{uri} {job}: {json.dumps(plain, sort_keys=True)}")
        if not targets:
            self.stdout.write(f"no destinations in namespace {settings.SIGNALBOX_NAMESPACE!r}: nothing to do")
