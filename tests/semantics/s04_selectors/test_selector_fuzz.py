"""Fuzzing the selector front end and the Lua evaluator: any text either parses or raises InvalidSelector,
and any selector that parses evaluates in Redis to TRUE, FALSE or NULL, or fails with the documented
runtime error (SelectorEvaluationError) - never a Lua error or another exception."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from redis.exceptions import ResponseError

from broker_core.errors import InvalidSelector
from broker_core.selector import SelectorEvaluationError, evaluate_in_redis, parse_selector

NAMES = ["a", "b", "s", "i", "x", "color"]
HEADERS = ["JMSPriority", "JMSType", "JMSDeliveryMode", "JMSXGroupSeq", "JMSTimestamp", "JMSRedelivered",
           "JMSDestination", "JMSXDeliveryCount", "JMSActiveMQBrokerPath"]
LITERALS = [
    "'x'", "''", "'a''b'", "'%'", "'_a%'", "'5'", "'true'", "'\u00e9\U0001f600'", "1", "0", "5L", "0x1F",
    "017", "1.5", ".5", "5.", "1e3", "2147483647", "2147483648", "9223372036854775807", "-1", "TRUE",
    "FALSE", "NULL",
]
TOKENS = (
    NAMES + HEADERS + LITERALS
    + ["NOT", "AND", "OR", "BETWEEN", "LIKE", "ESCAPE", "IN", "IS", "XQUERY", "XPATH", "=", "<>", "<", "<=",
       ">", ">=", "+", "-", "*", "/", "%", "(", ")", ",", "INLIST", "MAKELIST", "REGEX", "REPLACE", "SPLIT",
       "regex", "/* c */", "-- c\n", "'^a.*'", "'[0-9]+'", "'a|b'", "convert_string_expressions:"]
)

_values = {
    "s": st.text(max_size=8),
    "b": st.booleans(),
    "y": st.integers(-128, 127),
    "h": st.integers(-32768, 32767),
    "i": st.integers(-(2**31), 2**31 - 1),
    "l": st.integers(-(2**63), 2**63 - 1),
    "f": st.floats(width=32),
    "d": st.floats(),
}
_property = st.sampled_from(sorted(_values)).flatmap(lambda code: _values[code].map(lambda v: [code, v]))
MESSAGES = st.fixed_dictionaries(
    {"props": st.dictionaries(st.sampled_from(NAMES), _property, max_size=6)},
    optional={
        "priority": st.integers(0, 9), "type": st.text(max_size=4), "redelivery": st.integers(0, 3),
        "persistent": st.booleans(), "timestamp": st.integers(0, 2**62), "group_seq": st.integers(-1, 5),
        "orig_dest": st.just("queue://Q.A"), "broker_path": st.just("[b1]"),
    },
).map(lambda fields: {"dest": "queue://Q", **fields})

FUZZ_EXAMPLES = int(os.environ.get("SELECTOR_FUZZ_EXAMPLES", "500"))  # raise it for a longer hunt
SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _parse_or_none(text: str):
    try:
        return parse_selector(text)
    except InvalidSelector as exc:
        assert exc.position is None or 1 <= exc.position <= len(text) + 1
        return None


def _evaluates_cleanly(redis_client, selector, message) -> None:
    try:
        result = evaluate_in_redis(redis_client, selector, message)
    except SelectorEvaluationError:
        event("runtime error")
        return
    except ResponseError as exc:  # a Lua error: a bug in the evaluator
        raise AssertionError(f"{selector.text!r}: {exc}") from exc
    assert result in (True, False, None)
    event(f"evaluated to {result}")


@SETTINGS
@given(text=st.text(max_size=60))
def test_any_text_parses_or_raises_invalid_selector(text):
    _parse_or_none(text)


@SETTINGS
@given(tokens=st.lists(st.sampled_from(TOKENS), max_size=14), message=MESSAGES, stomp=st.booleans())
def test_token_soup_parses_or_is_refused_and_what_parses_evaluates(redis_client, tokens, message, stomp):
    text = ("convert_string_expressions:" if stomp else "") + " ".join(tokens)
    selector = _parse_or_none(text)
    if selector is not None:
        _evaluates_cleanly(redis_client, selector, message)


def _extend(children):
    binary = st.sampled_from(["+", "-", "*", "/", "%", "=", "<>", "<", ">", "<=", ">=", "AND", "OR"])
    like = st.sampled_from(["'a%'", "'_'", "'%\u00e9%'", "'x!%' ESCAPE '!'"])
    return st.one_of(
        st.tuples(children, binary, children).map(lambda t: f"({t[0]}) {t[1]} ({t[2]})"),
        children.map(lambda c: f"NOT ({c})"),
        children.map(lambda c: f"-({c})"),
        children.map(lambda c: f"({c}) IS NULL"),
        children.map(lambda c: f"({c}) IS NOT NULL"),
        st.tuples(children, like).map(lambda t: f"({t[0]}) LIKE {t[1]}"),
        st.tuples(children, children, children).map(lambda t: f"({t[0]}) BETWEEN ({t[1]}) AND ({t[2]})"),
        st.sampled_from(NAMES).map(lambda n: f"{n} NOT IN ('a', '5', 'true')"),
        st.tuples(children, children).map(lambda t: f"INLIST(MAKELIST(({t[0]}), 'a'), ({t[1]}))"),
        children.map(lambda c: f"REGEX('^[a-z0-9]+$', ({c}))"),
        children.map(lambda c: f"REPLACE(({c}), '\\d', '#') = 'x'"),
        children.map(lambda c: f"SPLIT(({c}), ',') = MAKELIST('a')"),
    )


EXPRESSIONS = st.recursive(st.sampled_from(NAMES + HEADERS + LITERALS), _extend, max_leaves=10)


@SETTINGS
@given(text=EXPRESSIONS, message=MESSAGES, stomp=st.booleans())
def test_generated_expressions_evaluate_without_lua_errors(redis_client, text, message, stomp):
    try:
        selector = parse_selector(text, convert_string_expressions=stomp)
    except InvalidSelector:
        return
    _evaluates_cleanly(redis_client, selector, message)
