"""Loads the Lua scripts in scripts/ and says how to run them: as one Redis function library on Redis >= 7,
as EVALSHA scripts on older servers (an external Redis 6.2; the embedded Valkey runs the library).

Every state transition is one script (shared/design/architecture.md, decision 2). A script is a body
(scripts/lua/<name>.lua) that names the shared code it uses with `--@include name` lines at its top
(scripts/lua/includes/). Redis runs an EVAL script's whole text on every call, so every include's functions
are built again on each call; that set-up was the largest single cost of a one-message send. A function
library is different: Redis runs its top level once, when it is loaded, and each call runs only the
body. So where the server has functions (FUNCTION LOAD, Redis 7), all the includes are loaded once as
the library `signalbox_<hash>` and each script body is registered in it as the function
`sb<hash>_<name>`; elsewhere each script is its includes plus its body, run by EVALSHA. In both forms the
body is a function of KEYS and ARGV that starts with `base.begin_call(KEYS)` (includes/base.lua), which resets
the state a call may leave behind (each include's `--@on-call` blocks, made into one function here), so
the two behave the same. The hash covers the whole library, so processes running different versions of
the scripts never call each other's functions.

A server that lost its scripts or its library (a restart without persistence) answers NOSCRIPT or
"Function not found"; the caller loads them again and repeats the call (broker.py).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

SCRIPT_DIR = Path(__file__).with_name("lua")
_INCLUDE = re.compile(r"^--@include\s+(\S+)\s*$", re.MULTILINE)
# Scripts that include base.lua start with base.begin_call (selector_match needs no prefix).
# (its reply, when it has one, is the call's: a commit's step that is not to run, base.lua begin_call)
_BEGIN = "do local skipped = base.begin_call(KEYS) if skipped then return skipped end end\n"
# ... and a library function whose body uses base ends with base.end_call (it writes the events the call
# gathered: lua/includes/base.lua)
_END = "function(KEYS, ARGV) return base.end_call(body(KEYS, ARGV)) end"
# A script marked `--@allow-oom` runs when Redis is over its maxmemory (noeviction): those that consume,
# remove, read or keep the broker running, so consumers drain a full broker; those that store messages
# (send, topic_send, forward_done, move) are refused there (flow.RedisMaxMemory). A function gets Redis 7's
# `allow-oom` flag. An EVAL script has no flags (Redis 6.2), and Redis refuses only its first write that
# may grow memory (each later one is let through, the script being half done); so such a script starts
# with a write that cannot: DEL of a key that never exists, in the destination's hash tag (keyless scripts
# write nothing).
_ALLOW_OOM = re.compile(r"^--@allow-oom\s*$", re.MULTILINE)
_OOM_GUARD = "redis.call('DEL', KEYS[1] .. ':-')  -- (--@allow-oom: see scripts/library.py)\n"
_FUNCTIONS_ENV = "SIGNALBOX_REDIS_FUNCTIONS"
# An include's resets of the state a call keeps outside its functions sit between a line `--@on-call` and a
# line `--@on-call-end`, next to that state. They are taken out of their place and made, in their order,
# into the one function base.reset_call, after all the includes (every module table is in scope there),
# which base.begin_call runs first thing in every call (lua/includes/base.lua): one function rather than
# one per include, as a Lua call costs about what a reset's statements do (docs/benchmarks.md, "Session 26").
_ON_CALL = re.compile(r"^--@on-call\n(.*?)^--@on-call-end\n", re.MULTILINE | re.DOTALL)
_RESET_HEAD = "-- the includes' --@on-call blocks (scripts/library.py)\nfunction base.reset_call()\n"


def _expand(text: str, included: set[str]) -> str:
    """Inline `--@include name` lines; each include appears once per script, at its first mention."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in included:
            return ""
        included.add(name)
        return _expand((SCRIPT_DIR / "includes" / f"{name}.lua").read_text(), included)

    return _INCLUDE.sub(replace, text)


def _names() -> list[str]:
    return sorted(p.stem for p in SCRIPT_DIR.glob("*.lua"))


def _split(name: str) -> tuple[list[str], str]:
    """A script's includes (its `--@include` lines, all at its top) and its body."""
    text = (SCRIPT_DIR / f"{name}.lua").read_text()
    return _INCLUDE.findall(text), _INCLUDE.sub("", text)


def _includes_text(names: list[str]) -> tuple[str, set[str]]:
    """The includes `names` bring, expanded, then base.reset_call made of their `--@on-call` blocks."""
    included: set[str] = set()
    text = _expand("".join(f"--@include {n}\n" for n in names), included)
    resets = _ON_CALL.findall(text)
    if not resets:
        return text, included
    if "base" not in included:
        raise ValueError(f"--@on-call blocks without base.lua in {names}")
    text = _ON_CALL.sub("", text)
    blocks = "".join(f"do\n{block}end\n" for block in resets)
    return f"{text}{_RESET_HEAD}{blocks}end\n", included


@dataclass(frozen=True)
class Script:
    name: str
    source: str  # the EVAL form: includes, then the body as a function starting with base.begin_call
    sha: str
    function: str  # its name in the function library


@dataclass(frozen=True)
class Library:
    name: str
    source: str  # FUNCTION LOAD's argument


@cache
def library() -> Library:
    """Every script in one function library: the includes once, then each body as a function."""
    everything = sorted({n for name in _names() for n in _split(name)[0]})
    shared, _ = _includes_text(everything)
    bodies = []
    for name in _names():
        includes, body = _split(name)
        begin = _BEGIN if "base" in _includes_text(includes)[1] else ""
        bodies.append((name, begin + body, bool(_ALLOW_OOM.search(body))))
    # (the callbacks' template is in the digest too: a library that runs its bodies differently is another)
    digest = hashlib.sha1((shared + _END + "".join(f"{b}{oom}" for _, b, oom in bodies)).encode()
                          ).hexdigest()[:12]
    lib = f"signalbox_{digest}"
    parts = [f"#!lua name={lib}\n", shared]
    for name, body, allow_oom in bodies:
        # The body's KEYS and ARGV are the function's arguments; everything else it names is the library's.
        # A body that uses base ends with base.end_call, which writes the events it gathered (base.lua).
        flags = "flags = { 'allow-oom' }, " if allow_oom else ""
        callback = _END if body.startswith(_BEGIN) else "body"
        parts.append(f"\ndo\nlocal body = function(KEYS, ARGV)\n{body}\nend\n"
                     f"redis.register_function{{function_name = '{_function_name(digest, name)}', {flags}"
                     f"callback = {callback}}}\nend\n")
    return Library(lib, "".join(parts))


def _function_name(digest: str, name: str) -> str:
    return f"sb{digest}_{name}"


@cache
def script(name: str) -> Script:
    """The script `scripts/lua/<name>.lua` with its includes expanded."""
    includes, body = _split(name)
    shared, included = _includes_text(includes)
    # The body is a function here too, as in the library: its own locals then do not count towards
    # Lua's limit of 200 locals in one function, which the includes' top level nearly fills.
    guard = _OOM_GUARD if "KEYS[1]" in shared + body and _ALLOW_OOM.search(body) else ""
    if "base" in included:  # (begin_call first, end_call around: as in the library)
        head, tail = "return base.end_call((function(KEYS, ARGV)\n" + _BEGIN, "\nend)(KEYS, ARGV))\n"
    else:
        head, tail = "return (function(KEYS, ARGV)\n", "\nend)(KEYS, ARGV)\n"
    source = shared + head + guard + body + tail
    digest = library().name.removeprefix("signalbox_")
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest(), _function_name(digest, name))


# -- how a client runs them ------------------------------------------------------------------------------

def wants_functions(server_info: dict[str, Any]) -> bool:
    """Whether to use the function library on a server, from its INFO: Redis >= 7, unless the
    environment says SIGNALBOX_REDIS_FUNCTIONS=0 (to run the EVAL form on a new server)."""
    if os.environ.get(_FUNCTIONS_ENV, "1") == "0":
        return False
    major = str(server_info.get("redis_version", "0")).split(".")[0]
    return major.isdigit() and int(major) >= 7


def call_args(s: Script, functions: bool, keys: tuple | list, args: tuple | list) -> tuple:
    """The command that runs script `s` with these keys and arguments."""
    if functions:
        return ("FCALL", s.function, len(keys), *keys, *args)
    return ("EVALSHA", s.sha, len(keys), *keys, *args)


def load_args(s: Script | None, functions: bool) -> tuple:
    """The command that (re)loads what `call_args` needs: the library, or script `s`."""
    if functions or s is None:
        return ("FUNCTION", "LOAD", "REPLACE", library().source)
    return ("SCRIPT", "LOAD", s.source)


def is_missing(error: BaseException) -> bool:
    """Whether a reply error says the script or the library is not loaded on the server."""
    return isinstance(error, NoScriptError) or "Function not found" in str(error)
