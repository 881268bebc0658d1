"""The analytics time range as docs/analytics.md gives it: `--since -6h` (argparse took -6h for an option),
-30m / -2d, ISO 8601 and epoch ms; a bad value is refused naming the option and the value, an empty range
naming both ends as dates. No Spark: every refusal happens before a session starts."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from analytics.pipeline import RangeError, attach_time_values, iso, parse_time
from analytics.tasks import time_range

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_795_000_000_000  # 2026-11-18T...Z, any fixed moment


@pytest.mark.parametrize(("text", "back_ms"), [
    ("-30m", 30 * 60_000), ("-6h", 6 * 3_600_000), ("-2d", 2 * 86_400_000), ("-0m", 0),
    (" -24h ", 86_400_000)])
def test_relative_times_count_back_from_now(text, back_ms):
    assert parse_time(text, name="since", now_ms=NOW) == NOW - back_ms


def test_absolute_times_are_iso_8601_in_utc_unless_offset_or_epoch_ms():
    assert parse_time("2026-11-21", name="since") == 1_795_219_200_000
    assert parse_time("2026-11-21T10:00", name="since") == 1_795_219_200_000 + 10 * 3_600_000
    assert parse_time("2026-11-21T10:00+01:00", name="since") == 1_795_219_200_000 + 9 * 3_600_000
    assert parse_time("1795219200000", name="until") == 1_795_219_200_000
    assert iso(1_795_219_200_000 + 10 * 3_600_000) == "2026-11-21T10:00:00Z"


@pytest.mark.parametrize(("text", "says"), [
    ("-6x", "--since '-6x' is not a relative time: use -30m, -6h or -2d"),
    ("-h", "--since '-h' is not a relative time"),
    ("-1.5h", "--since '-1.5h' is not a relative time"),
    ("6h", "--since '6h' is not a date/time: use ISO 8601"),
    ("yesterday", "--since 'yesterday' is not a date/time"),
    ("-99999999d", "--since '-99999999d' reaches before 1970-01-01"),
    ("", "--since is empty"),
])
def test_a_bad_time_is_refused_naming_the_option_and_the_value(text, says):
    with pytest.raises(RangeError) as caught:
        parse_time(text, name="since", now_ms=NOW)
    assert str(caught.value).startswith(says)


def test_a_value_after_since_or_until_is_attached_so_argparse_does_not_take_it_for_an_option():
    assert attach_time_values(["--since", "-6h", "--until", "-1h", "--no-archive"]) == [
        "--since=-6h", "--until=-1h", "--no-archive"]
    # Anything else is left as it was: plain values, option names, a missing value (argparse's error).
    kept = ["--since", "2026-11-21", "--destination", "-q", "--since", "--no-archive"]
    assert attach_time_values(kept) == kept
    assert attach_time_values(["--since"]) == ["--since"]
    assert attach_time_values(None) is None


def test_the_range_counts_both_ends_from_one_now_and_refuses_an_empty_one_with_dates():
    since, until = time_range("-6h", "-1h")
    assert until - since == 5 * 3_600_000 and abs(until - (time.time() * 1000 - 3_600_000)) < 60_000
    with pytest.raises(RangeError, match=r"--until \(2026-11-21T00:00:00Z\) must be after --since "
                                         r"\(2026-11-22T00:00:00Z\)"):
        time_range("2026-11-22", "2026-11-21")


def test_the_command_takes_since_minus_6h_and_names_a_bad_value():
    # -1h..-6h is an empty range: refused after parsing, which shows --since -6h got through argparse.
    with pytest.raises(CommandError, match=r"--until \(.*Z\) must be after --since \(.*Z\)"):
        call_command("signalbox_analytics", "--since", "-1h", "--until", "-6h", "--no-archive")
    with pytest.raises(CommandError, match="--since '-6x' is not a relative time"):
        call_command("signalbox_analytics", "--since", "-6x", "--no-archive")


def run_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "signalbox_analytics", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_real_command_line_takes_relative_times_and_names_a_bad_one():
    bad = run_command("--since", "-6x", "--no-archive")
    assert bad.returncode == 1 and "--since '-6x' is not a relative time: use -30m, -6h or -2d" in bad.stderr
    empty = run_command("--since", "-30m", "--until", "-2d", "--no-archive")
    assert empty.returncode == 1 and "must be after --since" in empty.stderr


def run_pipeline_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "analytics/pipeline.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_spark_submit_entry_point_takes_relative_times_and_names_a_bad_one():
    bad = run_pipeline_script("--since", "-6x")
    assert bad.returncode == 2 and "--since '-6x' is not a relative time" in bad.stderr
    empty = run_pipeline_script("--since", "-1h", "--until", "-2h")
    assert empty.returncode == 2 and "must be after --since" in empty.stderr
