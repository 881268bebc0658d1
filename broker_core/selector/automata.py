"""LIKE patterns and regexes compiled to DFAs over UTF-8 bytes, which the Lua evaluator runs in one pass.

Why automata: Lua patterns (what Signalbox used before) backtrack, and a Redis script cannot be
interrupted, so `REGEX('.*.*.*.*Z', s)` on a long property could hang the server. A DFA costs one table
lookup per byte of the subject whatever the pattern, so matching is linear in the subject; the pattern's
cost is paid here, at parse time, where it is bounded: a pattern whose automaton needs more than
MAX_PATTERN_STATES states (or the selector more than MAX_AUTOMATON_CELLS table entries, or the
construction more than MAX_CONSTRUCTION_STEPS steps) is refused with an error naming that limit.

A Pattern (read by patterns.py) is a sequence of items, each a character set with a repetition. Each item
becomes a small NFA over bytes (a UTF-8 character is one to four bytes; continuation bytes share one
chain per item, so a wildcard adds four NFA nodes), and the subset construction turns the NFA into a DFA
over the byte classes the pattern distinguishes.

Three uses:
- `find_automaton`: does the pattern occur (REGEX) or match the whole value (LIKE)? A plain subset DFA;
  for an unanchored pattern the start state keeps a "restart at the next character" thread. A state
  whose answer is already known (a REGEX has matched; `abc%` has read `abc`; nothing can match any
  more) becomes an absorbing state, where the Lua loop stops. This assumes the value is valid UTF-8,
  which every value reaching a selector is (it came through JSON or msgpack from Python strings).
- `span_automata` (REPLACE, SPLIT): where is the match java.util.regex's Matcher.find() returns? The
  forward DFA keeps its threads in priority order (greedy or lazy), drops every thread behind one that
  has matched, and reports the end of the leftmost match Java's backtracking would choose (the method
  of RE2's DFA); a second DFA of the reversed pattern, run backwards from that end, finds its leftmost
  start. Both runs are linear in the bytes they read.

The JSON form of an automaton (read by scripts/lua/includes/selector.lua): {"k": number of byte classes,
"c": the class + 1 of the bytes 0..255 in runs [count, class + 1, count, class + 1, ...], "t": the next
state of each (state, class) as state * k (so the Lua loop indexes t[state + class]), "f": 1 for each
accepting state, "s": the start state (times k), "x": the states below it (times k) are absorbing (every
byte leaves them where they are), so the run stops there; state 0 is the dead state}.
"""

from __future__ import annotations

from dataclasses import dataclass

from .limits import MAX_CONSTRUCTION_STEPS, MAX_PATTERN_STATES, over

ASCII = frozenset(range(0x80))
CONT = frozenset(range(0x80, 0xC0))
LEAD2, LEAD3, LEAD4 = frozenset(range(0xC0, 0xE0)), frozenset(range(0xE0, 0xF0)), frozenset(range(0xF0, 0xF8))


@dataclass(frozen=True, slots=True)
class CharSet:
    """One character: an ASCII code in `ascii`, any non-ASCII character when `nonascii`, or exactly the
    UTF-8 bytes `literal` (a non-ASCII literal)."""

    ascii: frozenset[int] = frozenset()
    nonascii: bool = False
    literal: bytes | None = None


ANY = CharSet(ASCII, True)  # LIKE's `_` and `%`: any character at all


@dataclass(frozen=True, slots=True)
class Item:
    chars: CharSet
    lo: int
    hi: int | None  # None: no upper bound
    lazy: bool = False


@dataclass(frozen=True, slots=True)
class Pattern:
    items: tuple[Item, ...]
    head: bool  # anchored at the start of the input
    tail: bool  # anchored at the end of the input


class AutomatonTooLarge(ValueError):
    """The pattern's automaton would exceed a limit; the message names it."""


# -- the NFA -------------------------------------------------------------------------------------------------

_BYTES, _SPLIT, _MATCH = 0, 1, 2


class _Nfa:
    """Nodes: (_BYTES, ((byte set, target), ...)) with disjoint sets, (_SPLIT, (target, ...)) in priority
    order, or (_MATCH,). Built back to front, so a node's targets exist before it."""

    def __init__(self) -> None:
        self.nodes: list[tuple] = [(_MATCH,)]
        self.inside: set[int] = set()  # nodes reached in the middle of a character

    MATCH = 0

    def add(self, node: tuple) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def switch(self, *edges: tuple[frozenset[int], int]) -> int:
        return self.add((_BYTES, tuple((s, t) for s, t in edges if s)))

    def char(self, cs: CharSet, then: int, reverse: bool) -> int:
        """One character of `cs`, then `then`; reversed: its bytes last to first."""
        if cs.literal is not None:
            node = then
            for b in (cs.literal if reverse else reversed(cs.literal)):
                if node != then:
                    self.inside.add(node)
                node = self.switch((frozenset((b,)), node))
            return node
        if not cs.nonascii:
            return self.switch((cs.ascii, then))
        if reverse:
            r3 = self.switch((LEAD4, then))
            r2 = self.switch((LEAD3, then), (CONT, r3))
            r1 = self.switch((LEAD2, then), (CONT, r2))
            self.inside.update((r1, r2, r3))
            return self.switch((cs.ascii, then), (CONT, r1))
        c1 = self.switch((CONT, then))
        c2 = self.switch((CONT, c1))
        c3 = self.switch((CONT, c2))
        self.inside.update((c1, c2, c3))
        return self.switch((cs.ascii, then), (LEAD2, c1), (LEAD3, c2), (LEAD4, c3))

    def item(self, it: Item, then: int, reverse: bool) -> int:
        node = then
        if it.hi is None:
            loop = self.add((_SPLIT, ()))
            body = self.char(it.chars, loop, reverse)
            self.nodes[loop] = (_SPLIT, (then, body) if it.lazy else (body, then))
            node = loop
        else:
            for _ in range(it.hi - it.lo):  # x{0,2} as (x(x)?)?: each optional copy only after the last
                body = self.char(it.chars, node, reverse)
                node = self.add((_SPLIT, (then, body) if it.lazy else (body, then)))
        for _ in range(it.lo):
            node = self.char(it.chars, node, reverse)
        return node

    def program(self, p: Pattern, reverse: bool, restart: bool) -> int:
        node = _Nfa.MATCH
        for it in (p.items if reverse else reversed(p.items)):
            node = self.item(it, node, reverse)
        if not restart:
            return node
        # Unanchored: a lowest-priority thread that skips one character and starts again.
        start = self.add((_SPLIT, ()))
        skip = self.char(ANY, start, reverse)
        self.nodes[start] = (_SPLIT, (node, skip))
        return start


# -- the subset construction ---------------------------------------------------------------------------------


def _classes(nfa: _Nfa) -> tuple[list[int], list[int]]:
    """The byte classes: bytes no node tells apart share one. Returns (class of each byte, a member)."""
    sets = {s for node in nfa.nodes if node[0] == _BYTES for s, _ in node[1]}
    signature: dict[tuple[bool, ...], int] = {}
    cmap, members = [], []
    ordered = sorted(sets, key=lambda s: sorted(s))
    for b in range(256):
        key = tuple(b in s for s in ordered)
        if key not in signature:
            signature[key] = len(members)
            members.append(b)
        cmap.append(signature[key])
    return cmap, members


class _Builder:
    def __init__(self, nfa: _Nfa, ordered: bool, sticky: bool, decide: bool = False) -> None:
        self.nfa = nfa
        self.ordered = ordered  # leftmost-first (priority lists with the cut) rather than plain sets
        self.sticky = sticky  # once matched, stay matched (REGEX finds): the absorbing match state
        self.decide = decide  # only the answer at the end matters: stop as soon as it is known
        self.cmap, self.members = _classes(nfa)
        self.steps = 0
        self._closure: dict[int, tuple[int, ...]] = {}

    def closure(self, node: int) -> tuple[int, ...]:
        """The byte nodes (and the match) reachable through splits, in priority order, up to the match."""
        done = self._closure.get(node)
        if done is not None:
            return done
        out: list[int] = []
        seen: set[int] = set()
        stack = [node]
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            kind = self.nfa.nodes[n][0]
            if kind == _SPLIT:
                stack.extend(reversed(self.nfa.nodes[n][1]))
            else:
                out.append(n)
                if kind == _MATCH and self.ordered:
                    break  # everything after the match has lower priority: cut
        result = tuple(out)
        self._closure[node] = result
        return result

    def follow(self, threads: tuple[int, ...]) -> tuple[int, ...]:
        """The thread list after following `threads` (each target's closure, in order, deduplicated)."""
        out: list[int] = []
        seen: set[int] = set()
        for t in threads:
            for n in self.closure(t):
                if n not in seen:
                    seen.add(n)
                    out.append(n)
                    if n == _Nfa.MATCH and self.ordered:
                        return tuple(out)
        return tuple(out) if self.ordered else tuple(sorted(out))

    def step(self, state: tuple[int, ...], byte: int) -> tuple[int, ...]:
        self.steps += len(state)
        if self.steps > MAX_CONSTRUCTION_STEPS:
            raise AutomatonTooLarge(over("max_construction_steps", "building its automaton takes", "steps"))
        targets = []
        for n in state:
            node = self.nfa.nodes[n]
            if node[0] == _BYTES:
                for s, t in node[1]:
                    if byte in s:
                        targets.append(t)
                        break
        return self.follow(tuple(targets))

    def build(self, start: int) -> dict:
        k = len(self.members)
        dead: tuple[int, ...] = ()
        matched = ("matched",)
        index: dict[tuple, int] = {dead: 0}
        order: list[tuple] = [dead]
        if self.sticky:
            index[matched] = 1
            order.append(matched)
        stop = len(order)

        def intern(state: tuple) -> int:
            if self.sticky and _Nfa.MATCH in state:
                state = matched
            found = index.get(state)
            if found is None:
                if len(order) >= MAX_PATTERN_STATES:
                    raise AutomatonTooLarge(over("max_pattern_states", "its automaton needs", "states"))
                found = index[state] = len(order)
                order.append(state)
            return found

        first = intern(self.follow((start,)))
        rows: list[list[int]] = []
        while len(rows) < len(order):
            i = len(rows)
            rows.append([i] * k if i < stop else [intern(self.step(order[i], b)) for b in self.members])
        flags = [1 if (s is matched or _Nfa.MATCH in s) else 0 for s in order]
        if self.decide:
            first = self.decided(order, rows, flags, first)
        # States that every byte leaves where they are end the run early (the Lua loop stops below "x"):
        # the dead state, and states like the one after the prefix of `abc%`, whose answer is then known.
        reachable, stack = {0, first}, [first]
        while stack:
            for t in rows[stack.pop()]:
                if t not in reachable:
                    reachable.add(t)
                    stack.append(t)
        absorbing = [i for i in sorted(reachable) if all(t == i for t in rows[i])]
        rest = sorted(reachable - set(absorbing))
        new = {old: n for n, old in enumerate(absorbing + rest)}
        table = [new[t] * k for old in absorbing + rest for t in rows[old]]
        runs: list[int] = []  # the byte classes as runs: [count, class + 1, count, class + 1, ...]
        for c in self.cmap:
            if runs and runs[-1] == c + 1:
                runs[-2] += 1
            else:
                runs += [1, c + 1]
        return {"k": k, "c": runs, "t": table,
                "f": [flags[old] for old in absorbing + rest], "s": new[first] * k, "x": len(absorbing) * k}

    def decided(self, order: list[tuple], rows: list[list[int]], flags: list[int], first: int) -> int:
        """Send every state whose answer is already known to an absorbing state: dead when no accepting
        state can follow, accepting when every state that can follow at a character boundary accepts
        (the value is UTF-8, so it ends at one). `abc%` then stops after `abc`. Returns the new start;
        `rows` and `flags` are changed in place (states nothing reaches any more stay, unused)."""
        # Only the edges valid UTF-8 can take: at a boundary an ASCII or a lead byte, inside a character a
        # continuation byte (a stray byte goes to the dead state, which would otherwise make every state
        # look as if it could still fail).
        boundary = [not any(n in self.nfa.inside for n in s) for s in order]
        groups = [_group(b) for b in self.members]
        preds: list[set[int]] = [set() for _ in rows]
        for i, row in enumerate(rows):
            for c, t in enumerate(row):
                if (groups[c] == "cont") != boundary[i] and groups[c] != "invalid":
                    preds[t].add(i)

        def reaching(targets: list[int]) -> set[int]:
            found, stack = set(targets), list(targets)
            while stack:
                for p in preds[stack.pop()]:
                    if p not in found:
                        found.add(p)
                        stack.append(p)
            return found

        may_reject = reaching([i for i in range(len(rows)) if boundary[i] and not flags[i]])
        may_accept = reaching([i for i in range(len(rows)) if flags[i]])
        sure = [i for i in range(len(rows)) if i not in may_reject]
        if not sure:
            accept = -1
        else:
            accept = next((i for i in sure if all(t == i for t in rows[i])), -1)
            if accept < 0:
                accept = len(rows)
                rows.append([accept] * len(rows[0]))
                flags.append(1)
        sure_set = set(sure)

        def target(t: int) -> int:
            if t in sure_set or t == accept:
                return accept
            return t if t in may_accept else 0

        for row in rows:
            row[:] = [target(t) for t in row]
        return target(first)


def _group(b: int) -> str:
    if b < 0x80:
        return "ascii"
    if b < 0xC0:
        return "cont"
    return "lead" if b < 0xF8 else "invalid"


def cells(compiled: dict) -> int:
    """Transition-table entries of an automaton or of span automata (what MAX_AUTOMATON_CELLS counts)."""
    if "t" in compiled:
        return len(compiled["t"])
    return sum(len(a["t"]) for a in compiled.values() if isinstance(a, dict))


def find_automaton(p: Pattern) -> dict:
    """The DFA deciding whether `p` occurs in the value (matches all of it when anchored at both ends)."""
    nfa = _Nfa()
    start = nfa.program(p, reverse=False, restart=not p.head)
    return _Builder(nfa, ordered=False, sticky=not p.tail, decide=True).build(start)


def span_automata(p: Pattern) -> dict:
    """The DFAs that find Matcher.find()'s span: {"f": forward, "r": reversed (absent when anchored at the
    start, where a match starts where the search does), "a": 1 when anchored at the start, "z": 1 when at
    the end}. Anchored at the end, every match ends there, so the forward DFA only decides whether one
    does; otherwise it keeps leftmost-first priorities to find where Java's match ends."""
    nfa = _Nfa()
    start = nfa.program(p, reverse=False, restart=not p.head)
    out: dict = {"f": _Builder(nfa, ordered=not p.tail, sticky=False).build(start)}
    if p.head:
        out["a"] = 1
    else:
        rnfa = _Nfa()
        rstart = rnfa.program(p, reverse=True, restart=False)
        out["r"] = _Builder(rnfa, ordered=False, sticky=False).build(rstart)
    if p.tail:
        out["z"] = 1
    return out
