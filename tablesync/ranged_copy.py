"""A keyed table's copy in ranges, staged so that it resumes after a crash (tablesync.resume).

``RangedCopy.run`` is the table-sync worker's copy step for such a table:
a first attempt stages every range under the sync slot's exported
snapshot, an attempt after a crash keeps what was staged and reads the
rest under a new snapshot, and either lands everything in one commit.

The rows are staged where they are read: in the daemon's spool when the
daemon reads them (a local Spark), in a Delta table under the warehouse
when Spark tasks read them on the executors (``apply.batching.copy_source.StagedParts``).
The manifest and the markers of complete parts are always in the spool.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Final, Protocol

import pyarrow as pa
import structlog
from psycopg import sql

from apply.arrival.spool_layout import SpoolLayout
from apply.batching.copy_source import CopySource, StagedParts
from apply.core.failpoints import failpoint
from apply.core.records import CommitMark
from subscriber.replication import session
from subscriber.replication.catalog import wal_end
from subscriber.replication.commands import SnapshotAction, quote_literal
from subscriber.replication.lsn import Lsn
from subscriber.replication.stream import ReplicationConnection
from tablesync.copy import BlockRange, RangeReader, parallel
from tablesync.resume import (
    CHANGED,
    KEYS,
    Manifest,
    RangeStage,
    key_schema,
    landed_rows,
    layout,
    next_attempt,
    range_name,
    read_again,
    read_again_where,
    snapshot_facts,
)
from tablesync.state import TableState

if TYPE_CHECKING:
    from apply.columns.schema import TargetSchema
    from apply.worker.pipeline import ApplyContext
    from tablesync.publication import PublishedTable
    from tablesync.state import TableStatus

log = structlog.get_logger(__name__)

# Parts staged at once on the executors: each is a Spark job of one task.
EXECUTOR_JOBS: Final = 16


def part(manifest: Manifest, name: str, attempt: int | None = None) -> str:
    """The staging table's partition of ``name`` as staged by ``attempt`` (default: this
    one). Never reused: a job of a killed daemon that a Spark Connect server finishes
    later writes a partition no later attempt reads."""
    return f"{name}@{int(manifest.lsn):x}.{attempt or manifest.attempt}"


class Handoff(Protocol):
    """The coordinator's side of a copy (``tablesync.worker.Handoff`` has more)."""

    def status(self, relid: int) -> TableStatus: ...

    def store(self, relid: int, state: TableState, lsn: Lsn | None = None) -> TableStatus: ...

    def copy_progress(self, relid: int, copied: int, estimated: int) -> None: ...


class Progress(Protocol):
    def __call__(self, blocks: Iterable[pa.Table], copied: int = 0) -> Iterator[pa.Table]: ...


class RangedCopy:
    def __init__(
        self,
        context: ApplyContext,
        table: PublishedTable,
        handoff: Handoff,
        *,
        slot: str,
        stage: RangeStage,
        readers: int,
        progress: Progress,
        drop_slot: Callable[[], None],
    ) -> None:
        self._context = context
        self.table = table
        self._handoff = handoff
        self.slot = slot
        self._stage = stage
        self._readers = readers
        self._progress = progress
        self._drop_slot = drop_slot
        # copy_into's own folder, for a local Spark
        self._spark_staging = SpoolLayout(context.spool_root).copy(table.relid)

    def run(self, schema: TargetSchema, ranges: list[BlockRange], on_executors: bool) -> Lsn:
        """Copy the table (resuming what a crashed attempt staged); its start LSN."""
        parts = self._context.tables.staged_copy(schema) if on_executors else None
        manifest = self._stage.manifest()
        if manifest is not None and self._resumable(manifest, schema):
            resumed = self._resume(schema, next_attempt(manifest), parts)
            if resumed is not None:
                return resumed
        return self._first(schema, ranges, parts)

    def _first(
        self, schema: TargetSchema, ranges: list[BlockRange], parts: StagedParts | None
    ) -> Lsn:
        table, context, conninfo = self.table, self._context, self._context.conninfo
        self._handoff.store(table.relid, TableState.DATASYNC)
        self._drop_slot()
        context.tables.prepare(schema, recreate=True)
        if parts is not None:
            parts.drop()  # what an attempt that cannot be resumed staged
        started = time.monotonic()
        with ReplicationConnection(conninfo) as connection:
            # The snapshot stays importable while this connection stays idle.
            slot = connection.create_slot(self.slot, snapshot=SnapshotAction.EXPORT)
            read = RangeReader(conninfo, slot.snapshot_name or "", table, schema)
            with session.connect(conninfo) as conn:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(read.snapshot_literal))
                xmin, relation = snapshot_facts(conn, table.relid)
                conn.execute("COMMIT")
            lsn = slot.consistent_point
            manifest = Manifest(self.slot, lsn, xmin, relation, layout(schema), tuple(ranges))
            self._stage.begin(manifest)
            log.info(
                "table copy started",
                table=table.qualified_name,
                lsn=str(lsn),
                estimated_rows=table.estimated_rows,
                ranges=len(ranges),
                read_by="pgsub" if parts is None else "spark tasks",
                staged=True,
            )
            self._stage_ranges(read, manifest, range(len(ranges)), parts, copied=0)
        return self._land(schema, manifest, None, parts, started)

    def _resumable(self, manifest: Manifest, schema: TargetSchema) -> bool:
        """Whether a crashed attempt's staged ranges can be kept: the table is still being
        copied from the same slot, into the same layout."""
        status = self._handoff.status(self.table.relid)
        if status.state is not TableState.DATASYNC or manifest.landed:
            return False
        if manifest.slot != self.slot or manifest.layout != layout(schema):
            return False
        with ReplicationConnection(self._context.conninfo) as connection:
            rows = connection.execute(
                "SELECT confirmed_flush_lsn FROM pg_catalog.pg_replication_slots"
                " WHERE slot_name = " + quote_literal(self.slot)
            )
        # An unused slot is where it was made: nothing streamed from it yet.
        flushed = rows[0]["confirmed_flush_lsn"] if rows else None
        return flushed is not None and Lsn.parse(flushed) == manifest.lsn

    def _resume(
        self, schema: TargetSchema, manifest: Manifest, parts: StagedParts | None
    ) -> Lsn | None:
        """Read what a crashed attempt left under a new snapshot and land it all; None when
        the table was rewritten since (the copy starts over)."""
        table, stage, conninfo = self.table, self._stage, self._context.conninfo
        started = time.monotonic()
        staged = stage.done()
        done = [i for i in range(len(manifest.ranges)) if range_name(i) in staged]
        with session.connect(conninfo) as holder:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            exported = holder.execute("SELECT pg_catalog.pg_export_snapshot()").fetchone()
            _, relation = snapshot_facts(holder, table.relid)
            # Read after the snapshot: every transaction it shows ends at or before it.
            manifest = replace(manifest, read_at=wal_end(holder))
            if relation != manifest.relation or exported is None:
                log.warning(
                    "table copy starts over: the table was rewritten since it was staged",
                    table=table.qualified_name,
                    staged_ranges=len(done),
                )
                return None
            stage.record(manifest)
            read = RangeReader(conninfo, str(exported[0]), table, schema)
            self._context.tables.prepare(schema, recreate=True)
            copied = sum(stage.rows(range_name(i)) for i in done) if parts is None else 0
            log.info(
                "table copy resumes",
                table=table.qualified_name,
                lsn=str(manifest.lsn),
                read_at=str(manifest.read_at),
                staged_ranges=len(done),
                ranges=len(manifest.ranges),
                staged_rows=copied if parts is None else None,
                attempt=manifest.attempt,
            )
            remaining = [i for i in range(len(manifest.ranges)) if i not in done]
            self._stage_ranges(read, manifest, remaining, parts, copied=copied)
            if parts is None:
                keys = read_again(stage, manifest, read, schema)
            else:
                changed, since = read_again_where(stage, manifest)
                self._stage_on_executors(parts, manifest, read.rows, [(CHANGED, changed, None)])
                self._stage_on_executors(
                    parts, manifest, read.rows, [(KEYS, since, key_schema(schema))]
                )
                keys = None
            holder.execute("COMMIT")
        return self._land(schema, manifest, keys, parts, started)

    def _stage_ranges(
        self,
        read: RangeReader,
        manifest: Manifest,
        indexes: Iterable[int],
        parts: StagedParts | None,
        copied: int,
    ) -> None:
        if parts is not None:
            wanted = [(range_name(i), manifest.ranges[i].condition(), None) for i in indexes]
            self._stage_on_executors(parts, manifest, read.rows, wanted)
            return
        stage = self._stage

        def staged(index: int) -> Iterator[pa.Table]:
            blocks = read(manifest.ranges[index])
            yield from stage.stage(range_name(index), blocks, manifest.attempt)
            failpoint("tablesync.after_range_staged")

        for _ in self._progress(parallel(staged, list(indexes), self._readers), copied):
            pass

    def _stage_on_executors(
        self,
        parts: StagedParts,
        manifest: Manifest,
        rows: Callable[..., Iterator[pa.Table]],
        wanted: Sequence[tuple[str, sql.Composable | None, TargetSchema | None]],
    ) -> None:
        """Each of ``wanted`` (name, condition, columns) read by a Spark task and staged,
        several at once; each marked complete as its job ends."""
        if not wanted:
            return
        lock = threading.Lock()
        staged: list[str] = []

        def one(name: str, condition: sql.Composable | None, columns: TargetSchema | None) -> None:
            # A plain SQL string travels into the task, whatever psycopg's objects pickle to.
            where = sql.SQL(condition.as_string(None)) if condition is not None else None
            self._stage.unmark(name)
            parts.stage(functools.partial(rows, where, columns), part(manifest, name))
            self._stage.mark(name, manifest.attempt)
            with lock:
                staged.append(name)
                log.info(
                    "table copy progress",
                    table=self.table.qualified_name,
                    staged=name,
                    parts=len(staged),
                    of=len(wanted),
                )
            failpoint("tablesync.after_range_staged")

        with ThreadPoolExecutor(min(len(wanted), EXECUTOR_JOBS), "copy-stage") as pool:
            for future in [pool.submit(one, *w) for w in wanted]:
                future.result()

    def _drop(self, parts: StagedParts) -> None:
        try:
            parts.drop()
        except Exception as exc:  # noqa: BLE001 - only room is at stake; said, not raised
            log.warning(
                "staged copy not removed",
                table=self.table.qualified_name,
                error=str(exc),
                note="removed by the table's next staged copy",
            )

    def _land(
        self,
        schema: TargetSchema,
        manifest: Manifest,
        keys: pa.Table | None,
        parts: StagedParts | None,
        started: float,
    ) -> Lsn:
        """The staged rows into the Delta table in one commit. Rows staged by an earlier
        attempt whose key was read again (``keys``, or part ``keys`` on the executors) are
        stale and left out."""
        table, stage, context = self.table, self._stage, self._context
        mark = CommitMark(context.subscription, manifest.lsn, 0)
        if parts is None:
            source = CopySource.read_here(lambda: landed_rows(stage, manifest, keys, schema.key))
            copied, _ = context.tables.copy_into(schema, source, mark, self._spark_staging)
        else:
            staged = stage.done()
            names = [range_name(i) for i in range(len(manifest.ranges))]
            missing = [name for name in names if name not in staged]
            if missing:
                raise RuntimeError(f"parts {missing} of {table.qualified_name} not staged")
            stale = [n for n in names if staged[n] < manifest.attempt]
            fresh = [n for n in names if n not in stale] + ([CHANGED] if manifest.resumed else [])
            copied, _ = parts.land(
                mark,
                [part(manifest, n, staged[n]) for n in stale],
                [part(manifest, n, staged[n]) for n in fresh],
                part(manifest, KEYS) if manifest.resumed else None,
            )
            labels = (context.subscription, table.qualified_name)
            context.metrics.tablesync_rows_copied.labels(*labels).inc(copied)
            self._handoff.copy_progress(table.relid, copied, table.estimated_rows)
        failpoint("tablesync.after_copy_landed")
        self._handoff.store(table.relid, TableState.FINISHEDCOPY, manifest.lsn)
        stage.record(manifest.landed_now())
        stage.drop_rows()
        if parts is not None:
            # Off the path to READY (VACUUM takes seconds to tens of seconds on a cluster);
            # what a crash leaves, the table's next staged copy removes first.
            threading.Thread(
                target=self._drop, args=(parts,), name=f"copy-drop-{table.relid}", daemon=True
            ).start()
        log.info(
            "table copy finished",
            table=table.qualified_name,
            rows=copied,
            seconds=round(time.monotonic() - started, 3),
            resumed=manifest.resumed,
        )
        return manifest.lsn
