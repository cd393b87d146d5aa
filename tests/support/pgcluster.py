"""Throwaway PostgreSQL clusters for the tests (the product's ``subscriber.runtime.embedded``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from subscriber.runtime.embedded import (
    DEFAULT_MAJOR,
    PgCluster,
    PgSetupError,
    available_majors,
    bin_dir,
    free_port,
)

__all__ = [
    "DEFAULT_MAJOR",
    "PgCluster",
    "PgSetupError",
    "available_majors",
    "bin_dir",
    "free_port",
    "running_cluster",
    "wait_until",
]


@contextlib.contextmanager
def running_cluster(major: int, **settings: str) -> Iterator[PgCluster]:
    cluster = PgCluster(major=major, settings=settings).start()
    try:
        yield cluster
    finally:
        cluster.destroy()


def wait_until(
    condition: object, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"
) -> None:
    """Poll ``condition()`` until it is truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():  # type: ignore[operator]
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
