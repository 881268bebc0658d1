"""Signalbox's ActiveMQ-compatible REST API (`/api/message`) against ActiveMQ 5.17.2's MessageServlet, fact
by fact: every scenario of tests/differential/rest/scenarios is replayed over HTTP (and STOMP over TCP
where a fact shows only there) and what Signalbox does is compared with what ActiveMQ did
(tests/differential/rest/golden, recorded by tools/differential/record_rest.py; ActiveMQ is not needed
here).

A golden fact that Signalbox does not reproduce fails the test, unless
tests/differential/rest/deliberate.json lists it (a pattern over `<group>/<scenario>/<fact>`) with the
reason: the deliberate differences docs/api.md explains ("Where the compatible API differs from
ActiveMQ's")."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest

from tests.differential.rest.runner import run
from tests.differential.runner import flatten

pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent
GROUPS = sorted(p.stem for p in (HERE / "golden").glob("*.json"))
DELIBERATE: dict[str, str] = json.loads((HERE / "deliberate.json").read_text())


def deliberate(key: str) -> str | None:
    return next((reason for pattern, reason in DELIBERATE.items() if fnmatch.fnmatchcase(key, pattern)), None)


def test_every_scenario_has_golden_facts():
    for group in GROUPS:
        scenarios = json.loads((HERE / "scenarios" / f"{group}.json").read_text())
        golden = json.loads((HERE / "golden" / f"{group}.json").read_text())
        assert set(golden) == set(scenarios), group
        assert all(golden.values()), group


def test_every_deliberate_difference_names_golden_facts():
    """A pattern that matches no recorded fact excuses nothing: stale, or a typo."""
    keys = [f"{group}/{name}/{fact}" for group in GROUPS
            for name, facts in json.loads((HERE / "golden" / f"{group}.json").read_text()).items()
            for fact in facts]
    stale = [pattern for pattern in DELIBERATE if not fnmatch.filter(keys, pattern)]
    assert not stale, stale


@pytest.mark.parametrize("group", GROUPS)
def test_signalbox_does_what_activemq_did(signalbox, group):
    scenarios = json.loads((HERE / "scenarios" / f"{group}.json").read_text())
    golden = json.loads((HERE / "golden" / f"{group}.json").read_text())
    differences: list[str] = []
    for name, expected in golden.items():
        observed = flatten(run(scenarios[name], signalbox.http, signalbox.tcp, ("alice", "secret")))
        for fact, value in expected.items():
            key = f"{group}/{name}/{fact}"
            got = observed.get(fact, "<absent>")
            if got != value and deliberate(key) is None:
                differences.append(f"{key}: ActiveMQ {value!r}, Signalbox {got!r}")
    assert not differences, f"{len(differences)} facts differ:\n" + "\n".join(differences)
