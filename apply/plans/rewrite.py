"""A small table's rows after a keyed batch, computed in Arrow (pure: no Delta, no Spark).

What a conflict-free keyed MERGE (``apply.plans.merge_plan``) does to a table,
done to the table's rows in memory: the rows whose key the batch does not
touch, then the batch's rows that exist at its end, each column the
publisher did not send (unchanged TOAST, ``__pgsub_keep_<n>``) taken from
the row it replaces. A table of a few thousand rows is rewritten whole in a
third of a MERGE's time (docs/performance.md, "Many tables"); its one file
is what the MERGE would rewrite anyway.

``rewritten`` returns None when some chain of the batch does not find what
its first change expects (an update or delete of a missing key, an insert
of a present one): a conflict, which Spark's MERGE judges and reports.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from apply.batching.source import FIRST, PRESENT, KeyedSource, keep_flag
from conflicts.kinds import First

_AT: Final = "__pgsub_at"
_FOUND: Final = "__pgsub_found"
_EXPECTS_PRESENT: Final = pa.array([f.value for f in First if f.expects_present], type=pa.string())


def found_as_expected(current: pa.Table, source: pa.Table, keys: list[str]) -> bool:
    """Whether every chain of ``source`` finds its key in ``current`` exactly when its first
    change expects a row (``current`` needs only the key columns)."""
    expects = pc.is_in(source[FIRST], _EXPECTS_PRESENT)
    if len(keys) == 1:  # a set lookup: a join's plan costs more than a small table's batch
        found = pc.is_in(source[keys[0]], value_set=current[keys[0]].combine_chunks())
        return not pc.any(pc.not_equal(found, expects)).as_py()
    looked = (
        source.select(keys)
        .append_column(_AT, pa.array(range(source.num_rows), pa.int64()))
        .join(
            current.select(keys).append_column(
                _FOUND, pa.array([True] * current.num_rows, pa.bool_())
            ),
            keys,
            join_type="left outer",
        )
        .sort_by(_AT)
    )
    found = pc.fill_null(looked[_FOUND], False)
    return not pc.any(pc.not_equal(found, expects)).as_py()


def rewritten(current: pa.Table, source: KeyedSource, keys: list[str]) -> pa.Table | None:
    """``current`` (every row of the table) after the batch ``source``, in ``current``'s
    schema; None: a conflict. ``keys`` are the key columns; the source moves no key."""
    rows = source.table
    if not found_as_expected(current, rows, keys):
        return None
    if len(keys) == 1:
        touched = pc.is_in(current[keys[0]], value_set=rows[keys[0]].combine_chunks())
        untouched = current.filter(pc.invert(touched))
    else:
        untouched = current.join(rows.select(keys), keys, join_type="left anti")
    staying = rows.filter(rows[PRESENT])
    names = current.schema.names
    carried = tuple(name for name in names if name not in rows.schema.names)
    staying = kept_values(staying, current, source.keep_columns, keys, carried)
    new = staying.select(names).cast(current.schema)
    # One chunk: the result is the next batch's ``current`` (``kept_rows``), and chunks
    # added batch after batch made each rewrite's statistics and write a chunk a batch
    # slower (a table's 60th batch took three times its first).
    return pa.concat_tables([untouched.select(names), new]).combine_chunks()


def kept_values(
    rows: pa.Table,
    current: pa.Table,
    keep_columns: tuple[int, ...],
    keys: list[str],
    carried: tuple[str, ...] = (),
) -> pa.Table:
    """``rows`` with each unsent value (its keep flag set) replaced by the current row's, and
    with the ``carried`` columns (the table's, no longer published) taken from the current
    row, NULL where there is none: what a MERGE's UPDATE and INSERT leave in them.
    ``keep_columns`` index ``rows``' value columns; ``current`` may hold only the keys, the
    kept and the carried columns."""
    if (not keep_columns and not carried) or rows.num_rows == 0:
        return rows
    kept = [rows.schema.names[i] for i in keep_columns]
    olds = {name: f"__pgsub_old_{i}" for i, name in enumerate([*kept, *carried])}
    looked = (
        rows.select(keys)
        .append_column(_AT, pa.array(range(rows.num_rows), pa.int64()))
        .join(
            current.select([*keys, *olds]).rename_columns([*keys, *olds.values()]),
            keys,
            join_type="left outer",
        )
        .sort_by(_AT)
    )
    if looked.num_rows != rows.num_rows:  # a key the table holds twice
        raise ValueError("a row of the batch matches more than one row of the table")
    for i, name in zip(keep_columns, kept, strict=True):
        value = pc.if_else(rows[keep_flag(i)], looked[olds[name]], rows[name])
        rows = rows.set_column(rows.schema.get_field_index(name), name, value)
    for name in carried:
        rows = rows.append_column(current.schema.field(name), looked[olds[name]])
    return rows
