"""Selector parsing (spec §4.1): the grammar, ActiveMQ's parse-time rules, and errors that name the
1-based position and what was expected. No Redis needed: nothing here evaluates."""

from __future__ import annotations

import json

import pytest

from broker_core.errors import InvalidSelector
from broker_core.selector import Selector, compile_optional, parse_selector


def _error(text: str, **kw) -> InvalidSelector:
    with pytest.raises(InvalidSelector) as info:
        parse_selector(text, **kw)
    return info.value


# (selector, position, a fragment of the message, a fragment of `expected`)
PARSE_ERRORS = [
    # The top level must be a boolean expression or a bare property.
    ("1", 1, "must be a boolean expression or a property", "boolean"),
    ("'x'", 1, "must be a boolean expression or a property", "boolean"),
    ("a + 1", 1, "must be a boolean expression or a property", "boolean"),
    ("a = 1 AND 2", 11, "an operand of AND", "boolean"),
    ("'x' OR a", 1, "an operand of OR", "boolean"),
    ("NOT 1", 5, "the operand of NOT", "boolean"),
    ("MAKELIST('a')", 1, "must be a boolean expression", "boolean"),
    # IN: only string literals, and a property on the left.
    ("i IN (5)", 7, "expected a string literal", "string literal"),
    ("i IN ('a', 5)", 12, "expected a string literal", "string literal"),
    ("'a' IN ('a')", 1, "IN needs a property", "property"),
    ("a + 1 IN ('a')", 1, "IN needs a property", "property"),
    ("i IN 'a'", 6, "expected '('", "'('"),
    ("i IN ('a' 'b')", 11, "expected ',' or ')'", "',' or ')'"),
    # ESCAPE is exactly one character; LIKE needs a string literal.
    ("c LIKE 'a' ESCAPE 'ab'", 19, "exactly one character", "single-character"),
    ("c LIKE 'a' ESCAPE ''", 19, "exactly one character", "single-character"),
    ("c LIKE 'a' ESCAPE '\U0001f600'", 19, "exactly one character", "single-character"),
    ("c LIKE 5", 8, "expected a string literal", "string literal"),
    ("c LIKE d", 8, "expected a string literal", "string literal"),
    # < <= > >= (and BETWEEN): literal operands must be numeric; no boolean expressions.
    ("'2' > 1", 1, "cannot be compared with '>'", "number"),
    ("sa > 'a'", 6, "cannot be compared with '>'", "number"),
    ("i > TRUE", 5, "cannot be compared with '>'", "number"),
    ("i <= NULL", 6, "cannot be compared with '<='", "number"),
    ("(a = 1) > 2", 1, "boolean expression", "number"),
    ("NOT a > 1", 1, "boolean expression", "number"),
    ("a < b < c", 1, "boolean expression", "number"),
    ("i BETWEEN 'a' AND 'b'", 11, "cannot be compared with '>='", "number"),
    ("i NOT BETWEEN 1 AND 'b'", 21, "cannot be compared with '>'", "number"),
    ("REGEX('a', b) >= 1", 1, "boolean expression", "number"),
    # `x = NULL` is an error; `TRUE = 1` is an error (`1 = TRUE` is fine).
    ("x = NULL", 5, "use IS NULL", "IS NULL"),
    ("NULL = x", 1, "use IS NULL", "IS NULL"),
    ("x <> NULL", 6, "use IS NOT NULL", "IS NOT NULL"),
    ("TRUE = 1", 8, "TRUE cannot be compared with 1", "TRUE or FALSE"),
    ("FALSE <> 'x'", 10, "cannot be compared", "TRUE or FALSE"),
    # Function names are case-sensitive, checked, and counted.
    ("regex('^r', color)", 1, "write REGEX", "REGEX"),
    ("Inlist(a, b)", 1, "unknown function", "INLIST"),
    ("FOO(a) = 1", 1, "unknown function 'FOO'", "one of"),
    ("REGEX('a')", 1, "REGEX takes 2 arguments, not 1", "2 arguments"),
    ("SPLIT('a') = 'a'", 1, "SPLIT takes 2 or 3 arguments, not 1", "arguments"),
    ("REPLACE('a', 'b') = 'a'", 1, "REPLACE takes 3 arguments", "arguments"),
    ("REGEX('a', b + 1)", 14, "expected ',' or ')'", "',' or ')'"),
    ("REGEX(p, c)", 7, "must be a string literal", "string literal"),
    # XPATH is not supported; unsupported regex constructs name the construct and its position.
    ("XPATH '//order'", 1, "XPATH selectors are not supported by Signalbox", "without XPATH"),
    ("a = 1 AND XPATH '//order'", 11, "XPATH selectors are not supported by Signalbox", "without XPATH"),
    ("REGEX('a|b', c)", 9, "alternation '|' is not supported", "supported subset"),
    ("REGEX('(ab)+', c)", 8, "groups", "supported subset"),
    ("REGEX('a\\b', c)", 9, "word boundaries", "supported subset"),
    ("REGEX('[\u00e9a]', c)", 9, "non-ASCII characters in a character class", "supported subset"),
    ("REGEX('\u00e9+', c)", 9, "quantifier on the non-ASCII character", "supported subset"),
    ("REGEX('a*+', c)", 10, "possessive", "supported subset"),
    ("REGEX('a{2,3}?', c)", 9, "lazy quantifiers", "supported subset"),
    ("REGEX('it''s|x', c)", 13, "alternation", "supported subset"),
    ("REGEX('*a', c)", 8, "dangling quantifier", "supported subset"),
    ("REPLACE(c, 'a$', 'b') = 'x'", 14, "'$' is not supported in REPLACE", "supported subset"),
    ("REGEX('a^', c)", 9, "'^' is only supported at the start", "supported subset"),
    # Syntax errors say what was expected and what was found.
    ("(a = 1", 7, "expected ')', found the end of the selector", "')'"),
    ("color = = 'red'", 9, "expected an expression", "an expression"),
    ("a = 1 b", 7, "expected an operator or the end of the selector, found 'b'", "end of the selector"),
    ("a NOT b", 7, "expected LIKE, BETWEEN or IN after NOT", "LIKE, BETWEEN or IN"),
    ("a IS 1", 6, "expected NULL or NOT NULL", "NULL"),
    ("a IS NOT 1", 10, "expected NULL", "NULL"),
    ("a BETWEEN 1 OR 2", 13, "expected AND", "AND"),
    ("a = 09", 6, "expected an operator", "end of the selector"),
    ("a = 1.2.3", 8, "expected an operator", "end of the selector"),
    ("a = 0x", 6, "expected an operator", "end of the selector"),
    ("a = 1L5", 7, "expected an operator", "end of the selector"),
    ("a = ", 5, "expected an expression", "an expression"),
    ("a IN ()", 7, "expected a string literal", "string literal"),
    ("XQUERY 5", 8, "expected a string literal", "string literal"),
    # Lexical errors name the offending character.
    ("a.b = 1", 2, "unexpected character '.'", "a token"),
    ("a != 1", 3, "unexpected character '!'", "a token"),
    ('a = "x"', 5, "unexpected character '\"'", "a token"),
    ("a = 1 # x", 7, "unexpected character '#'", "a token"),
    ("\u00e9t\u00e9 = 1", 1, "unexpected character '\u00e9'", "a token"),
    ("a = 'x", 5, "unterminated string literal", "quote"),
    ("a = 1 /* x", 7, "unterminated comment", "'*/'"),
    ("3+5", 1, "must be a boolean expression", "boolean"),
    ("TRUE AND 3+5", 10, "an operand of AND", "boolean"),
    ("=TEST 'test'", 1, "expected an expression", "an expression"),
    ("p1 = p2 foo AND s = 'Test'", 9, "expected an operator or the end of the selector, found 'foo'", "end"),
    ("a = 1 AMD  b = 2", 7, "found 'AMD'", "end of the selector"),
    # Literals outside a long.
    ("a = 9223372036854775808", 5, "does not fit in a long", "number"),
    ("a = 0x8000000000000000", 5, "does not fit in a long", None),
]


@pytest.mark.parametrize(
    ("text", "position", "message", "expected"), PARSE_ERRORS, ids=[p[0] for p in PARSE_ERRORS]
)
def test_parse_errors_name_the_position_and_what_was_expected(text, position, message, expected):
    error = _error(text)
    assert error.position == position, str(error)
    assert message in str(error)
    assert str(error).endswith(f"at position {position}")
    if expected is not None:
        assert expected in (error.expected or ""), error.expected


@pytest.mark.parametrize(
    "text",
    [
        "1 = TRUE", "TRUE = FALSE", "TRUE = x", "TRUE = -1", "TRUE IS NULL", "1 IS NULL", "NULL IS NULL",
        "a = -9223372036854775808", "a = 0x7FFFFFFFFFFFFFFF", "a = 077", "a = 5L", "a = 5l", "a = 1.5",
        "a = .5", "a = 5.", "a = 1e1", "a = 1E+10", "a = 2.5e-3", "a=0", "a = 00.5",
        "a-b = 1", "a = - - 1", "+a", "-a IS NULL", "NOT NOT a", "NOT a = b", "a = b = c", "a IS NULL = TRUE",
        "not a and b or c", "A_b$9 = 'x'", "$x IS NULL", "_x IS NULL", "NOTE = 1", "INX = 1", "ORDER = 1",
        "color = 'it''s'", "c LIKE '10!%' ESCAPE '!'", "c NOT LIKE 'a%'", "i NOT IN ('a', 'b')",
        "a BETWEEN 1 AND 2 AND b", "a NOT BETWEEN -1 AND +1", "a > -'x'", "x = -TRUE",
        "a = 1 -- trailing comment", "a = 1 -- comment\n AND b", "/* lead */ a /* mid */ = 1",
        "XQUERY 'a' OR b", "REGEX('^[a-z]+$', c)", "INLIST(SPLIT(s, ','), 'x')", "MAKELIST(a, 'b', 1) = x",
        "REPLACE(s, '\\s+', ' ') = 'a b'", "SPLIT(s, ',', 2) = MAKELIST('a')", "a\t=\r\n1\f",
        "(((a)))", "(a) IN ('x')", "+a IN ('x')",
    ],
)
def test_valid_selectors_parse(text):
    selector = parse_selector(text)
    assert json.loads(selector.compiled)["v"] == 2


def test_not_binds_tighter_than_comparison():
    tree = json.loads(parse_selector("NOT color = 'red'").compiled)["e"]
    assert tree == ["eq", ["not", ["bool", ["id", "color"]]], ["s", "red"]]


def test_precedence_from_or_down_to_unary():
    tree = json.loads(parse_selector("a OR b AND c = 1 + 2 * -x").compiled)["e"]
    assert tree == [
        "or",
        ["bool", ["id", "a"]],
        [
            "and",
            ["bool", ["id", "b"]],
            ["eq", ["id", "c"], ["add", ["i", 1], ["mul", ["i", 2], ["neg", ["id", "x"]]]]],
        ],
    ]


def test_keywords_are_case_insensitive_and_identifiers_case_sensitive():
    selector = parse_selector("Color = 'x' aNd JMSType is not null")
    assert selector.identifiers == frozenset({"Color", "JMSType"})
    assert selector.header_identifiers == frozenset({"JMSType"})
    assert selector.property_names == frozenset({"Color"})
    assert json.loads(parse_selector("jmstype = 'x'").compiled)["e"][1] == ["id", "jmstype"]


def test_literals_compile_with_their_java_types():
    def literal(text: str):
        return json.loads(parse_selector(f"a = {text}").compiled)["e"][2]

    assert literal("5") == ["i", 5]
    assert literal("5L") == ["i", 5]  # ActiveMQ narrows a long literal that fits an int
    assert literal("2147483648") == ["l", 2147483648]
    assert literal("0x1F") == ["i", 31]
    assert literal("017") == ["i", 15]
    assert literal("0") == ["i", 0]
    assert literal("1e1") == ["d", 10.0]
    assert literal(".5") == ["d", 0.5]
    assert literal("1e999") == ["d", "1e999"]
    assert literal("9007199254740993") == ["l", "9007199254740993"]
    assert literal("-9223372036854775808") == ["l", "-9223372036854775808"]
    assert literal("-2147483648") == ["l", -2147483648]  # negating the long 2147483648
    assert literal("'it''s'") == ["s", "it's"]
    assert literal("-0.0") == ["d", -0.0]


def test_the_compiled_form_is_stable_compact_json_without_nulls():
    text = "a IN ('x', 'y') AND b LIKE 'q_%' AND c IS NULL AND NULL IS NULL"
    compiled = parse_selector(text).compiled
    assert compiled == parse_selector(text.replace(" ", "  ").replace("AND", "and")).compiled
    assert ", " not in compiled and ": " not in compiled

    def walk(node):
        assert node is not None  # cjson would decode a JSON null to a lightuserdata
        if isinstance(node, list):
            for child in node:
                walk(child)
        elif isinstance(node, dict):
            for child in node.values():
                walk(child)

    walk(json.loads(compiled))


def test_the_stomp_prefix_turns_coercion_on_and_positions_count_from_the_text_given():
    selector = parse_selector("convert_string_expressions:s2 = 2")
    assert selector.convert_string_expressions is True
    assert json.loads(selector.compiled)["c"] is True
    assert parse_selector("s2 = 2").convert_string_expressions is False
    assert parse_selector("s2 = 2", convert_string_expressions=True).convert_string_expressions is True
    error = _error("convert_string_expressions:a = = 1")
    assert error.position == 32


def test_blank_selectors_mean_no_selector():
    assert compile_optional(None) is None
    assert compile_optional("") is None
    assert compile_optional("  \n\t") is None
    assert compile_optional("convert_string_expressions:  ") is None
    assert isinstance(compile_optional("a = 1"), Selector)
    with pytest.raises(InvalidSelector, match="empty"):
        parse_selector("   ")
    with pytest.raises(InvalidSelector, match="expected an expression"):
        parse_selector("/* only a comment */")


def test_parsed_selectors_are_cached():
    assert parse_selector("cached = 1") is parse_selector("cached = 1")
    assert parse_selector("cached = 1") is not parse_selector("cached = 1", convert_string_expressions=True)


def test_deep_nesting_is_refused_with_an_invalid_selector_not_a_crash():
    assert _error("(" * 200 + "a" + ")" * 200).position is not None
    assert _error("NOT " * 200 + "a").position is not None
    assert _error("a = " + " + ".join(["1"] * 200)).position is not None
    parse_selector(" AND ".join(f"p{i} = {i}" for i in range(500)))  # flat AND chains are fine
