"""AMQ_SCHEDULED_CRON: a cron expression read once, at the send, into the compact form the scripts fire it by.

The grammar and the values each field accepts are ActiveMQ 5.17.2's (CronParser): five fields separated by
whitespace (minute, hour, day of month, month, day of week 0-6 with 0 Sunday); each field is `*` or `?` (every
value), a number, a range `a-b`, a list `a,b,...` of those (empty items skipped), or a step `x/n`: the values
of `x` that are multiples of n (`*/15`: 0, 15, 30, 45; `10-30/7`: 14, 21, 28; not cron's "every n from x").
No month or day names. ActiveMQ also accepts minute 60, hour 24 and day 32, which no time has: they are
accepted and ignored here, and a field left with no value any time has is refused, as is an expression no
date matches (`0 0 30 2 *`), since its job would never fire.

When it fires is cron's (Vixie cron): a minute whose minute, hour and month are in their fields and whose
day is in the day-of-month field and in the day-of-week one, or in either of them when both are restricted
(neither is `*` or `?`; Vixie cron counts `*/2` as unrestricted too, which makes dates such as a Monday
29 February possible, 28 years apart). ActiveMQ's own search for the next time does not always keep to its
expression (docs/broker_core.md, "Scheduled delivery"). Times are UTC.

The compact form (scripts/lua/includes/cron.lua reads it): [expression, then one string per field of
'0'/'1' for each value any time has (minutes 0-59, hours 0-23, days 1-31, months 1-12, weekdays 0-6), then
1 when the day matches either day field, else 0]."""

from __future__ import annotations

import re

from .errors import InvalidMessage

# Limits: the expression's length, and how long a number in it may be (both far beyond any useful one).
MAX_CRON_LENGTH = 256
MAX_CRON_NUMBER_DIGITS = 9
# (name, the lowest and highest value ActiveMQ accepts, the highest value any time has)
FIELDS = (("minute", 0, 60, 59), ("hour", 0, 24, 23), ("day of month", 1, 32, 31), ("month", 1, 12, 12),
          ("day of week", 0, 6, 6))
# The days each month can have (February: 29, in a leap year).
MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

_NUMBER = re.compile(r"[0-9]+")
_SPACE = re.compile(r"[ \t\n\r\f]+")  # java.util.StringTokenizer's default delimiters, as ActiveMQ splits


class _Refused(ValueError):
    pass


def _number(text: str, field: str) -> int:
    if not _NUMBER.fullmatch(text) or len(text) > MAX_CRON_NUMBER_DIGITS:
        raise _Refused(f"the {field} field: {text!r} is not a number")
    return int(text)


def _values(token: str, field: str, low: int, high: int) -> set[int]:
    """The values a field's token names, read in ActiveMQ's order of forms (step, then list, then range)."""
    if token in ("*", "?"):
        return set(range(low, high + 1))
    if "/" in token:
        numerator, _, denominator = token.partition("/")
        step = _number(denominator, field)
        if step == 0:
            raise _Refused(f"the {field} field: a step of 0 in {token!r}")
        return {v for v in _values(numerator, field, low, high) if v % step == 0}
    if "," in token:
        out: set[int] = set()
        for item in token.split(","):
            if item:
                out |= _values(item, field, low, high)
        return out
    if "-" in token:
        first, last = (_number(part, field) for part in token.partition("-")[::2])
        if last > high:  # (not built: a range's values are all made first, as ActiveMQ makes them)
            raise _Refused(f"the {field} field: {token!r} goes past {high}")
        return set(range(first, last + 1))
    return {_number(token, field)}


def _bits(values: set[int], first: int, last: int) -> str:
    return "".join("1" if v in values else "0" for v in range(first, last + 1))


def parse(expression: object) -> list[object]:
    """The compact form of an AMQ_SCHEDULED_CRON expression (see the module); InvalidMessage naming the
    header and what is wrong otherwise."""
    if not isinstance(expression, str):
        raise InvalidMessage("cron schedule (AMQ_SCHEDULED_CRON) must be text, "
                             f"got {type(expression).__name__}", field="cron")
    try:
        if len(expression) > MAX_CRON_LENGTH:
            raise _Refused(f"longer than {MAX_CRON_LENGTH} characters (MAX_CRON_LENGTH)")
        tokens = [t for t in _SPACE.split(expression) if t]
        if len(tokens) != len(FIELDS):
            raise _Refused(f"{len(tokens)} fields, not 5 (minute hour day-of-month month day-of-week)")
        masks: list[object] = [expression]
        for token, (field, low, high, last) in zip(tokens, FIELDS, strict=True):
            values = _values(token, field, low, high)
            if not values:
                raise _Refused(f"the {field} field {token!r} names no value")
            if min(values) < low or max(values) > high:
                raise _Refused(f"the {field} field {token!r} is outside {low}-{high}")
            if not any(v <= last for v in values):
                raise _Refused(f"the {field} field {token!r} names no {field} any time has ({low}-{last})")
            masks.append(_bits(values, low, last))
        dom_star, dow_star = (tokens[i] in ("*", "?") for i in (2, 4))
        either = not dom_star and not dow_star
        if dow_star and not _some_date(str(masks[3]), str(masks[4])):
            raise _Refused("no date has both its day of month and its month: the job would never fire")
        masks.append(1 if either else 0)
        return masks
    except _Refused as exc:
        raise InvalidMessage(f"cron schedule (AMQ_SCHEDULED_CRON) {expression!r}: {exc}",
                             field="cron") from None


def _some_date(days: str, months: str) -> bool:
    return any(months[m] == "1" and "1" in days[:MONTH_DAYS[m]] for m in range(12))
