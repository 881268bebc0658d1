"""Destination names, composites and wildcards (spec §10.1, §10.5)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_core.destinations import (
    MAX_NAME_LENGTH,
    Destination,
    covers,
    matches,
    parse_composite,
    parse_destination,
)
from broker_core.errors import InvalidDestination


def q(name: str) -> Destination:
    return Destination("queue", name)


def t(name: str) -> Destination:
    return Destination("topic", name)


# -- names


@pytest.mark.parametrize(
    ("text", "default_kind", "expected"),
    [
        ("orders.eu", "queue", q("orders.eu")),
        ("orders.eu", "topic", t("orders.eu")),
        ("queue://orders.eu", "topic", q("orders.eu")),
        ("topic://prices", "queue", t("prices")),
        ("QUEUE://orders", "topic", q("orders")),
        ("Topic://prices", "queue", t("prices")),
        ("ActiveMQ.DLQ", "queue", q("ActiveMQ.DLQ")),
        ("Consumer.A.VirtualTopic.Orders", "queue", q("Consumer.A.VirtualTopic.Orders")),
        ("a/b:c-d_e", "queue", q("a/b:c-d_e")),
        ("zürich.bestellungen", "queue", q("zürich.bestellungen")),
        ("x" * MAX_NAME_LENGTH, "queue", q("x" * MAX_NAME_LENGTH)),
    ],
)
def test_valid_names_parse_to_their_kind_and_name(text, default_kind, expected):
    assert parse_destination(text, default_kind) == expected


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "the name is empty"),
        ("queue://", "the name is empty"),
        ("x" * (MAX_NAME_LENGTH + 1), f"the limit is {MAX_NAME_LENGTH} (MAX_NAME_LENGTH)"),
        ("orders eu", "found U+0020 (space) at position 7"),
        (" orders", "at position 1"),
        ("orders\t", "U+0009"),
        ("ord\x00ers", "U+0000"),
        ("ord\u200bers", "U+200B"),
        ("orders{eu}", "'{' is reserved for the Redis hash tag at position 7"),
        ("orders}", "'}' is reserved for the Redis hash tag"),
        ("a,b", "composite destination (A,B): not allowed where one is named at position 2"),
        ("a?consumer.prefetchSize=1", "destination options"),
        ("a..b", "empty segment ('..') at position 2"),
        (".a", "starts with '.'"),
        ("a.", "ends with '.'"),
        (".", "starts with '.'"),
        ("orders.*", "wildcard '*' is only allowed in patterns"),
        ("orders.>", "wildcard '>' is only allowed in patterns"),
        # (a temporary destination's own name, ID:<connection id>:<n>, is taken: tests/broker_core/
        # test_temp_destinations.py)
        ("temp-queue://ID:1", "temp-queue:// names one a connection created, ID:<connection id>:<number>"),
        ("temp-topic://ID:1", "temp-topic:// names one a connection created"),
        ("amqp://orders", "unknown scheme 'amqp://'"),
        ("queue://topic://x", "a scheme given twice"),
    ],
)
def test_invalid_names_say_what_is_wrong_and_where(text, complaint):
    with pytest.raises(InvalidDestination) as caught:
        parse_destination(text)
    assert complaint in caught.value.message


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("orders.>.eu", "'>' must be the last segment at position 8"),
        ("orders.>.>", "'>' must be the last segment"),
        ("orders.eu*", "wildcard '*' must be a whole segment, found 'eu*' at position 10"),
        ("orders.>>", "must be a whole segment"),
    ],
)
def test_wildcards_must_be_whole_segments_and_descendant_last(text, complaint):
    with pytest.raises(InvalidDestination) as caught:
        parse_destination(text, allow_wildcards=True)
    assert complaint in caught.value.message


def test_wildcard_patterns_parse_when_allowed():
    assert parse_destination("orders.*.>", allow_wildcards=True) == q("orders.*.>")
    assert parse_destination("topic://>", allow_wildcards=True) == t(">")
    assert parse_destination("*", "topic", allow_wildcards=True).is_wildcard


def test_a_destination_knows_its_uri_tag_and_kind():
    d = parse_destination("orders.eu")
    assert (d.uri, d.tag, str(d)) == ("queue://orders.eu", "q:orders.eu", "queue://orders.eu")
    assert d.is_queue and not d.is_topic and not d.is_wildcard
    topic = parse_destination("topic://prices.eu")
    assert (topic.tag, topic.is_topic) == ("t:prices.eu", True)
    assert topic.segments == ("prices", "eu")


def test_constructing_a_destination_validates_it():
    with pytest.raises(InvalidDestination, match="reserved for the Redis hash tag"):
        Destination("queue", "a{b")
    with pytest.raises(InvalidDestination, match="unknown destination kind 'temp-queue'"):
        Destination("temp-queue", "x")  # type: ignore[arg-type]


def test_an_unknown_default_kind_is_rejected():
    with pytest.raises(InvalidDestination, match="unknown destination kind 'exchange'"):
        parse_destination("orders", "exchange")  # type: ignore[arg-type]


@given(st.text(max_size=60), st.sampled_from(["queue", "topic"]), st.booleans())
def test_parsing_any_text_returns_a_destination_or_raises_invalid_destination(text, kind, wildcards):
    try:
        d = parse_destination(text, kind, allow_wildcards=wildcards)
    except InvalidDestination as error:
        assert error.message
    else:
        assert parse_destination(d.uri, allow_wildcards=wildcards) == d
        assert "{" not in d.tag and "}" not in d.tag


@given(st.text(alphabet="ab.*>, :/q", max_size=30))
def test_parsing_any_composite_returns_destinations_or_raises_invalid_destination(text):
    try:
        parts = parse_composite(text, allow_wildcards=True)
    except InvalidDestination as error:
        assert error.message
    else:
        assert parts and len(set(parts)) == len(parts)


# -- composites (§10.1)


def test_composite_parts_without_a_scheme_take_the_default_kind():
    assert parse_composite("A,B,topic://C") == [q("A"), q("B"), t("C")]
    assert parse_composite("A,B", "topic") == [t("A"), t("B")]


def test_a_leading_scheme_sets_the_kind_of_every_unqualified_part():
    # ActiveMQ strips the leading scheme from the whole string first (createDestination), so
    # unqualified parts take that kind, not the kind of the part before them.
    assert parse_composite("topic://A,B,queue://C,D") == [t("A"), t("B"), q("C"), t("D")]
    assert parse_composite("A,topic://B,C") == [q("A"), t("B"), q("C")]


def test_composite_parts_are_trimmed_and_duplicates_dropped_in_first_seen_order():
    assert parse_composite(" B , A ,B, queue://A ") == [q("B"), q("A")]


def test_a_single_name_is_a_composite_of_one():
    assert parse_composite("topic://prices") == [t("prices")]


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "names no destination"),
        (" , ,", "names no destination"),
        ("A,B b", "in part 2 of composite destination 'A,B b'"),
        ("A,temp-queue://x", "invalid temporary destination 'temp-queue://x'"),
        ("A,orders.>", "only allowed in patterns"),
    ],
)
def test_bad_composites_name_the_part(text, complaint):
    with pytest.raises(InvalidDestination) as caught:
        parse_composite(text)
    assert complaint in caught.value.message


def test_empty_composite_parts_are_ignored():
    # §10.1: "Parts are trimmed, empty parts are ignored" (FLOWFIX, review finding 19).
    assert parse_composite("A,,B,") == [q("A"), q("B")]
    assert parse_composite(",A") == [q("A")]


def test_composite_wildcard_parts_need_allow_wildcards():
    assert parse_composite("a.>,topic://b.*", allow_wildcards=True) == [q("a.>"), t("b.*")]


# -- wildcards (§10.5)


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("orders", "orders", True),
        ("orders", "orders.eu", False),
        ("orders.*", "orders.eu", True),
        ("orders.*", "orders", False),
        ("orders.*", "orders.eu.de", False),
        ("*.eu", "orders.eu", True),
        ("*.eu", "orders.us", False),
        ("*", "orders", True),
        ("*", "orders.eu", False),
        ("orders.*.de", "orders.eu.de", True),
        ("orders.>", "orders.eu", True),
        ("orders.>", "orders.eu.de.berlin", True),
        ("orders.>", "orders", True),  # '>' also matches the parent itself (PrefixDestinationFilter)
        ("orders.>", "ordersx", False),
        ("orders.>", "other.eu", False),
        (">", "orders", True),
        (">", "a.b.c.d", True),
        ("orders.*.>", "orders.eu", True),
        ("orders.*.>", "orders.eu.de", True),
        ("orders.*.>", "orders", False),
        ("*.>", "orders", True),
    ],
)
def test_wildcard_matching(pattern, name, expected):
    assert matches(q(pattern), q(name)) is expected
    assert matches(t(pattern), t(name)) is expected


def test_queues_and_topics_never_match_each_other():
    assert not matches(q(">"), t("orders"))
    assert not matches(t("orders"), q("orders"))


@pytest.mark.parametrize(
    ("general", "specific", "expected"),
    [
        (">", "orders.>", True),
        ("orders.>", "orders.eu.>", True),
        ("orders.>", "orders.*", True),
        ("orders.>", "orders", True),
        ("orders.*", "orders.>", False),
        ("orders.eu.>", "orders.>", False),
        ("*.*", "orders.*", True),
        ("orders.*", "*.*", False),
        ("orders.*", "*.eu", False),
        ("*.eu", "orders.*", False),
        ("*.>", "orders.>", True),
        ("orders.>", "*.>", False),
        ("orders.*", "orders.*", True),
        (">", "*.>", True),
        ("*.>", ">", False),
    ],
)
def test_pattern_inclusion(general, specific, expected):
    assert covers(q(general), q(specific)) is expected


_segment = st.sampled_from(["a", "b", "*"])
_pattern_text = st.builds(
    lambda segs, open_: ".".join([*segs, ">"] if open_ else segs) or ">",
    st.lists(_segment, max_size=3),
    st.booleans(),
)
_name_text = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4).map(".".join)


@given(_pattern_text, _pattern_text, _name_text)
def test_a_covering_pattern_matches_everything_the_covered_pattern_matches(general, specific, name):
    g, s, d = q(general), q(specific), q(name)
    if covers(g, s) and matches(s, d):
        assert matches(g, d)
