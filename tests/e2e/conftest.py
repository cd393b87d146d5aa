"""Fixtures for tests that run ``pgsub`` as a process: none may outlive its test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess


@pytest.fixture
def daemons() -> Iterator[Callable[..., DaemonProcess]]:
    """Starts ``pgsub run`` processes; each is killed (with its JVM) when the test ends."""
    started: list[DaemonProcess] = []

    def start(config: Path, port: int, failpoints: str | None = None) -> DaemonProcess:
        daemon = DaemonProcess(config, port, failpoints)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.kill()
