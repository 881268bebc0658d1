"""A differential suite's files, read one way for both suites (STOMP: tests/differential; the compatible
REST API: tests/differential/rest): `scenarios/<group>.json` (what to do), `golden/<group>.json` (what
ActiveMQ did: facts per scenario) and `deliberate.json` (patterns over `<group>/<scenario>/<fact>`, each
with the reason Signalbox differs there)."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Suite:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.groups = sorted(p.stem for p in (folder / "golden").glob("*.json"))
        self.deliberate_patterns: dict[str, str] = json.loads((folder / "deliberate.json").read_text())

    def scenarios(self, group: str) -> dict[str, Any]:
        return json.loads((self.folder / "scenarios" / f"{group}.json").read_text())

    def golden(self, group: str) -> dict[str, dict[str, Any]]:
        return json.loads((self.folder / "golden" / f"{group}.json").read_text())

    def deliberate(self, key: str) -> str | None:
        """The reason Signalbox differs on fact `key`, if deliberate.json lists it."""
        return next((reason for pattern, reason in self.deliberate_patterns.items()
                     if fnmatch.fnmatchcase(key, pattern)), None)

    def stale_patterns(self) -> list[str]:
        """deliberate.json's patterns that match no recorded fact: they excuse nothing (stale, or a typo)."""
        keys = [f"{group}/{name}/{fact}" for group in self.groups
                for name, facts in self.golden(group).items() for fact in facts]
        return [pattern for pattern in self.deliberate_patterns if not fnmatch.filter(keys, pattern)]

    def differences(self, group: str, observe: Callable[[Any], dict[str, Any]]) -> list[str]:
        """Each golden fact of `group` that Signalbox (`observe(scenario)`: its facts) does not reproduce
        and that is not deliberate."""
        scenarios = self.scenarios(group)
        out: list[str] = []
        for name, expected in self.golden(group).items():
            observed = observe(scenarios[name])
            for fact, value in expected.items():
                key = f"{group}/{name}/{fact}"
                got = observed.get(fact, "<absent>")
                if got != value and self.deliberate(key) is None:
                    out.append(f"{key}: ActiveMQ {value!r}, Signalbox {got!r}")
        return out
