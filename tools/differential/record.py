"""Record what ActiveMQ does in the differential scenarios (tests/differential/scenarios/<group>.json) as
golden files (tests/differential/golden/<group>.json), for tests/differential/test_replay.py to compare
Signalbox with.

    python -m tools.differential.record [--url tcp://127.0.0.1:61613] [--runs 3] [group ...]
    python -m tools.differential.record --url ... --only <scenario> [--only ...] <group>

`--only` records the named scenarios of the group and keeps the rest of its golden file as it was
(scenarios added to a group recorded earlier, without running its others again).

Run it against ActiveMQ 5.17.2 configured as tests/differential/activemq/activemq.xml (Debian's
`activemq` package; see tests/differential/README.md). Each scenario runs `--runs` times; only facts
observed identically in every run are kept (the others are timing, not behaviour), and the recorder
prints how many facts each group keeps and how many it dropped as unstable.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.differential.runner import flatten, run  # noqa: E402

SCENARIOS = ROOT / "tests" / "differential" / "scenarios"
GOLDEN = ROOT / "tests" / "differential" / "golden"


def split_stable(observed: list[dict]) -> tuple[dict, list[str]]:
    """(the facts every run observed identically, the names of the others: timing, not behaviour)."""
    stable = {fact: value for fact, value in observed[0].items()
              if all(other.get(fact, object()) == value for other in observed[1:])}
    return stable, sorted(set().union(*observed) - set(stable))


def record_scenarios(group: str, scenarios: dict[str, dict], observe: Callable[[dict], dict], runs: int,
                     golden: dict[str, dict]) -> tuple[int, int]:
    """Run each scenario `runs` times (`observe`: one run's facts, flattened) and keep in `golden` the facts
    every run observed identically, naming the others; (facts kept, facts dropped as unstable)."""
    kept = dropped = 0
    for name, scenario in scenarios.items():
        golden[name], unstable = split_stable([observe(scenario) for _ in range(runs)])
        kept += len(golden[name])
        dropped += len(unstable)
        if unstable:
            print(f"  {group}/{name}: unstable, dropped: {', '.join(unstable)}")
    return kept, dropped


def write_golden(directory: Path, group: Path, golden: dict[str, dict]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / group.name).write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")


def record_groups(scenarios: Path, groups: list[str],
                  record_group: Callable[[Path], tuple[int, int]]) -> None:
    """Record the groups named (every group when none) of the scenario files in `scenarios`, printing each
    group's facts and the total."""
    paths = sorted(scenarios.glob("*.json"))
    if groups:
        paths = [p for p in paths if p.stem in groups]
    total = 0
    for path in paths:
        kept, dropped = record_group(path)
        total += kept
        print(f"{path.stem}: {kept} facts ({dropped} unstable dropped)")
    print(f"total: {total} facts in {len(paths)} groups")


def record_group(path: Path, url: str, runs: int, only: list[str] | None = None) -> tuple[int, int]:
    scenarios = json.loads(path.read_text())
    golden: dict[str, dict] = {}
    if only:
        unknown = sorted(set(only) - set(scenarios))
        if unknown:
            raise SystemExit(f"{path.stem} has no scenario {', '.join(unknown)}")
        golden = json.loads((GOLDEN / path.name).read_text())
        scenarios = {name: scenario for name, scenario in scenarios.items() if name in only}
    counts = record_scenarios(path.stem, scenarios,
                              lambda scenario: flatten(run(scenario, url, ("admin", "admin"))), runs, golden)
    write_golden(GOLDEN, path, golden)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="tcp://127.0.0.1:61613")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", action="append", metavar="SCENARIO",
                        help="record only this scenario of the (one) group named, keeping the others")
    parser.add_argument("groups", nargs="*")
    args = parser.parse_args()
    if args.only and len(args.groups) != 1:
        parser.error("--only needs exactly one group")
    record_groups(SCENARIOS, args.groups, lambda path: record_group(path, args.url, args.runs, args.only))


if __name__ == "__main__":
    main()
