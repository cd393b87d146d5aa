"""The sync worker threads: room for max_sync_workers, each table's backoff, ends told back."""

from __future__ import annotations

import threading

from tablesync.publication import PublishedTable
from tablesync.settings import SyncSettings
from tablesync.workers import SyncWorkers

A = PublishedTable(1, "public", "a", ("id",), None, False, 10)
B = PublishedTable(2, "public", "b", ("id",), None, False, 10)
C = PublishedTable(3, "public", "c", ("id",), None, False, 10)


def test_room_for_max_sync_workers_and_none_while_held() -> None:
    release = threading.Event()
    ended: list[int] = []

    def wait(stop: threading.Event) -> None:
        release.wait(10)

    workers = SyncWorkers(
        SyncSettings("s", max_sync_workers=2),
        lambda table: wait,
        on_failure=lambda table, exc: None,
        on_exit=lambda table: ended.append(table.relid),
    )
    assert workers.room() == 2
    workers.start(A)
    workers.start(B)
    assert workers.room() == 0 and workers.running(A.relid) and not workers.due(A.relid)
    release.set()
    workers.stop()
    assert sorted(ended) == [A.relid, B.relid] and workers.count() == 0
    workers.held = True
    assert workers.room() == 0


def test_a_failure_is_told_before_the_end_and_backs_the_table_off() -> None:
    now = [100.0]
    told: list[str] = []
    done = threading.Event()

    def fail(stop: threading.Event) -> None:
        raise RuntimeError("copy failed")

    def on_failure(table: PublishedTable, exc: Exception) -> None:
        told.append(f"failed {exc}")
        workers.failed(table.relid, str(exc))

    def on_exit(table: PublishedTable) -> None:
        told.append("ended")
        done.set()

    workers = SyncWorkers(
        SyncSettings("s", retry_interval=5.0, max_retry_interval=8.0),
        lambda table: fail,
        on_failure=on_failure,
        on_exit=on_exit,
        clock=lambda: now[0],
    )
    workers.start(C)
    assert done.wait(10)
    assert told == ["failed copy failed", "ended"]
    failure = workers.failure(C.relid)
    assert failure is not None and failure.count == 1 and failure.retry_in == 5.0
    assert not workers.due(C.relid)
    now[0] += 5.0
    assert workers.due(C.relid)
    assert workers.failed(C.relid, "again").retry_in == 8.0  # doubled, then capped
    workers.synchronized(C.relid)
    assert workers.failure(C.relid) is None and workers.due(C.relid)


def test_a_worker_asked_to_stop_sees_its_event() -> None:
    seen = threading.Event()

    def wait(stop: threading.Event) -> None:
        if stop.wait(10):
            seen.set()

    workers = SyncWorkers(
        SyncSettings("s"),
        lambda table: wait,
        on_failure=lambda table, exc: None,
        on_exit=lambda table: None,
    )
    workers.start(A)
    workers.stop_worker(A.relid)
    workers.stop()
    assert seen.is_set() and not workers.alive(A.relid)
