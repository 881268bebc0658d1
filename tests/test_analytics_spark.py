"""Spark runs in local mode on the machine the README targets (Python 3.11 + Java 17)."""

from __future__ import annotations

import pytest

from analytics.spark import DEFAULT_MASTER, spark_master, spark_session

pytestmark = pytest.mark.e2e


def test_the_master_defaults_to_local_and_follows_the_environment(monkeypatch):
    monkeypatch.delenv("SIGNALBOX_SPARK_MASTER", raising=False)
    assert spark_master() == DEFAULT_MASTER == "local[*]"
    monkeypatch.setenv("SIGNALBOX_SPARK_MASTER", "spark://analytics:7077")
    assert spark_master() == "spark://analytics:7077"


def test_a_local_session_aggregates_and_round_trips_parquet(tmp_path, monkeypatch):
    monkeypatch.delenv("SIGNALBOX_SPARK_MASTER", raising=False)
    spark = spark_session("signalbox-test")
    try:
        assert spark.sparkContext.master == "local[*]"
        events = spark.createDataFrame(
            [("orders", "enqueue", 1), ("orders", "ack", 2), ("audit", "enqueue", 3)],
            ["destination", "event", "at_ms"],
        )
        events.write.parquet(str(tmp_path / "events"))
        counts = {
            row["destination"]: row["count"]
            for row in spark.read.parquet(str(tmp_path / "events")).groupBy("destination").count().collect()
        }
        assert counts == {"orders": 2, "audit": 1}
    finally:
        spark.stop()
