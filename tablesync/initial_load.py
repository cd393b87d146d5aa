"""The first start's copy: the small tables, under the subscription slot's own snapshot.

PostgreSQL's subscriber synchronizes every table on its own (``tablesync.worker``):
a sync slot, a copy under that slot's snapshot, a catch-up stream from it to
the leader's position, and a handover. For a table of minutes the fixed
cost is nothing; for a database of hundreds of small tables it is the whole
sync (``make bench-tables``: 200 tables of 2,000 rows took 75-85 s, against
4-5 s for PostgreSQL's subscriber, which does the same steps in C).

So on a subscription's first start pgsub makes its own slot with an exported
snapshot (``SNAPSHOT 'export'``), as PeerDB's initial load and Debezium's
initial snapshot do, and, before the leader streams, copies under it every
table of at most ``copy.range_size`` of heap that its copy settings read in
one range (``copy.ranges`` set to more reads a table its own way):

- The slot's consistent point L is every such table's copy position, and the
  leader starts streaming at L: there is nothing to catch up, no sync slot and
  no handover. A loaded table goes from INIT to READY at L, as a table does
  with ``copy_data`` off.
- ``max_sync_workers`` threads copy, each on one connection that imported the
  snapshot (``SET TRANSACTION SNAPSHOT``) and copies table after table in that
  one transaction, each table into its Delta table in one commit marked with L
  (``Tables.copy_into``, as a sync worker's copy).
- READY is stored for the copied tables together, every half second, with the
  record that pgsub created their Delta tables: a crash before that leaves them
  INIT, and they are copied again.
- Whatever is not loaded goes on as PostgreSQL's protocol: the larger tables,
  a table whose copy failed (counted and shown as a failed sync, retried by
  its own worker after its backoff), every table after a restart (the snapshot
  dies with the connection that exported it) and every table added later.
- The leader waits for the load, and the slot keeps the publisher's WAL from L
  meanwhile: one pass over the small tables' rows (200 tables of 2,000 rows:
  about as long as PostgreSQL's subscriber takes to sync them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import psycopg
import structlog
from psycopg import sql

from apply.arrival.spool_layout import SpoolLayout
from apply.batching.collapse import is_keyed
from apply.batching.copy_source import CopySource
from apply.columns.schema import TargetSchema, target_schema
from apply.core.failpoints import failpoint
from apply.core.records import CommitMark
from apply.worker.pipeline import ApplyContext
from subscriber.replication import session
from subscriber.replication.lsn import Lsn
from tablesync.copy import BlockRange, CopySettings, RangeReader, copied_blocks
from tablesync.publication import PublishedTable, describe
from tablesync.state import TableState, TableStatus
from tablesync.worker import CopyWatcher, watch_copy

log = structlog.get_logger(__name__)

BLOCK_SIZE = 8192  # PostgreSQL's default; a larger build's tables only look larger
# How often the copied tables' READY is stored (and the caller's ``beat`` runs).
SETTLE_INTERVAL = 0.5

# Each table's heap in blocks, as ``PublishedTable.heap_blocks`` reads one.
_HEAP_BLOCKS = """
SELECT r.relid, greatest(pg_catalog.pg_relation_size(r.relid), (
         SELECT coalesce(max(pg_catalog.pg_relation_size(t.relid)), 0)
           FROM pg_catalog.pg_partition_tree(r.relid) t WHERE t.isleaf))
       / pg_catalog.current_setting('block_size')::bigint
  FROM unnest(%s::oid[]) AS r(relid)
"""


class LoadHandoff(CopyWatcher, Protocol):
    """The coordinator's side (``tablesync.coordinator.SyncCoordinator``)."""

    @property
    def statuses(self) -> list[TableStatus]: ...

    def store_many(
        self, relids: list[int], state: TableState, lsn: Lsn | None = None
    ) -> list[TableStatus]: ...

    def failed(self, table: PublishedTable, exc: Exception) -> None: ...


class InitialLoad:
    """Copies the small INIT tables under ``snapshot``, exported by the subscription's slot
    at ``lsn``, before its leader streams."""

    def __init__(
        self,
        context: ApplyContext,
        handoff: LoadHandoff,
        *,
        snapshot: str,
        lsn: Lsn,
        copy: CopySettings,
        workers: int,
    ) -> None:
        self._context = context
        self._handoff = handoff
        self._snapshot = snapshot
        self._lsn = lsn
        self._copy_settings = copy
        self._workers = max(1, workers)
        self._lock = threading.Lock()
        self._pending: Iterator[PublishedTable] = iter(())
        self._copied: list[PublishedTable] = []

    def run(
        self,
        published: list[PublishedTable],
        stopping: threading.Event,
        beat: Callable[[], None] = lambda: None,
    ) -> list[int]:
        """Load what fits; the tables made READY. ``beat`` runs every half second, and once
        READY is stored for the last of them."""
        waiting = {s.relid for s in self._handoff.statuses if s.state is TableState.INIT}
        tables = self._fitting([t for t in published if t.relid in waiting])
        if not tables:
            return []
        started = time.monotonic()
        log.info(
            "initial load started",
            subscription=self._context.subscription,
            lsn=str(self._lsn),
            tables=len(tables),
            left_to_sync_workers=len(waiting) - len(tables),
        )
        self._pending = iter(tables)
        threads = [
            threading.Thread(target=self._loader, args=(stopping,), name=f"load-{n}", daemon=True)
            for n in range(min(self._workers, len(tables)))
        ]
        for thread in threads:
            thread.start()
        ready: list[int] = []
        while True:
            alive = [thread for thread in threads if thread.is_alive()]
            if alive:
                alive[0].join(SETTLE_INTERVAL)  # a half-second tick, or sooner: one ended
            # Once more after every thread has ended: the last tables are stored READY and
            # shown so at once, not at the leader's first status sample.
            ready += self._settle()
            beat()
            if not alive:
                break
        log.info(
            "initial load finished",
            subscription=self._context.subscription,
            lsn=str(self._lsn),
            ready=len(ready),
            left_to_sync_workers=len(waiting) - len(ready),
            seconds=round(time.monotonic() - started, 3),
        )
        return ready

    def _fitting(self, tables: list[PublishedTable]) -> list[PublishedTable]:
        """The tables of at most ``copy.range_size`` of heap (a partitioned one: its largest
        partition) that the copy settings read in one range, smallest first."""
        if not tables:
            return []
        with session.connect(self._context.conninfo) as conn:
            rows = conn.execute(_HEAP_BLOCKS, [[t.relid for t in tables]]).fetchall()
        blocks = {int(relid): int(size or 0) for relid, size in rows}
        settings, on_executors = self._copy_settings, self._context.tables.copy_on_executors

        def fits(table: PublishedTable) -> bool:
            heap = blocks.get(table.relid, 0)
            return (
                heap * BLOCK_SIZE <= settings.range_bytes
                and settings.ranges_for(heap, on_executors) == 1
            )

        return sorted(filter(fits, tables), key=lambda t: blocks.get(t.relid, 0))

    def _settle(self) -> list[int]:
        """Store READY at the snapshot's LSN for the tables copied since the last call."""
        with self._lock:
            copied, self._copied = self._copied, []
        if copied:
            self._context.tables.remember_created([table.qualified_name for table in copied])
            failpoint("tablesync.before_syncdone")
            self._handoff.store_many([t.relid for t in copied], TableState.READY, self._lsn)
            failpoint("tablesync.after_syncdone")
        return [table.relid for table in copied]

    def _next(self) -> PublishedTable | None:
        with self._lock:
            return next(self._pending, None)

    def _loader(self, stopping: threading.Event) -> None:
        """One connection in the snapshot, copying tables until none is left. A table that
        fails is left to its sync worker; a lost connection leaves this thread's next
        tables to the other threads."""
        try:
            with session.connect(self._context.conninfo) as conn:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                conn.execute(
                    sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(self._snapshot))
                )
                while not stopping.is_set() and (table := self._next()) is not None:
                    conn.execute("SAVEPOINT pgsub_table")
                    try:
                        # Its creation's and its copy's names made durable together, before
                        # it is counted copied: READY is stored only after (``_settle``).
                        with self._context.tables.written_together():
                            self._copy(conn, table)
                    except Exception as exc:  # noqa: BLE001 - its own worker tries again
                        self._handoff.failed(table, exc)
                        conn.execute("ROLLBACK TO SAVEPOINT pgsub_table")
                        continue
                    conn.execute("RELEASE SAVEPOINT pgsub_table")
                    with self._lock:
                        self._copied.append(table)
        except psycopg.Error as exc:
            log.warning(
                "initial load connection lost; its next tables go to sync workers",
                subscription=self._context.subscription,
                error=str(exc),
            )

    def _copy(self, conn: psycopg.Connection[Any], table: PublishedTable) -> None:
        context = self._context
        relation = describe(conn, table)
        schema = target_schema(relation, context.types, is_keyed(relation))
        labels = (context.subscription, table.qualified_name)
        context.metrics.tablesync_rows_estimated.labels(*labels).set(table.estimated_rows)
        # The copy fills it, and makes its first commit with its rows.
        context.tables.prepare(schema, recreate=True, remember=False, with_copy=True)
        started = time.monotonic()
        on_executors = context.tables.copy_on_executors
        log.info(
            "table copy started",
            table=table.qualified_name,
            lsn=str(self._lsn),
            estimated_rows=table.estimated_rows,
            ranges=1,
            read_by="spark tasks" if on_executors else "pgsub",
            snapshot="the subscription slot's",
        )
        source = self._source(conn, table, schema, on_executors)
        mark = CommitMark(context.subscription, self._lsn, 0)
        staging = SpoolLayout(context.spool_root).copy(table.relid)
        copied, _ = context.tables.copy_into(schema, source, mark, staging)
        if on_executors:
            context.metrics.tablesync_rows_copied.labels(*labels).inc(copied)
            self._handoff.copy_progress(table.relid, copied, table.estimated_rows)
        log.info(
            "table copy finished",
            table=table.qualified_name,
            rows=copied,
            lsn=str(self._lsn),
            read_by="spark tasks" if on_executors else "pgsub",
            seconds=round(time.monotonic() - started, 3),
        )

    def _source(
        self,
        conn: psycopg.Connection[Any],
        table: PublishedTable,
        schema: TargetSchema,
        on_executors: bool,
    ) -> CopySource:
        """The table's rows: on a cluster read by one Spark task that imports the snapshot
        too; otherwise read here, on this thread's connection."""
        if on_executors:
            read = RangeReader(self._context.conninfo, self._snapshot, table, schema)
            whole = BlockRange(0, None)
            return CopySource(lambda: read(whole), [whole], read)

        return CopySource.read_here(
            lambda: copied_blocks(conn, table.copy_query(), schema)
        ).watched(lambda rows: watch_copy(self._context, table, self._handoff, rows))
