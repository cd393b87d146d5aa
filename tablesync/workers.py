"""The table-sync worker threads of one subscription, and each table's failures in a row.

PostgreSQL's launcher starts a table's sync worker when there is room
(``max_sync_workers_per_subscription``) and, after a failed attempt, not
sooner than ``wal_retrieve_retry_interval``; pgsub doubles that wait with
each consecutive failure up to ``max_retry_interval`` (``apply.core.backoff``).
``SyncWorkers`` holds the threads and that backoff; which table is due is
the coordinator's question (``tablesync.coordinator``), answered with
``due`` and ``room``.

A worker's end is told back through two callbacks, outside this object's
lock: ``on_failure(table, exc)`` when its work raised, then
``on_exit(table)`` however it ended.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from apply.core.backoff import retry_delay
from tablesync.publication import PublishedTable
from tablesync.settings import SyncSettings
from tablesync.state import SyncFailure

WorkerFactory = Callable[[PublishedTable], Callable[[threading.Event], None]]


@dataclass
class _Running:
    thread: threading.Thread
    stop: threading.Event


class SyncWorkers:
    """At most ``max_sync_workers`` threads, one per table being synchronized."""

    def __init__(
        self,
        settings: SyncSettings,
        factory: WorkerFactory,
        *,
        on_failure: Callable[[PublishedTable, Exception], None],
        on_exit: Callable[[PublishedTable], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._factory = factory
        self._on_failure = on_failure
        self._on_exit = on_exit
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[int, _Running] = {}
        self._failed_at: dict[int, float] = {}
        self._failures: dict[int, SyncFailure] = {}  # until the table synchronizes
        self.held = False  # a failure disabled the subscription: no new worker until resumed

    # -- questions -----------------------------------------------------------

    def running(self, relid: int) -> bool:
        """Whether ``relid`` has a worker (started, not yet ended)."""
        with self._lock:
            return relid in self._running

    def alive(self, relid: int) -> bool:
        """Whether ``relid``'s worker thread still runs."""
        with self._lock:
            entry = self._running.get(relid)
        return entry is not None and entry.thread.is_alive()

    def count(self) -> int:
        """Threads running now (those that ended are forgotten first)."""
        with self._lock:
            for relid, entry in list(self._running.items()):
                if not entry.thread.is_alive():
                    del self._running[relid]
            return len(self._running)

    def room(self) -> int:
        """How many more workers may start now."""
        return 0 if self.held else max(0, self._settings.max_sync_workers - self.count())

    def due(self, relid: int) -> bool:
        """Whether ``relid`` may get a worker now: none running, its backoff over."""
        now = self._clock()
        with self._lock:
            if relid in self._running:
                return False
            failure = self._failures.get(relid)
            retry_in = 0.0 if failure is None else failure.retry_in
            return now - self._failed_at.get(relid, -1e9) >= retry_in

    def failure(self, relid: int) -> SyncFailure | None:
        with self._lock:
            return self._failures.get(relid)

    # -- changes -------------------------------------------------------------

    def start(self, table: PublishedTable) -> None:
        stop = threading.Event()
        work = self._factory(table)

        def run() -> None:
            try:
                work(stop)
            except Exception as exc:  # noqa: BLE001 - a sync failure must not stop the leader
                self._on_failure(table, exc)
            finally:
                with self._lock:
                    if self._running.get(table.relid) is entry:
                        del self._running[table.relid]
            self._on_exit(table)

        thread = threading.Thread(target=run, name=f"sync-{table.relid}", daemon=True)
        entry = _Running(thread, stop)
        with self._lock:
            self._running[table.relid] = entry
        thread.start()

    def failed(self, relid: int, error: str) -> SyncFailure:
        """Count a failed attempt at ``relid``: its next one waits for the backoff."""
        with self._lock:
            self._failed_at[relid] = self._clock()
            previous = self._failures.get(relid)
            count = 1 if previous is None else previous.count + 1
            retry_in = retry_delay(
                count, self._settings.retry_interval, self._settings.max_retry_interval
            )
            failure = self._failures[relid] = SyncFailure(count, error, time.time(), retry_in)
            return failure

    def synchronized(self, relid: int) -> None:
        """``relid`` synchronized: its failures are forgotten, the backoff starts over."""
        with self._lock:
            self._failures.pop(relid, None)

    def stop_worker(self, relid: int) -> None:
        """Ask ``relid``'s worker to stop (its table left, or is copied again)."""
        with self._lock:
            entry = self._running.get(relid)
        if entry is not None:
            entry.stop.set()

    def stop(self) -> None:
        """Ask every worker to stop, and wait for them."""
        with self._lock:
            running = list(self._running.values())
        for entry in running:
            entry.stop.set()
        for entry in running:
            entry.thread.join()
