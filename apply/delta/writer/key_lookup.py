"""What a table's files hold of a batch's keys, asked before delta-rs writes the batch.

``keys_conflict`` reads the key columns of the live files (filtered to the
batch's keys) and says whether some chain does not find what its first
change expects; ``keys_apart`` asks only the files' statistics whether any
of them can hold a key in a range (a large transaction that only inserts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from apply.history.stamps import DELETED
from apply.plans.rewrite import found_as_expected

if TYPE_CHECKING:
    import deltalake

    from apply.columns.schema import TargetSchema
    from apply.delta.writer.open_table import OpenTable


def keys_apart(table: deltalake.DeltaTable, key: str, bounds: tuple[int, int] | None) -> bool:
    """Whether no live file of ``table`` can hold a key whose first column is within
    ``bounds`` (its statistics' min and max say so; a file without them might)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if not actions.num_rows:
        return True
    low_name, high_name = f"min.{key}", f"max.{key}"
    if bounds is None or low_name not in actions.column_names:
        return False
    lows, highs = actions[low_name], actions[high_name]
    if lows.null_count or highs.null_count:
        return False
    low, high = bounds
    below = pc.less(highs, pa.scalar(low, highs.type))
    above = pc.greater(lows, pa.scalar(high, lows.type))
    return bool(pc.all(pc.or_(below, above)).as_py())


def keys_conflict(
    table: OpenTable, schema: TargetSchema, source: pa.Table, soft: bool = False
) -> bool:
    """Whether some chain of ``source`` does not find what its first change expects: an
    update or delete whose key is missing, an insert whose key is there (``soft``: a
    soft-delete table, whose marked rows are missing). ``table``: at its latest commit."""
    import pyarrow.dataset as ds

    keys = list(schema.key)
    store = table.store
    files = [store.source(file.name) for file in table.files()]
    if files:
        fields = [source.schema.field(k) for k in keys]
        wanted = pa.schema([*fields, pa.field(DELETED, pa.bool_())] if soft else fields)
        scan = ds.dataset(files, schema=wanted, format="parquet", filesystem=store.filesystem)
        where = pc.field(keys[0]).isin(source[keys[0]].unique())
        if soft:
            where = where & ~pc.field(DELETED)
        local = scan.to_table(columns=keys, filter=where)
    else:
        local = pa.schema([source.schema.field(k) for k in keys]).empty_table()
    return not found_as_expected(local, source, keys)
