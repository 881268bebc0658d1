"""Selector evaluation in Redis's Lua (spec §4.3): the truth table in the JMS and the STOMP coercion modes,
then headers, numbers, strings and the built-in functions. Every result comes from the Lua evaluator."""

from __future__ import annotations

import pytest

from broker_core.scripts.library import SCRIPT_DIR
from broker_core.selector import (
    SelectorEvaluationError,
    evaluate_in_redis,
    evaluate_in_redis_async,
    message_json,
    parse_selector,
)

T, F, N = True, False, None
RAISES = "raises"  # ActiveMQ throws a RuntimeException: an error, not NULL, and so no match

# The message every truth-table row runs against.
MESSAGE = {
    "id": "ID:test-1",
    "dest": "queue://ActiveMQ.DLQ",
    "orig_dest": "queue://Q.A",
    "type": "order",
    "persistent": True,
    "priority": 4,
    "redelivery": 1,
    "timestamp": 1_700_000_000_000,
    "props": {
        "color": "red",
        "s2": "2",
        "s25": "2.5",
        "bs": "true",
        "st": "true",
        "sa": "abc",
        "sb": "abd",
        "i": 5,
        "l": ["l", 5],
        "f": ["f", 5.0],
        "d": 5.0,
        "b": True,
    },
}

# (selector, result in JMS mode, result in STOMP's convert_string_expressions mode)
TRUTH_TABLE = [
    # §4.1: NOT binds tighter than comparisons.
    ("NOT color = 'red'", F, F),
    ("NOT (color = 'red')", F, F),
    ("NOT (color = 'blue')", T, T),
    # Equality and NULL: left NULL gives NULL, right-only NULL gives FALSE, both NULL gives TRUE.
    ("missing = 'x'", N, N),
    ("NOT(missing='x')", N, N),
    ("'x' = missing", F, F),
    ("NOT('x' = missing)", T, T),
    ("missing = other", T, T),
    ("missing <> 'x'", N, N),
    ("'x' <> missing", T, T),
    ("color = 'red'", T, T),
    ("color <> 'red'", F, F),
    # Numbers widen.
    ("i = 5.0", T, T),
    ("l = 5", T, T),
    ("f = 5", T, T),
    ("d = 5", T, T),
    ("5 = l", T, T),
    ("l = i", T, T),
    ("i > 4.5", T, T),
    # Different types compare FALSE in JMS mode; STOMP converts the string toward the other type.
    ("s2 = 2", F, T),
    ("s2 > 1", F, T),
    ("s2 < 10", F, T),
    ("NOT (s2 > 1)", T, F),
    ("bs = TRUE", F, T),
    ("2 = s2", F, T),
    ("i = '5'", F, T),
    ("s25 > 2", F, F),  # Integer.valueOf("2.5") fails: FALSE
    ("s25 > 2.0", F, T),  # Double.valueOf("2.5") works
    ("color = 1", F, F),
    ("JMSDeliveryMode = 1", F, F),
    ("1 = TRUE", F, F),
    # IS NULL is TRUE only for a NULL.
    ("missing IS NULL", T, T),
    ("missing IS NOT NULL", F, F),
    ("i IS NULL", F, F),
    ("color IS NOT NULL", T, T),
    # IN: NULL and non-strings give NULL for IN and NOT IN.
    ("missing IN ('a')", N, N),
    ("missing NOT IN ('a')", N, N),
    ("i IN ('5')", N, N),
    ("i NOT IN ('5')", N, N),
    ("color IN ('red', 'blue')", T, T),
    ("color IN ('blue')", F, F),
    ("color NOT IN ('red', 'blue')", F, F),
    ("color NOT IN ('blue')", T, T),
    # LIKE: NULL gives NULL, a non-string FALSE.
    ("missing LIKE 'r%'", N, N),
    ("missing NOT LIKE 'r%'", N, N),
    ("i LIKE '5'", F, F),
    ("i NOT LIKE '5'", T, T),
    ("color LIKE 'r%'", T, T),
    ("color LIKE 'r_d'", T, T),
    ("color LIKE 'R%'", F, F),
    ("color NOT LIKE 'b%'", T, T),
    # BETWEEN is >= AND <=; NOT BETWEEN is < OR >; both NULL for a missing property.
    ("missing BETWEEN 1 AND 10", N, N),
    ("missing NOT BETWEEN 1 AND 10", N, N),
    ("i BETWEEN 5 AND 6", T, T),
    ("i BETWEEN 6 AND 9", F, F),
    ("i NOT BETWEEN 5 AND 6", F, F),
    ("i NOT BETWEEN 6 AND 9", T, T),
    ("s2 BETWEEN 1 AND 3", F, T),
    ("s2 NOT BETWEEN 1 AND 3", F, F),  # NOT BETWEEN is `< OR >`, not NOT(BETWEEN)
    # Three-valued AND/OR/NOT.
    ("i>4 AND missing='x'", N, N),
    ("i>4 OR missing='x'", T, T),
    ("i<4 OR missing='x'", N, N),
    ("i<4 AND missing='x'", F, F),
    ("missing='x' OR i>4", T, T),
    ("NOT missing", N, N),
    ("NOT (missing = 'x' AND i > 4)", N, N),
    # A bare property is TRUE only when it holds a boolean true.
    ("b", T, T),
    ("st", F, F),
    ("missing", N, N),
    ("NOT b", F, F),
    ("NOT st", T, T),
    ("TRUE", T, T),
    ("FALSE", F, F),
    ("NULL", N, N),
    ("NOT NULL", N, N),
    # Arithmetic: / and % give doubles; string + x concatenates; other non-numbers throw.
    ("i/2 = 2.5", T, T),
    ("i/2 = 2", F, F),
    ("i % 2 = 1", T, T),
    ("i * 2 = 10", T, T),
    ("i - 6 = -1", T, T),
    ("-i = -5", T, T),
    ("+i = 5", T, T),
    ("color + '!' = 'red!'", T, T),
    ("'n' + i = 'n5'", T, T),
    ("missing + 1 = 1", N, N),
    ("i + missing = 1", N, N),
    ("i + color = 6", RAISES, RAISES),
    ("b + 1 = 2", RAISES, RAISES),
    ("color * 2 = 1", RAISES, RAISES),
    ("s2 - 1 = 1", RAISES, RAISES),
    ("-color IS NULL", T, T),
    ("-b IS NULL", T, T),
    # Property-to-property string comparison is lexicographic.
    ("sa < sb", T, T),
    ("sb < sa", F, F),
    ("sa <= sa", T, T),
    # XQUERY is always FALSE.
    ("XQUERY 'doc/order'", F, F),
    ("NOT XQUERY 'doc/order'", T, T),
    # Header identifiers (§4.2) are case-sensitive; a wrong case is just a missing property.
    ("JMSDestination = 'queue://Q.A'", T, T),
    ("JMSDeliveryMode = 'PERSISTENT'", T, T),
    ("JMSXDeliveryCount = 2", T, T),
    ("JMSRedelivered", T, T),
    ("JMSXGroupSeq = 0", T, T),
    ("JMSPriority = 4", T, T),
    ("JMSType = 'order'", T, T),
    ("jmstype = 'order'", N, N),
    # Functions.
    ("REGEX('^r', color)", T, T),
    ("REGEX('^b', color)", F, F),
]


def _evaluate(redis_client, text: str, stomp: bool, message=MESSAGE):
    selector = parse_selector(text, convert_string_expressions=stomp)
    return evaluate_in_redis(redis_client, selector, message)


@pytest.mark.parametrize("mode", ["jms", "stomp"])
@pytest.mark.parametrize(("text", "jms", "stomp"), TRUTH_TABLE, ids=[row[0] for row in TRUTH_TABLE])
def test_truth_table(redis_client, text, jms, stomp, mode):
    expected = jms if mode == "jms" else stomp
    try:
        result = _evaluate(redis_client, text, mode == "stomp")
    except SelectorEvaluationError:
        result = RAISES
    assert result == expected


def test_the_stomp_prefix_turns_coercion_on(redis_client):
    assert evaluate_in_redis(redis_client, "convert_string_expressions:s2 = 2", MESSAGE) is True
    assert evaluate_in_redis(redis_client, "s2 = 2", MESSAGE) is False


def _ev(redis_client, text: str, stomp: bool = False, **fields):
    props = fields.pop("props", {})
    return _evaluate(redis_client, text, stomp, {"dest": "queue://Q", **fields, "props": props})


# -- headers ---------------------------------------------------------------------------------------------


def test_jms_destination_is_the_destination_unless_the_message_was_copied(redis_client):
    assert _ev(redis_client, "JMSDestination = 'queue://Q'") is True
    assert _ev(redis_client, "JMSDestination = 'queue://Q.A'", orig_dest="queue://Q.A") is True


def test_header_identifiers_read_message_fields_not_properties(redis_client):
    fields = {
        "id": "ID:7", "reply_to": "queue://replies", "type": "t", "corr_id": "c-1", "user_id": "alice",
        "producer_tx": "TX:1", "broker_path": "[b1, b2]", "priority": 9, "timestamp": 1000,
        "expiration": 2000, "redelivery": 0, "group_id": "g", "group_seq": 3, "group_first": True,
        "broker_in": 10, "broker_out": 20, "persistent": False,
        "props": {"JMSPriority": 1, "JMSType": "shadowed"},
    }
    checks = [
        "JMSMessageID = 'ID:7'", "JMSReplyTo = 'queue://replies'", "JMSType = 't'",
        "JMSCorrelationID = 'c-1'",
        "JMSXUserID = 'alice'", "JMSXProducerTXID = 'TX:1'", "JMSActiveMQBrokerPath = '[b1, b2]'",
        "JMSPriority = 9", "JMSTimestamp = 1000", "JMSExpiration = 2000", "NOT JMSRedelivered",
        "JMSXDeliveryCount = 1", "JMSXGroupID = 'g'", "JMSXGroupSeq = 3", "JMSXGroupFirstForConsumer",
        "JMSActiveMQBrokerInTime = 10", "JMSActiveMQBrokerOutTime = 20",
        "JMSDeliveryMode = 'NON_PERSISTENT'",
    ]
    for text in checks:
        assert _ev(redis_client, text, **fields) is True, text


def test_header_defaults_when_the_message_lacks_them(redis_client):
    assert _ev(redis_client, "JMSXGroupSeq = 0") is True
    assert _ev(redis_client, "JMSXDeliveryCount = 1") is True
    assert _ev(redis_client, "JMSRedelivered") is False
    assert _ev(redis_client, "JMSXGroupFirstForConsumer") is False
    assert _ev(redis_client, "JMSDeliveryMode = 'NON_PERSISTENT'") is True
    assert _ev(redis_client, "JMSType IS NULL") is True
    assert _ev(redis_client, "JMSXGroupID IS NULL") is True
    # Arrays.toString(null) is the string "null", so the broker path is never NULL.
    assert _ev(redis_client, "JMSActiveMQBrokerPath = 'null'") is True


def test_jmsx_user_id_falls_back_to_the_property(redis_client):
    assert _ev(redis_client, "JMSXUserID = 'bob'", props={"JMSXUserID": "bob"}) is True


# -- numbers -------------------------------------------------------------------------------------------


def test_int_arithmetic_wraps_like_java(redis_client):
    assert _ev(redis_client, "2147483647 + 1 = -2147483648") is True
    assert _ev(redis_client, "i * 1000000000 = 705032704", props={"i": 5}) is True
    assert _ev(redis_client, "-2147483648 - 1 = -2147483649") is True  # a long literal: no wrap
    assert _ev(redis_client, "2147483648 + 1 = 2147483649") is True


def test_longs_compare_exactly_beyond_two_to_the_53(redis_client):
    props = {"big": ["l", 9007199254740993], "max": ["l", 2**63 - 1], "min": ["l", -(2**63)]}
    assert _ev(redis_client, "big = 9007199254740993", props=props) is True
    assert _ev(redis_client, "big = 9007199254740992", props=props) is False
    assert _ev(redis_client, "big > 9007199254740992", props=props) is True
    assert _ev(redis_client, "max = 9223372036854775807", props=props) is True
    assert _ev(redis_client, "min = -9223372036854775808", props=props) is True
    assert _ev(redis_client, "min < max", props=props) is True
    assert _ev(redis_client, "'' + big = '9007199254740993'", props=props) is True


def test_a_long_may_arrive_as_a_decimal_string(redis_client):
    assert _ev(redis_client, "n = 12", props={"n": ["l", "12"]}) is True


def test_doubles_follow_javas_total_order(redis_client):
    props = {"neg_zero": -0.0, "nan": float("nan")}
    assert _ev(redis_client, "neg_zero = 0", props=props) is False  # Double.compareTo(-0.0, 0.0) < 0
    assert _ev(redis_client, "neg_zero < 0", props=props) is True
    assert _ev(redis_client, "nan = nan", props=props) is True  # Double.equals(NaN, NaN)
    assert _ev(redis_client, "nan > 1e308", props=props) is True
    assert _ev(redis_client, "1 / 0.0 > 1e308") is True
    assert _ev(redis_client, "-7 % 3 = -1") is True  # truncated remainder, not Lua's floored one


def test_floats_keep_single_precision(redis_client):
    props = {"f": ["f", 0.1], "y": ["y", 5], "h": ["h", 300]}
    assert _ev(redis_client, "f = 0.1", props=props) is False  # (double) 0.1f != 0.1
    assert _ev(redis_client, "f * 10 > 1", props=props) is True
    assert _ev(redis_client, "y = 5 AND 5 = y AND h = 300 AND h > y", props=props) is True
    assert _ev(redis_client, "-y = -5", props=props) is True


def test_string_concatenation_formats_numbers_like_java(redis_client):
    cases = [
        ("'' + 1.0", "1.0"), ("'' + 100.0", "100.0"), ("'' + 1234567.0", "1234567.0"), ("'' + 1e7", "1.0E7"),
        ("'' + 0.001", "0.001"), ("'' + 0.0001", "1.0E-4"), ("'' + 123456789.125", "1.23456789125E8"),
        ("'' + -0.0", "-0.0"), ("'' + (0.1 + 0.2)", "0.30000000000000004"), ("'' + 0.0 / 0", "NaN"),
        ("'' + 1 / 0.0", "Infinity"), ("'' + -1 / 0.0", "-Infinity"), ("'' + 42", "42"),
        ("'' + -9223372036854775808", "-9223372036854775808"), ("'' + TRUE", "true"), ("'' + f", "0.1"),
        ("'' + MAKELIST('a', 1, missing)", "[a, 1, null]"),
    ]
    for expression, text in cases:
        assert _ev(redis_client, f"{expression} = '{text}'", props={"f": ["f", 0.1]}) is True, expression


def test_stomp_conversions_follow_javas_value_of(redis_client):
    props = {
        "plus": "+5", "spaced": " 5 ", "suffixed": "5d", "exp": "1e1", "hex": "0x10", "big": "3000000000",
        "flag": "TRUE",
    }
    assert _ev(redis_client, "plus = 5", stomp=True, props=props) is True
    assert _ev(redis_client, "spaced = 5", stomp=True, props=props) is False  # Integer.valueOf does not trim
    assert _ev(redis_client, "spaced = 5.0", stomp=True, props=props) is True  # Double.valueOf does
    assert _ev(redis_client, "suffixed = 5.0", stomp=True, props=props) is True
    assert _ev(redis_client, "exp = 10.0", stomp=True, props=props) is True
    assert _ev(redis_client, "hex = 16", stomp=True, props=props) is False
    assert _ev(redis_client, "big = 3000000000", stomp=True, props=props) is True  # Long.valueOf
    assert _ev(redis_client, "big > 5", stomp=True, props=props) is False  # Integer.valueOf overflows
    assert _ev(redis_client, "flag = TRUE", stomp=True, props=props) is True  # equalsIgnoreCase


def test_string_ordering_is_javas_utf16_order(redis_client):
    props = {"bmp": "\ufb01", "astral": "\U0001f600", "a": "a", "ab": "ab", "e": "\u00e9"}
    assert _ev(redis_client, "astral < bmp", props=props) is True  # a surrogate pair sorts below U+FB01
    assert _ev(redis_client, "a < ab AND ab < e", props=props) is True


# -- functions -------------------------------------------------------------------------------------------


def test_inlist_and_makelist_compare_with_java_equals(redis_client):
    props = {"i": 5, "color": "red"}
    assert _ev(redis_client, "INLIST(SPLIT('red,green', ','), color)", props=props) is True
    assert _ev(redis_client, "INLIST(MAKELIST(5, 6), i)", props=props) is True
    assert _ev(redis_client, "INLIST(MAKELIST('5'), i)", props=props) is False
    assert _ev(redis_client, "INLIST(MAKELIST(5), missing)", props=props) is False
    assert _ev(redis_client, "MAKELIST('a', 'b') = MAKELIST('a', 'b')", props=props) is True
    assert _ev(redis_client, "MAKELIST('a') = 'a'", props=props) is False
    with pytest.raises(SelectorEvaluationError, match="INLIST"):
        _ev(redis_client, "INLIST(color, 'red')", props=props)
    with pytest.raises(SelectorEvaluationError, match="NULL"):
        _ev(redis_client, "INLIST(MAKELIST(missing, 'a'), 'a')", props=props)
    with pytest.raises(SelectorEvaluationError, match="list"):
        _ev(redis_client, "MAKELIST('a') > i", props=props)


def test_regex_finds_anywhere_in_the_value_as_a_string(redis_client):
    props = {"i": 5, "code": "AB-12"}
    assert _ev(redis_client, "REGEX('^5$', i)", props=props) is True
    assert _ev(redis_client, "REGEX('\\d+', code)", props=props) is True
    assert _ev(redis_client, "REGEX('^[A-Z]{2}-\\d{2}$', code)", props=props) is True
    assert _ev(redis_client, "REGEX('[0-9]*', n)", props={"n": ["l", 1870414179]}) is True
    assert _ev(redis_client, "REGEX('^[1-8]*$', n)", props={"n": ["l", 1870414179]}) is False
    assert _ev(redis_client, "REGEX('conn1', REPLACE(JMSMessageID, ':', ''))", id="ID:conn:1") is True
    assert _ev(redis_client, "REGEX('x', missing)", props=props) is False
    assert _ev(redis_client, "NOT REGEX('x', missing)", props=props) is True


def test_replace_and_split_follow_java(redis_client):
    checks = [
        "REPLACE('1,2/3', '[,/]', ';') = '1;2;3'",
        "REPLACE('abc', 'b', '[$0]') = 'a[b]c'",
        "REPLACE('abc', 'b', '\\$') = 'a$c'",
        "REPLACE('abc', 'b*', '-') = '-a--c-'",
        "REPLACE('\u00e9', 'x*', '-') = '-\u00e9-'",
        "REPLACE('aaa', '^a', 'b') = 'baa'",
        "SPLIT('a,b,,c,,', ',') = MAKELIST('a', 'b', '', 'c')",
        "SPLIT('a,b,c', ',', 2) = MAKELIST('a', 'b,c')",
        "SPLIT('a,b,,', ',', -1) = MAKELIST('a', 'b', '', '')",
        "SPLIT('', ',') = MAKELIST('')",
        "SPLIT(',a', ',') = MAKELIST('', 'a')",
        "SPLIT('abc', '') = MAKELIST('a', 'b', 'c')",
        "SPLIT('\u00e9\U0001f600x', '') = MAKELIST('\u00e9', '\U0001f600', 'x')",
        "SPLIT('a1b22c', '\\d+') = MAKELIST('a', 'b', 'c')",
    ]
    for text in checks:
        assert _ev(redis_client, text) is True, text


@pytest.mark.parametrize(
    "text",
    [
        "REPLACE(missing, 'a', 'b') = 'x'", "REPLACE('abc', 'b', '$1') = 'x'",
        "REPLACE('abc', 'b', 'x\\') = 'x'",
        "REPLACE(5, 'a', 'b') = 'x'", "SPLIT(missing, ',') = MAKELIST('a')",
        "SPLIT('a', ',', 1.5) = MAKELIST('a')",
    ],
)
def test_function_errors_are_runtime_errors_like_activemqs(redis_client, text):
    with pytest.raises(SelectorEvaluationError):
        _ev(redis_client, text)


def test_a_runtime_error_anywhere_fails_the_whole_selector(redis_client):
    # Not NULL: OR does not rescue it, as ActiveMQ's exception would not be rescued.
    with pytest.raises(SelectorEvaluationError, match="cannot add"):
        _ev(redis_client, "i + 'x' = 1 OR TRUE", props={"i": 1})
    # ...but a short-circuit that never reaches it is fine.
    assert _ev(redis_client, "TRUE OR i + 'x' = 1", props={"i": 1}) is True


# -- the Lua contract and the async helper ------------------------------------------------------------------

_MATCHES_PROBE = """
local expr = cjson.decode(ARGV[1])
local msg = cjson.decode(ARGV[2])
local matched, why = selector.matches(expr, msg)
return { matched and 1 or 0, why or '' }
"""


def test_selector_matches_is_true_only_for_true_and_never_raises(redis_client):
    source = (SCRIPT_DIR / "includes" / "selector.lua").read_text() + _MATCHES_PROBE

    def matches(text: str, props: dict):
        compiled = parse_selector(text).compiled
        matched, why = redis_client.eval(source, 0, compiled, message_json({"props": props}))
        return matched == 1, why.decode()

    assert matches("a = 1", {"a": 1}) == (True, "")
    assert matches("a = 2", {"a": 1}) == (False, "")
    assert matches("missing = 1", {"a": 1}) == (False, "")  # NULL
    matched, why = matches("a + 'x' = 1", {"a": 1})
    assert not matched and "cannot add" in why


async def test_the_async_helper_runs_the_same_script(redis_url):
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        assert await evaluate_in_redis_async(client, "a = 1", {"props": {"a": 1}}) is True
        assert await evaluate_in_redis_async(client, "a = 1", {"props": {}}) is None
        with pytest.raises(SelectorEvaluationError):
            await evaluate_in_redis_async(client, "a * 'x' = 1", {"props": {"a": 1}})
    finally:
        await client.aclose()
