"""pytest fixtures for Spark with Delta: one local session per test run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apply.delta.session import SparkSettings, build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = build_session(SparkSettings(master="local[2]", app_name="pgsub-tests"))
    yield session
    session.stop()


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    """A temporary Delta root for one test."""
    root = tmp_path / "warehouse"
    root.mkdir()
    return root
