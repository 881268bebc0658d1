"""A small Lua 5.1 tokenizer and the facts about an include file that test_include_shape.py checks.

Token-level, not a full parser: comments and strings are skipped as Lua reads them (long brackets
included), blocks are counted by their keywords (`function`, `do`, `if`, `repeat` open one; `end`,
`until` close one; `while` and `for` open theirs with their `do`), so "top level" means block depth 0
of the file's text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_LONG_OPEN = re.compile(r"\[(=*)\[")
_OPERATORS = ("...", "..", "==", "~=", "<=", ">=")
_OPENERS = {"function", "do", "if", "repeat"}
_CLOSERS = {"end", "until"}


@dataclass(frozen=True)
class Token:
    kind: str  # 'name', 'string', 'number', 'op'
    text: str
    line: int
    depth: int  # block depth before this token (its own `end` is still inside)
    pos: int  # offset in the source


def tokens(source: str) -> list[Token]:
    out: list[Token] = []
    i, line, depth, n = 0, 1, 0, len(source)
    while i < n:
        c = source[i]
        if c == "\n":
            line += 1
            i += 1
        elif c in " \t\r":
            i += 1
        elif source.startswith("--", i):
            long = _LONG_OPEN.match(source, i + 2)
            if long:
                end = source.index("]" + long.group(1) + "]", long.end())
                line += source.count("\n", i, end)
                i = end + len(long.group(0))
            else:
                end = source.find("\n", i)
                i = n if end < 0 else end
        elif c in "'\"":
            j = i + 1
            while source[j] != c:
                j += 2 if source[j] == "\\" else 1
            out.append(Token("string", source[i:j + 1], line, depth, i))
            line += source.count("\n", i, j)
            i = j + 1
        elif c == "[" and _LONG_OPEN.match(source, i):
            long = _LONG_OPEN.match(source, i)
            end = source.index("]" + long.group(1) + "]", long.end())
            out.append(Token("string", source[i:end + len(long.group(0))], line, depth, i))
            line += source.count("\n", i, end)
            i = end + len(long.group(0))
        elif _NAME.match(source, i):
            word = _NAME.match(source, i).group(0)
            if word in _CLOSERS:
                depth -= 1
            out.append(Token("name", word, line, depth if word not in _CLOSERS else depth + 1, i))
            if word in _OPENERS:
                depth += 1
            i += len(word)
        elif c.isdigit() or (c == "." and i + 1 < n and source[i + 1].isdigit()):
            number = _NUMBER.match(source, i).group(0)
            out.append(Token("number", number, line, depth, i))
            i += len(number)
        else:
            op = next((o for o in _OPERATORS if source.startswith(o, i)), c)
            out.append(Token("op", op, line, depth, i))
            i += len(op)
    # `while ... do` and `for ... do` open one block, counted at their `do`: nothing else to fix.
    return out


@dataclass
class Shape:
    top_locals: list[tuple[str, int]] = field(default_factory=list)  # (name, line) declared at depth 0
    global_writes: list[tuple[str, int]] = field(default_factory=list)  # assignments to free names
    free_uses: list[Token] = field(default_factory=list)  # every use of a name no local binds
    includes: list[str] = field(default_factory=list)


_KEYWORDS = {"and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local",
             "nil", "not", "or", "repeat", "return", "then", "true", "until", "while"}


def shape(source: str, known: set[str] = frozenset()) -> Shape:
    """The top-level locals of `source`, its `--@include` lines, and its assignments to names that are
    neither a local in scope nor in `known` (the module tables of other files): writes to globals."""
    result = Shape(includes=re.findall(r"^--@include\s+(\S+)\s*$", source, re.M))
    toks = tokens(source)
    # Scopes: a stack of (depth, names). A name is bound from its `local` (or parameter) on.
    scopes: list[tuple[int, set[str]]] = [(0, set())]
    brackets: list[str] = []
    loop_names: dict[int, list[str]] = {}  # a for loop's `do` -> the names it binds

    def bound(name: str) -> bool:
        return name in known or any(name in names for _, names in scopes)

    def declare(name: str, depth: int) -> None:
        if scopes[-1][0] != depth:
            scopes.append((depth, set()))
        scopes[-1][1].add(name)

    i = 0
    while i < len(toks):
        t = toks[i]
        while len(scopes) > 1 and scopes[-1][0] > t.depth:
            scopes.pop()
        if t.kind == "op" and t.text in "({[":
            brackets.append(t.text)
        elif t.kind == "op" and t.text in ")}]" and brackets:
            brackets.pop()
        if t.kind == "name" and t.text == "local":
            j = i + 1
            if toks[j].text == "function":
                if t.depth == 0:
                    result.top_locals.append((toks[j + 1].text, toks[j + 1].line))
                declare(toks[j + 1].text, t.depth)
                i = j  # its parameters, below
                continue
            names = []
            while toks[j].kind == "name":
                names.append(toks[j].text)
                if toks[j + 1].text != ",":
                    break
                j += 2
            if t.depth == 0:
                result.top_locals.extend((name, t.line) for name in names)
            # bound after the statement's expressions; declaring now only matters for `local x = x`
            for name in names:
                declare(name, t.depth)
            i = j + 1
            continue
        if t.kind == "name" and t.text == "function":
            # parameters are locals of the function's block (depth + 1)
            j = i + 1
            while toks[j].text != "(":
                j += 1
            # `function a.b()` / `function a:b()` assigns a field; `function a()` assigns a name
            named = toks[i + 1].kind == "name" and toks[i + 2].text == "("
            if named and (i == 0 or toks[i - 1].text != "local") and not bound(toks[i + 1].text):
                result.global_writes.append((toks[i + 1].text, t.line))
            if toks[i + 2].text == ":":
                declare("self", t.depth + 1)
            j += 1
            while toks[j].text != ")":
                if toks[j].kind == "name":
                    declare(toks[j].text, t.depth + 1)
                j += 1
            i = j + 1
            continue
        if t.kind == "name" and t.text == "for":
            j, names = i + 1, []
            while toks[j].text not in ("=", "in"):
                if toks[j].kind == "name":
                    names.append(toks[j].text)
                j += 1
            # bound inside the loop's block, which its `do` opens (the expressions before it cannot see them)
            k = j
            while not (toks[k].text == "do" and toks[k].depth == t.depth):
                k += 1
            loop_names[k] = names
            i = j + 1
            continue
        if t.kind == "name" and t.text == "do" and i in loop_names:
            for name in loop_names.pop(i):
                declare(name, t.depth + 1)
        is_key = bool(brackets) and brackets[-1] == "{" and toks[i - 1].text in ("{", ",", ";") and (
            i + 1 < len(toks) and toks[i + 1].text == "=")
        if (t.kind == "name" and t.text not in _KEYWORDS and (i == 0 or toks[i - 1].text not in (".", ":"))
                and not is_key and not any(t.text in names for _, names in scopes)):
            result.free_uses.append(t)
        if (t.kind == "name" and t.text not in _KEYWORDS and (i == 0 or toks[i - 1].text not in (".", ":"))
                and not bound(t.text)):
            # an assignment target: followed by '=' (a statement's own, not a table key) or by ', name ... ='
            nxt = toks[i + 1].text if i + 1 < len(toks) else ""
            is_key = brackets and brackets[-1] == "{" and toks[i - 1].text in ("{", ",", ";")
            if nxt == "=" and not is_key:
                result.global_writes.append((t.text, t.line))
            elif nxt == "," and not (brackets and brackets[-1] in "({"):
                j = i + 1
                while toks[j].text == "," and toks[j + 1].kind == "name":
                    j += 2
                    while toks[j].text == ".":
                        j += 2
                if toks[j].text == "=":
                    result.global_writes.append((t.text, t.line))
        i += 1
    return result
