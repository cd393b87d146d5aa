"""Fixtures for tests that run ``pgsub`` as a process: none may outlive its test; a failed
test's report ends with what each of its daemons logged last."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess


@pytest.fixture
def daemons(request: pytest.FixtureRequest) -> Iterator[Callable[..., DaemonProcess]]:
    """Starts ``pgsub run`` processes; each is killed (with its JVM) when the test ends."""
    started: list[DaemonProcess] = []
    request.node.pgsub_daemons = started  # read by ``pytest_runtest_makereport``

    def start(
        config: Path, port: int, failpoints: str | None = None, temp: Path | None = None
    ) -> DaemonProcess:
        daemon = DaemonProcess(config, port, failpoints, temp)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.kill()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report: a section per daemon it started, the end of that daemon's log
    (a wait that timed out says what it waited for, not what the daemon was doing)."""
    report = yield
    if report.when == "call" and report.failed:
        for daemon in getattr(item, "pgsub_daemons", []):
            report.sections.append((f"pgsub log {daemon.log_path.name}", daemon.logs()))
    return report
