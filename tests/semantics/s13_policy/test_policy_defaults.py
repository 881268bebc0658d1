"""The scripts' fallback policy values (includes/base.lua base.POLICY_NAMES/POLICY_DEFAULTS, used where a
destination has no policy hash) equal what Python writes for a destination no policy entry matches
(CLASS_DEFAULTS): otherwise such a destination would behave one way in Lua and be shown another way."""

import re

from broker_core.config.entry import CLASS_DEFAULTS, PolicyEntry
from broker_core.destinations import parse_destination
from broker_core.scripts.library import SCRIPT_DIR

BASE_LUA = SCRIPT_DIR / "includes" / "base.lua"


def _lua_table(source: str, name: str) -> list[str]:
    body = re.search(rf"base\.{name} = \{{(.*?)\n\}}", source, re.S)
    assert body, f"{name} not found in {BASE_LUA}"
    text = re.sub(r"--[^\n]*", "", body.group(1))  # comments inside the table
    return re.findall(r"'([^']*)'", text)


def test_lua_policy_defaults_equal_python_policy_entry_defaults():
    source = BASE_LUA.read_text()
    names, defaults = _lua_table(source, "POLICY_NAMES"), _lua_table(source, "POLICY_DEFAULTS")
    assert len(names) == len(defaults) and len(names) > 30
    python = CLASS_DEFAULTS.to_redis_hash()
    # written beside the attributes by ops/context.py: where this policy sends a dead queue message
    python["deadLetterTarget"] = CLASS_DEFAULTS.dead_letter_destination_for(parse_destination("queue://q")).uri
    # read by Lua only for the bucket map, where Python resolves it to ActiveMQ's bucketCount
    python["groupMapBucketCount"] = PolicyEntry(message_group_map_factory_type="bucket").to_redis_hash()[
        "groupMapBucketCount"]
    differing = {}
    for name, lua in zip(names, defaults, strict=True):
        assert name in python, f"Lua reads policy field {name!r}, which PolicyEntry does not write"
        py = python[name]
        same = lua == py or (_number(lua) is not None and _number(lua) == _number(py))
        if not same:
            differing[name] = (lua, py)
    assert not differing, f"Lua default != Python default (lua, python): {differing}"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
