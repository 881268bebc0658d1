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
