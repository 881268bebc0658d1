"""Recursive-descent parser for JMS selectors with ActiveMQ's parse-time rules (spec §4.1).

It mirrors SelectorParser.jj level by level (OR, AND, equality, comparison, additive, multiplicative,
unary, primary; `NOT` is unary, so `NOT a = b` is `(NOT a) = b`) and applies the checks ActiveMQ makes
while building the tree: the top level and the operands of AND/OR/NOT must be boolean expressions or
properties; `< <= > >=` (and BETWEEN) refuse literal strings/booleans/NULL and boolean expressions;
`=`/`<>` refuse NULL; a boolean literal on the left of `=` needs a boolean literal on the right when both
are literals; IN needs a property on its left. Each node carries its compiled JSON form (see __init__).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidSelector
from .automata import AutomatonTooLarge, Pattern, cells, find_automaton, span_automata
from .lexer import Token, tokenize
from .limits import (
    MAX_AUTOMATON_CELLS,
    MAX_NESTING,
    MAX_PATTERN_LENGTH,
    MAX_PATTERNS,
    MAX_SELECTOR_LENGTH,
    MAX_TERMS,
    MAX_TREE_DEPTH,
    over,
)
from .patterns import RegexUnsupported, compile_like, java_regex

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
EXACT_DOUBLE = 2**53  # integers beyond this travel as decimal strings so Lua keeps them exact

# Identifiers that map to message headers (spec §4.2); everything else is a user property.
HEADER_IDENTIFIERS = frozenset({
    "JMSDestination", "JMSReplyTo", "JMSType", "JMSDeliveryMode", "JMSPriority", "JMSMessageID",
    "JMSTimestamp", "JMSCorrelationID", "JMSExpiration", "JMSRedelivered", "JMSXDeliveryCount",
    "JMSXGroupID", "JMSXGroupSeq", "JMSXUserID", "JMSXProducerTXID", "JMSActiveMQBrokerInTime",
    "JMSActiveMQBrokerOutTime", "JMSActiveMQBrokerPath", "JMSXGroupFirstForConsumer",
})

# name -> (minimum arguments, maximum arguments or None, returns a boolean)
FUNCTIONS: dict[str, tuple[int, int | None, bool]] = {
    "INLIST": (2, 2, True),
    "MAKELIST": (1, None, False),
    "REGEX": (2, 2, True),
    "REPLACE": (3, 3, False),
    "SPLIT": (2, 3, False),
}
_REGEX_ARGUMENT = {"REGEX": 0, "REPLACE": 1, "SPLIT": 1}


@dataclass(frozen=True, slots=True)
class Node:
    """A parsed expression: its compiled JSON, where it came from, and what ActiveMQ's checks look at."""

    json: Any
    start: int  # 0-based offsets into the selector text
    end: int
    boolean: bool = False  # an ActiveMQ BooleanExpression (comparison, logic, NOT, TRUE/FALSE/NULL, ...)
    literal: str | None = None  # for a literal: 's', 'i', 'l', 'd', 'b', 'null', or 'big' (> long)
    value: Any = None
    prop: str | None = None  # for a bare identifier
    depth: int = 1

    @property
    def position(self) -> int:
        return self.start + 1


def _literal_json(kind: str, value: Any) -> list[Any]:
    if kind == "null":
        return ["null"]
    if kind in ("i", "l") and abs(value) > EXACT_DOUBLE:
        return [kind, str(value)]
    if kind == "d" and value in (float("inf"), float("-inf")):
        return ["d", "1e999" if value > 0 else "-1e999"]
    return [kind, value]


class Parser:
    def __init__(self, text: str, offset: int) -> None:
        self.text = text
        self.tokens = tokenize(text, offset)
        self.k = 0
        self.nesting = 0
        self.identifiers: set[str] = set()
        self.terms = 0
        self.patterns = 0
        self.cells = 0

    # -- token helpers ---------------------------------------------------------------------------------

    @property
    def tok(self) -> Token:
        return self.tokens[self.k]

    def next(self) -> Token:
        t = self.tokens[self.k]
        if t.kind != "eof":
            self.k += 1
        return t

    def at_op(self, *ops: str) -> bool:
        return self.tok.kind == "op" and self.tok.value in ops

    def at_kw(self, *words: str) -> bool:
        return self.tok.kind == "kw" and self.tok.value in words

    def peek_kw(self, word: str) -> bool:
        nxt = self.tokens[min(self.k + 1, len(self.tokens) - 1)]
        return nxt.kind == "kw" and nxt.value == word

    def expected(self, what: str, token: Token | None = None) -> InvalidSelector:
        t = token or self.tok
        return InvalidSelector(f"expected {what}, found {t.describe()}", position=t.start + 1, expected=what)

    def expect_op(self, op: str) -> Token:
        if not self.at_op(op):
            raise self.expected(f"'{op}'")
        return self.next()

    def string_literal(self, what: str) -> Token:
        if self.tok.kind != "str":
            raise self.expected(what)
        return self.next()

    def source(self, node: Node) -> str:
        shown = self.text[node.start: node.end]
        return shown if len(shown) <= 40 else shown[:37] + "..."

    # -- node construction -----------------------------------------------------------------------------

    def make(self, json: list[Any], start: int, end: int, children: tuple[Node, ...], **flags: Any) -> Node:
        for child in children:
            if child.literal == "big":
                raise InvalidSelector(
                    f"integer literal {child.value} does not fit in a long", position=child.position,
                    expected="a number between -9223372036854775808 and 9223372036854775807",
                )
        depth = 1 + max((c.depth for c in children), default=0)
        if depth > MAX_TREE_DEPTH:
            raise InvalidSelector(over("max_tree_depth", "the selector nests operations", "deep"),
                                  position=start + 1)
        return Node(json, start, end, depth=depth, **flags)

    def as_boolean(self, node: Node, context: str) -> Node:
        """ActiveMQ's asBooleanExpression: a property becomes a boolean cast; other values are refused."""
        if node.boolean:
            return node
        if node.prop is not None:
            return self.make(["bool", node.json], node.start, node.end, (node,), boolean=True)
        raise InvalidSelector(
            f"{context} must be a boolean expression or a property, not {self.source(node)!r}",
            position=node.position, expected="a boolean expression or a property",
        )

    def check_orderable(self, node: Node, op: str) -> None:
        """ComparisonExpression.checkLessThanOperand."""
        if node.literal is not None and node.literal not in ("i", "l", "d", "big"):
            raise InvalidSelector(
                f"{self.source(node)} cannot be compared with '{op}': only numeric literals can",
                position=node.position, expected="a number, a property or an arithmetic expression",
            )
        if node.boolean:
            raise InvalidSelector(
                f"the boolean expression {self.source(node)!r} cannot be compared with '{op}'",
                position=node.position, expected="a number, a property or an arithmetic expression",
            )

    def equality(self, left: Node, right: Node, op: str) -> Node:
        """ComparisonExpression.createEqual / createNotEqual."""
        for side in (left, right):
            if side.literal == "null":
                fix = "IS NULL" if op == "=" else "IS NOT NULL"
                raise InvalidSelector(
                    f"NULL cannot be compared with '{op}'; use {fix}", position=side.position, expected=fix
                )
        if left.literal == "b" and right.literal is not None and right.literal != "b":
            raise InvalidSelector(
                f"{self.source(left)} cannot be compared with {self.source(right)}",
                position=right.position, expected="TRUE or FALSE",
            )
        node = self.make(["eq", left.json, right.json], left.start, right.end, (left, right), boolean=True)
        if op == "<>":
            node = self.make(["not", node.json], left.start, right.end, (node,), boolean=True)
        return node

    def ordering(self, op: str, left: Node, right: Node) -> Node:
        self.check_orderable(left, op)
        self.check_orderable(right, op)
        tag = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge"}[op]
        return self.make([tag, left.json, right.json], left.start, right.end, (left, right), boolean=True)

    def logic(self, tag: str, operands: list[Node]) -> Node:
        return self.make(
            [tag, *(o.json for o in operands)], operands[0].start, operands[-1].end, tuple(operands),
            boolean=True,
        )

    # -- grammar ---------------------------------------------------------------------------------------

    def selector(self) -> Node:
        node = self.or_expr()
        if self.tok.kind != "eof":
            raise self.expected("an operator or the end of the selector")
        return self.as_boolean(node, "the selector")

    def or_expr(self) -> Node:
        first = self.and_expr()
        if not self.at_kw("OR"):
            return first
        operands = [self.as_boolean(first, "an operand of OR")]
        while self.at_kw("OR"):
            self.next()
            operands.append(self.as_boolean(self.and_expr(), "an operand of OR"))
        return self.logic("or", operands)

    def and_expr(self) -> Node:
        first = self.equality_expr()
        if not self.at_kw("AND"):
            return first
        operands = [self.as_boolean(first, "an operand of AND")]
        while self.at_kw("AND"):
            self.next()
            operands.append(self.as_boolean(self.equality_expr(), "an operand of AND"))
        return self.logic("and", operands)

    def equality_expr(self) -> Node:
        left = self.comparison_expr()
        while True:
            if self.at_op("=", "<>"):
                op = self.next().value
                right = self.comparison_expr()
                left = self.equality(left, right, str(op))
            elif self.at_kw("IS"):
                self.next()
                negate = False
                if self.at_kw("NOT"):
                    self.next()
                    negate = True
                if not self.at_kw("NULL"):
                    raise self.expected("NULL" if negate else "NULL or NOT NULL")
                end = self.next().end
                node = self.make(["isnull", left.json], left.start, end, (left,), boolean=True)
                if negate:
                    node = self.make(["not", node.json], left.start, end, (node,), boolean=True)
                left = node
            else:
                return left

    def comparison_expr(self) -> Node:
        left = self.add_expr()
        while True:
            if self.at_op("<", "<=", ">", ">="):
                op = str(self.next().value)
                left = self.ordering(op, left, self.add_expr())
                continue
            negate = False
            if self.at_kw("NOT") and any(self.peek_kw(w) for w in ("LIKE", "BETWEEN", "IN")):
                self.next()
                negate = True
            elif self.at_kw("NOT"):
                self.next()
                raise self.expected("LIKE, BETWEEN or IN after NOT")
            if self.at_kw("LIKE"):
                left = self.like(left, negate)
            elif self.at_kw("BETWEEN"):
                left = self.between(left, negate)
            elif self.at_kw("IN"):
                left = self.in_list(left, negate)
            else:
                return left

    def like(self, left: Node, negate: bool) -> Node:
        self.next()
        pattern = self.string_literal("a string literal (the LIKE pattern)")
        escape: str | None = None
        end = pattern.end
        if self.at_kw("ESCAPE"):
            self.next()
            esc = self.string_literal("a string literal (the ESCAPE character)")
            escape = str(esc.value)
            # Java counts UTF-16 code units, so a character outside the BMP is two.
            if len(escape.encode("utf-16-le")) != 2:
                raise InvalidSelector(
                    f"the ESCAPE string must be exactly one character, not {esc.text}",
                    position=esc.start + 1, expected="a single-character string such as '\\'",
                )
            end = esc.end
        automaton = self.automaton("the LIKE pattern", pattern, lambda text: compile_like(text, escape))
        node = self.make(["like", left.json, automaton], left.start, end, (left,), boolean=True)
        if negate:
            node = self.make(["not", node.json], left.start, end, (node,), boolean=True)
        return node

    def between(self, value: Node, negate: bool) -> Node:
        self.next()
        low = self.add_expr()
        if not self.at_kw("AND"):
            raise self.expected("AND (BETWEEN low AND high)")
        self.next()
        high = self.add_expr()
        if negate:  # createNotBetween: value < low OR value > high
            parts = [self.ordering("<", value, low), self.ordering(">", value, high)]
            return self.logic("or", parts)
        parts = [self.ordering(">=", value, low), self.ordering("<=", value, high)]
        return self.logic("and", parts)

    def in_list(self, left: Node, negate: bool) -> Node:
        self.next()
        if left.prop is None:
            raise InvalidSelector(
                f"IN needs a property on its left, not {self.source(left)!r}",
                position=left.position, expected="a property name",
            )
        self.expect_op("(")
        values: dict[str, bool] = {}
        while True:
            item = self.string_literal("a string literal (IN lists hold only strings)")
            self.term(item)
            values[str(item.value)] = True
            if self.at_op(","):
                self.next()
                continue
            if not self.at_op(")"):
                raise self.expected("',' or ')'")
            end = self.next().end
            break
        return self.make(["in", left.json, values, negate], left.start, end, (left,), boolean=True)

    def add_expr(self) -> Node:
        left = self.mult_expr()
        while self.at_op("+", "-"):
            op = self.next().value
            right = self.mult_expr()
            tag = "add" if op == "+" else "sub"
            left = self.make([tag, left.json, right.json], left.start, right.end, (left, right))
        return left

    def mult_expr(self) -> Node:
        left = self.unary_expr()
        while self.at_op("*", "/", "%"):
            op = self.next().value
            right = self.unary_expr()
            tag = {"*": "mul", "/": "div", "%": "mod"}[str(op)]
            left = self.make([tag, left.json, right.json], left.start, right.end, (left, right))
        return left

    def unary_expr(self) -> Node:
        self.nesting += 1
        try:
            if self.nesting > MAX_NESTING:
                raise InvalidSelector(
                    over("max_nesting", "the selector nests parentheses or unary operators", "deep"),
                    position=self.tok.start + 1,
                )
            return self._unary()
        finally:
            self.nesting -= 1

    def _unary(self) -> Node:
        t = self.tok
        if self.at_op("+"):
            self.next()
            operand = self.unary_expr()
            # ActiveMQ drops a unary plus altogether: `+a` is still the property a, `+'x'` the literal.
            return Node(operand.json, t.start, operand.end, operand.boolean, operand.literal, operand.value,
                        operand.prop, operand.depth)
        if self.at_op("-"):
            self.next()
            operand = self.unary_expr()
            return self.negate(operand, t.start)
        if self.at_kw("NOT"):
            self.next()
            operand = self.as_boolean(self.unary_expr(), "the operand of NOT")
            return self.make(["not", operand.json], t.start, operand.end, (operand,), boolean=True)
        if self.at_kw("XPATH"):
            raise InvalidSelector(
                "XPATH selectors are not supported by Signalbox", position=t.start + 1,
                expected="a selector without XPATH",
            )
        if self.at_kw("XQUERY"):
            self.next()
            query = self.string_literal("a string literal (the XQuery expression)")
            return Node(["xquery"], t.start, query.end, boolean=True)
        if t.kind == "id" and self.tokens[self.k + 1].kind == "op" and self.tokens[self.k + 1].value == "(":
            return self.function_call()
        return self.primary()

    def negate(self, operand: Node, start: int) -> Node:
        if operand.literal == "big" and operand.value == 2**63:
            return Node(_literal_json("l", LONG_MIN), start, operand.end, depth=1)
        if operand.literal in ("i", "l", "d"):
            # Fold the literal (keeping its type, and Java's wrap-around of MIN_VALUE); the node is still
            # not a literal for the parse-time checks, exactly as ActiveMQ's negate expression is not.
            value = operand.value
            if operand.literal == "i":
                value = INT_MIN if value == INT_MIN else -value
            elif operand.literal == "l":
                value = LONG_MIN if value == LONG_MIN else -value
            else:
                value = -value
            return Node(_literal_json(operand.literal, value), start, operand.end, depth=1)
        return self.make(["neg", operand.json], start, operand.end, (operand,))

    def function_call(self) -> Node:
        name_token = self.next()
        name = str(name_token.value)
        if name not in FUNCTIONS:
            hint = ""
            if name.upper() in FUNCTIONS:
                hint = f" (function names are case-sensitive: write {name.upper()})"
            raise InvalidSelector(
                f"unknown function {name!r}{hint}", position=name_token.start + 1,
                expected="one of " + ", ".join(sorted(FUNCTIONS)),
            )
        self.expect_op("(")
        args: list[Node] = []
        arg_tokens: list[Token] = []
        while True:
            arg_tokens.append(self.tok)
            args.append(self.unary_expr())
            if self.at_op(","):
                self.next()
                continue
            if not self.at_op(")"):
                raise self.expected("',' or ')' (function arguments cannot contain binary operators)")
            end = self.next().end
            break
        low, high, returns_boolean = FUNCTIONS[name]
        if len(args) < low or (high is not None and len(args) > high):
            count = str(low) if low == high else (f"{low} or {high}" if high else f"at least {low}")
            raise InvalidSelector(
                f"{name} takes {count} argument{'s' if count != '1' else ''}, not {len(args)}",
                position=name_token.start + 1, expected=f"{count} arguments",
            )
        payload: list[Any] = [a.json for a in args]
        regex_index = _REGEX_ARGUMENT.get(name)
        if regex_index is not None:
            payload[regex_index] = self.regex_argument(name, args[regex_index], arg_tokens[regex_index])
        return self.make(
            [name.lower(), *payload], name_token.start, end, tuple(args), boolean=returns_boolean
        )

    def regex_argument(self, name: str, arg: Node, token: Token) -> str:
        if arg.literal != "s" or token.kind != "str" or token.end != arg.end:
            raise InvalidSelector(
                f"the regular expression of {name} must be a string literal in Signalbox",
                position=arg.position, expected="a string literal",
            )
        try:
            spans = name != "REGEX"
            return self.automaton(
                f"the {name} pattern", token, lambda text: java_regex(text, spans=spans), spans
            )
        except RegexUnsupported as exc:
            raise InvalidSelector(
                f"{name} pattern: {exc.message}", position=_string_position(token, exc.index),
                expected="a regular expression in the supported subset",
            ) from None

    def automaton(self, what: str, token: Token, read: Callable[[str], Pattern], spans: bool = False) -> dict:
        """The automaton (automata.py) of the pattern in string literal `token`, within the limits: the
        one deciding a match, or with `spans` those finding where matches are (REPLACE, SPLIT)."""
        at = token.start + 1
        self.patterns += 1
        if self.patterns > MAX_PATTERNS:
            raise InvalidSelector(
                over("max_patterns", "the selector has", "patterns (LIKE, REGEX, REPLACE, SPLIT)"),
                position=at,
            )
        text = str(token.value)
        if len(text) > MAX_PATTERN_LENGTH:
            raise InvalidSelector(over("max_pattern_length", f"{what} has", "characters"), position=at)
        pattern = read(text)
        try:
            automaton = span_automata(pattern) if spans else find_automaton(pattern)
        except AutomatonTooLarge as exc:
            raise InvalidSelector(f"{what} is too complex: {exc}", position=at) from None
        self.cells += cells(automaton)
        if self.cells > MAX_AUTOMATON_CELLS:
            raise InvalidSelector(
                over("max_automaton_cells", "the selector's patterns need", "automaton table entries"),
                position=at,
            )
        return automaton

    def term(self, token: Token) -> None:
        self.terms += 1
        if self.terms > MAX_TERMS:
            raise InvalidSelector(
                over("max_terms", "the selector has", "terms (literals, properties, IN values)"),
                position=token.start + 1,
            )

    def primary(self) -> Node:
        t = self.tok
        if t.kind in ("str", "int", "float", "id") or self.at_kw("TRUE", "FALSE", "NULL"):
            self.term(t)
        if t.kind == "str":
            self.next()
            return Node(_literal_json("s", t.value), t.start, t.end, literal="s", value=t.value)
        if t.kind == "int":
            self.next()
            value = int(t.value)  # type: ignore[call-overload]
            kind = "i" if value <= INT_MAX else ("l" if value <= LONG_MAX else "big")
            json = _literal_json(kind, value) if kind != "big" else ["big"]
            return Node(json, t.start, t.end, literal=kind, value=value)
        if t.kind == "float":
            self.next()
            return Node(_literal_json("d", t.value), t.start, t.end, literal="d", value=t.value)
        if self.at_kw("TRUE", "FALSE"):
            self.next()
            value = t.value == "TRUE"
            return Node(["b", value], t.start, t.end, boolean=True, literal="b", value=value)
        if self.at_kw("NULL"):
            self.next()
            return Node(["null"], t.start, t.end, boolean=True, literal="null")
        if t.kind == "id":
            self.next()
            name = str(t.value)
            self.identifiers.add(name)
            tag = "hdr" if name in HEADER_IDENTIFIERS else "id"
            return Node([tag, name], t.start, t.end, prop=name)
        if self.at_op("("):
            self.next()
            inner = self.or_expr()
            close = self.expect_op(")")
            return Node(inner.json, t.start, close.end, inner.boolean, inner.literal, inner.value,
                        inner.prop, inner.depth)
        raise self.expected("an expression (a literal, a property, a function call or '(')")


def _string_position(token: Token, index: int) -> int:
    """1-based selector position of character `index` of the decoded string literal `token`."""
    raw = token.text
    j, decoded = 1, 0
    while j < len(raw) - 1 and decoded < index:
        j += 2 if raw[j] == "'" else 1
        decoded += 1
    return token.start + j + 1


def parse(text: str, offset: int) -> tuple[Node, frozenset[str]]:
    """Parse text[offset:]; returns the boolean root node and the identifiers it references."""
    if len(text) > MAX_SELECTOR_LENGTH:
        raise InvalidSelector(over("max_selector_length", "the selector has", "characters"),
                              position=MAX_SELECTOR_LENGTH + 1)
    parser = Parser(text, offset)
    root = parser.selector()
    return root, frozenset(parser.identifiers)
