"""Writes to a table with a key: one MERGE per batch, conflicts judged by the MERGE itself.

The default path: the MERGE raises on insert_exists / update_exists (with
the ``error`` action) and skips the *_missing chains; its own metrics then
tell whether anything conflicted (``expected_counts``), and only then is
the table read again to name the conflicting rows (``find_keyed``, against
the version before the MERGE). Actions other than PostgreSQL's defaults,
an update that changed a key, and rows another writer changed
(*_origin_differs) need the batch's keys looked up first: the net effect is
then cut to what the actions keep (``apply.batching.resolve``) and merged.

A batch with a TRUNCATE is judged against an empty table and written with
one overwrite.

A stamped table (``stamping``, ``apply.history.stamps``) takes the same paths, its
rows stamped with their last commit; with soft deletes its MERGE marks
deleted rows, and its marked rows count as absent wherever the table is
judged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from apply.batching.collapse import KeyedNet
from apply.batching.resolve import ORIGIN, looks_up_first, origin_looks_up_first, resolve
from apply.batching.source import FIRST, PRESENT, REINSERTED, KeyedSource, keyed_source
from apply.columns.schema import TargetSchema, quote
from apply.core.errors import ConflictError, TargetTableError
from apply.core.records import CommitMark, WriteResult
from apply.delta.spark.findings import find_keyed
from apply.delta.spark.moved import fill_moved
from apply.delta.spark.origins import OriginTracker
from apply.delta.spark.session import SparkErrors
from apply.history.changelog import COMMIT_TIME, LSN
from apply.history.stamps import DELETED, Stamping, soft_delete_schema, stamped, stamped_schema
from apply.plans.merge_plan import (
    conflict_in,
    expected_counts,
    expected_touched,
    key_bounds,
    keyed_merge,
    on_exists,
    shape_of,
)
from apply.plans.staging import StagedSource
from conflicts.findings import Finding
from conflicts.kinds import ConflictKind, First, Resolution, judge
from subscriber.replication.wire import pg_timestamp

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from apply.delta.spark.target import TargetTable


def write_keyed(
    target: TargetTable,
    schema: TargetSchema,
    net: KeyedNet,
    mark: CommitMark,
    resolutions: Mapping[ConflictKind, Resolution],
    *,
    origins: OriginTracker,
    stamping: Stamping = Stamping.NONE,
) -> WriteResult:
    session = target.session
    soft = stamping.soft
    if net.truncated:
        return _write_truncated(
            target, schema, net, mark, resolutions, origins=origins, stamping=stamping
        )
    first = looks_up_first(resolutions) or any(
        r.first is First.KEY_UPDATE_OLD for r in net.rows.values()
    )
    origin_first = origin_looks_up_first(resolutions)
    if (first or origin_first) and origins.has_new_commits(session):
        origins.catch_up(session)  # the lookup judges against every other writer's rows
    if first or (origin_first and origins.foreign):
        return _write_looked_up(
            target, schema, net, mark, resolutions, origins=origins, stamping=stamping
        )
    # The default path: the MERGE judges, and is looked at after only when it must be.
    result, source = merge_net(target, schema, net, mark, resolutions, stamping=stamping)
    origins.committed(session, result.version)
    if not origins.foreign and _conflict_free(result, source.table, soft):
        return result  # the conflict-free path: nothing more to look at
    before = live(target.read(None if result.version is None else result.version - 1), soft)
    findings = find_keyed(session, schema, net, before, origins.foreign)
    _prune_replaced(origins, target, findings)
    return replace(result, conflicts=tuple(findings))


def _conflict_free(result: WriteResult, source: pa.Table, soft: bool) -> bool:
    """Whether the MERGE's counts are those of a batch without conflicts."""
    if soft:  # a revived or marked row is an update: only the rows touched tell
        touched = result.inserted + result.updated
        return result.deleted == 0 and touched == expected_touched(source)
    return (result.inserted, result.updated, result.deleted) == expected_counts(source)


def live(rows: DataFrame, soft: bool) -> DataFrame:
    """The rows of a table that exist on the publisher: a soft-delete table's unmarked."""
    return rows.where(f"NOT {quote(DELETED)}") if soft else rows


def raised_conflict(
    target: TargetTable, schema: TargetSchema, net: KeyedNet, kind: str, *, soft: bool = False
) -> ConflictError:
    """The MERGE raised: every conflicting chain, found against the unchanged table."""
    findings = find_keyed(target.session, schema, net, live(target.read(), soft))
    return ConflictError(kind, schema.table, findings)


def _write_looked_up(
    target: TargetTable,
    schema: TargetSchema,
    net: KeyedNet,
    mark: CommitMark,
    resolutions: Mapping[ConflictKind, Resolution],
    *,
    origins: OriginTracker,
    stamping: Stamping,
) -> WriteResult:
    """Judge the batch's keys against the table first, then MERGE what the actions keep."""
    before = live(target.read(), stamping.soft)
    findings = find_keyed(target.session, schema, net, before, origins.foreign)
    resolved = resolve(net, findings, resolutions)
    if resolved.stop is not None:
        raise ConflictError(resolved.stop.kind, schema.table, list(resolved.findings))
    result, _ = merge_net(target, schema, resolved.net, mark, resolutions, stamping=stamping)
    origins.committed(target.session, result.version)
    _prune_replaced(origins, target, resolved.findings)
    return replace(result, conflicts=resolved.findings)


def merge_net(
    target: TargetTable,
    schema: TargetSchema,
    net: KeyedNet,
    mark: CommitMark,
    resolutions: Mapping[ConflictKind, Resolution],
    *,
    stamping: Stamping = Stamping.NONE,
) -> tuple[WriteResult, KeyedSource]:
    """The MERGE of ``net`` alone: no lookup before, no look at its metrics after."""
    source = keyed_source(net, schema)
    if stamping.stamps:
        source = replace(source, table=stamped(source.table, list(net.rows.values()), net.commits))
    stops = on_exists(
        resolutions[ConflictKind.INSERT_EXISTS] is Resolution.ERROR,
        resolutions[ConflictKind.UPDATE_EXISTS] is Resolution.ERROR,
    )
    with target.marked(mark):
        frame = target.frame(source.table, stamped_schema(schema, stamping))
        if source.moved:
            existing = live(target.read(), stamping.soft)
            frame = fill_moved(frame, schema, source.keep_columns, existing)
        bounds = key_bounds(source.table, schema.key[0])
        shape = shape_of(source.table)
        plan = keyed_merge(schema, source.keep_columns, stops, shape, bounds, stamping=stamping)
        if not plan.clauses:  # the actions skipped every change: nothing to write
            return WriteResult(schema.table, None), source
        return target.merge(schema, frame, plan, reads_target=source.moved), source


def _write_truncated(
    target: TargetTable,
    schema: TargetSchema,
    net: KeyedNet,
    mark: CommitMark,
    resolutions: Mapping[ConflictKind, Resolution],
    *,
    origins: OriginTracker,
    stamping: Stamping,
) -> WriteResult:
    """A batch with a TRUNCATE: its chains are judged against an empty table. A soft-delete
    table keeps its rows, marked deleted by the TRUNCATE, beside the batch's."""
    missing = [
        Finding(kind.value, r.first_tx, r.key, r.image, None, key_kinds=net.key_kinds)
        for r in net.rows.values()
        if (kind := judge(r.first, False)) is not None and not r.reinserted
    ]
    resolved = resolve(net, missing, resolutions)
    if resolved.stop is not None:
        raise ConflictError(resolved.stop.kind, schema.table, list(resolved.findings))
    table = keyed_source(resolved.net, schema).table
    expects_absent = pc.is_in(
        table[FIRST], pa.array([First.INSERT.value, First.KEY_UPDATE_NEW.value])
    )
    keep = pc.and_(table[PRESENT], pc.or_(expects_absent, table[REINSERTED]))
    if stamping.stamps:
        table = stamped(table, list(resolved.net.rows.values()), resolved.net.commits)
    if stamping.soft:
        result = _overwrite_soft(target, schema, resolved.net, table.filter(keep), mark)
    else:
        stored = stamped_schema(schema, stamping)
        rows = table.filter(keep).select([c.name for c in stored.columns])
        result = target.overwrite(stored, rows, mark)
    origins.rewritten(result.version)
    return replace(result, conflicts=resolved.findings)


def _overwrite_soft(
    target: TargetTable, schema: TargetSchema, net: KeyedNet, rows: pa.Table, mark: CommitMark
) -> WriteResult:
    """A soft-delete table after a TRUNCATE: its rows marked deleted at the TRUNCATE's
    commit (those deleted before keep their LSN), but for the keys the batch writes after
    it (``rows``: the source's, stamped), in one commit."""
    from pyspark.sql import functions as fn

    stored = soft_delete_schema(schema)
    written = rows.append_column(DELETED, pa.array([False] * rows.num_rows, pa.bool_()))
    written = written.select([c.name for c in stored.columns])
    lsn, time = net.commits[net.truncate_tx]
    was_live = fn.col(quote(DELETED)) == fn.lit(False)
    before = target.read()  # every column it keeps: one the publisher dropped too
    marked = (
        before.withColumn(LSN, fn.when(was_live, fn.lit(lsn)).otherwise(fn.col(quote(LSN))))
        .withColumn(
            COMMIT_TIME,
            fn.when(was_live, fn.lit(pg_timestamp(time))).otherwise(fn.col(quote(COMMIT_TIME))),
        )
        .withColumn(DELETED, fn.lit(True))
    )
    fresh = target.frame(written, stored)
    keys = [quote(k) for k in schema.key]
    kept = marked.join(fresh.select(*keys), on=list(schema.key), how="left_anti")
    everything = kept.unionByName(fresh, allowMissingColumns=True)
    return target.overwrite_frame(stored, everything, mark, rows.num_rows)


def _prune_replaced(
    origins: OriginTracker, target: TargetTable, findings: Sequence[Finding]
) -> None:
    """The batch wrote over other writers' rows: some of their versions may be gone."""
    if any(ConflictKind(f.kind) in ORIGIN for f in findings):
        origins.prune(target.session)


def staged_keys_unique(target: TargetTable, stage: StagedSource) -> bool:
    """Whether no key has rows in two of a large transaction's staged pieces (one Spark job):
    then ``write_staged`` may MERGE them at once."""
    frame = target.staged(stage.directory, stage.columns, stage.schema)
    keys = [quote(k) for k in stage.schema.key]
    try:
        row = frame.selectExpr("count(*) AS n", f"count(DISTINCT {', '.join(keys)}) AS d").first()
    except SparkErrors as exc:
        raise TargetTableError(f"cannot read the staged rows of {target.table}: {exc}") from exc
    return row is not None and int(row["n"]) == int(row["d"])


def write_staged(
    target: TargetTable,
    schema: TargetSchema,
    stage: StagedSource,
    mark: CommitMark,
    resolutions: Mapping[ConflictKind, Resolution],
    *,
    nets: Callable[[], Iterator[KeyedNet]],
) -> WriteResult:
    """A large transaction's net effect in one MERGE of its staged pieces (``apply.plans.staging``).

    ``nets`` reads the pieces' net effects again: only when the MERGE says something
    conflicted are they judged, one piece at a time, against the table before it.
    """
    stops = on_exists(
        resolutions[ConflictKind.INSERT_EXISTS] is Resolution.ERROR,
        resolutions[ConflictKind.UPDATE_EXISTS] is Resolution.ERROR,
    )
    plan = keyed_merge(schema, tuple(sorted(stage.keep)), stops, stage.shape, stage.bounds)
    with target.marked(mark):
        frame = target.staged(stage.directory, stage.columns, schema)
        try:
            result = target.merge(schema, frame, plan)
        except SparkErrors as exc:
            kind = conflict_in(str(exc))
            if kind is None:
                raise
            before = target.read()
            findings = [
                f for net in nets() for f in find_keyed(target.session, schema, net, before)
            ]
            raise ConflictError(kind, schema.table, findings) from None
    if (result.inserted, result.updated, result.deleted) == stage.expected:
        return result
    before = target.read(None if result.version is None else result.version - 1)
    findings = [f for net in nets() for f in find_keyed(target.session, schema, net, before)]
    return replace(result, conflicts=tuple(findings))
