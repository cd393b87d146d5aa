"""Writes to a table kept as versions (``history: scd2``, ``apply.history.versions``).

A batch is written in two steps: the current versions of the keys its
changes name are looked up (by delta-rs on a local warehouse it may
write, by Spark otherwise), the change rows are turned into versions
against them, and one MERGE marked with the batch's mark closes the
versions the batch replaced and inserts the new ones (by the same engine).
A batch already committed for its mark (a resend after a crash) is not
written again: delta-rs looks the mark's idempotent-write id up first, and
Spark's ``txnAppId`` refuses the commit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa

from apply.columns.columnar import arrow_schema
from apply.columns.schema import TargetSchema, quote
from apply.core.errors import ConflictError, TargetTableError
from apply.core.records import CommitMark, WriteResult
from apply.delta.writer.delta_rs_merge import run_merge
from apply.delta.writer.local_tables import folder
from apply.delta.writer.overwrite import keep_log
from apply.history.versions import (
    CURRENT,
    Conflicted,
    Key,
    Row,
    touched_keys,
    versioned,
    versions_schema,
    versions_source,
)
from apply.plans.merge_plan import key_bounds, versions_merge
from conflicts.findings import Finding
from conflicts.kinds import ConflictKind, Resolution

if TYPE_CHECKING:
    import deltalake

    from apply.delta.spark.target import TargetTable
    from apply.delta.writer.open_table import OpenTable

# The conflicts a batch's versions met, as the applier reports them.
Witness = Callable[[Sequence[Conflicted]], list[Finding]]


def write_versions(
    target: TargetTable,
    schema: TargetSchema,
    changes: pa.Table,
    mark: CommitMark,
    resolutions: Mapping[ConflictKind, Resolution],
    witness: Witness,
    *,
    opened: OpenTable | None,
) -> WriteResult:
    """The change rows ``changes`` (``apply.history.changelog.change_rows``) as versions of the
    table
    of ``schema``, in one commit carrying ``mark``: by delta-rs on ``opened`` (the table kept
    open), else by Spark."""
    stored = versions_schema(schema)
    table = None
    app_id, batch_version = mark.txn
    if opened is not None:
        done = opened.done(app_id)
        if done is not None and done >= batch_version:
            return WriteResult(schema.table, None)  # committed before: Delta's txn says so
        table = opened.synced()
    keys = touched_keys(changes, schema)
    current = _current(target, schema, stored, keys, table) if keys else []
    out = versioned(changes, schema, current, resolutions)
    findings = witness(out.conflicts)
    if out.stop is not None:
        raise ConflictError(out.stop.kind.value, schema.table, findings)
    if not out.closes and not out.opens and out.truncated is None:
        return WriteResult(schema.table, None, conflicts=tuple(findings))
    source = versions_source(out, schema)
    bounds = key_bounds(source, schema.key[0])
    plan = versions_merge(schema, out.truncated, closes=bool(out.closes), bounds=bounds)
    if opened is not None and table is not None:
        import deltalake

        try:
            metrics = run_merge(table, source, plan, mark)
        except deltalake.exceptions.DeltaError as exc:
            raise TargetTableError(
                f"writing the versions of {schema.table} to {target.path} at LSN {mark.lsn} "
                f"through delta-rs failed: {exc}"
            ) from exc
        keep_log(table, folder(target.path))
        opened.wrote(app_id, batch_version)
        return WriteResult(
            schema.table,
            table.version(),
            inserted=metrics.get("num_target_rows_inserted", 0),
            updated=metrics.get("num_target_rows_updated", 0),
            deleted=metrics.get("num_target_rows_deleted", 0),
            conflicts=tuple(findings),
        )
    with target.marked(mark):
        result = target.merge(stored, target.frame(source, stored), plan)
    return replace(result, conflicts=tuple(findings))


def _current(
    target: TargetTable,
    schema: TargetSchema,
    stored: TargetSchema,
    keys: list[Key],
    table: deltalake.DeltaTable | None,
) -> list[Row]:
    """The current versions of ``keys`` in the table, as rows of ``stored``."""
    names = [c.name for c in stored.columns]
    key_rows = pa.Table.from_pylist(
        [dict(zip(schema.key, key, strict=True)) for key in keys],
        schema=arrow_schema([schema.column(k) for k in schema.key]),
    )
    if table is not None:
        import pyarrow.dataset as ds

        first = schema.key[0]
        wanted = (ds.field(CURRENT) == pa.scalar(True)) & ds.field(first).isin(key_rows[first])
        bounds = key_bounds(key_rows, first)
        if bounds is not None:  # files (by their statistics) outside the keys' range skipped
            wanted &= (ds.field(first) >= bounds[0]) & (ds.field(first) <= bounds[1])
        held = table.to_pyarrow_dataset()
        present = [name for name in names if name in held.schema.names]
        rows: list[Row] = held.to_table(columns=present, filter=wanted).to_pylist()
        return rows
    frame = target.frame(key_rows, schema)
    read = target.read().where(quote(CURRENT))
    bounds = key_bounds(key_rows, schema.key[0])
    if bounds is not None:  # a data-skipping predicate on the files' statistics
        read = read.where(f"{quote(schema.key[0])} BETWEEN {int(bounds[0])} AND {int(bounds[1])}")
    present = [quote(name) for name in names if name in read.columns]
    found = read.join(frame, on=list(schema.key), how="left_semi")
    looked_up: list[Row] = found.select(*present).toArrow().to_pylist()
    return looked_up
