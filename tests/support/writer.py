"""A write load on a publisher, in a background thread, for tests that copy or apply under it.

``Writer(publisher, step)`` calls ``step(conn, n)`` for n = 1, 2, ... on one
autocommit connection until stopped, pausing ``pause(n)`` seconds after
each step; ``written`` is the last n done. With ``reconnect`` it rides out
a publisher restart (connection errors: wait, connect again, go on with the
next n). ``stop()`` ends it and raises whatever ended it early, so a broken
workload fails its test instead of passing quietly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg

from tests.support.pgdatabase import PgDatabase

Step = Callable[[psycopg.Connection[Any], int], None]


class Writer(threading.Thread):
    def __init__(
        self,
        publisher: PgDatabase,
        step: Step,
        *,
        pause: float | Callable[[int], float] = 0.0,
        reconnect: bool = False,
    ) -> None:
        super().__init__(daemon=True, name="writer")
        self._publisher = publisher
        self._step = step
        self._pause = pause if callable(pause) else (lambda n, seconds=pause: seconds)
        self._reconnect = reconnect
        self.stopping = threading.Event()
        self.written = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    self._write()
                except psycopg.OperationalError:
                    if not self._reconnect:
                        raise
                    self.stopping.wait(0.5)  # the server is going down or coming back
        except BaseException as exc:
            self.error = exc

    def _write(self) -> None:
        with self._publisher.connect() as conn:
            while not self.stopping.is_set():
                n = self.written + 1
                self._step(conn, n)
                self.written = n
                seconds = self._pause(n)
                if seconds:
                    self.stopping.wait(seconds)

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join()
        if self.error is not None:
            raise AssertionError(f"the writer failed after {self.written} steps") from self.error

    def __enter__(self) -> Writer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.join()
