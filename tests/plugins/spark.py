"""pytest fixtures for Spark with Delta: one local session per test run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apply.delta.spark.session import SparkSettings, build_session

# The whole suite shares one JVM: room for its hundreds of tables, beside the daemons.
DRIVER_MEMORY = "2g"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    settings = SparkSettings(
        master="local[2]", app_name="pgsub-tests", conf={"spark.driver.memory": DRIVER_MEMORY}
    )
    session = build_session(settings)
    yield session
    session.stop()


@pytest.fixture
def warehouse(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A temporary Delta root for one test; its tables leave the shared JVM's caches after it
    (Delta keeps a snapshot per table path: over a suite of tests, the heap filled up)."""
    root = tmp_path / "warehouse"
    root.mkdir()
    yield root
    if "spark" in request.fixturenames:
        session = request.getfixturevalue("spark")
        with contextlib.suppress(Exception):  # best effort: never fail a test on cleanup
            session._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
            session.catalog.clearCache()
