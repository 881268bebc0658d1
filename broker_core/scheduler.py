"""ActiveMQ's scheduler management by message: a SEND to `ActiveMQ.Scheduler.Management` whose
`AMQ_SCHEDULER_ACTION` is BROWSE, REMOVE or REMOVEALL acts on the scheduled jobs (delayed and repeating
messages not yet due) instead of being delivered. This module reads such a message into a request and
makes the messages a BROWSE sends; AsyncBroker.manage_scheduler carries it out (docs/broker_core.md
"Scheduler management")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from .destinations import Destination, parse_destination
from .errors import InvalidDestination, InvalidMessage
from .messages import SCHEDULED_JOB_ID, Delivery, Message, PropertyValue, TypedValue

# ActiveMQ's ScheduledMessage names. SchedulerBroker takes any destination, queue or topic, whose name
# starts with MANAGEMENT_NAME in any case (`regionMatches(true, …)`), so `…Management.x` is one too.
MANAGEMENT_NAME = "ActiveMQ.Scheduler.Management"
ACTION = "AMQ_SCHEDULER_ACTION"
START_TIME = "ACTION_START_TIME"
END_TIME = "ACTION_END_TIME"
ACTIONS = ("BROWSE", "REMOVE", "REMOVEALL")
# What a job's destination needs for each action: to see its jobs, the right to read it (a browse of
# it); to cancel them, the right to administer it (remove_message's).
NEEDS: dict[str, Literal["read", "admin"]] = {"BROWSE": "read", "REMOVE": "admin", "REMOVEALL": "admin"}
# The bodies a BROWSE sends to its reply-to in one send at most (at least one message): a page of jobs
# holds up to browse's byte budget (512 KiB), and storing that much in one call held Redis over 20 ms
# (bench/scheduler_management.py --body 20000: the send's HSET into a growing hash).
REPLY_SEND_BYTES = 128 * 1024


_PREFIX = MANAGEMENT_NAME.lower()


def is_management(dest: Destination) -> bool:
    # (asked of every SEND: the first letter turns almost every other name away before any lowering)
    name = dest.name
    return name[:1] in "aA" and name[:len(_PREFIX)].lower() == _PREFIX


@dataclass(frozen=True)
class SchedulerRequest:
    """One management message, checked: the action, the job a REMOVE names, the due times a BROWSE or
    REMOVEALL is limited to (both or neither, inclusive), where a BROWSE sends the jobs."""

    action: Literal["BROWSE", "REMOVE", "REMOVEALL"]
    job_id: str | None = None
    start: int | None = None
    end: int | None = None
    reply_to: Destination | None = None


def _text(value: PropertyValue | None) -> str | None:
    if isinstance(value, TypedValue):
        value = value.value
    return None if value is None else str(value)


def _time(message: Message, name: str) -> int | None:
    text = _text(message.properties.get(name))
    if text is None:
        return None
    # As ActiveMQ's Long.valueOf: a sign and decimal digits (any script's, as Java's Character.digit), no
    # spaces or digit separators (which Python's int would take), within a long.
    value = None
    if "_" not in text and text == text.strip():
        with contextlib.suppress(ValueError):
            value = int(text)
    if value is None or not -(2**63) <= value < 2**63:
        raise InvalidMessage(f"{name} must be a time in ms since the epoch, got {text[:64]!r}", field=name)
    return value


def scheduler_request(message: Message) -> SchedulerRequest:
    """The management message as a request. Raises InvalidMessage naming what is wrong (nothing has
    changed then). ActiveMQ ignores such a message silently; an error the sender can act on is better."""
    action = _text(message.properties.get(ACTION))
    if action is None:
        raise InvalidMessage(f"a message to {MANAGEMENT_NAME} needs {ACTION}: one of {', '.join(ACTIONS)}",
                             field=ACTION)
    if action not in ACTIONS:  # (ActiveMQ compares exactly: `browse` is no action)
        raise InvalidMessage(f"{ACTION} must be one of {', '.join(ACTIONS)}, got {action[:64]!r}",
                             field=ACTION)
    start, end = _time(message, START_TIME), _time(message, END_TIME)
    if action != "REMOVE" and (start is None) != (end is None):
        # ActiveMQ would act on every job then: a REMOVEALL meant for a time range would empty the store
        given, missing = (START_TIME, END_TIME) if start is not None else (END_TIME, START_TIME)
        raise InvalidMessage(f"{given} needs {missing}: a time range has both ends", field=missing)
    job_id = _text(message.properties.get(SCHEDULED_JOB_ID))
    if action == "REMOVE" and not job_id:
        raise InvalidMessage(f"REMOVE needs {SCHEDULED_JOB_ID}: the id of the job to remove (a BROWSE "
                             "gives each job's)", field=SCHEDULED_JOB_ID)
    reply_to = None
    if action == "BROWSE":
        if message.reply_to is None:
            raise InvalidMessage("BROWSE needs reply-to: the destination the scheduled messages are sent to",
                                 field="reply_to")
        reply_to = parse_destination(message.reply_to)
    return SchedulerRequest(action, job_id if action == "REMOVE" else None,  # type: ignore[arg-type]
                            start, end, reply_to)


def is_management_send(destinations: list[Destination]) -> bool:
    """Does a SEND to `destinations` go to the scheduler's management destination (asked of every SEND)?"""
    return any(is_management(dest) for dest in destinations)


def scheduler_requests(destinations: list[Destination], messages: list[Message]) -> list[SchedulerRequest]:
    """A batch sent to the management destination, each message read into its request before any acts
    (a bad one changes nothing): what every adapter hands AsyncBroker.manage_scheduler. Raises
    InvalidDestination for the management destination inside a composite, InvalidMessage naming what is
    wrong with a message."""
    if len(destinations) > 1:
        raise InvalidDestination(f"{MANAGEMENT_NAME} takes a message of its own, not a part of a composite "
                                 "destination")
    return [scheduler_request(message) for message in messages]


class BrowsedJob(Message):
    """A BROWSE's message for one job (`browsed_job`): its AMQ_SCHEDULED_* properties show the job's
    schedule and schedule nothing themselves, as SchedulerBroker's sendScheduledJob sends them past its own
    scheduling (Message.pack reads them as a schedule from any other message)."""

    def _schedule_from_properties(self) -> None:
        return None


def browsed_job(delivery: Delivery, schedule: tuple[int | None, int | None, int, str | None]) -> Message:
    """The message a BROWSE sends for one job, as SchedulerBroker's sendScheduledJob: the message as sent,
    with its schedule (the AMQ_SCHEDULED_* it was sent with, messages.schedule_of: a delay or period given
    as 0 shows as 0, one not given not at all; a repeating job's full repeat, not what is left), its
    destination as original destination, `scheduledJobId` (which the job's delivery carries:
    messages.unpack_delivery), type `Advisory`, a new id, not persistent."""
    delay, period, repeat, cron = schedule
    properties: dict[str, PropertyValue] = dict(delivery.properties)
    for name, given in (("AMQ_SCHEDULED_DELAY", delay), ("AMQ_SCHEDULED_PERIOD", period)):
        if given is not None:
            properties[name] = TypedValue("long", given)
    if repeat:
        properties["AMQ_SCHEDULED_REPEAT"] = repeat
    if cron is not None:
        properties["AMQ_SCHEDULED_CRON"] = cron
    return BrowsedJob(delivery.body, delivery.content_type, delivery.priority, False, delivery.timestamp,
                   delivery.expiration, delivery.correlation_id, delivery.reply_to, "Advisory", properties,
                   delivery.group_id, delivery.group_seq, original_destination=delivery.destination)


def in_sends(messages: list[Message]) -> Iterator[list[Message]]:
    """`messages` in consecutive sends of at most REPLY_SEND_BYTES of bodies each (at least one message)."""
    batch: list[Message] = []
    size = 0
    for message in messages:
        length = len(message.body)
        if batch and size + length > REPLY_SEND_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(message)
        size += length
    if batch:
        yield batch
