"""The initial copy into a target table: the blocks a table-sync worker read, in Delta.

Three ways (``DeltaTables.copy_into`` picks), each one Delta commit
carrying the copy's mark (idempotent-write id and ``userMetadata``):

- ``write_once``: the Arrow blocks, read in this process, written as they
  come straight into the table's Parquet files, by pgsub's own commit where
  the protocol allows (delta-rs's otherwise) - each row is written once, no
  JVM round trip; ``write_first`` the same into a table whose creation was
  held back for the copy, its commit making the table. For a local Spark,
  a warehouse on the local file system and a table whose writer features
  delta-rs supports (no column mapping, no type widening).
- with a local Spark otherwise, the blocks are staged as Parquet files and
  land in one Spark commit;
- on a cluster or through Spark Connect (``copy_on_executors``) Spark
  tasks read the table's CTID ranges on the executors, one task per
  range, and one Spark write commits them: no row passes through the
  daemon.

The Spark ways may land the rows by a MERGE instead (``plan``): a
soft-delete table copied again keeps the rows it marked deleted
(``apply.plans.merge_plan.soft_resync_merge``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pyarrow as pa

from apply.batching.copy_source import CopySource
from apply.batching.source import empty as source_empty
from apply.columns.columnar import arrow_schema
from apply.columns.schema import TargetSchema
from apply.core.errors import TargetTableError
from apply.core.records import CommitMark
from apply.delta.files.storage import is_object_store
from apply.delta.files.store import commit_name, table_store
from apply.delta.spark import sql as delta_sql
from apply.delta.spark.session import SparkErrors, runs_here, struct
from apply.delta.writer.creation import HeldCreation
from apply.delta.writer.local_tables import (
    as_table_holds,
    delta_rs_writes,
    held_schema,
    marked,
    opened,
)
from apply.delta.writer.open_table import OpenTable
from apply.delta.writer.overwrite import Appended, append, hand_appendable
from apply.history.changelog import HistoryMode, changelog_schema
from apply.history.changelog import copied as changelog_copied
from apply.history.stamps import Keeping, stamped_schema
from apply.history.stamps import copied as stamped_copied
from apply.history.versions import copied as versions_copied
from apply.history.versions import versions_schema
from apply.plans.merge_plan import MergePlan, soft_resync_merge, versions_resync_merge
from subscriber.replication.lsn import Lsn

if TYPE_CHECKING:
    import deltalake

    from apply.delta.spark.target import TargetTable

# A copy replaces a mirror table's rows, and is appended to a change log's.
WriteMode = Literal["overwrite", "append"]


@dataclass(frozen=True, slots=True)
class KeptCopy:
    """A copy as its table keeps it (``history``): its rows, their layout, how they land."""

    source: CopySource
    schema: TargetSchema
    mode: WriteMode = "overwrite"
    plan: MergePlan | None = None  # a resync that merges instead of replacing


def kept_copy(
    keeping: Keeping,
    schema: TargetSchema,
    source: CopySource,
    lsn: Lsn,
    holds_rows: Callable[[], bool],
) -> KeptCopy:
    """A copy at ``lsn`` of a table of ``schema`` kept as ``keeping`` says; ``holds_rows``:
    whether the table has rows already (a resync)."""
    if keeping.mode is HistoryMode.CHANGELOG:  # a truncate row, then the copy's rows
        return KeptCopy(changelog_copied(source, schema, lsn), changelog_schema(schema), "append")
    if keeping.mode is HistoryMode.SCD2:  # first versions; a resync closes the current ones
        plan = versions_resync_merge(schema, int(lsn)) if holds_rows() else None
        return KeptCopy(versions_copied(source, schema, lsn), versions_schema(schema), plan=plan)
    stamping = keeping.stamping
    if not stamping.stamps:
        return KeptCopy(source, schema)
    # A resync of a soft-delete table keeps what it marked deleted.
    plan = soft_resync_merge(schema, int(lsn)) if stamping.soft and holds_rows() else None
    stamped = stamped_copied(source, schema, lsn, stamping)  # alive, written at the copy's LSN
    return KeptCopy(stamped, stamped_schema(schema, stamping), plan=plan)


def copy_target(
    path: str, created: deltalake.DeltaTable | None = None
) -> deltalake.DeltaTable | None:
    """The table at ``path`` as delta-rs opens it (``created``: as its creation left it, just
    before), if a copy into it may be written in this process (``write_once``): by pgsub's
    own commit, or, on a local folder, by delta-rs; None otherwise. The copy's write, its
    size check and the first batch's key index go on from this one opening of the log
    (each opened it again: about 1 ms each on a local disk, a listing and a read of each
    commit in a bucket). ``created`` is opened anew if the table has a commit after it
    (one look for the next commit's name)."""
    import deltalake

    if created is not None and table_store(path).exists(commit_name(created.version() + 1)):
        created = None
    if is_object_store(path):
        table = created or opened(path)
        return table if hand_appendable(table, nullable=True) else None
    try:
        table = created or opened(path)
    except (deltalake.exceptions.DeltaError, OSError):
        return None
    return table if delta_rs_writes(table.protocol()) else None


def write_once(
    target: TargetTable,
    table: deltalake.DeltaTable,
    schema: TargetSchema,
    blocks: Iterator[pa.Table],
    mark: CommitMark,
    *,
    mode: WriteMode = "overwrite",
) -> tuple[int, int | None]:
    """Replace the rows of ``table`` (``copy_target``'s) with ``blocks`` (``mode`` append:
    add them) in one commit carrying ``mark``; the rows written, and the commit's version
    if it is pgsub's own (durable already; None: delta-rs's); ``table`` is brought up to
    the commit. pgsub's own commit where the table's protocol
    allows (``apply.delta.writer.overwrite.append``: the blocks written as Parquet as they come,
    by this thread), else delta-rs's: it pulls the blocks from its own threads, calling back
    into Python, and in an object store that deadlocked against other delta-rs calls of
    the process (the initial load's parallel copies) - not an option there."""
    import deltalake

    arrow = arrow_schema(schema.columns)
    written = [0]
    own: int | None = None

    def batches(held: pa.Schema) -> Iterator[pa.RecordBatch]:
        for block in blocks:
            written[0] += block.num_rows
            yield from as_table_holds(block.cast(arrow), held).to_batches()

    try:
        # A column the publisher no longer sends stays in the table, NULL in these rows.
        held = as_table_holds(arrow.empty_table(), held_schema(table))
        if hand_appendable(table, nullable=True):
            store = table_store(target.path)
            live = OpenTable(store, table).files() if mode == "overwrite" else None
            own = table.version() + 1
            append(store, own - 1, batches(held.schema), held.schema, mark, replacing=live)
        else:
            deltalake.write_deltalake(
                table,
                pa.RecordBatchReader.from_batches(held.schema, batches(held.schema)),
                mode=mode,
                commit_properties=marked(mark),
            )
        table.update_incremental()
    except deltalake.exceptions.DeltaError as exc:
        raise TargetTableError(f"copying {schema.table} into {target.path} failed: {exc}") from exc
    return written[0], own


def write_first(
    target: TargetTable,
    held: HeldCreation,
    schema: TargetSchema,
    blocks: Iterator[pa.Table],
    mark: CommitMark,
) -> Appended:
    """The rows of ``blocks`` into a table whose first commit was held back for them
    (``create_table``'s ``hold``): pgsub's own commit, carrying ``mark``, makes the table
    with them - its version 0, durable when it returns; a ``CommitRacedError`` if another
    writer made the table first. An overwrite and an append are one here: the table holds
    no row yet. No delta-rs opening: its protocol and columns are the held creation's."""
    arrow = arrow_schema(schema.columns)
    held_columns = held.arrow()

    def batches() -> Iterator[pa.RecordBatch]:
        for block in blocks:
            yield from as_table_holds(block.cast(arrow), held_columns).to_batches()

    store = table_store(target.path)
    return append(store, -1, batches(), held_columns, mark, creating=held.actions())


def copy_into(
    target: TargetTable,
    schema: TargetSchema,
    source: CopySource,
    mark: CommitMark,
    staging: Path,
    *,
    mode: WriteMode = "overwrite",
    plan: MergePlan | None = None,
    read_here: bool | None = None,
) -> tuple[int, int | None]:
    """Replace the table's rows with ``source``'s (the initial copy; ``mode`` append: add
    them to a change log table; ``plan``: merge them by it); (rows, version).

    Read here (``read_here``; by default with a local Spark) the blocks are
    staged as Parquet files in ``staging`` (written by pyarrow, one block in
    memory at a time; a folder Spark sees), then land in one Delta commit
    carrying ``mark``. Otherwise (a cluster, which cannot read the daemon's
    disk) the executors read the parts themselves.
    """
    if read_here is None:
        read_here = runs_here(target.session)
    try:
        if read_here:
            blocks = source.blocks()
            return _copy_staged(target, schema, blocks, mark, staging, mode=mode, plan=plan)
        return copy_on_executors(target, schema, source, mark, mode=mode, plan=plan)
    except SparkErrors as exc:
        raise TargetTableError(f"copying {schema.table} into {target.path} failed: {exc}") from exc


def _copy_staged(
    target: TargetTable,
    schema: TargetSchema,
    blocks: Iterator[pa.Table],
    mark: CommitMark,
    staging: Path,
    *,
    mode: WriteMode,
    plan: MergePlan | None,
) -> tuple[int, int | None]:
    import pyarrow.parquet as pq

    shutil.rmtree(staging, ignore_errors=True)  # what a killed attempt left
    staging.mkdir(parents=True, mode=0o700)
    try:
        rows = 0
        for number, block in enumerate(blocks):
            pq.write_table(block, staging / f"part-{number:06d}.parquet")
            rows += block.num_rows
        with target.marked(mark) as session:
            if rows:
                frame = session.read.schema(struct(schema.ddl())).parquet(staging.as_uri())
            else:
                frame = target.frame(source_empty(schema), schema)
            if plan is not None:  # staged files: read twice, the same rows
                return rows, target.merge(schema, frame, plan).version
            frame.write.format("delta").mode(mode).save(target.path)
            return rows, target.committed_version()
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def copy_on_executors(
    target: TargetTable,
    schema: TargetSchema,
    source: CopySource,
    mark: CommitMark,
    *,
    mode: WriteMode = "overwrite",
    plan: MergePlan | None = None,
) -> tuple[int, int | None]:
    """One Spark job, a task per part, each reading its part on an executor; its rows are
    written (``plan``: merged) in one commit carrying ``mark``. A failed task is retried by
    Spark."""
    session = target.session
    arrow = arrow_schema(schema.columns)
    parts, read = list(source.parts), source.read

    def task(numbers: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in numbers:
            for number in batch.column(0).to_pylist():
                for block in read(parts[number]):
                    # An empty batch would end Spark's read of the task's output.
                    yield from (b for b in block.cast(arrow).to_batches() if b.num_rows)

    frame = session.range(0, len(parts), 1, len(parts)).mapInArrow(task, struct(schema.ddl()))
    with target.marked(mark):
        if plan is None:
            frame.write.format("delta").mode(mode).save(target.path)
            version = target.committed_version()
        else:  # read from the publisher: copied once by Delta, not read twice
            version = target.merge(schema, frame, plan, reads_target=True).version
    if version is None:  # Delta skipped the write: this mark's copy was committed before
        return 0, None
    # The rows the commit wrote, from its own metrics (a Spark Connect client has no
    # accumulators).
    metrics = delta_sql.commit_metrics(session, target.path, version)
    return int(metrics.get("numSourceRows" if plan else "numOutputRows") or 0), version
