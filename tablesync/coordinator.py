"""The leader's side of table synchronization (PostgreSQL's process_syncing_tables_for_apply).

Holds the subscription's table states (stored ones in the state store,
SYNCWAIT and CATCHUP in memory) and, each time the leader calls
``process(position)`` - after each batch and when idle:

- a SYNCDONE table whose LSN the leader has reached becomes READY;
- a sync worker waiting in SYNCWAIT gets CATCHUP with an LSN at or past the
  leader's position, and the leader waits until that worker reports
  SYNCDONE (so it cannot run past the handoff point);
- tables not yet synchronized get a worker, at most ``max_sync_workers``
  at once, and after a failed attempt for the same table not sooner than
  ``wal_retrieve_retry_interval``, doubled with each consecutive failure up
  to ``max_retry_interval`` (the leader's backoff, ``apply.core.backoff``). A
  failed worker is counted in ``pgsub_sync_errors_total``, its error shows
  in ``/status`` and ``pgsub status`` until the table syncs, and it does not
  stop the leader or the others.

``should_apply`` is PostgreSQL's ``should_apply_changes_for_rel``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

import structlog

from apply.core.errors import ApplyError
from apply.core.records import StoredTableState
from apply.core.transactions import RemoteTransaction
from subscriber.metrics import Metrics
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Relation
from tablesync.copy_progress import CopyProgress
from tablesync.publication import PublishedTable
from tablesync.settings import SyncSettings, TableStates
from tablesync.state import SyncFailure, TableState, TableStatus
from tablesync.workers import SyncWorkers, WorkerFactory

log = structlog.get_logger(__name__)


class TableRenamedError(ApplyError):
    """A table was renamed on the publisher while the subscription applied it."""


# How often a running leader looks for tables added or removed by ``pgsub refresh``.
RELOAD_INTERVAL = 3.0


class SyncCoordinator:
    def __init__(
        self,
        settings: SyncSettings,
        store: TableStates,
        metrics: Metrics,
        worker_factory: WorkerFactory,
        *,
        drop_sync_slot: Callable[[int], None] | None = None,
        list_published: Callable[[], list[PublishedTable]] | None = None,
        on_error: Callable[[str], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._store = store
        self._metrics = metrics
        self._drop_sync_slot = drop_sync_slot
        self._list_published = list_published
        self._on_error = on_error  # told of every worker failure; True: start no more workers
        self._clock = clock
        self._reloaded_at = clock()
        self._recorded_at: dict[int, datetime] = {}  # each table's last row of this process
        self._cond = threading.Condition()
        self._statuses: dict[int, TableStatus] = {}
        self._published: dict[int, PublishedTable] = {}
        self.workers = SyncWorkers(
            settings, worker_factory, on_failure=self.failed, on_exit=self._ended, clock=clock
        )
        self._copied_at: dict[int, Lsn] = {}  # FINISHEDCOPY's LSN while SYNCWAIT/CATCHUP
        self.copies = CopyProgress(clock)  # how far each copy is, for /status
        self.sync_errors = 0  # failed table-sync workers since the process started
        self.stopping = threading.Event()
        # Wakes the leader's apply thread (set by the subscription while one runs): a worker
        # at SYNCWAIT or SYNCDONE is moved on at once, as PostgreSQL's sync worker sets the
        # apply worker's latch, rather than at the leader's next idle tick.
        self.wake_leader: Callable[[], None] = lambda: None

    # -- table list ----------------------------------------------------------

    def publish(self, published: list[PublishedTable]) -> None:
        """What the publications publish now (sync workers copy these definitions)."""
        with self._cond:
            self._published = {t.relid: t for t in published}

    def load(self, published: list[PublishedTable], position: Lsn) -> None:
        """Start from the stored states; on a subscription's first start, add its tables."""
        stored = self._store.load(self.settings.subscription)
        self.publish(published)
        if not stored:
            self.add_tables(published, position)
            return
        with self._cond:
            for relid, row in stored.items():
                self._statuses[relid] = TableStatus(
                    relid, row.schema, row.name, TableState(row.state), row.lsn
                )
        self._export()

    def add_tables(self, tables: list[PublishedTable], position: Lsn) -> None:
        """New tables: INIT, or READY at ``position`` without the initial copy (copy_data off)."""
        state = TableState.INIT if self.settings.copy_data else TableState.READY
        lsn = None if self.settings.copy_data else position
        fresh = [
            TableStatus(t.relid, t.schema, t.name, state, lsn)
            for t in tables
            if t.relid not in self._statuses
        ]
        if not fresh:
            return
        for table in tables:
            self._published[table.relid] = table
        self._persist(fresh)
        with self._cond:
            for status in fresh:
                self._statuses[status.relid] = status
            self._cond.notify_all()
        log.info(
            "tables added to the subscription",
            subscription=self.settings.subscription,
            tables=[s.qualified_name for s in fresh],
            state=state.label,
        )
        self._export()

    # -- the leader's questions ----------------------------------------------

    def should_apply(self, relation: Relation, tx: RemoteTransaction) -> bool:
        status = self._statuses.get(relation.oid)
        if status is None or not status.applies(tx.final_lsn):
            return False
        # Its name's parts, not the quoted name: asked for every change (the quoted forms
        # differ exactly when the parts do).
        if status.name != relation.name or status.schema != relation.namespace:
            # Its changes would land in a new, empty Delta table under the new name.
            name = self.settings.subscription
            raise TableRenamedError(
                f"table {status.qualified_name} was renamed to {relation.qualified_name} on "
                f'the publisher; subscription "{name}" stops rather than apply '
                "its changes to a new, empty table. Copy it again under its new name: "
                f"`pgsub resync -c <config> {name} {status.qualified_name}`"
            )
        return True

    def status(self, relid: int) -> TableStatus:
        with self._cond:
            return self._statuses[relid]

    @property
    def statuses(self) -> list[TableStatus]:
        with self._cond:
            return list(self._statuses.values())

    # -- state changes -------------------------------------------------------

    def store(self, relid: int, state: TableState, lsn: Lsn | None = None) -> TableStatus:
        return self.store_many([relid], state, lsn)[0]

    def store_many(
        self, relids: list[int], state: TableState, lsn: Lsn | None = None
    ) -> list[TableStatus]:
        """Move every table of ``relids`` to ``state``, stored in one write."""
        with self._cond:
            moved = [self._statuses[relid].moved_to(state, lsn) for relid in relids]
            # A retried copy's DATASYNC again is nothing new to store.
            fresh = [m for m in moved if m != self._statuses[m.relid]]
        if not fresh:
            return moved
        if state.stored:
            self._persist(fresh)
        with self._cond:
            for status in fresh:
                self._statuses[status.relid] = status
                if state in (TableState.SYNCDONE, TableState.READY):
                    self.workers.synchronized(status.relid)  # the backoff starts over
            self._cond.notify_all()
        if state in (TableState.SYNCWAIT, TableState.SYNCDONE):
            self.wake_leader()
        for status in fresh:
            log.info(
                "table state changed",
                subscription=self.settings.subscription,
                table=status.qualified_name,
                state=state.label,
                lsn=None if lsn is None else str(lsn),
            )
        self._export()
        return moved

    def _persist(self, statuses: list[TableStatus]) -> None:
        recorded_at = self._store.record(
            self.settings.subscription,
            [StoredTableState(s.relid, s.schema, s.name, s.state.value, s.lsn) for s in statuses],
        )
        for status in statuses:
            self._recorded_at[status.relid] = recorded_at

    def _resync_requested(self, status: TableStatus, stored: StoredTableState) -> bool:
        """A stored INIT newer than this process's own last row: ``pgsub resync``. A store
        read that began before this process's last write shows an older row, not a request."""
        if stored.state != TableState.INIT.value or status.state is TableState.INIT:
            return False
        mine = self._recorded_at.get(status.relid)
        return mine is None or stored.recorded_at is None or stored.recorded_at > mine

    def copy_progress(self, relid: int, copied: int, estimated: int) -> None:
        self.copies.note(relid, copied, estimated)

    def describe(self) -> list[dict[str, object]]:
        """Each table's state, LSN and copy progress, for ``/status``."""
        rows: list[dict[str, object]] = []
        for status in self.statuses:
            running = self.workers.running(status.relid)
            rows.append(
                {
                    "table": status.qualified_name,
                    "state": status.state.label,
                    "lsn": None if status.lsn is None else str(status.lsn),
                    **self.copies.figures(status.relid, running=running),
                    "sync_worker": running,
                    **SyncFailure.fields(self.workers.failure(status.relid)),
                }
            )
        return rows

    def wait_for_catchup(self, relid: int, start: Lsn, stopping: threading.Event) -> Lsn | None:
        """The sync worker's SYNCWAIT: wait until the leader sets CATCHUP; its LSN."""
        self._copied_at[relid] = start
        self.store(relid, TableState.SYNCWAIT, start)
        with self._cond:
            while not (stopping.is_set() or self.stopping.is_set()):
                status = self._statuses[relid]
                if status.state is TableState.CATCHUP:
                    return status.catchup_to
                self._cond.wait(0.5)
        return None

    # -- the leader's bookkeeping --------------------------------------------

    def process(self, position: Lsn, confirmed: Lsn | None = None) -> None:
        """``position``: the leader's, as it applied (a SYNCDONE table at or before it is
        READY); ``confirmed``: how far it has confirmed upstream, which passes ``position``
        when transactions formed while its last batch was written were confirmed as their
        writes ended. A CATCHUP reaches at least both: the leader skipped the table's
        changes in every transaction confirmed, and the slot never sends one again."""
        if self._clock() - self._reloaded_at >= RELOAD_INTERVAL:
            self.reload()
        # Every worker waiting gets CATCHUP at once, and the leader waits for them all: the
        # leader stands still until the last one's SYNCDONE, as it does for one. They catch up
        # side by side, where one at a time (PostgreSQL's loop) held each table's catch-up -
        # its stream's start, its SYNCDONE's write - behind the others': 200 small tables
        # synced by four workers took 45 s, now 31 s (docs/performance.md).
        waiting = [s for s in self.statuses if s.state is TableState.SYNCWAIT]
        for status in waiting:
            reached = max(status.catchup_to, position, confirmed or position)
            self.store(status.relid, TableState.CATCHUP, reached)
        for status in waiting:
            self._wait_sync_done(status.relid)
        # A SYNCDONE table the leader has reached is READY - also one handed over just now,
        # not at the leader's next batch or idle tick - all of them in one write.
        ready = [
            s.relid
            for s in self.statuses
            if s.state is TableState.SYNCDONE and position >= s.synced_to
        ]
        if ready:
            self.store_many(ready, TableState.READY, position)
        self._start_workers()

    def reload(self) -> None:
        """Pick up tables added or removed by ``pgsub refresh`` since the last look."""
        self._reloaded_at = self._clock()
        stored = self._store.load(self.settings.subscription)
        with self._cond:  # tables to copy (added, resynced): read as published now
            anew = [
                r
                for r in stored
                if r not in self._statuses or self._resync_requested(self._statuses[r], stored[r])
            ]
        if anew and self._list_published is not None:
            self.publish(self._list_published())
        with self._cond:
            added = [
                TableStatus(relid, s.schema, s.name, TableState(s.state), s.lsn)
                for relid, s in stored.items()
                if relid not in self._statuses
            ]
            removed = [s for relid, s in self._statuses.items() if relid not in stored]
            # pgsub resync: a table stored back at INIT is copied again from scratch.
            resynced = [
                self._renamed_as_published(replace(s, state=TableState.INIT, lsn=None))
                for relid, s in self._statuses.items()
                if relid in stored and self._resync_requested(s, stored[relid])
            ]
            for status in added + resynced:
                self._statuses[status.relid] = status
            for status in removed:
                del self._statuses[status.relid]
            for status in added + resynced + removed:
                self.workers.stop_worker(status.relid)
            self._cond.notify_all()
        for status in removed:
            for state in TableState:
                self._metrics.table_state.remove(
                    self.settings.subscription, status.qualified_name, state.label
                )
            log.info(
                "table removed from the subscription",
                subscription=self.settings.subscription,
                table=status.qualified_name,
                note="its Delta table is kept; its changes are no longer applied",
            )
            if self._drop_sync_slot is not None:
                self._drop_sync_slot(status.relid)
        for status in resynced:
            log.info(
                "table state changed",
                subscription=self.settings.subscription,
                table=status.qualified_name,
                state=TableState.INIT.label,
                lsn=None,
                cause="pgsub resync",
            )
        if added:
            log.info(
                "tables added to the subscription",
                subscription=self.settings.subscription,
                tables=[s.qualified_name for s in added],
            )
        if added or removed or resynced:
            self._export()

    def _renamed_as_published(self, status: TableStatus) -> TableStatus:
        """A table copied again takes the name the publication gives it now."""
        published = self._published.get(status.relid)
        if published is None:
            return status
        return replace(status, schema=published.schema, name=published.name)

    def _wait_sync_done(self, relid: int) -> None:
        """Hold the leader until the worker is SYNCDONE (or gone: it will be retried)."""
        with self._cond:
            while not self.stopping.is_set():
                if self._statuses[relid].state is TableState.SYNCDONE:
                    return
                if not self.workers.alive(relid):
                    return
                self._cond.wait(0.5)

    def _start_workers(self, after: int | None = None) -> None:
        """Workers for tables waiting to be copied, while there is room; ``after``: a table
        whose worker just ended, left for the leader's next look."""
        with self._cond:
            if self.stopping.is_set():
                return
            room = self.workers.room()  # forgets the workers that ended first
            waiting = [
                s
                for s in self._statuses.values()
                if s.state in (TableState.INIT, TableState.DATASYNC, TableState.FINISHEDCOPY)
                and s.relid != after
                and s.relid in self._published
                and self.workers.due(s.relid)
            ]
            for status in waiting[:room]:
                self.workers.start(self._published[status.relid])
        self._metrics.workers.labels(self.settings.subscription, "table synchronization").set(
            self.workers.count()
        )

    def _ended(self, table: PublishedTable) -> None:
        """A worker ended. A table synchronized gives its place to the next one now, not at
        the leader's next batch or idle tick; a worker that failed or stopped early does
        not: its table waits for the leader's look (and its retry interval)."""
        with self._cond:
            self._cond.notify_all()
        if self._synchronized(table.relid):
            self._start_workers(after=table.relid)

    def _synchronized(self, relid: int) -> bool:
        with self._cond:
            status = self._statuses.get(relid)
        return status is not None and status.state in (TableState.SYNCDONE, TableState.READY)

    def failed(self, table: PublishedTable, exc: Exception) -> None:
        """A table's sync failed: counted, shown, retried after its backoff."""
        with self._cond:
            if table.relid not in self._statuses:
                log.info(
                    "table sync stopped: the table left the subscription",
                    table=table.qualified_name,
                )
                return
        self._metrics.sync_errors.labels(self.settings.subscription).inc()
        self.sync_errors += 1
        failure = self.workers.failed(table.relid, str(exc))
        with self._cond:
            status = self._statuses.get(table.relid)
            if status is not None and not status.state.stored:
                # SYNCWAIT / CATCHUP live in memory: back to the stored FINISHEDCOPY.
                self._statuses[table.relid] = TableStatus(
                    status.relid,
                    status.schema,
                    status.name,
                    TableState.FINISHEDCOPY,
                    self._copied_at[table.relid],  # noted before its SYNCWAIT
                )
        log.error(
            "logical replication table synchronization worker failed",
            subscription=self.settings.subscription,
            table=table.qualified_name,
            error=str(exc),
            error_type=type(exc).__name__,
            failures=failure.count,
            retry_in=failure.retry_in,
        )
        if self._on_error is not None and self._on_error(
            f"table synchronization of {table.qualified_name} failed: {exc}"
        ):
            self.workers.held = True

    def resume(self) -> None:
        """Start table-sync workers again (the subscription was enabled)."""
        self.workers.held = False

    def stop(self) -> None:
        self.stopping.set()
        with self._cond:
            self._cond.notify_all()
        self.workers.stop()

    def _export(self) -> None:
        gauge = self._metrics.table_state
        for status in self.statuses:
            for state in TableState:
                gauge.labels(self.settings.subscription, status.qualified_name, state.label).set(
                    1 if state is status.state else 0
                )
