"""The Spark session every analytics job uses: local[*] by default, any cluster via SIGNALBOX_SPARK_MASTER.

The machine set-up Spark needs is done here, not by the user: in local mode the driver binds to the
loopback interface (a host name that resolves to an unreachable address otherwise stalls start-up), and
Python workers run the interpreter that runs the driver (the virtualenv's, with pyarrow and this package)
unless PYSPARK_PYTHON says otherwise.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"


def spark_master() -> str:
    """SIGNALBOX_SPARK_MASTER, else the Django setting of that name (when Django is set up), else local[*]."""
    if os.environ.get("SIGNALBOX_SPARK_MASTER"):
        return os.environ["SIGNALBOX_SPARK_MASTER"]
    try:
        from django.conf import settings

        if settings.configured and getattr(settings, "SIGNALBOX_SPARK_MASTER", ""):
            return str(settings.SIGNALBOX_SPARK_MASTER)
    except ImportError:  # plain spark-submit without Django installed
        pass
    return DEFAULT_MASTER


def _default_shuffle_partitions(master: str) -> int:
    if master.startswith("local"):
        cores = master[len("local"):].strip("[]").split(",")[0]
        if cores.isdigit():
            return max(int(cores), 1)
        if cores == "*" or cores == "":
            return os.cpu_count() or 2
    return 8


def prepare_environment(master: str) -> None:
    """Environment the driver JVM and the Python workers read at start-up."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def spark_session(app_name: str = "signalbox-analytics", master: str | None = None) -> SparkSession:
    """A SparkSession for `app_name` on `master` (default: spark_master()). An active session (one that
    spark-submit started, or a test's) is reused with its own master."""
    from pyspark.sql import SparkSession  # imported here: starting the JVM is the caller's choice

    builder = SparkSession.builder.appName(app_name)
    if master is None and os.environ.get("PYSPARK_GATEWAY_PORT"):
        # Launched by spark-submit: its --master (already in the JVM's conf) decides.
        master = SparkSession.builder.getOrCreate().sparkContext.master
    else:
        master = master or spark_master()
        builder = builder.master(master)
    prepare_environment(master)
    builder = (
        builder
        # Event timestamps are epoch milliseconds in UTC; keep Spark from shifting them to local time.
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Spark's default of 200 shuffle partitions is mostly scheduling overhead on a few cores: in local
        # mode one per core (local[2] -> 2), else 8 (adaptive execution coalesces small ones either way).
        .config("spark.sql.shuffle.partitions", os.environ.get("SIGNALBOX_SPARK_SHUFFLE_PARTITIONS")
                or str(_default_shuffle_partitions(master)))
        .config("spark.sql.adaptive.enabled", "true")
    )
    if os.environ.get("SIGNALBOX_SPARK_DRIVER_MEMORY"):  # local mode: the executors live in the driver
        builder = builder.config("spark.driver.memory", os.environ["SIGNALBOX_SPARK_DRIVER_MEMORY"])
    if master.startswith("local"):
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host",
                                                                                   "127.0.0.1")
    return builder.getOrCreate()
