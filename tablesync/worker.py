"""A table-sync worker: copy one table under its slot's snapshot, catch up, hand over.

PostgreSQL's ``LogicalRepSyncTableStart`` and ``process_syncing_tables_for_sync``:

1. SYNCDONE or READY: nothing to do.
2. Otherwise, unless the copy already finished (FINISHEDCOPY): store
   DATASYNC; drop a sync slot a failed attempt left; on the publisher
   ``BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ`` and
   ``CREATE_REPLICATION_SLOT ... (SNAPSHOT 'use')`` - the slot's consistent
   point is the table's start LSN; COPY the published columns and rows into
   the Delta table (replacing what a failed attempt left); COMMIT; store
   FINISHEDCOPY with that LSN.
3. SYNCWAIT: the leader answers with CATCHUP and an LSN at or past its own
   position.
4. Stream from the sync slot, applying this table's changes only, until
   the CATCHUP LSN is reached; store SYNCDONE with the LSN reached, drop the
   sync slot.

The catch-up runs the leader's own machinery (receiver, batches, MERGE) on
the sync slot, filtered to one table.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Protocol

import pyarrow as pa
import structlog

from apply.arrival.spool_layout import SpoolLayout
from apply.batching.collapse import is_keyed
from apply.batching.copy_source import CopySource
from apply.columns.schema import target_schema
from apply.core.failpoints import failpoint
from apply.core.records import CommitMark
from apply.core.roles import CatchUp
from apply.worker.pipeline import ApplyContext, ApplyPipeline
from subscriber.replication import session
from subscriber.replication.commands import SnapshotAction, quote_literal
from subscriber.replication.lsn import Lsn
from subscriber.replication.stream import ReplicationConnection
from tablesync.copy import (
    CopySettings,
    RangeReader,
    parallel,
    parse_block,
    read_ahead,
    split,
)
from tablesync.publication import PublishedTable, describe
from tablesync.ranged_copy import RangedCopy
from tablesync.resume import MIN_SERVER_VERSION, RESUMED_RESOLUTIONS, RangeStage
from tablesync.state import TableState, TableStatus

log = structlog.get_logger(__name__)


class CopyWatcher(Protocol):
    """Who hears of a copy's progress (``tablesync.coordinator.SyncCoordinator``)."""

    def copy_progress(self, relid: int, copied: int, estimated: int) -> None: ...


class Handoff(CopyWatcher, Protocol):
    """The leader's side of the handoff (``tablesync.coordinator.SyncCoordinator``)."""

    def status(self, relid: int) -> TableStatus: ...

    def store(self, relid: int, state: TableState, lsn: Lsn | None = None) -> TableStatus: ...

    def wait_for_catchup(self, relid: int, start: Lsn, stopping: threading.Event) -> Lsn | None: ...


def watch_copy(
    context: ApplyContext,
    table: PublishedTable,
    watcher: CopyWatcher,
    blocks: Iterable[pa.Table],
    copied: int = 0,
) -> Iterator[pa.Table]:
    """``blocks`` as they are copied, counted in the metrics, ``/status`` and the log (a
    ``table copy progress`` event per block); the ``tablesync.after_copy_block`` failpoint
    after each."""
    counter = context.metrics.tablesync_rows_copied.labels(
        context.subscription, table.qualified_name
    )
    for block in blocks:
        copied += block.num_rows
        counter.inc(block.num_rows)
        watcher.copy_progress(table.relid, copied, table.estimated_rows)
        log.info(
            "table copy progress",
            table=table.qualified_name,
            rows=copied,
            estimated_rows=table.estimated_rows,
        )
        yield block
        failpoint("tablesync.after_copy_block")


def sync_slot_name(subscription: str, relid: int, system_id: str) -> str:
    """PostgreSQL's ``pg_<subid>_sync_<relid>_<sysid>``, with the subscription's name."""
    tail = f"_sync_{relid}_{system_id}"
    return f"pgsub_{subscription.lower()[: 63 - len('pgsub_') - len(tail)]}{tail}"


def sync_slot_relid(slot: str) -> int | None:
    """The table a sync slot was made for (None: not a sync slot's name)."""
    found = re.search(r"_sync_(\d+)_(\d+)$", slot)
    return int(found.group(1)) if found else None


def is_sync_slot(subscription: str, slot: str) -> bool:
    """Whether ``slot`` is one of ``subscription``'s sync slots (for ``pgsub drop``)."""
    found = re.search(r"_sync_(\d+)_(\d+)$", slot)
    return found is not None and slot == sync_slot_name(
        subscription, int(found.group(1)), found.group(2)
    )


class SyncWorker:
    """One table's synchronization, on the subscription's ``ApplyContext``."""

    def __init__(
        self,
        context: ApplyContext,
        table: PublishedTable,
        *,
        handoff: Handoff,
        system_id: str,
        copy: CopySettings | None = None,
    ) -> None:
        self._context = context
        self.table = table
        self._handoff = handoff
        self.slot = sync_slot_name(context.subscription, table.relid, system_id)
        self._conninfo = context.conninfo
        self._copy_settings = copy or CopySettings()
        self._stage = RangeStage(SpoolLayout(context.spool_root).ranges_of(table.relid))

    def run(self, stopping: threading.Event) -> None:
        relid = self.table.relid
        status = self._handoff.status(relid)
        if status.state in (TableState.SYNCDONE, TableState.READY):
            return
        if status.state is TableState.FINISHEDCOPY and self._slot_exists():
            start = status.snapshot
            log.info(
                "table sync resumes its catch-up", table=self.table.qualified_name, lsn=str(start)
            )
        else:
            start = self._copy()
        target = self._handoff.wait_for_catchup(relid, start, stopping)
        if target is None:
            return
        reached = self._catch_up(start, target, stopping)
        if reached is None:
            return
        failpoint("tablesync.before_syncdone")
        self._handoff.store(relid, TableState.SYNCDONE, reached)
        failpoint("tablesync.after_syncdone")
        self._stage.clear()
        self._drop_slot()
        log.info("table synchronized", table=self.table.qualified_name, lsn=str(reached))

    # -- copy ----------------------------------------------------------------

    def _copy(self) -> Lsn:
        table = self.table
        with session.connect(self._conninfo) as conn:
            relation = describe(conn, table)
            heap_blocks = table.heap_blocks(conn)
            server_version = conn.info.server_version
        context = self._context
        schema = target_schema(relation, context.types, is_keyed(relation))
        labels = (context.subscription, table.qualified_name)
        context.metrics.tablesync_rows_estimated.labels(*labels).set(table.estimated_rows)
        on_executors = context.tables.copy_on_executors
        ranges = split(heap_blocks, self._copy_settings.ranges_for(heap_blocks, on_executors))
        staged = len(ranges) > 1 and server_version >= MIN_SERVER_VERSION
        # A table kept with its history lands its staged rows through copy_into, which turns
        # them into its own (apply.history.changelog, apply.history.stamps,
        # apply.history.versions): staged in the
        # daemon's spool, not on executors, whose parts land as a mirror's rows.
        landed_here = context.tables.plain_mirror(schema) or not on_executors
        if staged and schema.key and self._copy_settings.resumable and landed_here:
            return RangedCopy(
                context,
                table,
                self._handoff,
                slot=self.slot,
                stage=self._stage,
                readers=self._copy_settings.readers,
                progress=self._progress,
                drop_slot=self._drop_slot,
            ).run(schema, ranges, on_executors)
        self._stage.clear()
        self._handoff.store(table.relid, TableState.DATASYNC)
        self._drop_slot()
        context.tables.prepare(schema, recreate=True)  # the copy fills it
        started = time.monotonic()
        with ReplicationConnection(self._conninfo) as connection:
            in_transaction = len(ranges) == 1 and not on_executors
            if in_transaction:
                # PostgreSQL's way: the copy runs in the transaction that made the slot.
                connection.execute("BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ")
                slot = connection.create_slot(self.slot, snapshot=SnapshotAction.USE)
                rows = connection.copy_out(table.copy_query().as_string(None))
                source = CopySource.read_here(
                    lambda: read_ahead(rows, functools.partial(parse_block, schema=schema))
                )
            else:
                # The snapshot stays importable while this connection stays idle.
                slot = connection.create_slot(self.slot, snapshot=SnapshotAction.EXPORT)
                read = RangeReader(self._conninfo, slot.snapshot_name or "", table, schema)
                readers = self._copy_settings.readers
                source = CopySource(lambda: parallel(read, ranges, readers), ranges, read)
            log.info(
                "table copy started",
                table=table.qualified_name,
                lsn=str(slot.consistent_point),
                estimated_rows=table.estimated_rows,
                ranges=len(ranges),
                read_by="spark tasks" if on_executors else "pgsub",
            )
            source = source.watched(self._progress)
            mark = CommitMark(context.subscription, slot.consistent_point, 0)
            staging = SpoolLayout(context.spool_root).copy(table.relid)
            copied, _ = context.tables.copy_into(schema, source, mark, staging)
            if in_transaction:
                connection.execute("COMMIT")
        if on_executors:
            context.metrics.tablesync_rows_copied.labels(*labels).inc(copied)
            self._handoff.copy_progress(table.relid, copied, table.estimated_rows)
        self._handoff.store(table.relid, TableState.FINISHEDCOPY, slot.consistent_point)
        log.info(
            "table copy finished",
            table=table.qualified_name,
            rows=copied,
            seconds=round(time.monotonic() - started, 3),
        )
        return slot.consistent_point

    def _progress(self, blocks: Iterable[pa.Table], copied: int = 0) -> Iterator[pa.Table]:
        return watch_copy(self._context, self.table, self._handoff, blocks, copied)

    def _slot_exists(self) -> bool:
        with ReplicationConnection(self._conninfo) as connection:
            return bool(
                connection.execute(
                    "SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = "
                    + quote_literal(self.slot)
                )
            )

    def _drop_slot(self) -> None:
        if self._slot_exists():
            with ReplicationConnection(self._conninfo) as connection:
                connection.drop_slot(self.slot)

    # -- catch-up ------------------------------------------------------------

    def _catch_up(self, start: Lsn, target: Lsn, stopping: threading.Event) -> Lsn | None:
        """Apply this table's changes from the sync slot up to ``target``; the LSN reached."""
        context = self._context
        staged = self._stage.manifest()
        resumed = staged is not None and staged.resumed and staged.lsn == start
        if target <= start and not resumed:
            # The leader is not past the copy's snapshot: nothing to catch up. PostgreSQL's
            # worker ends here too, at its start position, without applying a change.
            return start
        if resumed:
            # The table holds rows read after ``start``, up to ``read_at``: replay over them,
            # and at least to there (tablesync.resume).
            assert staged is not None
            target = max(target, staged.read_at or start)
            resolutions = {**context.resolutions, **RESUMED_RESOLUTIONS}
            context = replace(context, resolutions=resolutions, reporter=None)
            log.info(
                "table catch-up replays changes over rows read after its start",
                table=self.table.qualified_name,
                lsn=str(start),
                through=str(target),
                conflicts="insert_exists, update_exists: apply_remote; missing rows: skip;"
                " not reported",
            )
        pipeline = ApplyPipeline(context, CatchUp(self.table.relid, self.slot), start)
        progress = pipeline.progress
        pipeline.start()
        reached = False
        try:
            while not (stopping.is_set() or pipeline.done.is_set()):
                if progress.done_through >= target:
                    reached = True
                    break
                pipeline.done.wait(0.1)
        finally:
            failures = pipeline.stop()
        if failures:
            raise failures[0]
        # Read only once the apply thread has stopped: it may have committed one more
        # batch past the target, and SYNCDONE must say everything the table holds.
        return max(target, progress.flushed) if reached else None
