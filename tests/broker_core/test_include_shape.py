"""The shape of the Lua includes (issue #22): each scripts/lua/includes/<name>.lua defines one module table
named after its file, `<name>`, holding its functions and constants, and no other top-level local; nothing
assigns a global (the scripts' call state lives in module tables, reset by base.begin_call); and a
script's `--@include` lines bring every module it names, and it names every module it includes.

Checked on the text, token by token (lua_shape.py), not by running it."""

from __future__ import annotations

import pytest

from broker_core.scripts.library import SCRIPT_DIR, library, script

from .lua_shape import shape

INCLUDES = {p.stem: p.read_text() for p in sorted((SCRIPT_DIR / "includes").glob("*.lua"))}
SCRIPTS = {p.stem: p.read_text() for p in sorted(SCRIPT_DIR.glob("*.lua"))}

# A top-level local besides the module table, allowed where a measurement showed a hot path needs it:
# {include: {local name: why}}. (None so far.)
HOT_ALIASES: dict[str, dict[str, str]] = {}

# every include, base.lua too (the last to become one, `base`)
MODULES = set(INCLUDES)
# what Redis gives a script or a function body
REDIS_NAMES = {"KEYS", "ARGV"}


def test_the_tokenizer_reads_every_file_to_depth_zero():
    from .lua_shape import tokens

    for name, text in [*INCLUDES.items(), *SCRIPTS.items()]:
        last = tokens(text)[-1]
        assert last.depth - (last.text in ("end", "until")) == 0, name


@pytest.mark.parametrize("name", sorted(MODULES))
def test_an_include_is_one_module_table_named_after_its_file(name):
    top = shape(INCLUDES[name]).top_locals
    allowed = {name, *HOT_ALIASES.get(name, {})}
    assert [n for n, _ in top if n not in allowed] == [], f"{name}.lua: top-level locals besides `{name}`"
    assert [n for n, _ in top].count(name) == 1, f"{name}.lua must declare `local {name}` once"


@pytest.mark.parametrize("name", sorted([f"includes/{n}" for n in INCLUDES] + list(SCRIPTS)))
def test_nothing_assigns_a_global(name):
    text = INCLUDES[name.removeprefix("includes/")] if name.startswith("includes/") else SCRIPTS[name]
    known = MODULES | REDIS_NAMES
    assert shape(text, known).global_writes == []


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_script_has_each_module_it_names_declared_before_it(name):
    # the text Redis runs (the EVAL form: includes expanded in order, then the body): a module named
    # where its `local` is not in scope yet, or not there at all, would be a global (nil)
    free = {t.text for t in shape(script(name).source, REDIS_NAMES).free_uses}
    assert free & MODULES == set(), f"{name}.lua: modules named before (or without) their include"


def test_the_library_has_each_module_declared_before_it_is_named():
    free = {t.text for t in shape(library().source, REDIS_NAMES).free_uses}
    assert free & MODULES == set()


def _closure(names: list[str]) -> set[str]:
    """The includes `names` bring, with those they include."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(shape(INCLUDES[name]).includes)
    return seen


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_script_includes_only_modules_it_uses(name):
    # each module include is one the script names, or brings a module it names that the script's other
    # includes do not bring (dispatch.lua brings message, consumers, groups, ...)
    found = shape(SCRIPTS[name])
    named = {t.text for t in found.free_uses} & MODULES
    if "base" in found.includes:  # its body starts with base.begin_call (scripts/library.py puts it there)
        named.add("base")
    for include in found.includes:
        if include not in MODULES:
            continue
        others = _closure([n for n in found.includes if n != include])
        brought = _closure([include]) - others
        assert include in named or brought & named, f"{name}.lua includes {include}, names nothing it brings"


# The globals Redis's Lua offers that the scripts use (Lua 5.1's base library and Redis's own libraries).
LUA_GLOBALS = {"redis", "cjson", "cmsgpack", "bit", "struct", "string", "table", "math", "tonumber",
               "tostring", "type", "pairs", "ipairs", "next", "select", "unpack", "pcall", "error",
               "setmetatable", "getmetatable", "rawget", "rawset", "assert"}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_script_names_nothing_undeclared(name):
    # a name left over from before a rename (a function moved into a module table) reads as a global: nil
    free = {t.text for t in shape(script(name).source, REDIS_NAMES).free_uses}
    assert free - LUA_GLOBALS - REDIS_NAMES == set()


@pytest.mark.parametrize("name", sorted(INCLUDES))
def test_an_includes_resets_are_whole_blocks(name):
    # (a marker without its end would leave its statements where they are: run once, when the library
    # loads, and never again at the start of a call)
    lines = INCLUDES[name].splitlines()
    opened = [i for i, line in enumerate(lines) if line.rstrip() == "--@on-call"]
    closed = [i for i, line in enumerate(lines) if line.rstrip() == "--@on-call-end"]
    assert len(opened) == len(closed), f"{name}.lua: an --@on-call block without its end"
    assert all(o < c for o, c in zip(opened, closed, strict=True))
    assert all(c < o for c, o in zip(closed, opened[1:], strict=False)), f"{name}.lua: nested --@on-call"


@pytest.mark.parametrize("source", ["library", *sorted(SCRIPTS)])
def test_every_reset_is_in_base_reset_call(source):
    # base.begin_call runs base.reset_call (scripts/library.py makes it of the includes' --@on-call
    # blocks): each block of every include the text holds is in it, and none is left where it was
    text = library().source if source == "library" else script(source).source
    lines = text.splitlines()
    assert "--@on-call" not in lines and "--@on-call-end" not in lines
    brought = sorted(INCLUDES) if source == "library" else sorted(_closure(shape(SCRIPTS[source]).includes))
    blocks = [block for n in brought
              for block in INCLUDES[n].split("--@on-call\n")[1:]]
    if not blocks:
        assert "function base.reset_call()" not in text
        return
    head, _, generated = text.partition("function base.reset_call()\n")
    assert head and generated
    for block in blocks:
        statements = block.split("--@on-call-end\n")[0]
        assert statements in generated and statements not in head
