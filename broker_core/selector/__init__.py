"""JMS message selectors: parsed and type-checked here, compiled to JSON, evaluated only in Lua.

`parse_selector(text)` applies ActiveMQ's grammar and parse-time rules (spec §4.1) and returns a
`Selector` whose `compiled` JSON the scripts evaluate with scripts/lua/includes/selector.lua (spec §4.3).
There is no Python evaluator: `evaluate_in_redis` runs the same Lua through scripts/lua/selector_match.lua.

Compiled form (compact JSON, stable for a given text):
`{"v":2,"c":<bool>,"b":<bytes>,"B":<bytes>,"e":<node>}` where `c` turns on STOMP's string coercion,
`b` is what one evaluation may spend and `B` what the evaluations of one dispatch or browse call may
(limits.py), and a node is an array whose first element names it:

- literals `["s","text"]`, `["i",5]`, `["l",5]` (a decimal string beyond 2^53), `["d",1.5]` (`"1e999"` for
  infinity), `["b",true]`, `["null"]`; a negated numeric literal is folded into the literal;
- `["id",name]` a user property, `["hdr",name]` a JMS header identifier (spec §4.2);
- `["and",a,b,...]`, `["or",a,b,...]`, `["not",a]`, `["bool",prop]` (a property used as a condition);
- `["eq",a,b]` (`<>` is `["not",["eq",...]]`), `["lt"|"le"|"gt"|"ge",a,b]`, `["isnull",a]`;
  BETWEEN is `["and",["ge",v,lo],["le",v,hi]]`, NOT BETWEEN `["or",["lt",v,lo],["gt",v,hi]]`;
- `["like",a,<automaton>]` (NOT LIKE wraps it in "not"), `["in",prop,{"value":true,...},negated]`;
- `["add"|"sub"|"mul"|"div"|"mod",a,b]`, `["neg",a]`;
- `["xquery"]`, `["inlist",list,v]`, `["makelist",a,...]`, `["regex",<automaton>,v]`,
  `["replace",s,<span automata>,repl]`, `["split",s,<span automata>]` or with a limit argument.

Patterns are compiled to DFAs over UTF-8 bytes, which the Lua evaluator runs in one pass over the value
(automata.py describes both JSON forms). The regular-expression subset REGEX/REPLACE/SPLIT accept is
described in patterns.py; every limit on a selector is in limits.py.

Where Signalbox differs from ActiveMQ on purpose:
- XPATH is refused at parse time; the regular expression of REGEX/REPLACE/SPLIT must be a string
  literal in the supported subset (ActiveMQ compiles it per message, so a bad one fails at run time);
- a `--` comment may end at the end of input (ActiveMQ then lexes `-` `-`);
- integer literals beyond a long are refused (ActiveMQ makes them BigDecimal, comparing FALSE);
- numeric widening is symmetric (ActiveMQ compares Integer/Long/Float/Double on the left with a
  Byte/Short on the right as FALSE, and a Double with a Float throws); negating a byte or short gives
  an int (ActiveMQ throws); in the STOMP mode a boolean compared with a string converts the string
  (ActiveMQ throws a ClassCastException);
- long arithmetic is exact only below 2^53 and does not wrap at 2^63 (int arithmetic wraps as in Java);
  long comparisons are exact over the whole range.
"""

from __future__ import annotations

from .compiled import (
    COMPILED_VERSION,
    CONVERT_STRING_EXPRESSIONS_PREFIX,
    Selector,
    compile_optional,
    parse_selector,
)
from .evaluate import SelectorEvaluationError, evaluate_in_redis, evaluate_in_redis_async, message_json

__all__ = [
    "CONVERT_STRING_EXPRESSIONS_PREFIX",
    "COMPILED_VERSION",
    "Selector",
    "SelectorEvaluationError",
    "compile_optional",
    "evaluate_in_redis",
    "evaluate_in_redis_async",
    "message_json",
    "parse_selector",
]
