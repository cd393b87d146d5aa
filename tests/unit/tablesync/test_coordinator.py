"""The leader's side of table sync, with an in-memory state store and fake workers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from apply.core.records import StoredTableState
from apply.core.transactions import RemoteTransaction
from subscriber.metrics import Metrics
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Column, Relation, ReplicaIdentity
from tablesync.coordinator import SyncCoordinator, TableRenamedError
from tablesync.publication import PublishedTable
from tablesync.settings import SyncSettings
from tablesync.state import TableState

TABLE = PublishedTable(1, "public", "t", ("id",), None, False, 10)


class MemoryStore:
    """The state store's table-state log, in memory: every recorded row kept, with the
    time it was recorded at (a second apart, in order)."""

    def __init__(self) -> None:
        self.rows: list[StoredTableState] = []
        self.stale: int | None = None  # load() sees only this many rows (a late snapshot)

    def record(self, subscription: str, rows: list[StoredTableState]) -> datetime:
        at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=len(self.rows))
        self.rows.extend(replace(row, recorded_at=at) for row in rows)
        return at

    def load(self, subscription: str) -> dict[int, StoredTableState]:
        visible = self.rows if self.stale is None else self.rows[: self.stale]
        latest = {row.relid: row for row in visible}
        return {relid: row for relid, row in latest.items() if row.state}


def coordinator(
    store: MemoryStore,
    worker: Callable[[threading.Event], None] | None = None,
    *,
    clock: Callable[[], float] | None = None,
    metrics: Metrics | None = None,
) -> SyncCoordinator:
    return SyncCoordinator(
        SyncSettings("s", retry_interval=5.0),
        store,
        metrics or Metrics(),
        lambda table: worker or (lambda stop: None),
        clock=clock or (lambda: 0.0),
    )


def wait_for(condition: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if condition():
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_leader_gives_catchup_at_its_position_and_waits_for_syncdone() -> None:
    """PostgreSQL's handoff: SYNCWAIT -> CATCHUP at the leader's position -> SYNCDONE -> READY,
    the leader held in between so that it cannot run past the handoff point."""
    store = MemoryStore()
    given: list[Lsn | None] = []
    release = threading.Event()

    def worker(stop: threading.Event) -> None:
        sync.store(TABLE.relid, TableState.DATASYNC)
        sync.store(TABLE.relid, TableState.FINISHEDCOPY, Lsn(10))
        target = sync.wait_for_catchup(TABLE.relid, Lsn(10), stop)
        given.append(target)
        release.wait(5)  # catching up...
        assert target is not None
        sync.store(TABLE.relid, TableState.SYNCDONE, Lsn(int(target) + 5))

    sync = coordinator(store, worker)
    sync.load([TABLE], Lsn(0))
    sync.process(Lsn(0))  # starts the worker
    wait_for(lambda: sync.status(TABLE.relid).state is TableState.SYNCWAIT, "SYNCWAIT")
    leader = threading.Thread(target=sync.process, args=(Lsn(50),))
    leader.start()
    wait_for(lambda: given == [Lsn(50)], "CATCHUP at the leader's position")
    leader.join(0.3)
    assert leader.is_alive(), "the leader went on before the worker reached SYNCDONE"
    release.set()
    leader.join(5)
    assert not leader.is_alive()
    assert sync.status(TABLE.relid).state is TableState.SYNCDONE
    assert not sync.status(TABLE.relid).applies(Lsn(54))  # the worker applied up to 55
    sync.process(Lsn(60))
    status = sync.status(TABLE.relid)
    assert status.state is TableState.READY and status.applies(Lsn(61))
    assert [row.state for row in store.rows] == ["i", "d", "f", "s", "r"]  # w, c in memory


def test_catchup_reaches_what_the_leader_confirmed_past_its_position() -> None:
    """The leader confirmed transactions past its last batch (formed while it was written,
    the syncing table's changes skipped): CATCHUP is at least as far as it confirmed, since
    the slot never sends them again; READY still follows the position it applied."""
    store = MemoryStore()
    given: list[Lsn | None] = []

    def worker(stop: threading.Event) -> None:
        sync.store(TABLE.relid, TableState.DATASYNC)
        sync.store(TABLE.relid, TableState.FINISHEDCOPY, Lsn(10))
        target = sync.wait_for_catchup(TABLE.relid, Lsn(10), stop)
        given.append(target)
        assert target is not None
        sync.store(TABLE.relid, TableState.SYNCDONE, target)

    sync = coordinator(store, worker)
    sync.load([TABLE], Lsn(0))
    sync.process(Lsn(0))  # starts the worker
    wait_for(lambda: sync.status(TABLE.relid).state is TableState.SYNCWAIT, "SYNCWAIT")
    sync.process(Lsn(50), Lsn(80))
    assert given == [Lsn(80)]
    assert sync.status(TABLE.relid).state is TableState.SYNCDONE  # not READY at 50
    sync.process(Lsn(80), Lsn(80))
    assert sync.status(TABLE.relid).state is TableState.READY


def test_a_failed_worker_is_retried_after_the_retry_interval_and_counted() -> None:
    now = [0.0]
    attempts: list[float] = []
    metrics = Metrics()

    def worker(stop: threading.Event) -> None:
        attempts.append(now[0])
        if len(attempts) == 1:
            raise RuntimeError("the publisher went away")

    sync = coordinator(MemoryStore(), worker, clock=lambda: now[0], metrics=metrics)
    sync.load([TABLE], Lsn(0))
    sync.process(Lsn(0))
    wait_for(lambda: metrics.sync_errors.labels("s")._value.get() == 1, "the failure counted")
    now[0] = 4.9
    sync.process(Lsn(0))
    assert attempts == [0.0]  # not before wal_retrieve_retry_interval
    now[0] = 5.0
    sync.process(Lsn(0))
    wait_for(lambda: len(attempts) == 2, "the retry")
    assert attempts == [0.0, 5.0]


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


def test_a_late_read_of_the_store_is_not_a_resync() -> None:
    """A reload whose read of the state store began before a sync worker's last write sees
    the table's older INIT row: that is not ``pgsub resync`` (seen on a Spark cluster, where
    every copy was started twice)."""
    store = MemoryStore()
    sync = coordinator(store)
    sync.load([TABLE], Lsn(0))
    sync.store(TABLE.relid, TableState.DATASYNC)
    store.stale = 1  # only the INIT row that load() recorded
    sync.reload()
    assert sync.status(TABLE.relid).state is TableState.DATASYNC
    store.stale = None
    store.record("s", [StoredTableState(TABLE.relid, "public", "t", "i", None)])  # pgsub resync
    sync.reload()
    assert sync.status(TABLE.relid).state is TableState.INIT


def test_a_worker_at_syncwait_or_syncdone_wakes_the_leader() -> None:
    """As PostgreSQL's sync worker sets the apply worker's latch: no wait for an idle tick."""
    sync = coordinator(MemoryStore())
    woken: list[TableState] = []
    sync.wake_leader = lambda: woken.append(sync.status(TABLE.relid).state)
    sync.load([TABLE], Lsn(0))
    for state, lsn in [
        (TableState.DATASYNC, None),
        (TableState.FINISHEDCOPY, Lsn(10)),
        (TableState.SYNCWAIT, Lsn(10)),
        (TableState.CATCHUP, Lsn(20)),
        (TableState.SYNCDONE, Lsn(25)),
    ]:
        sync.store(TABLE.relid, state, lsn)
    assert woken == [TableState.SYNCWAIT, TableState.SYNCDONE]


def test_consecutive_failures_back_off_like_the_leader_and_show_their_error() -> None:
    """wal_retrieve_retry_interval doubled after each failure in a row, up to
    max_retry_interval; the error in /status until the table syncs, then the backoff resets."""
    now = [0.0]
    attempts: list[float] = []
    fail = [True]

    def worker(stop: threading.Event) -> None:
        attempts.append(now[0])
        if fail[0]:
            raise RuntimeError(f"attempt {len(attempts)} failed\nwith details")
        sync.store(TABLE.relid, TableState.DATASYNC)

    metrics = Metrics()
    sync = SyncCoordinator(
        SyncSettings("s", retry_interval=5.0, max_retry_interval=12.0),
        MemoryStore(),
        metrics,
        lambda table: worker,
        clock=lambda: now[0],
    )
    sync.load([TABLE], Lsn(0))

    def attempt_at(moment: float) -> None:
        count = len(attempts)
        now[0] = moment
        sync.process(Lsn(0))
        wait_for(lambda: len(attempts) == count + 1, f"an attempt at {moment}")
        if fail[0]:
            wait_for(lambda: sync.sync_errors == count + 1, "the attempt's failure")

    attempt_at(0.0)
    (row,) = sync.describe()
    assert row["sync_failures"] == 1 and row["last_error"] == "attempt 1 failed\nwith details"
    assert row["retry_at"] == pytest.approx(float(row["last_error_at"]) + 5.0)  # type: ignore[arg-type]
    for waited, moment in ((5.0, 5.0), (10.0, 15.0), (12.0, 27.0)):  # 5, 10, then capped at 12
        now[0] = moment - 0.01
        sync.process(Lsn(0))
        assert len(attempts) == len([a for a in attempts if a < moment]), f"not before {waited} s"
        attempt_at(moment)
    assert attempts == [0.0, 5.0, 15.0, 27.0]
    assert sync.describe()[0]["sync_failures"] == 4
    fail[0] = False
    attempt_at(39.0)
    wait_for(lambda: sync.status(TABLE.relid).state is TableState.DATASYNC, "the copy to start")
    assert sync.describe()[0]["sync_failures"] == 4  # still failing until the table syncs
    sync.store(TABLE.relid, TableState.FINISHEDCOPY, Lsn(5))
    sync.store(TABLE.relid, TableState.SYNCWAIT, Lsn(5))
    sync.store(TABLE.relid, TableState.CATCHUP, Lsn(6))
    sync.store(TABLE.relid, TableState.SYNCDONE, Lsn(7))
    (row,) = sync.describe()
    assert row["sync_failures"] == 0 and row["last_error"] is None


def test_a_worker_that_ends_gives_its_place_to_the_next_table_at_once() -> None:
    """max_sync_workers 1, two tables: the second table's worker starts when the first
    one's ends synchronized, with no further call of the leader's process(); a worker that
    ends without synchronizing its table leaves the next start to the leader."""
    other = PublishedTable(2, "public", "u", ("id",), None, False, 10)
    started: list[int] = []
    release = threading.Event()

    def factory(table: PublishedTable) -> Callable[[threading.Event], None]:
        def work(stop: threading.Event) -> None:
            started.append(table.relid)
            release.wait(5)
            if table.relid == 1:
                for state, lsn in (
                    (TableState.DATASYNC, None),
                    (TableState.FINISHEDCOPY, Lsn(5)),
                    (TableState.SYNCWAIT, Lsn(5)),
                    (TableState.CATCHUP, Lsn(6)),
                    (TableState.SYNCDONE, Lsn(7)),
                ):
                    sync.store(table.relid, state, lsn)

        return work

    sync = SyncCoordinator(SyncSettings("s", max_sync_workers=1), MemoryStore(), Metrics(), factory)
    sync.load([TABLE, other], Lsn(0))
    sync.process(Lsn(0))
    wait_for(lambda: len(started) == 1, "one worker")
    release.set()
    wait_for(lambda: sorted(started) == [1, 2], "the second table's worker, unasked")
    wait_for(lambda: not sync.describe()[1]["sync_worker"], "the second worker's end")
    threading.Event().wait(0.2)
    assert sorted(started) == [1, 2]  # table 2 is not synchronized: no worker until asked
    sync.stop()


def test_a_table_handed_over_at_the_leaders_position_is_ready_in_the_same_pass() -> None:
    """The worker stops at the CATCHUP LSN the leader gave (its own position): READY before
    process() returns, not at the leader's next batch or idle tick."""
    store = MemoryStore()

    def worker(stop: threading.Event) -> None:
        sync.store(TABLE.relid, TableState.DATASYNC)
        sync.store(TABLE.relid, TableState.FINISHEDCOPY, Lsn(10))
        target = sync.wait_for_catchup(TABLE.relid, Lsn(10), stop)
        assert target is not None
        sync.store(TABLE.relid, TableState.SYNCDONE, target)

    sync = coordinator(store, worker)
    sync.load([TABLE], Lsn(0))
    sync.process(Lsn(0))
    wait_for(lambda: sync.status(TABLE.relid).state is TableState.SYNCWAIT, "SYNCWAIT")
    sync.process(Lsn(50))
    assert sync.status(TABLE.relid).state is TableState.READY


def test_workers_waiting_together_catch_up_side_by_side_and_are_ready_in_one_write() -> None:
    """Two workers at SYNCWAIT both get CATCHUP at the leader's position before either is
    SYNCDONE (one at a time held each catch-up behind the other's); the leader returns only
    after both, and both are READY in one stored write."""
    store = MemoryStore()
    both_given = threading.Barrier(2, timeout=3)  # broken if CATCHUP came one at a time
    given: dict[int, Lsn | None] = {}

    def worker(table: PublishedTable, stop: threading.Event) -> None:
        sync.store(table.relid, TableState.DATASYNC)
        sync.store(table.relid, TableState.FINISHEDCOPY, Lsn(10))
        given[table.relid] = sync.wait_for_catchup(table.relid, Lsn(10), stop)
        both_given.wait()  # catching up, while the other does too
        sync.store(table.relid, TableState.SYNCDONE, Lsn(50))

    sync = SyncCoordinator(
        SyncSettings("s", max_sync_workers=2),
        store,
        Metrics(),
        lambda table: lambda stop: worker(table, stop),
        clock=lambda: 0.0,
    )
    tables = [replace(TABLE, relid=n, name=f"t{n}") for n in (1, 2)]
    sync.load(tables, Lsn(0))
    sync.process(Lsn(0))  # starts both workers
    wait_for(
        lambda: all(sync.status(n).state is TableState.SYNCWAIT for n in (1, 2)), "two SYNCWAITs"
    )
    written = len(store.rows)
    sync.process(Lsn(50))
    assert given == {1: Lsn(50), 2: Lsn(50)}
    assert [sync.status(n).state for n in (1, 2)] == [TableState.READY] * 2
    ready = [r for r in store.rows[written:] if r.state == "r"]
    assert sorted(r.relid for r in ready) == [1, 2]
    assert len({r.recorded_at for r in ready}) == 1  # one write


def test_tables_loaded_together_are_ready_in_one_write_and_need_no_worker() -> None:
    """The first start's load (tablesync.initial_load): INIT -> READY at the slot's
    consistent point for several tables in one stored write, and no worker is started
    for them."""
    store = MemoryStore()
    started: list[int] = []
    sync = coordinator(store, lambda stop: started.append(1))
    tables = [replace(TABLE, relid=n, name=f"t{n}") for n in (1, 2, 3)]
    sync.load(tables, Lsn(0))
    written = len(store.rows)
    sync.store_many([1, 2], TableState.READY, Lsn(40))
    assert [(r.relid, r.state, r.lsn) for r in store.rows[written:]] == [
        (1, "r", Lsn(40)),
        (2, "r", Lsn(40)),
    ]
    assert len({r.recorded_at for r in store.rows[written:]}) == 1  # one write
    sync.process(Lsn(40))
    wait_for(lambda: len(started) == 1, "a worker for t3 only")
    assert {s.relid: s.state for s in sync.statuses}[3] is not TableState.READY


@pytest.mark.parametrize(
    ("namespace", "name", "renamed"),
    [
        ("public", "a.b", False),
        ("public", "u", True),  # RENAME TO
        ("other", "a.b", True),  # SET SCHEMA
        ("public.a", "b", True),  # the same dotted text, split elsewhere
        ("Public", "a.b", True),  # a case only quoting keeps
    ],
)
def test_a_tables_changes_under_another_name_stop_the_leader(
    namespace: str, name: str, renamed: bool
) -> None:
    """``should_apply``, asked for every change: a READY table's changes apply under its
    own name; under any other - renamed, moved to another schema, or the same text split
    differently into schema and name - they stop the subscription rather than land in a
    new, empty Delta table, naming the resync that copies it again."""
    store = MemoryStore()
    store.record("s", [StoredTableState(7, "public", "a.b", TableState.READY.value, Lsn(5))])
    sync = coordinator(store)
    sync.load([PublishedTable(7, "public", "a.b", ("id",), None, False, 10)], Lsn(5))
    columns = (Column("id", 23, -1, True),)
    relation = Relation(7, namespace, name, ReplicaIdentity.DEFAULT, columns)
    tx = RemoteTransaction(1, Lsn(10), Lsn(11), 0, ())
    if not renamed:
        assert sync.should_apply(relation, tx)
        return
    with pytest.raises(
        TableRenamedError, match=r'renamed to .* `pgsub resync -c <config> s public\."a\.b"`'
    ):
        sync.should_apply(relation, tx)
