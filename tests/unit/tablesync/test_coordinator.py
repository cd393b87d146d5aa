"""The leader's side of table sync, with an in-memory state store and fake workers."""

from __future__ import annotations

import threading
from collections.abc import Callable

from apply.delta.state_store import StoredTableState
from subscriber.metrics import Metrics
from subscriber.replication.lsn import Lsn
from subscriber.runtime.config import SubscriptionConfig
from tablesync.coordinator import SyncCoordinator
from tablesync.publication import PublishedTable
from tablesync.state import TableState

TABLE = PublishedTable(1, "public", "t", ("id",), None, False, 10)


class MemoryStore:
    """The state store's table-state log, in memory: every recorded row kept."""

    def __init__(self) -> None:
        self.rows: list[StoredTableState] = []

    def record(self, subscription: str, rows: list[StoredTableState]) -> None:
        self.rows.extend(rows)

    def load(self, subscription: str) -> dict[int, StoredTableState]:
        latest = {row.relid: row for row in self.rows}
        return {relid: row for relid, row in latest.items() if row.state}


def coordinator(
    store: MemoryStore, worker: Callable[[threading.Event], None] | None = None
) -> SyncCoordinator:
    config = SubscriptionConfig(name="s", connection="", publications=["p"])
    return SyncCoordinator(
        config,
        store,  # type: ignore[arg-type]
        Metrics(),
        lambda table: worker or (lambda stop: None),
    )


def test_a_retried_copy_stores_datasync_once() -> None:
    store = MemoryStore()
    sync = coordinator(store)
    sync.load([TABLE], Lsn(0))
    for _ in range(5):  # a copy that keeps failing starts over from DATASYNC each time
        sync.store(TABLE.relid, TableState.DATASYNC)
    assert [row.state for row in store.rows] == ["i", "d"]
    sync.store(TABLE.relid, TableState.FINISHEDCOPY, Lsn(100))
    assert [row.state for row in store.rows] == ["i", "d", "f"]


def test_a_table_stored_back_at_init_is_synchronized_again() -> None:
    """``pgsub resync``: the running leader stops applying it and a worker copies it."""
    store = MemoryStore()
    started = threading.Event()
    sync = coordinator(store, worker=lambda stop: started.set())
    sync.load([TABLE], Lsn(0))
    for state, lsn in (
        (TableState.DATASYNC, None),
        (TableState.FINISHEDCOPY, Lsn(10)),
        (TableState.SYNCWAIT, Lsn(10)),
        (TableState.CATCHUP, Lsn(20)),
        (TableState.SYNCDONE, Lsn(20)),
        (TableState.READY, Lsn(30)),
    ):
        sync.store(TABLE.relid, state, lsn)
    assert sync.status(TABLE.relid).applies(Lsn(40))
    store.record("s", [StoredTableState(TABLE.relid, "public", "t", "i", None)])
    sync.reload()
    status = sync.status(TABLE.relid)
    assert status.state is TableState.INIT and not status.applies(Lsn(40))
    sync.process(Lsn(40))
    assert started.wait(5), "no sync worker started for the resynced table"
