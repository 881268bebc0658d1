"""LIKE in the Lua evaluator: `%` any run, `_` exactly one character (UTF-8 aware), anchored, DOTALL, and
ESCAPE escaping only `_`, `%` or itself. The property test checks Lua against ActiveMQ's own construction
(a java.util.regex built from the pattern), reproduced with Python's re as the oracle."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_core.selector import evaluate_in_redis, parse_selector


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _like(redis_client, value: str, pattern: str, escape: str | None = None) -> bool | None:
    text = f"v LIKE {_quote(pattern)}" + (f" ESCAPE {_quote(escape)}" if escape is not None else "")
    return evaluate_in_redis(redis_client, parse_selector(text), {"props": {"v": value}})


def activemq_like(value: str, pattern: str, escape: str | None) -> bool:
    """ComparisonExpression.LikeExpression: the pattern as a DOTALL regex anchored at both ends."""
    regex = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        escapes_next = i + 1 < len(pattern) and pattern[i + 1] in ("_", "%", escape)
        if escape is not None and c == escape and escapes_next:
            regex.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        regex.append(".*?" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.fullmatch("".join(regex), value, re.DOTALL) is not None


@pytest.mark.parametrize(
    ("value", "pattern", "escape", "expected"),
    [
        ("red", "r%", None, True),
        ("red", "%d", None, True),
        ("red", "%e%", None, True),
        ("red", "r_d", None, True),
        ("red", "r__d", None, False),
        ("red", "re", None, False),  # anchored at both ends
        ("red", "ed", None, False),
        ("", "", None, True),
        ("", "%", None, True),
        ("", "_", None, False),
        ("x", "_%", None, True),
        ("", "_%", None, False),
        ("abcabc", "%b%b%", None, True),
        ("abcab", "%b%b_c", None, False),
        ("aXbXc", "a%b%c", None, True),
        ("abab_d", "%ab_d", None, True),
        # Characters that are special in regexes or in Lua patterns are literal.
        ("a.c", "a.c", None, True),
        ("abc", "a.c", None, False),
        ("(x)[y]^$*+?", "(x)[y]^$*+?", None, True),
        ("100% off", "100% off", None, True),
        ("a%b", "a%%b", None, True),
        ("50%", "50\\%", "\\", True),
        ("500", "50\\%", "\\", False),
        ("a_b", "a\\_b", "\\", True),
        ("axb", "a\\_b", "\\", False),
        ("a\\b", "a\\\\b", "\\", True),
        # ESCAPE escapes only _, % and itself; before anything else it is an ordinary character.
        ("a!b", "a!b", "!", True),
        ("a!!b", "a!!!!b", "!", True),
        ("a!b", "a!!b", "!", True),
        # With ESCAPE '%', '%%' is a literal percent sign but a lone '%' is still a wildcard.
        ("100%", "100%%", "%", True),
        ("1000", "100%%", "%", False),
        ("aXYZb", "a%b", "%", True),
        ("_foo", "%_%", "%", True),  # '%_' is a literal underscore, the last '%' a wildcard
        ("XD7n_", "_D7n__", "_", True),  # '_D' is a wildcard, '__' a literal underscore
        ("XD7n_", "%D7n%_", "%", True),
        ("XD7n_", "%D7n%%", "%", False),
        ("!#$&()*+,-./:;<=>?@[\\]^`{|}~", "!#$&()*+,-./:;<=>?@[\\]^`{|}~", None, True),
        # UTF-8: '_' is one character, however many bytes it takes.
        ("caf\u00e9", "caf_", None, True),
        ("caf\u00e9", "caf__", None, False),
        ("\u00e9", "_", None, True),
        ("\U0001f600", "_", None, True),
        ("\U0001f600x", "__", None, True),
        ("\u4e2d\u6587", "_\u6587", None, True),
        ("\u00e9t\u00e9", "%t_", None, True),
        ("\u00e9t\u00e9", "_t%", None, True),
        ("x\u00e9y", "%\u00e9%", None, True),
        ("x\u00e9y", "x_y", None, True),
        # DOTALL: wildcards cross newlines.
        ("a\nb", "a_b", None, True),
        ("a\nb", "a%b", None, True),
        ("line1\nline2\n", "%line2%", None, True),
        ("a\r\nb", "a__b", None, True),
        # NUL characters are ordinary.
        ("a\x00b", "a_b", None, True),
        ("a\x00b", "a\x00b", None, True),
        ("a\x00b", "%\x00%", None, True),
    ],
)
def test_like_edge_cases(redis_client, value, pattern, escape, expected):
    assert activemq_like(value, pattern, escape) is expected  # the oracle agrees with the table
    assert _like(redis_client, value, pattern, escape) is expected


def test_not_like_and_null(redis_client):
    assert evaluate_in_redis(redis_client, "v NOT LIKE 'a%'", {"props": {"v": "abc"}}) is False
    assert evaluate_in_redis(redis_client, "v NOT LIKE 'a%'", {"props": {}}) is None
    assert evaluate_in_redis(redis_client, "v LIKE '1'", {"props": {"v": 1}}) is False


_PATTERN_CHARS = st.sampled_from(
    ["a", "b", "\u00e9", "\U0001f600", "%", "_", "\n", ".", "!", "\\", "*", "\x00"]
)
_VALUE_CHARS = st.sampled_from(["a", "b", "\u00e9", "\U0001f600", "\n", ".", "!", "%", "_", "\\", "\x00"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pattern=st.lists(_PATTERN_CHARS, max_size=8).map("".join),
    value=st.lists(_VALUE_CHARS, max_size=10).map("".join),
    escape=st.sampled_from([None, "!", "\\", "%", "_", "a"]),
)
def test_like_matches_activemqs_regex_construction(redis_client, pattern, value, escape):
    assert _like(redis_client, value, pattern, escape) is activemq_like(value, pattern, escape)
