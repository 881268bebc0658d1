"""Messages: what a producer sends, what a consumer receives, and their packed form in Redis.

A message is stored once, as one msgpack array (the layout below, mirrored by
scripts/lua/includes/message.lua), in its destination's `msgs` hash. Headers follow JMS: priority 0-9
(default 4), persistent flag, timestamp, expiration (absolute ms, 0 = never), correlation id, reply-to,
type, group id and sequence, plus typed user properties.
"""

from __future__ import annotations

import base64
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

import msgpack

from .cron import parse as parse_cron
from .errors import InvalidMessage

FORMAT_VERSION = 1
RECORD_LENGTH = 21  # fields of the packed array (scripts/lua/includes/message.lua names them)
# The 21st, a cron schedule's compact form (broker_core/cron.py), is packed only when the message has one.
CRON = 20
# An optional 22nd field, only on the copy a wildcard topic subscription receives: the topic the message
# was published to, which its consumers see as its destination (topics.wildcard_copy; `published_to`).
PUBLISHED_TO = RECORD_LENGTH
# The 23rd field, always the last (the two before it nil when the message has neither): when the message
# last reached a destination, ms. ActiveMQ's brokerInTime, which RegionBroker.send sets on every send (a
# producer's, the scheduler's firing, a dead letter's, a move's) and its destinations' enqueue time
# (AverageEnqueueTime, Min/MaxEnqueueTime) measures each dispatch from. Set when a send is packed (`arrive`),
# by a dead letter's and a moved message's copy, and by a scheduled message's firing
# (scripts/lua/includes/message.lua restamp); a virtual destination's or a wildcard subscription's copy keeps
# it (ActiveMQ's interceptors pass the message on, not through a send). A time after 1970-02-19 packs as
# msgpack's uint64 (0xcf and 8 bytes), which message.lua `arrived` reads off the end of the record without
# decoding it. Records stored before it have no 23rd field: their dispatches are not timed.
ARRIVED = PUBLISHED_TO + 1
DEFAULT_PRIORITY = 4


def jms_priority(value: int) -> int:
    """A priority given as a Java int, as ActiveMQ makes it (a STOMP SEND's priority header, the REST
    servlet's JMSPriority): ActiveMQMessage's (byte) cast (which wraps: 130 is -126), then
    Message.setPriority's clamp to 0..9. So 15 is 9 and -1 is 0, delivered with that priority and
    dispatched in that place, not refused."""
    return min(max((value + 128) % 256 - 128, 0), 9)


MAX_PROPERTY_NAME = 256
MAX_MESSAGE_ID = 256
_ID_FORBIDDEN = re.compile(r"[\s|#]")  # whitespace (as str.isspace), '|' and '#'
MAX_DELAY_MS = 366 * 24 * 3600 * 1000  # a year and a day
# A delay or a period the producer gave as 0, as the record stores it (fields 18 and 19 of
# scripts/lua/includes/message.lua, which names it too). ActiveMQ's SchedulerBroker makes a scheduler job of
# every message sent with an AMQ_SCHEDULED_DELAY or AMQ_SCHEDULED_PERIOD property, whatever its value:
# given as 0 the message is still a job, due now (delivered at once, once, with scheduledJobId). A 0 stored
# there keeps meaning "none given", as in every record stored before, so that a stored message moved or
# dead-lettered is not made a job.
GIVEN_ZERO = -1
# The properties a JMS producer schedules a message with (ActiveMQ's ScheduledMessage), and the Message
# fields of the same meaning: SchedulerBroker reads only the properties, so a producer that can set nothing
# else (ActiveMQ's REST servlet makes every parameter a string property) schedules with them.
# `Message.pack` moves them into the fields (`_schedule_from_properties`).
SCHEDULE_PROPERTIES = {"AMQ_SCHEDULED_DELAY": "delay_ms", "AMQ_SCHEDULED_PERIOD": "period_ms",
                       "AMQ_SCHEDULED_REPEAT": "repeat", "AMQ_SCHEDULED_CRON": "cron"}
_SCHEDULE_NAMES = frozenset(SCHEDULE_PROPERTIES)
_JAVA_LONG = re.compile(r"[+-]?[0-9]{1,19}")  # what Long.valueOf reads (ASCII digits, an optional sign)
MAX_REPEAT = 1_000_000
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

PropertyType = Literal["string", "boolean", "int", "long", "double"]
_TYPE_CODES: dict[str, str] = {"string": "s", "boolean": "b", "int": "i", "long": "l", "double": "d"}
_CODE_TYPES = {code: name for name, code in _TYPE_CODES.items()}


@dataclass(frozen=True)
class TypedValue:
    """A property value with an explicit JMS type, e.g. TypedValue("long", 5)."""

    type: PropertyType
    value: str | bool | int | float


PropertyValue = str | bool | int | float | TypedValue


# The random half of message ids: a generator of this module's own (seeded from the system's entropy, and
# again in a forked child), so an application seeding `random` cannot make two processes' ids collide, and
# an id costs no system call (os.urandom's getrandom() is one, dear on a virtual machine).
_ID_BITS = random.Random()

# Ids sort, as bytes, in the order this process makes them: the parked set (a zset scored by due time)
# breaks ties by member, the id, so jobs due in the same millisecond come back in send order, as
# ActiveMQ's scheduler keeps them (docs/broker_core.md "Scheduled delivery"). An id is the millisecond it
# was made (never less than the last one's: a clock stepping back does not reorder) and a 48-bit count
# within it that starts at a random value below 2**47 (the uniqueness across processes the random half
# gave) and goes up by one per id. The 64 characters are url-safe base64's, in byte order.
_ID_ALPHABET = b"-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"
_ID_SORTED = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
                             _ID_ALPHABET)
_ID_COUNT_MOST = (1 << 48) - 1
_ID_LOCK = threading.Lock()
_ID_LAST = [-1, 0]  # the last id's millisecond and count


def _forked() -> None:
    """A forked child starts its own count (its parent's next ids would be the same), with a lock of its
    own (another thread of the parent may have held it at the fork)."""
    global _ID_LOCK
    _ID_BITS.seed()
    _ID_LAST[:] = [-1, 0]
    _ID_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forked)


# msgpack.packb makes a Packer, and its buffer, on every call; a send packs with this thread's own instead
# (a Packer is not thread safe). Its buffer grows to hold what it packs and stays so: one that packed a
# message larger than the buffer it started with is dropped.
_PACKERS = threading.local()
PACKER_BUFFER = 256 * 1024


BODY_FIELD = 14  # the body's place in the packed array (`Message.pack`; message.lua message.BODY, from 1)
# A packed message shorter than this goes to a check whole: cutting its body out saves Redis less than
# the cut costs here.
WITHOUT_BODY_FROM = 1024


def without_body(packed: bytes) -> bytes:
    """The packed message with an empty body, every other field as it was: what a call that only checks a
    message's limits needs (its size goes beside it: send.lua, origin 'check'), so a transaction's commit
    does not carry each body twice in its one MULTI/EXEC, once to check and once to store."""
    if len(packed) < WITHOUT_BODY_FROM:
        return packed
    unpacker = msgpack.Unpacker(raw=True)
    unpacker.feed(packed)
    if unpacker.read_array_header() <= BODY_FIELD:
        return packed
    for _ in range(BODY_FIELD):
        unpacker.skip()
    start = unpacker.tell()
    unpacker.skip()
    return packed[:start] + b"\xa0" + packed[unpacker.tell():]  # (0xa0: msgpack's empty string)


def arrive(record: list[object], now_ms: int) -> None:
    """Make `now_ms` the time the message (its record, as unpacked) reached its destination: ARRIVED."""
    record += [None] * (ARRIVED - len(record))
    del record[ARRIVED:]
    record.append(now_ms)


def _pack_record(record: list[object]) -> bytes:
    packer = getattr(_PACKERS, "packer", None)
    if packer is None:
        # Redis's cmsgpack knows no bin type: bytes travel as msgpack raw strings, `body kind` says which.
        packer = _PACKERS.packer = msgpack.Packer(use_bin_type=False, buf_size=PACKER_BUFFER)
    packed = packer.pack(record)
    if len(packed) > PACKER_BUFFER:
        _PACKERS.packer = None
    return packed


def new_message_id() -> str:
    """A unique id that sorts after every id this process made before: 'ID:' + 16 url-safe characters
    (48-bit ms, 48-bit count within it; see _ID_ALPHABET)."""
    now = time.time_ns() // 1_000_000
    with _ID_LOCK:
        ms, count = _ID_LAST
        if now > ms:
            ms, count = now, _ID_BITS.getrandbits(47)
        elif count < _ID_COUNT_MOST:
            count += 1
        else:  # (2**47 ids in one millisecond: on into the next)
            ms, count = ms + 1, _ID_BITS.getrandbits(47)
        _ID_LAST[0], _ID_LAST[1] = ms, count
    raw = (ms << 48 | count).to_bytes(12, "big")
    return "ID:" + base64.urlsafe_b64encode(raw).translate(_ID_SORTED).decode()


def _typed(name: str, value: PropertyValue) -> tuple[str, str | bool | int | float]:
    """Validate one property and give its type code and value."""
    if isinstance(value, TypedValue):
        kind, raw = value.type, value.value
        if kind not in _TYPE_CODES:
            raise InvalidMessage(f"property {name!r} has unknown type {kind!r}", property=name)
        ok = {
            "string": isinstance(raw, str),
            "boolean": isinstance(raw, bool),
            "int": isinstance(raw, int) and not isinstance(raw, bool) and INT_MIN <= raw <= INT_MAX,
            "long": isinstance(raw, int) and not isinstance(raw, bool) and LONG_MIN <= raw <= LONG_MAX,
            "double": isinstance(raw, int | float) and not isinstance(raw, bool),
        }[kind]
        if not ok:
            raise InvalidMessage(f"property {name!r}: {raw!r} is not a valid {kind}", property=name)
        return _TYPE_CODES[kind], float(raw) if kind == "double" else raw
    if isinstance(value, bool):
        return "b", value
    if isinstance(value, int):
        if INT_MIN <= value <= INT_MAX:
            return "i", value
        if LONG_MIN <= value <= LONG_MAX:
            return "l", value
        raise InvalidMessage(f"property {name!r}: {value} does not fit in a long", property=name)
    if isinstance(value, float):
        return "d", value
    if isinstance(value, str):
        return "s", value
    raise InvalidMessage(
        f"property {name!r} has unsupported type {type(value).__name__} "
        "(string, boolean, int, long or double)",
        property=name,
    )


@dataclass
class Message:
    """A message as a producer sends it."""

    body: str | bytes = ""
    content_type: str | None = None
    priority: int = DEFAULT_PRIORITY
    persistent: bool = True
    timestamp: int | None = None
    expiration: int = 0
    correlation_id: str | None = None
    reply_to: str | None = None
    type: str | None = None
    properties: dict[str, PropertyValue] = field(default_factory=dict)
    group_id: str | None = None
    group_seq: int = 0
    connection_id: str | None = None
    user_id: str | None = None
    message_id: str | None = None
    original_destination: str | None = None
    # AMQ_SCHEDULED_DELAY: invisible to consumers until this long after the send. None: not given. A delay
    # or a period given, 0 included, makes the message a scheduler job (ActiveMQ's SchedulerBroker.send asks
    # whether the property is there): with no delay, repeat or cron one due now, delivered at once, once,
    # with scheduledJobId. Stored as GIVEN_ZERO when 0 (`_stored_schedule`), which the scripts read
    # (scripts/lua/includes/message.lua `message.delayed`): the one place the rule is written.
    delay_ms: int | None = None
    period_ms: int | None = None  # AMQ_SCHEDULED_PERIOD: time between repeated deliveries; None: not given
    repeat: int = 0  # AMQ_SCHEDULED_REPEAT: deliveries after the first, `period_ms` apart
    cron: str | None = None  # AMQ_SCHEDULED_CRON: fires at each time it names (broker_core/cron.py)

    @property
    def body_size(self) -> int:
        """The body's bytes as stored (a text body in UTF-8)."""
        body = self.body
        return len(body) if isinstance(body, bytes) else len(body.encode("utf-8", "surrogatepass"))

    def pack(self, now_ms: int) -> tuple[str, bytes]:
        """Validate and give (message id, packed bytes). Raises InvalidMessage naming the problem. The
        AMQ_SCHEDULED_* properties are moved into the schedule's fields first (SCHEDULE_PROPERTIES)."""
        # (not a message a scheduler fired already, which carries its job's id: SchedulerBroker.send
        # schedules only a message without AMQ_SCHEDULED_ID, so a BROWSE's reply re-sent as it came is
        # delivered at once, its AMQ_SCHEDULED_* kept as properties)
        if (self.properties and not _SCHEDULE_NAMES.isdisjoint(self.properties)
                and SCHEDULED_JOB_ID not in self.properties):
            self._schedule_from_properties()
        # The usual message passes this one test (plain ints in range, no cron); anything else goes through
        # `_check`, which accepts what it always accepted (int subclasses too) and names what it refuses.
        if not (type(self.priority) is int and 0 <= self.priority <= 9
                and type(self.expiration) is int and 0 <= self.expiration <= LONG_MAX
                and type(self.group_seq) is int and INT_MIN <= self.group_seq <= INT_MAX
                and (self.delay_ms is None
                     or type(self.delay_ms) is int and 0 <= self.delay_ms <= MAX_DELAY_MS)
                and (self.period_ms is None
                     or type(self.period_ms) is int and 0 <= self.period_ms <= MAX_DELAY_MS)
                and type(self.repeat) is int and 0 <= self.repeat <= MAX_REPEAT
                and (self.period_ms or not self.repeat) and self.cron is None
                and type(self.body) in (str, bytes)):
            self._check()
        flat: list[object] = []
        for name, value in self.properties.items():
            if not isinstance(name, str) or not name or len(name) > MAX_PROPERTY_NAME:
                raise InvalidMessage(
                    f"property names must be 1-{MAX_PROPERTY_NAME} characters, got {name!r}", property=name
                )
            code, raw = _typed(name, value)
            flat += [name, code, raw]
        message_id = self.message_id
        if not message_id:
            message_id = new_message_id()  # well formed by construction: nothing to check
        elif not isinstance(message_id, str) or not 1 <= len(message_id) <= MAX_MESSAGE_ID \
                or _ID_FORBIDDEN.search(message_id):
            raise InvalidMessage(
                f"message id must be 1-{MAX_MESSAGE_ID} characters without whitespace, '|' or '#' "
                f"('#' marks deliveries of repeating scheduled messages), got {message_id!r}",
                field="message_id")
        record = [
            FORMAT_VERSION,
            self.priority,
            self.persistent,
            self.timestamp if self.timestamp is not None else now_ms,
            self.expiration,
            self.correlation_id,
            self.reply_to,
            self.type,
            self.group_id,
            self.group_seq,
            self.connection_id,
            flat or None,
            self.content_type,
            "t" if isinstance(self.body, str) else "b",
            self.body,
            self.user_id,
            self.original_destination,
            _stored_schedule(self.delay_ms),
            _stored_schedule(self.period_ms),
            self.repeat,
        ]
        if self.cron is not None:
            record.append(parse_cron(self.cron))
        arrive(record, now_ms)
        return message_id, _pack_record(record)

    def _schedule_from_properties(self) -> None:
        """Move the AMQ_SCHEDULED_* properties into the fields of the same meaning, converted as ActiveMQ's
        TypeConversionSupport does (a number, or text Long.valueOf reads; a cron expression as text), so
        that the message is scheduled, and delivered without them, as SchedulerBroker does. Raises
        InvalidMessage for a value that is no number, or a property given beside its field (before any
        change)."""
        taken: dict[str, int | str] = {}
        for name, field_name in SCHEDULE_PROPERTIES.items():
            if name not in self.properties:
                continue
            value = self.properties[name]
            raw = value.value if isinstance(value, TypedValue) else value
            # (a delay or period given as 0 is given: a job due now; no repeat is 0)
            if getattr(self, field_name) not in ((None, 0) if field_name == "repeat" else (None,)):
                raise InvalidMessage(f"property {name!r} gives the schedule's {field_name} again: give one "
                                     "of them", property=name)
            if field_name == "cron":
                if not isinstance(raw, str):
                    raise InvalidMessage(f"property {name!r} must be a cron expression (text), got {raw!r}",
                                         property=name)
                taken[field_name] = raw
            elif type(raw) is int or (isinstance(raw, str) and _JAVA_LONG.fullmatch(raw)):
                taken[field_name] = int(raw)
            else:
                raise InvalidMessage(f"property {name!r} must be an integer (ms, or a count), got {raw!r}",
                                     property=name)
        self.properties = {k: v for k, v in self.properties.items() if k not in _SCHEDULE_NAMES}
        for field_name, given in taken.items():
            setattr(self, field_name, given)

    def _check(self) -> None:
        """Every field's check, in order: InvalidMessage for the first one at fault."""
        priority = self.priority
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
            raise InvalidMessage(f"priority must be an integer 0-9, got {self.priority!r}", field="priority")
        if not isinstance(self.body, str | bytes):
            raise InvalidMessage(
                f"body must be text or bytes, got {type(self.body).__name__}", field="body"
            )
        if isinstance(self.expiration, bool) or not isinstance(self.expiration, int) or not (
                0 <= self.expiration <= LONG_MAX):
            raise InvalidMessage(f"expiration must be ms since the epoch or 0, got {self.expiration!r}",
                                 field="expiration")
        if isinstance(self.group_seq, bool) or not isinstance(self.group_seq, int):
            raise InvalidMessage(f"group sequence must be an integer, got {self.group_seq!r}",
                                 field="group_seq")
        if not INT_MIN <= self.group_seq <= INT_MAX:
            raise InvalidMessage(f"group sequence {self.group_seq} does not fit in an int", field="group_seq")
        delay = self.delay_ms
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int)
                                  or not 0 <= delay <= MAX_DELAY_MS):
            raise InvalidMessage(f"scheduled delay must be 0-{MAX_DELAY_MS} ms, got {self.delay_ms!r}",
                                 field="delay_ms")
        repeat = self.repeat
        if isinstance(repeat, bool) or not isinstance(repeat, int) or not 0 <= repeat <= MAX_REPEAT:
            raise InvalidMessage(f"scheduled repeat must be 0-{MAX_REPEAT}, got {repeat!r}", field="repeat")
        period = self.period_ms
        if period is not None and (isinstance(period, bool) or not isinstance(period, int)
                                   or not 0 <= period <= MAX_DELAY_MS):
            raise InvalidMessage(f"scheduled period must be 0-{MAX_DELAY_MS} ms, got {self.period_ms!r}",
                                 field="period_ms")
        if self.repeat and not self.period_ms:
            raise InvalidMessage("a repeated scheduled message needs a period (AMQ_SCHEDULED_PERIOD > 0)",
                                 field="period_ms")


def _stored_schedule(value: int | None) -> int:
    """A delay or period as the record stores it: 0 when not given, GIVEN_ZERO when given as 0."""
    return 0 if value is None else value or GIVEN_ZERO


def _given_schedule(stored: int | None) -> int | None:
    """`_stored_schedule` undone: the delay or period as the producer gave it, None when not given."""
    return None if not stored else 0 if stored == GIVEN_ZERO else int(stored)


@dataclass(frozen=True)
class Delivery:
    """A message as a consumer receives it."""

    message_id: str
    destination: str
    consumer_id: str
    body: str | bytes
    content_type: str | None
    priority: int
    persistent: bool
    timestamp: int
    expiration: int
    correlation_id: str | None
    reply_to: str | None
    type: str | None
    properties: dict[str, PropertyValue]
    group_id: str | None
    group_seq: int
    connection_id: str | None
    user_id: str | None
    original_destination: str | None
    redelivery_count: int
    group_first_for_consumer: bool

    @property
    def redelivered(self) -> bool:
        return self.redelivery_count > 0

    @property
    def delivery_count(self) -> int:
        """JMSXDeliveryCount: the redelivery counter plus one."""
        return self.redelivery_count + 1


def unpack_delivery(
    message_id: str, destination: str, consumer_id: str, blob: bytes, redeliveries: int, first: bool
) -> Delivery:
    # Strings decoded by msgpack itself (no Python pass over the fields); a binary body (msgpack raw like
    # the text, `body kind` 13 tells them apart) comes back byte for byte through surrogateescape.
    r = msgpack.unpackb(blob, raw=False, unicode_errors="surrogateescape")
    r += [None] * (RECORD_LENGTH - len(r))
    body, flat = r[14], r[11] or ()
    if r[13] != "t" and isinstance(body, str):
        body = body.encode("utf-8", "surrogateescape")
    props: dict[str, PropertyValue] = {}
    for i in range(0, len(flat), 3):
        name, code, raw = flat[i], flat[i + 1], flat[i + 2]
        # Keep the declared type where the Python value alone would not say it (a small long).
        props[name] = TypedValue("long", raw) if code == "l" and INT_MIN <= raw <= INT_MAX else raw
        if code == "d" and isinstance(raw, int):
            props[name] = float(raw)
    # (arrived still carrying its schedule: a delay or a period (GIVEN_ZERO too), a repeat, a cron form)
    if (r[17] or r[18] or r[19] or type(r[CRON]) is list) and SCHEDULED_JOB_ID not in props:
        props[SCHEDULED_JOB_ID] = _job_id(message_id)
    # Built without Delivery's generated __init__: a frozen dataclass sets each of its 20 fields with
    # its own object.__setattr__ call, which took about half of the client CPU of a received message.
    # The same fields, so equality, hashing, repr and immutability are Delivery's own.
    delivery = object.__new__(Delivery)
    delivery.__dict__.update(
        message_id=message_id,
        destination=published_to(r) or destination,
        consumer_id=consumer_id,
        body=body if body is not None else "",
        content_type=r[12],
        priority=r[1],
        persistent=bool(r[2]),
        timestamp=r[3],
        expiration=r[4],
        correlation_id=r[5],
        reply_to=r[6],
        type=r[7],
        properties=props,
        group_id=r[8],
        group_seq=r[9] or 0,
        connection_id=r[10],
        user_id=r[15],
        original_destination=r[16],
        redelivery_count=int(redeliveries),
        group_first_for_consumer=bool(first),
    )
    return delivery


def dead_letter_copy(blob: bytes, source: str, cause: str | None, now_ms: int,
                     expiration_ms: int = 0, message_id: str | None = None) -> bytes:
    """The copy a dead-letter queue receives (spec §5.4): the same id, `original destination` set to
    where it died, `dlqDeliveryFailureCause` (unless the cause is null, as for a STOMP NACK), no expiry
    and `originalExpiration` unless already there (or, with the strategy's expiration, that expiry and no
    `originalExpiration`: RegionBroker.sendToDeadLetterQueue), persistent (a
    non-persistent one records `originalDeliveryMode`), no scheduled delay. Redelivery counters live
    outside the message, so the copy starts at 0. `message_id`: a message that still carried its schedule
    (a delayed one that expired as it arrived) loses it here, so the copy is given SCHEDULED_JOB_ID, as
    ActiveMQ's dead letter of a fired job still carries it."""
    record = msgpack.unpackb(blob, raw=True)
    record += [None] * (RECORD_LENGTH - len(record))
    topic = published_to(record)
    if topic is not None:  # a wildcard subscription's copy died: where it was published
        source = topic.decode()
    del record[RECORD_LENGTH:]
    flat = list(record[11] or [])
    if cause is not None:  # a retried dead letter that dies again gets the new cause, once
        flat = [x for i in range(0, len(flat), 3) if flat[i] != b"dlqDeliveryFailureCause"
                for x in flat[i:i + 3]]
        flat += [b"dlqDeliveryFailureCause", b"s", cause.encode()]
    names = {flat[i] for i in range(0, len(flat), 3)}
    scheduled = record[17] or record[18] or record[19] or type(record[CRON]) is list
    if scheduled and message_id is not None and SCHEDULED_JOB_ID.encode() not in names:
        flat += [SCHEDULED_JOB_ID.encode(), b"s", _job_id(message_id).encode()]
    if expiration_ms <= 0 and b"originalExpiration" not in names:
        # (stampAsExpired: only a copy that never expires records the expiration it had)
        flat += [b"originalExpiration", b"l", record[4] or 0]
    if not record[2]:
        flat += [b"originalDeliveryMode", b"s", b"NON_PERSISTENT"]
        record[2] = True
    record[11] = flat
    record[4] = now_ms + expiration_ms if expiration_ms > 0 else 0
    record[16] = source
    record[17:RECORD_LENGTH] = [0, 0, 0, None]  # a dead letter is not scheduled
    arrive(record, now_ms)  # (a send to the dead-letter queue: its enqueue time starts again)
    return msgpack.packb(record, use_bin_type=False)


def redelivery_policy_text(policy: dict[str, str]) -> str:
    """RedeliveryPolicy.toString() as ActiveMQ's client writes it into the cause."""
    def flag(name: str) -> str:
        return "true" if policy.get(name) in ("1", "true") else "false"

    multiplier = float(policy.get("backOffMultiplier", "5.0"))
    return (
        "RedeliveryPolicy {destination = null, collisionAvoidanceFactor = 0.15, "
        f"maximumRedeliveries = {policy.get('maximumRedeliveries', '6')}, "
        f"maximumRedeliveryDelay = {policy.get('maximumRedeliveryDelay', '-1')}, "
        f"initialRedeliveryDelay = {policy.get('initialRedeliveryDelay', '1000')}, "
        f"useCollisionAvoidance = {flag('useCollisionAvoidance')}, "
        f"useExponentialBackOff = {flag('useExponentialBackOff')}, backOffMultiplier = {multiplier!r}, "
        f"redeliveryDelay = {policy.get('redeliveryDelay', '1000')}, preDispatchCheck = true}}"
    )


def failure_cause(kind: str, argument: str, policy: dict[str, str]) -> str | None:
    """dlqDeliveryFailureCause for a dead letter of this kind (spec §5.4's table)."""
    if kind == "redelivery":
        return (f"java.lang.Throwable: Delivery[{argument}] exceeds redelivery policy limit:"
                f"{redelivery_policy_text(policy)}, cause:null")
    if kind == "expired":
        return f"java.lang.Throwable: Message Expired. Expiration:{argument}"
    if kind == "evicted":  # TopicSubscription.discard in 5.17.2 (5.18 on: "Subscription discard. ID:")
        return f"java.lang.Throwable: TopicSubDiscard. ID:{argument}"
    return None  # poison: a STOMP NACK carries no cause


# The property a scheduled message arrives with: the id it was sent with, its job's (SchedulerBroker's
# scheduledJobId; `_job_id`: a firing's id `<id>#<n>` without its `#<n>`). One rule, given at two moments
# because the stored record alone must say it came from a job: a message still carrying its schedule (a
# queue's delayed message, a job's firing, a job a BROWSE reads) is stored without the property, which
# unpack_delivery adds when it is read (nothing more to store per message); a copy that loses its schedule
# (forward_copy: a topic job's firing published to its subscriptions, a virtual destination's copy of a
# firing, a move of one that arrived) would no longer say so when read, so the property is written into the
# copy. (scripts/lua/includes/message.lua `job_of` reads it back from such a copy; it sets nothing.)
SCHEDULED_JOB_ID = "scheduledJobId"


def _job_id(message_id: str) -> str:
    return message_id.split("#", 1)[0]


def published_to(record: list) -> str | bytes | None:
    """The topic a wildcard subscription's copy (a record of RECORD_LENGTH fields at least) was published
    to, None for any other message: its 22nd field, or its 21st in a copy stored before cron schedules
    took that place (there a string, where a cron form is a list), so such a copy still in Redis after an
    upgrade keeps its destination."""
    if len(record) > PUBLISHED_TO:
        return record[PUBLISHED_TO] or None
    legacy = record[CRON]
    return legacy if isinstance(legacy, (str, bytes)) and legacy else None


def schedule_of(blob: bytes) -> tuple[int | None, int | None, int, str | None]:
    """A stored message's schedule as it was sent: (delay ms, period ms, repeat, cron expression); a
    delay or period not given None (one given as 0 is 0), no repeat 0, no cron None."""
    record = msgpack.unpackb(blob, raw=False)
    record += [None] * (RECORD_LENGTH - len(record))
    cron = record[CRON][0] if type(record[CRON]) is list else None
    return _given_schedule(record[17]), _given_schedule(record[18]), int(record[19] or 0), cron


def forward_copy(blob: bytes, original: str, arrived: bool = False, message_id: str | None = None,
                 now_ms: int | None = None) -> bytes:
    """The copy a virtual destination's target receives: the message as sent, with its original
    destination set when the configuration says so (composites and virtual topics).

    A repeating (or cron) scheduled message's copies are made each time its job fires (lifecycle.lua
    fire_scheduled), never at its send, so a copy that still carries a repeat is one firing: like the
    firing ActiveMQ's scheduler re-sends (SchedulerBroker.scheduledJob), it loses its delay, period and
    repeat, so its target delivers it now and schedules nothing again. `arrived`: a copy of a message
    that has reached its destination (a move's, the NoConsumer advisory's), which a delay no longer
    concerns either: it loses any schedule. `message_id`: the copy's id; one that loses its schedule is
    given SCHEDULED_JOB_ID, as SchedulerBroker gives what it fires. `now_ms`: the copy is sent anew (a
    move, a copy, a retry: ActiveMQ re-sends it, BrokerSupport.resend), its ARRIVED then; else it keeps the
    message's."""
    record = msgpack.unpackb(blob, raw=True)
    cron = len(record) > CRON and type(record[CRON]) is list
    fired = len(record) >= CRON and bool(record[19] or cron or (arrived and (record[17] or record[18])))
    if not original and not fired and now_ms is None:
        return blob
    if now_ms is not None:
        arrive(record, now_ms)
    if original:
        record[16] = original
    if fired:
        record[17:20] = [0, 0, 0]
        if len(record) > CRON:
            record[CRON] = None
        flat = list(record[11] or [])
        if message_id is not None and SCHEDULED_JOB_ID.encode() not in flat[::3]:
            record[11] = [*flat, SCHEDULED_JOB_ID.encode(), b"s", _job_id(message_id).encode()]
    return msgpack.packb(record, use_bin_type=False)
