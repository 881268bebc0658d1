"""The Spark session every analytics job uses: local[*] by default, any cluster via SIGNALBOX_SPARK_MASTER."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"


def spark_master() -> str:
    return os.environ.get("SIGNALBOX_SPARK_MASTER") or DEFAULT_MASTER


def spark_session(app_name: str = "signalbox-analytics", master: str | None = None) -> SparkSession:
    """A SparkSession for `app_name` on `master` (default: SIGNALBOX_SPARK_MASTER, else local[*])."""
    from pyspark.sql import SparkSession  # imported here: starting the JVM is the caller's choice

    builder = (
        SparkSession.builder.appName(app_name)
        .master(master or spark_master())
        # Event timestamps are epoch milliseconds in UTC; keep Spark from shifting them to local time.
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
    )
    return builder.getOrCreate()
