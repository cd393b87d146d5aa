"""Fixtures for every test: real PostgreSQL servers and one local Spark session.

A run stopped with SIGTERM (a CI timeout, ``kill``) ends like one stopped
with Ctrl-C: pytest runs the fixtures' teardown, so no PostgreSQL server,
daemon or Spark cluster started by a test outlives the run.
"""

from __future__ import annotations

import signal
from types import FrameType

import pytest

pytest_plugins = [
    "tests.plugins.postgres",
    "tests.plugins.spark",
    "tests.plugins.s3",
    "tests.plugins.docker",
]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    signal.signal(signal.SIGTERM, _interrupt)
