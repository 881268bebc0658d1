"""scripts/calls.py is the one place that knows how a script is called and where a value sits in its reply
(issue #22): each Lua script has exactly one typed call there, only calls.py builds a script call (`Eval`),
no other module indexes a raw reply, and every script that runs a dispatch chunk ends its reply with the
shared tail."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import broker_core
from broker_core.scripts import calls
from broker_core.scripts.library import SCRIPT_DIR

PACKAGE = Path(broker_core.__file__).parent
CALLS = PACKAGE / "scripts" / "calls.py"


def _scripts() -> list[str]:
    return sorted(p.stem for p in SCRIPT_DIR.glob("*.lua"))


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != CALLS)


def test_each_script_has_exactly_one_typed_call_and_each_call_a_script():
    typed = [c for c in vars(calls).values()
             if isinstance(c, type) and issubclass(c, calls.ScriptCall) and c is not calls.ScriptCall]
    names = [c.script for c in typed]
    assert sorted(names) == _scripts()  # (a name twice would show here)
    assert len(set(names)) == len(names)
    for c in typed:  # named after its script
        assert c.__name__ == _camel(c.script), c


def test_calls_build_each_eval_with_their_own_script():
    """Every Eval in calls.py is made from the class's own `script` (no name typed twice)."""
    tree = ast.parse(CALLS.read_text())
    made = [node for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Eval"]
    assert made
    for node in made:
        first = node.args[0]
        assert isinstance(first, ast.Attribute) and first.attr == "script", ast.unparse(node)
        assert isinstance(first.value, ast.Name) and first.value.id == "cls", ast.unparse(node)


def test_no_other_module_builds_a_script_call():
    """Only calls.py constructs an Eval: every script call goes through a typed builder."""
    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
                name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                if name == "Eval" and path.name != "effects.py":
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == []


def test_no_other_module_indexes_a_raw_reply():
    """No subscript of a name called `reply`, and no search for a separator in one, outside calls.py."""
    def is_reply(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == "reply"

    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            indexed = isinstance(node, ast.Subscript) and is_reply(node.value)
            searched = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "index" and is_reply(node.func.value))
            if indexed or searched:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_every_script_that_dispatches_ends_its_reply_with_the_tail():
    """A script that runs a dispatch chunk (or a topic's deliveries) can leave work behind: its replies that
    are not errors or early answers end with the tail dispatch.add_tail (includes/dispatch.lua) appends, which
    calls.split reads."""
    runs = re.compile(r"\bdispatch\.chunk\(|\btopic\.deliver\(")
    for name in _scripts():
        body = (SCRIPT_DIR / f"{name}.lua").read_text()
        if runs.search(body):
            assert "dispatch.add_tail(" in body, name
