"""The pipeline runs under plain spark-submit (its own JVM, its --master) and writes the same summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analytics import jobs
from tests.analytics import reference
from tests.analytics.journal import START_MS

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_spark_submit_runs_the_pipeline_file_and_writes_the_summary(archived_journal, journal, tmp_path):
    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PYSPARK_PYTHON",
                                                            "SIGNALBOX_SPARK_MASTER")}
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"  # spark-submit runs `python3` from PATH
    command = [str(venv_bin / "spark-submit"), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
               str(ROOT / "analytics" / "pipeline.py"), "--archive", archived_journal.root,
               "--output", str(tmp_path / "out"), "--since", str(START_MS - 1),
               "--until", str(START_MS + 86_400_000), "--redis-url", ""]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed["destinations"] == ["queue://audit", "queue://orders"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    expected = reference.per_minute(journal.rows())
    for destination, entry in summary["destinations"].items():
        for name in jobs.COUNTER_NAMES:
            total = sum(v[name] for (d, _minute), v in expected.items() if d == destination)
            assert entry["totals"][name] == total, (destination, name)
