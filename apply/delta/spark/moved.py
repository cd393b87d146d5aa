"""Kept values of key-changing updates: an update that changed the key and left TOAST unsent.

The unsent values live at the old key's row in the target; the MERGE
source takes them from there before the MERGE (``apply.batching.source`` marks such
rows with the old key in ``__pgsub_from_<n>``).
"""

from __future__ import annotations

from functools import reduce
from typing import TYPE_CHECKING

from apply.batching.source import from_key, keep_flag
from apply.columns.schema import TargetSchema, quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def fill_moved(
    frame: DataFrame,
    schema: TargetSchema,
    keep_columns: tuple[int, ...],
    target: DataFrame,
) -> DataFrame:
    """Take kept (unchanged TOAST) values of key-changing updates from the old key's row.

    A row whose old key is not in ``target`` (the table's rows that exist) is
    dropped: PostgreSQL skips such an update (update_missing).
    """
    from pyspark.sql import functions as fn

    old = target.select(
        *[fn.col(quote(c.name)).alias(f"__pgsub_old_{i}") for i, c in enumerate(schema.columns)]
    )
    names = [c.name for c in schema.columns]
    on = [
        frame[quote(from_key(p))] == old[f"__pgsub_old_{names.index(k)}"]
        for p, k in enumerate(schema.key)
    ]
    joined = frame.join(old, reduce(lambda a, b: a & b, on), "left")
    moved = fn.col(quote(from_key(0))).isNotNull()
    found = fn.col(f"__pgsub_old_{names.index(schema.key[0])}").isNotNull()
    joined = joined.where(~moved | found)
    for index in keep_columns:
        flag = fn.col(keep_flag(index))
        value = fn.col(quote(names[index]))
        joined = joined.withColumn(
            names[index], fn.when(moved & flag, fn.col(f"__pgsub_old_{index}")).otherwise(value)
        ).withColumn(keep_flag(index), flag & ~moved)
    return joined.select(*[quote(n) for n in frame.columns])
