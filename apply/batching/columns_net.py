"""The net effect of row changes held as columns on a keyed table, with Arrow. Pure.

``keyed_columns_source`` makes the MERGE source that
``apply.batching.source.keyed_source(apply.batching.collapse.collapse(...))`` makes of the
same changes, row for row and in the same order (a property test holds
them equal), without a Python step per change: each change's key is taken
from its image, the changes are grouped by key (Arrow's hash aggregation),
and each key's first and last change give its ``First``, whether the row
is present after them and its image.

It takes the shape of nearly every large transaction and leaves the rest
to the row-wise chain (it returns None): an update that changes a key (a
delete and an insert of two chains), an unchanged TOASTed value in a key's
chain of two or more changes (taken from an earlier image of the chain),
and a column whose values come in both text and binary format in one
piece (``binary`` changed between transactions).
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from apply.batching.collapse import is_keyed
from apply.batching.source import (
    FIRST,
    PRESENT,
    REINSERTED,
    TX,
    KeyedSource,
    check_names,
    keep_flag,
)
from apply.columns.change_columns import ChangeColumns
from apply.columns.columnar import to_arrow
from apply.columns.schema import TargetSchema
from conflicts.kinds import First
from subscriber.replication.messages import BINARY, TEXT, UNCHANGED
from subscriber.replication.tuples import DELETE, INSERT, UPDATE

_FIRSTS: Final = pa.array([First.INSERT.value, First.UPDATE.value, First.DELETE.value])


def keyed_columns_source(
    changes: ChangeColumns, schema: TargetSchema, tx: int = 0
) -> KeyedSource | None:
    """The MERGE source of ``changes`` (all of transaction ``tx`` of the batch) on their keyed
    table laid out as ``schema``; None when only the row-wise chain can make it."""
    relation = changes.relation
    if changes.rows == 0 or not is_keyed(relation):
        return None
    check_names(schema)
    ops = changes.ops
    deletes = ops == DELETE
    keys = [i for i, c in enumerate(relation.columns) if c.is_key]
    # Each change's key, from its old image for a delete and its new one otherwise: never
    # NULL or unchanged, and in one format per column.
    key_kinds = np.where(deletes[:, None], changes.old_kinds, changes.new_kinds)[:, keys]
    binary_key = []
    for position in range(len(keys)):
        kinds = key_kinds[:, position]
        if (kinds == TEXT).all():
            binary_key.append(False)
        elif (kinds == BINARY).all():
            binary_key.append(True)
        else:
            return None
    is_delete = pa.array(deletes)
    key_values = [pc.if_else(is_delete, changes.old_values[p], changes.new_values[p]) for p in keys]
    if _changes_a_key(changes, keys):
        return None
    index = np.arange(changes.rows, dtype=np.int64)
    grouping = {f"k{j}": values for j, values in enumerate(key_values)}
    grouping["i"] = pa.array(index)
    grouping["ins"] = pa.array(np.where(ops == INSERT, index, -1))
    grouped = (
        pa.table(grouping)
        .group_by([f"k{j}" for j in range(len(keys))], use_threads=False)
        .aggregate([("i", "min"), ("i", "max"), ("i", "count"), ("ins", "max")])
    )
    grouped = grouped.take(pc.sort_indices(grouped["i_min"]))  # in order of first change
    first = grouped["i_min"].to_numpy()
    last = grouped["i_max"].to_numpy()
    if (grouped["i_count"].to_numpy() > 1).any() and (changes.new_kinds == UNCHANGED).any():
        return None  # a kept value may come from an earlier image of its chain
    present = ops[last] != DELETE
    final_kinds = changes.new_kinds[last]  # a delete has no new image: all zero
    at_last = pa.array(last)
    arrays: dict[str, pa.Array] = {}
    for c, column in enumerate(schema.columns):
        kinds = final_kinds[:, c]
        binary = bool((kinds == BINARY).any())
        if binary and (kinds == TEXT).any():
            return None
        values = changes.new_values[c].take(at_last)
        arrays[column.name] = to_arrow(values, column.type, column.name, binary=binary)
    for j, p in enumerate(keys):
        column = schema.columns[p]
        values = grouped[f"k{j}"].combine_chunks()
        arrays[column.name] = to_arrow(values, column.type, column.name, binary=binary_key[j])
    first_ops = ops[first]
    which = np.where(first_ops == INSERT, 0, np.where(first_ops == UPDATE, 1, 2))
    arrays[FIRST] = _FIRSTS.take(pa.array(which))
    arrays[PRESENT] = pa.array(present)
    arrays[REINSERTED] = pa.array(grouped["ins_max"].to_numpy() > first)
    arrays[TX] = pa.array(np.full(len(first), tx, dtype=np.int32))
    keep: list[int] = []
    for c in range(len(schema.columns)):
        flags = final_kinds[:, c] == UNCHANGED
        if flags.any():
            keep.append(c)
            arrays[keep_flag(c)] = pa.array(flags)
    return KeyedSource(pa.table(arrays), tuple(keep), moved=False)


def _changes_a_key(changes: ChangeColumns, keys: list[int]) -> bool:
    """Whether an update sent an old key that differs from its new one."""
    with_old = (changes.ops == UPDATE) & changes.old_kinds.any(axis=1)
    if not with_old.any():
        return False
    chosen = pa.array(with_old)
    for p in keys:
        old = changes.old_values[p].filter(chosen)
        new = changes.new_values[p].filter(chosen)
        if not pc.all(pc.fill_null(pc.equal(old, new), False)).as_py():
            return True
    return False
