"""One local Spark session for every analytics test (starting one costs ~10-30 s on this machine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from analytics.archive import ArchiveLocation, write_entries
from tests.analytics.journal import Journal, generate


@pytest.fixture(scope="session")
def spark() -> Iterator:
    from analytics.spark import DEFAULT_MASTER, spark_session

    # The default master, so tests/test_analytics_spark.py (which checks it) can reuse this session.
    session = spark_session("signalbox-tests", DEFAULT_MASTER)
    try:
        yield session
    finally:
        session.stop()


def archive_journal(journal: Journal, root: Path) -> ArchiveLocation:
    """Write a journal as the archiver lays it out (one batch file per destination and day)."""
    location = ArchiveLocation.parse(root)
    for destination, entries in journal.entries.items():
        write_entries(location, destination, entries)
    return location


@pytest.fixture(scope="session")
def journal() -> Journal:
    return generate(seed=7)


@pytest.fixture(scope="session")
def archived_journal(journal: Journal, tmp_path_factory) -> ArchiveLocation:
    return archive_journal(journal, tmp_path_factory.mktemp("archive"))
