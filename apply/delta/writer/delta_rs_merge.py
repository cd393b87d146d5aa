"""One keyed batch into one open table by delta-rs: its MERGE, or a small table's rewrite.

``merge_into`` is steps 1-3 of ``apply.delta.writer.local_merge`` for one table kept open
(``OpenTable``): the batch's mark looked for in the log, the batch's keys looked up
(``apply.delta.writer.key_lookup``), then delta-rs's MERGE of the same plan as Spark's
(``run_merge``); a table of at most ``REWRITE_MAX_BYTES`` is instead read whole, the batch
applied in Arrow (``apply.plans.rewrite``) and the table overwritten in one commit, by
pgsub's own commit where its protocol allows (``apply.delta.writer.overwrite``).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Final

import pyarrow as pa
import structlog

from apply.batching.source import KeyedSource
from apply.columns.columnar import arrow_schema
from apply.core.records import CommitMark, WriteResult
from apply.delta.files.store import TableStore
from apply.delta.writer.checkpoint import keep_log_of
from apply.delta.writer.kept_rows import KEPT
from apply.delta.writer.key_lookup import keys_conflict
from apply.delta.writer.local_tables import delta_rs_writes, marked, no_checkpoint
from apply.delta.writer.open_table import LiveFile, OpenTable
from apply.delta.writer.overwrite import hand_writable, keep_log, overwrite
from apply.history.stamps import Stamping, stamped_schema
from apply.plans.merge_plan import (
    ClauseKind,
    MergePlan,
    OnExists,
    expected_counts,
    expected_touched,
    key_bounds,
    keyed_merge,
    shape_of,
)
from apply.plans.rewrite import rewritten

if TYPE_CHECKING:
    import deltalake

    from apply.columns.schema import TargetSchema

log = structlog.get_logger(__name__)

# Above this much Parquet a table's MERGE goes to Spark: delta-rs rewrites the touched files
# in this process's memory, and the key lookup reads every key.
LOCAL_MERGE_MAX_BYTES: Final = 256 * 2**20
# Up to this much Parquet a table is rewritten whole, its new rows computed in Arrow
# (``apply.plans.rewrite``): cheaper than delta-rs's MERGE, which rewrites its one file anyway.
REWRITE_MAX_BYTES: Final = 4 * 2**20


def merge_into(
    open_table: OpenTable,
    schema: TargetSchema,
    source: KeyedSource,
    mark: CommitMark,
    *,
    done: int | None,
    max_bytes: int = LOCAL_MERGE_MAX_BYTES,
    stamping: Stamping = Stamping.NONE,
) -> WriteResult | None:
    """``source`` merged into ``table`` (at its latest commit, of at most ``max_bytes`` of
    Parquet; rewritten whole up to ``REWRITE_MAX_BYTES``, read at the call);
    None: Spark's path. ``done``: the last batch version of ``mark``'s app the table has."""
    if not delta_rs_writes(open_table.table.protocol()):
        return None
    app_id, version = mark.txn
    if done is not None and done >= version:
        return WriteResult(schema.table, None)  # committed before: Delta's txn says so
    size = fitting_size(open_table, stamped_schema(schema, stamping), max_bytes)
    if size is None:
        return None
    try:
        if size <= REWRITE_MAX_BYTES and not stamping.stamps:
            return _rewrite(open_table, schema, source, mark)
        open_table.confirm_latest()
        table = open_table.synced()
        if keys_conflict(open_table, schema, source.table, stamping.soft):
            return None
    except pa.ArrowException:  # a key type pyarrow cannot join on
        return None
    bounds = key_bounds(source.table, schema.key[0])
    shape = shape_of(source.table)
    plan = keyed_merge(
        schema, source.keep_columns, OnExists.APPLY_REMOTE, shape, bounds, stamping=stamping
    )
    metrics = run_merge(table, source.table, plan, mark)
    keep_log(table, open_table.store.location)
    counts = (
        metrics.get("num_target_rows_inserted", 0),
        metrics.get("num_target_rows_updated", 0),
        metrics.get("num_target_rows_deleted", 0),
    )
    expected = expected_counts(source.table)
    if stamping.soft:  # a revived or marked row is an update
        expected = (counts[0], expected_touched(source.table) - counts[0], 0)
    if counts != expected:
        # Only another writer between the lookup and the commit can make this happen.
        log.warning(
            "a MERGE by delta-rs changed other rows than its lookup predicted",
            table=schema.table,
            lsn=str(mark.lsn),
            counts=counts,
            expected=expected,
        )
    open_table.wrote(app_id, version)
    return WriteResult(schema.table, table.version(), *counts)


def fitting_size(open_table: OpenTable, schema: TargetSchema, max_bytes: int) -> int | None:
    """The table's bytes of Parquet, if at most ``max_bytes`` and its columns have the types
    pgsub's Arrow values have (``_types``); else None."""
    size = sum(file.size for file in open_table.files())
    if size > max_bytes or table_types(open_table, schema) is None:
        return None
    return size


def table_types(open_table: OpenTable, schema: TargetSchema) -> pa.Schema | None:
    """The table's Arrow schema, if its columns have the types pgsub's Arrow values have (a
    table made by Spark, or evolved, may differ); else None."""
    return open_table.fact(("table_types", schema.columns), partial(_types, schema=schema))


def _types(table: deltalake.DeltaTable, schema: TargetSchema) -> pa.Schema | None:
    have = pa.schema(table.schema().to_arrow())
    for wanted in arrow_schema(schema.columns):
        if wanted.name not in have.names or have.field(wanted.name).type != wanted.type:
            return None
    return have


def _rewrite(
    open_table: OpenTable, schema: TargetSchema, source: KeyedSource, mark: CommitMark
) -> WriteResult | None:
    """A small table rewritten whole with the batch applied in Arrow (``apply.plans.rewrite``), in
    one commit carrying ``mark``; None: a conflict (Spark's path), nothing written."""
    import deltalake

    have = open_table.arrow_schema
    live = open_table.files()
    current = _read(have, open_table.store, live)
    rows = rewritten(current, source, list(schema.key))
    if rows is None:
        return None
    app_id, version = mark.txn
    counts = expected_counts(source.table)
    if hand_writable(open_table.table, rows):
        own, written, actions = overwrite(
            open_table.store,
            open_table.version,
            live,
            rows,
            mark,
            before_commit=open_table.confirm_latest,  # the log's check, asked meanwhile
        )
        KEPT.forget(open_table.store.location, [file.name for file in live])
        KEPT.keep(open_table.store.location, own.name, rows)  # the next batch's ``current``
        open_table.wrote(app_id, version, own, actions=actions)
        keep_log_of(open_table)
        return WriteResult(
            schema.table, open_table.version, *counts, written_bytes=written, durable=True
        )
    open_table.confirm_latest()
    table = open_table.synced()
    deltalake.write_deltalake(
        table,
        rows,
        mode="overwrite",
        commit_properties=marked(mark),
        post_commithook_properties=no_checkpoint(),
    )
    keep_log(table, open_table.store.location)
    open_table.wrote(app_id, version)
    return WriteResult(schema.table, table.version(), *counts)


def _read(schema: pa.Schema, store: TableStore, live: list[LiveFile]) -> pa.Table:
    """The rows of a small table's files ``live``, in its ``schema``: kept from this
    process's own overwrite (``apply.delta.writer.kept_rows``), or read."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    def scanned() -> pa.Table:
        files = [store.source(file.name) for file in live]
        dataset = ds.dataset(files, schema=schema, format="parquet", filesystem=store.filesystem)
        return dataset.to_table()

    parts = []
    for file in live:
        part = KEPT.get(store.location, file.name)
        if part is None:  # a quarter of a dataset scan's time:
            part = pq.ParquetFile(store.open(file.name, file.size)).read()
        if sorted(part.schema.names) != sorted(schema.names):
            return scanned()
        part = part.select(schema.names)
        if part.schema.types != schema.types:  # another writer's types (Spark's INT96)
            return scanned()
        parts.append(part)
    return pa.concat_tables(parts).cast(schema) if parts else schema.empty_table()


def run_merge(
    table: deltalake.DeltaTable, source: pa.Table, plan: MergePlan, mark: CommitMark
) -> dict[str, int]:
    """``plan`` (the SQL conditions and values Spark's MERGE takes) run by delta-rs."""
    merger = table.merge(
        source,
        plan.condition,
        source_alias="s",
        target_alias="t",
        streamed_exec=False,  # a small source, read twice: its key range prunes files
        commit_properties=marked(mark),
        post_commithook_properties=no_checkpoint(),
    )
    for clause in plan.clauses:
        if clause.kind is ClauseKind.MATCHED_UPDATE:
            merger = merger.when_matched_update(clause.assignments, clause.condition)
        elif clause.kind is ClauseKind.MATCHED_DELETE:
            merger = merger.when_matched_delete(clause.condition)
        elif clause.kind is ClauseKind.NOT_MATCHED_BY_SOURCE_UPDATE:
            merger = merger.when_not_matched_by_source_update(clause.assignments, clause.condition)
        else:
            merger = merger.when_not_matched_insert(clause.assignments, clause.condition)
    return {k: int(v) for k, v in merger.execute().items() if isinstance(v, int)}
