"""Option types the commands share: durations (`30s`, `5m`, `1500` ms) and message properties."""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

import click

UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
MAX_MILLIS = 2 ** 53  # the API's largest duration (a JSON number every client reads exactly)


class Millis(click.ParamType):
    """A duration in ms: a plain number is ms; `250ms`, `30s`, `5m`, `2h`, `1d` are converted. With bounds
    (as written, e.g. "1s" and "1h"), one outside them is a usage error naming the option, before any call."""

    name = "duration"

    def __init__(self, least: str | None = None, most: str | None = None) -> None:
        self.least, self.most = least, most

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        ms = self._millis(value, param, ctx)
        if self.least is not None and self.most is not None:
            if not self._millis(self.least, param, ctx) <= ms <= self._millis(self.most, param, ctx):
                self.fail(f"{value!r} is not between {self.least} and {self.most}", param, ctx)
        elif ms > MAX_MILLIS:
            self.fail(f"{value!r} is too long (at most {MAX_MILLIS} ms)", param, ctx)
        if 0 < ms < 1:  # it would go as 0, which for a time to live means "never expires"
            self.fail(f"{value!r} is above 0 but under 1 ms: give 0 or at least 1 ms", param, ctx)
        return int(ms)

    def _millis(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Decimal:
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", str(value).lower())
        if not found:
            self.fail(f"{value!r} is not a duration: give ms, or a number with ms, s, m, h or d", param, ctx)
        # Decimal, not float: 400 digits would be infinity, which no int holds
        return Decimal(found[1]) * UNITS[found[2] or "ms"]


MILLIS = Millis()
# a leased consumer's lease: the API's bounds (`lease_ms`, 1000..3600000)
LEASE = Millis("1s", "1h")


class Property(click.ParamType):
    """`NAME=VALUE` is a string property; `NAME:=JSON` gives a number, a boolean or a typed value
    (`n:=3`, `ok:=true`, `big:='{"type": "long", "value": 5}'`)."""

    name = "name=value"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[str, Any]:
        if isinstance(value, tuple):
            return value
        name, sep, text = str(value).partition("=")
        if not sep or not name or name == ":":
            self.fail(f"{value!r}: a property is NAME=VALUE (a string) or NAME:=JSON", param, ctx)
        if not name.endswith(":"):
            return name, text
        try:
            parsed = json.loads(text, parse_constant=_no_constant)
            if not _finite(parsed):  # (1e400 is read as infinity; JSON has no such number to send)
                raise NotFinite
        except NotFinite:
            self.fail(f"{value!r}: not a finite number (JSON has no NaN or Infinity)", param, ctx)
        except ValueError:
            self.fail(f"{value!r}: after := comes JSON (a number, true, false or an object)", param, ctx)
        return name[:-1], parsed


class NotFinite(ValueError):
    """NaN, Infinity or a number past a double's range in a property's JSON."""


def _no_constant(name: str) -> Any:
    """NaN and Infinity, which Python's JSON reader takes and JSON does not: refused, as JSON refuses them."""
    raise NotFinite


def _finite(value: Any) -> bool:
    """No float in the value (a number, or a typed value's `value`) is infinite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


PROPERTY = Property()


class Seconds(click.FloatRange):
    """Seconds, at least `least` (`above`: more than it), and finite: click's FloatRange takes `nan`
    (no comparison refuses it) and `inf`, which the HTTP client and `time.sleep` end in a traceback on."""

    name = "seconds"

    def __init__(self, least: float, above: bool = False) -> None:
        super().__init__(min=least, min_open=above)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return seconds


class WatchSeconds(Seconds):
    """--watch's optional SECONDS (at least 0.2): what follows --watch is taken as its value, so a
    destination written after it is named in the error."""

    def __init__(self) -> None:
        super().__init__(0.2)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds (a destination goes before --watch: "
                      f"stat {value} --watch)", param, ctx)
        return super().convert(value, param, ctx)


WATCH_SECONDS = WatchSeconds()
