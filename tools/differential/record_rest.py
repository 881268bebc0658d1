"""Record what ActiveMQ's REST servlet (`/api/message`) does in the REST differential scenarios
(tests/differential/rest/scenarios/<group>.json) as golden files (tests/differential/rest/golden/), for
tests/differential/rest/test_replay.py to compare Signalbox with.

    python -m tools.differential.record_rest [--http http://127.0.0.1:8161] [--stomp tcp://127.0.0.1:61613]
                                             [--runs 3] [group ...]

Run it against ActiveMQ 5.17.2 with its activemq-web MessageServlet (the REST API under /api/message,
HTTP Basic admin/admin) and a STOMP connector on the same broker (see tests/differential/rest/README.md).
Each scenario runs `--runs` times; only facts observed identically in every run are kept, as
tools/differential/record.py keeps them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.differential.rest.runner import run  # noqa: E402
from tests.differential.runner import flatten  # noqa: E402
from tools.differential.record import record_groups, record_scenarios, write_golden  # noqa: E402

SUITE = ROOT / "tests" / "differential" / "rest"


def record_group(path: Path, http: str, stomp: str, runs: int) -> tuple[int, int]:
    golden: dict[str, dict] = {}
    counts = record_scenarios(path.stem, json.loads(path.read_text()),
                              lambda scenario: flatten(run(scenario, http, stomp, ("admin", "admin"))), runs,
                              golden)
    write_golden(SUITE / "golden", path, golden)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--http", default="http://127.0.0.1:8161")
    parser.add_argument("--stomp", default="tcp://127.0.0.1:61613")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("groups", nargs="*")
    args = parser.parse_args()
    record_groups(SUITE / "scenarios", args.groups,
                  lambda path: record_group(path, args.http, args.stomp, args.runs))


if __name__ == "__main__":
    main()
