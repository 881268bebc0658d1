"""Every limit on what a selector may be and on what evaluating one may cost, in one place.

A selector is untrusted input that Redis evaluates inside a script, where nothing can interrupt it, so
each limit below bounds either the parse (Python, on the request path) or the work of one evaluation
(Lua). A selector over a limit is refused when it is parsed, with an error naming the limit; an
evaluation over MAX_EVALUATION_BYTES is a runtime error, which makes the selector not match that message
(docs/api.md "Selector limits").
"""

from __future__ import annotations

MAX_SELECTOR_LENGTH = 8192  # characters of selector text
MAX_NESTING = 48  # parentheses / unary operators; keeps Python's recursion well inside its limit
MAX_TREE_DEPTH = 96  # the compiled tree; cjson refuses JSON deeper than 1000 levels
MAX_TERMS = 1024  # literals, properties and IN-list values
MAX_PATTERNS = 16  # LIKE, REGEX, REPLACE and SPLIT patterns
MAX_PATTERN_LENGTH = 1024  # characters of one LIKE pattern or regular expression
MAX_REPEAT = 100  # the largest count in a regex repetition {n,m}
MAX_PATTERN_STATES = 2048  # states of one pattern's automaton (a pattern usually needs a few dozen)
MAX_AUTOMATON_CELLS = 8192  # transition-table entries of all the selector's automata (~40 kB of JSON)
MAX_CONSTRUCTION_STEPS = 400_000  # parse-time work building one automaton (0.1-0.3 s of Python)
# Bytes one evaluation may run through automata or produce with REPLACE; beyond it the selector fails on
# that message (no match). At about 0.1 us a byte this keeps one evaluation to a few milliseconds.
MAX_EVALUATION_BYTES = 256 * 1024
# A dispatch, browse or move-matching chunk ends once its evaluations have spent this much (after at
# least one message), and the next call goes on from there. (256 KiB let one message offered to 100
# consumers with 100 kB regexes take 22 ms in a call on a quiet machine, bench/adversarial.py; 128 KiB
# keeps such a call to about two evaluations.)
MAX_CALL_EVALUATION_BYTES = 128 * 1024

LIMITS = {
    "max_selector_length": MAX_SELECTOR_LENGTH,
    "max_nesting": MAX_NESTING,
    "max_tree_depth": MAX_TREE_DEPTH,
    "max_terms": MAX_TERMS,
    "max_patterns": MAX_PATTERNS,
    "max_pattern_length": MAX_PATTERN_LENGTH,
    "max_repeat": MAX_REPEAT,
    "max_pattern_states": MAX_PATTERN_STATES,
    "max_automaton_cells": MAX_AUTOMATON_CELLS,
    "max_construction_steps": MAX_CONSTRUCTION_STEPS,
    "max_evaluation_bytes": MAX_EVALUATION_BYTES,
    "max_call_evaluation_bytes": MAX_CALL_EVALUATION_BYTES,
}


def over(name: str, what: str, unit: str) -> str:
    """The wording of every limit error: what is too big, the limit's value and its name."""
    return f"{what} more than {LIMITS[name]} {unit} (limit {name})"
