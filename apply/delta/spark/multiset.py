"""Writes to a table without a key (a multiset: REPLICA IDENTITY FULL, or no identity).

One Spark query counts the target's copies of each row the batch removes
from (fewer than it removes is delete_missing); then one MERGE deletes
every copy of those rows and inserts the copies that stay plus the new
ones. A batch that only inserts is an append.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from apply.batching.collapse import MultisetNet
from apply.batching.source import COUNT, REMOVE, ROW, multiset_source
from apply.columns.schema import TargetSchema, quote
from apply.core.errors import ConflictError
from apply.core.records import CommitMark, WriteResult
from apply.plans.merge_plan import multiset_merge
from conflicts.findings import Finding
from conflicts.kinds import ConflictKind, Resolution

if TYPE_CHECKING:
    from apply.delta.spark.target import TargetTable


def write_multiset(
    target: TargetTable,
    schema: TargetSchema,
    net: MultisetNet,
    mark: CommitMark,
    resolutions: Mapping[ConflictKind, Resolution],
) -> WriteResult:
    source = multiset_source(net, schema)
    if net.truncated:
        return target.overwrite(schema, source.inserts, mark)
    if source.removals.num_rows == 0:
        return target.append(schema, source.inserts, mark)
    names = [c.name for c in schema.columns]
    values = source.inserts.select(names).schema
    remaining, short = _remaining_copies(target, schema, source.removals)
    missing = tuple(
        Finding("delete_missing", row.first_tx, (), row.image, None)
        for index, row in enumerate(source.removed)
        if index in short
    )
    if missing and resolutions[ConflictKind.DELETE_MISSING] is Resolution.ERROR:
        raise ConflictError(ConflictKind.DELETE_MISSING.value, schema.table, list(missing))
    copies = [i for i, n in enumerate(remaining[COUNT].to_pylist()) for _ in range(n)]
    reinserts = remaining.take(pa.array(copies, type=pa.int64())).select(names).cast(values)
    markers = source.removals.select(names)
    # Typed flags: an untyped empty list is Arrow's null type, which concat refuses.
    markers = markers.append_column(REMOVE, _flags(True, markers.num_rows))
    adds = pa.concat_tables([reinserts, source.inserts.select(names)])
    adds = adds.append_column(REMOVE, _flags(False, adds.num_rows))
    with target.marked(mark):
        frame = target.frame(pa.concat_tables([markers, adds]), schema)
        result = target.merge(schema, frame, multiset_merge(schema))
    return WriteResult(
        schema.table,
        result.version,
        inserted=result.inserted - reinserts.num_rows,
        deleted=result.deleted - reinserts.num_rows,
        conflicts=missing,
    )


def _remaining_copies(
    target: TargetTable, schema: TargetSchema, removals: pa.Table
) -> tuple[pa.Table, set[int]]:
    """Each row to remove from, with how many copies stay (the target's count minus COUNT).

    Fewer copies in the target than the batch removes is delete_missing.
    """
    from pyspark.sql import functions as fn

    names = [c.name for c in schema.columns]
    rows = target.read().select(*[quote(n) for n in names]).withColumn("__pgsub_hit", fn.lit(1))
    wanted = target.frame(removals, schema)
    same = reduce(lambda a, b: a & b, [wanted[quote(n)].eqNullSafe(rows[quote(n)]) for n in names])
    counted = (
        wanted.join(rows, same, "left")
        .groupBy(*[wanted[quote(n)] for n in names], wanted[quote(COUNT)], wanted[ROW])
        .agg(fn.sum(fn.coalesce(rows["__pgsub_hit"], fn.lit(0))).alias("__pgsub_existing"))
        .toArrow()
    )
    stay = pc.subtract(counted["__pgsub_existing"], counted[COUNT])
    short = {
        int(row)
        for row, left in zip(counted[ROW].to_pylist(), stay.to_pylist(), strict=True)
        if left < 0
    }
    table: pa.Table = counted.drop_columns(["__pgsub_existing", COUNT, ROW])
    return table.append_column(COUNT, pc.max_element_wise(stay, 0)), short


def _flags(value: bool, count: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, type=pa.bool_()), count)
