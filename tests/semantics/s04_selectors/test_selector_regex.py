"""REGEX, REPLACE and SPLIT run Java regexes as automata (broker_core/selector/automata.py). Within the
supported subset the results must be Java's: the property tests compare the Lua evaluator with Python's
re (ASCII mode, which agrees with java.util.regex on this subset and on these subjects) over generated
patterns and UTF-8 text."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_core.errors import InvalidSelector
from broker_core.selector import evaluate_in_redis, parse_selector


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _true(redis_client, text: str, value: str) -> bool | None:
    return evaluate_in_redis(redis_client, parse_selector(text), {"props": {"v": value}})


# Atoms as (Java text, whether a quantifier other than {n} may follow).
_ATOMS = [
    ("a", True), ("b", True), ("1", True), (" ", True), ("-", True), ("_", True), ("\\.", True),
    (".", True), ("\\d", True), ("\\D", True), ("\\w", True), ("\\W", True), ("\\s", True), ("\\S", True),
    ("[ab]", True), ("[^a]", True), ("[a-c1]", True), ("[^\\s]", True), ("[.-]", True), ("\\t", True),
    ("\u00e9", False), ("\U0001f600", False),
]
_QUANTIFIERS = ["", "*", "+", "?", "*?", "+?", "{2}", "{1,3}", "{0,2}", "{2,}", "{2,}?"]
_SUBJECT = st.lists(
    st.sampled_from(["a", "b", "1", " ", "\n", "\t", "\u00e9", "\U0001f600", "-", ".", "_"]), max_size=10
).map("".join)


@st.composite
def java_regexes(draw, spans: bool):
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        atom, quantifiable = draw(st.sampled_from(_ATOMS))
        quantifier = draw(st.sampled_from(_QUANTIFIERS if quantifiable else ["", "{2}"]))
        parts.append(atom + quantifier)
    head = draw(st.sampled_from(["", "^", "\\A"]))
    tail = draw(st.sampled_from(["", "\\z"] if spans else ["", "$", "\\z", "\\Z"]))
    return head + "".join(parts) + tail


def _python(regex: str) -> str:
    # Java's \z is Python's \Z; Java's \Z is Python's $ (end, or before a final newline).
    return regex.replace("\\Z", "$").replace("\\z", "\\Z")


SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def java_matches(regex: str, value: str) -> list[re.Match[str]]:
    """Matcher.find() repeatedly: after an empty match Java resumes one character later (Python's
    finditer would first retry the same position for a non-empty match)."""
    pattern = re.compile(_python(regex), re.ASCII)
    found, pos = [], 0
    while pos <= len(value):
        m = pattern.search(value, pos)
        if m is None:
            break
        found.append(m)
        pos = m.end() if m.end() > m.start() else m.end() + 1
    return found


@SETTINGS
@given(regex=java_regexes(spans=False), value=_SUBJECT)
def test_regex_finds_what_java_finds(redis_client, regex, value):
    expected = re.search(_python(regex), value, re.ASCII) is not None
    assert _true(redis_client, f"REGEX({_quote(regex)}, v)", value) is expected


@SETTINGS
@given(regex=java_regexes(spans=True), value=_SUBJECT, replacement=st.sampled_from(["#", "[$0]", "", "\\$"]))
def test_replace_replaces_what_java_replaces(redis_client, regex, value, replacement):
    out, last = [], 0
    for m in java_matches(regex, value):
        out.append(value[last:m.start()])
        out.append(replacement.replace("$0", m.group()).replace("\\$", "$"))
        last = m.end()
    expected = "".join(out) + value[last:]
    text = f"REPLACE(v, {_quote(regex)}, {_quote(replacement)}) = {_quote(expected)}"
    assert _true(redis_client, text, value) is True


def java_split(value: str, regex: str, limit: int) -> list[str]:
    """java.util.regex.Pattern.split."""
    index, out = 0, []
    for m in java_matches(regex, value):
        if limit <= 0 or len(out) < limit - 1:
            if index == 0 and m.start() == 0 and m.start() == m.end():
                continue
            out.append(value[index:m.start()])
            index = m.end()
        elif len(out) == limit - 1:
            out.append(value[index:])
            index = m.end()
            break
    if index == 0:
        return [value]
    if limit <= 0 or len(out) < limit:
        out.append(value[index:])
    if limit == 0:
        while out and out[-1] == "":
            out.pop()
    return out


@SETTINGS
@given(regex=java_regexes(spans=True), value=_SUBJECT, limit=st.sampled_from([None, -1, 1, 2, 3]))
def test_split_splits_like_java(redis_client, regex, value, limit):
    pieces = java_split(value, regex, limit or 0)
    if not pieces:
        pieces_text = "SPLIT('x', 'x')"  # Java's empty list: the only way to write one
    else:
        pieces_text = "MAKELIST(" + ", ".join(_quote(p) for p in pieces) + ")"
    limit_text = "" if limit is None else f", {limit}"
    text = f"SPLIT(v, {_quote(regex)}{limit_text}) = {pieces_text}"
    assert _true(redis_client, text, value) is True


@pytest.mark.parametrize(
    ("regex", "matching", "other"),
    [
        ("^abc", "abcd", "xabc"),
        ("a.c", "a\u00e9c", "a\nc"),
        ("^[^,]+$", "a\U0001f600b", "a,b"),
        ("\\d+", "x12", "xy"),
        ("^[a-z_]*$", "a_b", "a-b"),
        ("^x{2,3}$", "xxx", "xxxx"),
        ("a*?b", "aab", "aa"),
        ("\\Qa.b\\E", "a.b", "axb"),
        ("caf\u00e9$", "caf\u00e9\r\n", "caf\u00e9\n\n"),
        ("\\x41\\u00e9\\t", "A\u00e9\t", "A\u00e9 "),
        ("\\z", "", None),
        ("^\u00e9{2}$", "\u00e9\u00e9", "\u00e9"),
    ],
)
def test_examples(redis_client, regex, matching, other):
    assert _true(redis_client, f"REGEX({_quote(regex)}, v)", matching) is True
    if other is not None:
        assert _true(redis_client, f"REGEX({_quote(regex)}, v)", other) is False


@pytest.mark.parametrize(
    ("regex", "fragment"),
    [
        ("a|b", "alternation"), ("(a)", "groups"), ("(?i)a", "groups"), ("a\\1", "back-references"),
        ("\\bword", "word boundaries"), ("\\p{L}", "Unicode classes"), ("[a&&b]", "intersections"),
        ("[[a]]", "nested"), ("a++", "possessive"), ("a??", "'??'"), ("\u00e9*", "non-ASCII"),
        ("[\u00e9]", "non-ASCII"), ("a{1,200}", "above 100"), ("a{", "repetition"), ("{a}", "'{'"),
        ("a$b", "'$'"), ("\\u", "\\u"), ("[a", "unclosed"), ("[z-a]", "invalid range"), ("\\", "unfinished"),
    ],
)
def test_unsupported_constructs_are_refused_at_parse_time_with_their_position(regex, fragment):
    with pytest.raises(InvalidSelector) as info:
        parse_selector(f"REGEX({_quote(regex)}, v)")
    assert fragment in str(info.value)
    assert 7 <= info.value.position <= 7 + len(regex) + 1
