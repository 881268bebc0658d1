"""AMQ_SCHEDULED_CRON: the expression read at the send (broker_core/cron.py) and the next time the scripts
compute from it (scripts/lua/includes/cron.lua, run by the real Redis), against a minute-by-minute search in
Python's own calendar."""

from __future__ import annotations

import datetime
import random

import pytest

from broker_core.cron import parse
from broker_core.errors import InvalidMessage
from broker_core.scripts.library import SCRIPT_DIR

UTC = datetime.UTC
_CRON_LUA = (SCRIPT_DIR / "includes" / "cron.lua").read_text()
# One EVAL answers many questions: ARGV is the packed forms and times, the reply their next times (-1: none).
_ASK = _CRON_LUA + """
local out = {}
for i = 1, #ARGV, 2 do
  local next_time = cron.next(cmsgpack.unpack(ARGV[i]), tonumber(ARGV[i + 1]))
  out[#out + 1] = next_time and string.format('%d', next_time) or '-1'
end
return out
"""


def lua_next(redis_client, questions: list[tuple[list[object], int]]) -> list[int | None]:
    import msgpack

    argv: list[object] = []
    for form, after in questions:
        argv += [msgpack.packb(form), after]
    replies = redis_client.eval(_ASK, 0, *argv)
    return [None if r == b"-1" else int(r) for r in replies]


def brute_next(expression: str, after_ms: int, limit_days: int) -> int | None:
    """The first minute after `after_ms` that the expression matches, minute by minute on each matching day
    (cron's rules read from the text: `x/n` are x's values that are multiples of n, as ActiveMQ's; both day
    fields restricted: either)."""
    fields = expression.split()
    ranges = ((0, 60), (0, 24), (1, 32), (1, 12), (0, 6))
    sets = []
    for token, (low, high) in zip(fields, ranges, strict=True):
        sets.append(_values(token, low, high))
    minutes, hours, days, months, weekdays = sets
    restricted = [fields[i] not in ("*", "?") for i in (2, 4)]
    # day by day (a day that does not match is passed whole), then minute by minute on one that does
    start = datetime.datetime.fromtimestamp(after_ms / 1000, UTC).replace(second=0, microsecond=0)
    start += datetime.timedelta(minutes=1)
    day = start.replace(hour=0, minute=0)
    for _ in range(limit_days):
        in_month, in_week = day.day in days, (day.isoweekday() % 7) in weekdays
        day_ok = (in_month or in_week) if all(restricted) else (in_month and in_week)
        if day.month in months and day_ok:
            t = max(day, start)
            while t.date() == day.date():
                if t.minute in minutes and t.hour in hours:
                    return int(t.timestamp() * 1000)
                t += datetime.timedelta(minutes=1)
        day += datetime.timedelta(days=1)
    return None


def _values(token: str, low: int, high: int) -> set[int]:
    if token in ("*", "?"):
        return set(range(low, high + 1))
    if "/" in token:
        x, n = token.split("/", 1)
        return {v for v in _values(x, low, high) if v % int(n) == 0}
    if "," in token:
        return set().union(*(_values(p, low, high) for p in token.split(",") if p))
    if "-" in token:
        a, b = token.split("-")
        return set(range(int(a), int(b) + 1))
    return {int(token)}


def _random_field(rng: random.Random, low: int, high: int) -> str:
    kind = rng.random()
    if kind < 0.3:
        return "*"
    if kind < 0.45:
        return f"*/{rng.randint(1, high // 2 + 1)}"
    if kind < 0.6:
        a = rng.randint(low, high)
        return f"{a}-{rng.randint(a, high)}"
    if kind < 0.8:
        return ",".join(str(rng.randint(low, high)) for _ in range(rng.randint(1, 4)))
    if kind < 0.9:
        a = rng.randint(low, high)
        return f"{a}-{rng.randint(a, high)}/{rng.randint(1, 5)}"
    return str(rng.randint(low, high))


def test_the_next_time_in_lua_matches_a_minute_by_minute_search(redis_client):
    rng = random.Random(20261129)
    ranges = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))
    cases: list[tuple[str, list[object], int]] = []
    while len(cases) < 1000:
        expression = " ".join(_random_field(rng, low, high) for low, high in ranges)
        try:
            form = parse(expression)
        except InvalidMessage:
            continue  # (a step that leaves no value, a date no month has: refused at the send)
        # from 1970 to 2200, and around the ends of months, years and leap days
        after = rng.choice([rng.randint(0, 7_258_118_400_000),
                            int(datetime.datetime(rng.choice([2024, 2100, 2096, 2399]), rng.choice([2, 12]),
                                                  28, 23, 59, 59, tzinfo=UTC).timestamp() * 1000)
                            + rng.randint(0, 3 * 86_400_000)])
        cases.append((expression, form, after))
    got = lua_next(redis_client, [(form, after) for _e, form, after in cases])
    # a year of minutes covers every case here: the rare dates (29 February) get their own test below
    for (expression, _form, after), lua in zip(cases, got, strict=True):
        expected = brute_next(expression, after, 367)
        if expected is None:  # (further than the brute search looks: Lua's must be later still)
            assert lua is not None and lua > after + 366 * 86_400_000, expression
        else:
            assert lua == expected, (expression, after)


@pytest.mark.parametrize(("expression", "after", "expected"), [
    # 29 February: 2100 is not a leap year, so from 2096 the next is 2104
    ("0 0 29 2 *", "2096-03-01T00:00", "2104-02-29T00:00"),
    ("0 0 29 2 *", "2023-06-01T12:00", "2024-02-29T00:00"),
    # strictly after: the minute itself is not next
    ("30 9 * * *", "2026-01-01T09:30", "2026-01-02T09:30"),
    ("* * * * *", "2026-01-01T09:30:59.999", "2026-01-01T09:31"),
    # both day fields restricted: either (the 13th, or a Friday: 2026-11-29 is a Sunday)
    ("0 0 13 * 5", "2026-11-29T21:09", "2026-12-04T00:00"),
    # day of week alone: Mondays
    ("0 0 * * 1", "2026-11-29T21:09", "2026-11-30T00:00"),
    # ActiveMQ's steps: multiples (day of month */5: the 5th, 10th, ...)
    ("0 12 */5 * *", "2026-01-01T00:00", "2026-01-05T12:00"),
    ("*/15 9 * * *", "2026-11-29T21:08", "2026-11-30T09:00"),
    # a day-of-month step is restricted: the 29th or a Monday (Vixie's rule would want a Monday 29 February)
    ("0 0 */29 2 1", "2026-03-01T00:00", "2027-02-01T00:00"),
    # the 31st: months that have one
    ("0 0 31 * *", "2026-04-01T00:00", "2026-05-31T00:00"),
])
def test_known_next_times(redis_client, expression, after, expected):
    def ms(text: str) -> int:
        return int(datetime.datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)

    assert lua_next(redis_client, [(parse(expression), ms(after))]) == [ms(expected)]


@pytest.mark.parametrize(("expression", "says"), [
    ("", "0 fields, not 5"),
    ("* * * *", "4 fields, not 5"),
    ("* * * * * *", "6 fields, not 5"),
    ("abc * * * *", "the minute field: 'abc' is not a number"),
    ("* * * JAN *", "the month field: 'JAN' is not a number"),
    ("* * * * MON", "the day of week field: 'MON' is not a number"),
    ("61 * * * *", "the minute field '61' is outside 0-60"),
    ("* 25 * * *", "the hour field '25' is outside 0-24"),
    ("* * 0 * *", "the day of month field '0' is outside 1-32"),
    ("* * * 13 *", "the month field '13' is outside 1-12"),
    ("* * * * 7", "the day of week field '7' is outside 0-6"),
    ("3/5 * * * *", "the minute field '3/5' names no value"),
    ("*/0 * * * *", "a step of 0"),
    ("5-1 * * * *", "the minute field '5-1' names no value"),
    ("0-99 * * * *", "'0-99' goes past 60"),
    ("60 * * * *", "names no minute any time has (0-59)"),
    ("0 0 32 * *", "names no day of month any time has (1-31)"),
    ("0 0 30 2 *", "no date has both its day of month and its month"),
    ("0 0 31 4,6,9,11 *", "no date has both its day of month and its month"),
    ("1 " * 200 + "x", "longer than 256 characters (MAX_CRON_LENGTH)"),
    ("1234567890 * * * *", "is not a number"),
])
def test_invalid_expressions_are_refused_naming_the_header_and_the_fault(expression, says):
    with pytest.raises(InvalidMessage, match="AMQ_SCHEDULED_CRON") as raised:
        parse(expression)
    assert says in str(raised.value)
    assert raised.value.details == {"field": "cron"}


@pytest.mark.parametrize("expression", [
    "? * * * *", "1,,2 * * * *", "0-60/30 * * * *", "*/61 * * * *", "0 0 29 2 *", "0 0 30 2 1", " * * * * * ",
])
def test_what_activemq_accepts_is_accepted(expression):
    parse(expression)  # (ActiveMQ 5.17.2 gave a RECEIPT for each: /tmp probes, docs/broker_core.md)
