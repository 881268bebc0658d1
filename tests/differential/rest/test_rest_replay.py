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

from pathlib import Path

import pytest

from tests.differential.rest.runner import run
from tests.differential.runner import flatten
from tests.differential.suite import Suite

pytestmark = pytest.mark.e2e

SUITE = Suite(Path(__file__).parent)


def test_every_scenario_has_golden_facts():
    for group in SUITE.groups:
        golden = SUITE.golden(group)
        assert set(golden) == set(SUITE.scenarios(group)), group
        assert all(golden.values()), group


def test_every_deliberate_difference_names_golden_facts():
    """A pattern that matches no recorded fact excuses nothing: stale, or a typo."""
    assert not SUITE.stale_patterns()


@pytest.mark.parametrize("group", SUITE.groups)
def test_signalbox_does_what_activemq_did(signalbox, group):
    differences = SUITE.differences(
        group, lambda scenario: flatten(run(scenario, signalbox.http, signalbox.tcp, ("alice", "secret"))))
    assert not differences, f"{len(differences)} facts differ:\n" + "\n".join(differences)
