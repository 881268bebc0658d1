"""JMX object names (gateway/api/object_names.py), which /api/jolokia parses from untrusted requests: the
grammar's edges, patterns, and a fuzz that no input makes it fail other than with its own refusal."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.object_names import MAX_OBJECT_NAME_LENGTH, MalformedObjectName, parse


def test_canonical_form_sorts_the_keys_and_keeps_a_property_list_pattern():
    assert parse("d:type=Broker,brokerName=x").canonical == "d:brokerName=x,type=Broker"
    assert parse("d:type=Broker,*").canonical == "d:type=Broker,*"
    assert parse("d:*,type=Broker").canonical == "d:type=Broker,*"
    assert parse("d:*").canonical == "d:*"


@pytest.mark.parametrize(("text", "reason"), [
    ("notaname", "Key properties cannot be empty"),
    ("a:", "Key properties cannot be empty"),
    ("a:b", "Unterminated key property part"),
    ("a:b=c,b=d", "key `b' already defined"),
    ("a:=c", "Invalid key (empty)"),
    ("a:b=c,", "Invalid ending comma"),
    ("a:b=c=d", "Invalid character '=' in value part of property"),
    ("a:b=x:y", "Invalid character ':' in value part of property"),
    ('a:b=x"y', "Invalid character '\"' in value part of property"),
    ("a:b*=c", "Invalid character '*' in key part of property"),
    ("a:b=", "Invalid value (empty)"),
    ('a:b="x', "Missing termination quote"),
    ("a:*,*", "Cannot have several '*' characters in pattern property list"),
])
def test_malformed_names_are_refused_with_objectnames_reason(text, reason):
    with pytest.raises(MalformedObjectName) as refused:
        parse(text)
    assert str(refused.value) == reason


def test_patterns_match_values_domains_and_other_keys():
    name = parse("org.apache.activemq:brokerName=localhost,destinationName=orders.eu,destinationType=Queue,"
                 "type=Broker")
    assert not name.is_pattern
    assert parse("org.apache.activemq:type=Broker,*").matches(name)
    assert parse("org.apache.*:type=Broker,*").matches(name)
    assert parse("org.apache.activemq:type=Broker,brokerName=*,destinationType=Q?eue,destinationName=orders.*"
                 ).matches(name)
    assert not parse("org.apache.activemq:type=Broker").matches(name)  # other keys, no `,*`
    assert not parse("org.apache.activemq:destinationName=orders,*").matches(name)
    # `.` and other regular-expression characters stand for themselves
    assert not parse("org.apache.activemq:destinationName=orders?eu,*").matches(parse(
        "org.apache.activemq:destinationName=ordersXeu2"))
    assert parse('d:k="a,b",*').matches(parse('d:k="a,b",j=1'))
    assert parse('d:k="a*"').get("k") == "a*"  # quoted: a literal star, no pattern
    assert not parse('d:k="a*"').is_pattern


def test_a_name_has_a_length_limit_that_says_its_name():
    with pytest.raises(MalformedObjectName, match="MAX_OBJECT_NAME_LENGTH"):
        parse("d:k=" + "x" * MAX_OBJECT_NAME_LENGTH)


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('ab:,=*?"\\\n!/ ')), max_size=40))
def test_any_text_parses_or_is_refused_and_its_canonical_form_parses_again(text):
    try:
        name = parse(text)
    except MalformedObjectName:
        return
    again = parse(name.canonical)
    assert again.canonical == name.canonical
    assert again.is_pattern == name.is_pattern
    if not name.is_pattern:
        assert name.matches(name)


@pytest.mark.parametrize("pattern", [
    "*" * 40 + "X:*",  # the domain: a run of stars before a character the name lacks
    "?*" * 30 + "X:*",
    "org.apache.activemq:destinationName=" + "*a" * 60 + "b,*",  # a value, against a long name
    "org.apache.activemq:destinationName=" + "*?" * 60 + "b,*",
])
def test_a_pathological_pattern_costs_little(pattern):
    # (a regular expression of `.*` runs backtracks exponentially: 14 stars took 10 s, 40 years)
    import time

    name = parse(f"org.apache.activemq:destinationName={'a' * 1024},type=Broker")
    started = time.perf_counter()
    assert not parse(pattern).matches(name)
    assert time.perf_counter() - started < 0.5


def test_wildcards_match_as_objectname_does():
    name = parse("d.x:k=abcabc")
    for yes in ("*:k=*", "d?x:k=a*c", "d.x:k=*abc", "d.x:k=a*b*c", "d.x:k=??????", "d.x:k=*c*c",
                "*.*:k=abc*"):
        assert parse(yes).matches(name), yes
    for no in ("d:k=*", "d.x:k=a*b", "d.x:k=?????", "d.x:k=*cc", "d.x:k=abc?abc", "x*:k=*"):
        assert not parse(no).matches(name), no


def _reference_match(pattern: str, text: str) -> bool:
    """ObjectName's wildcard match, by the textbook table (slow, plainly right)."""
    table = [[False] * (len(text) + 1) for _ in range(len(pattern) + 1)]
    table[0][0] = True
    for i, p in enumerate(pattern, 1):
        table[i][0] = table[i - 1][0] and p == "*"
        for j, t in enumerate(text, 1):
            table[i][j] = (table[i - 1][j] or table[i][j - 1]) if p == "*" else (
                table[i - 1][j - 1] and p in ("?", t))
    return table[-1][-1]


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet="ab*?", max_size=12), st.text(alphabet="ab", max_size=12))
def test_the_wildcard_match_agrees_with_the_textbook_one(pattern, text):
    from gateway.api.object_names import _match

    assert _match(pattern, text) == _reference_match(pattern, text)


def test_a_long_pattern_costs_about_what_a_short_one_does_against_short_names():
    # (each match split the pattern again: 1,000 stars cost 8x a plain pattern per name, now 3x, and a
    # POST of 100 such searches over 5,000 queues took 9 s)
    import time

    names = [parse(f"org.apache.activemq:brokerName=localhost,destinationName=q{i % 10}.n{i},"
                   "destinationType=Queue,type=Broker") for i in range(20_000)]

    def cost(pattern: str) -> float:
        name = parse(pattern)
        started = time.perf_counter()
        for other in names:
            name.matches(other)
        return time.perf_counter() - started

    plain = cost("org.apache.activemq:destinationName=zzz*,*")
    assert cost("org.apache.activemq:destinationName=" + "*?" * 1000 + ",*") < 5 * plain + 0.05
