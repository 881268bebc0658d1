"""Loads the Lua scripts in scripts/, expanding `--@include name` lines, and runs them by EVALSHA.

Every state transition is one script (shared/design/architecture.md, decision 2). Scripts are plain
EVAL scripts (no FUNCTION LOAD) so any Redis >= 6.2 runs them; a NOSCRIPT reply after a server restart
reloads the script transparently.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SCRIPT_DIR = Path(__file__).with_name("scripts")
_INCLUDE = re.compile(r"^--@include\s+(\S+)\s*$", re.MULTILINE)


def _expand(text: str, included: set[str]) -> str:
    """Inline `--@include name` lines; each include appears once per script, at its first mention."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in included:
            return ""
        included.add(name)
        return _expand((SCRIPT_DIR / "includes" / f"{name}.lua").read_text(), included)

    return _INCLUDE.sub(replace, text)


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str


@cache
def script(name: str) -> Script:
    """The script `scripts/<name>.lua` with its includes expanded."""
    source = _expand((SCRIPT_DIR / f"{name}.lua").read_text(), set())
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())
