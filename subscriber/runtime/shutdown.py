"""How the process stops: signals, a second signal, a shutdown that gives up (the CLI's exits).

uvicorn's habit: the first SIGTERM or SIGINT asks for a graceful shutdown,
a second one ends the process at once. Both are safe at any moment, as a
kill -9 is: the publisher's slot is only ever confirmed up to what the Delta
tables hold, so whatever was in flight is sent again. No Spark here, so the
CLI imports it without starting anything.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import structlog

log = structlog.get_logger(__name__)


class ShutdownTimedOut(Exception):  # noqa: N818 - named for what happened, as ForcedExit
    """The shutdown gave up on threads still running: the process must end without them."""

    exit_code = 1


class ForcedExit(BaseException):
    """A second SIGTERM or SIGINT during a shutdown: end the process now.

    A BaseException, raised in the main thread by the signal handler, so that it unwinds
    past ``except Exception`` and through every ``finally`` (the demo's publisher is
    removed) up to the CLI, which exits without waiting for other threads."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum).name
        self.exit_code = 128 + signum
        super().__init__(f"a second {self.signal}: exiting at once")


@contextmanager
def captured_signals(stopping: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stopping`` for the duration; a second one raises
    ``ForcedExit``; the old handlers come back after."""
    received: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) > 1:
            log.warning("second signal: exiting at once", signal=signal.Signals(signum).name)
            raise ForcedExit(signum)
        log.info(
            "shutdown requested",
            signal=signal.Signals(signum).name,
            hint="send it again to exit at once",
        )
        stopping.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def join_within(threads: list[threading.Thread], timeout: float) -> list[str]:
    """Wait for ``threads``, ``timeout`` seconds at most in all; the names of those still
    running."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [thread.name for thread in threads if thread.is_alive()]
