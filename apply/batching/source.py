"""Arrow tables that feed a MERGE: the net effect of a batch, typed.

No Spark here. A ``KeyedSource`` holds one row per key with the value
columns in the target's layout and helper columns the MERGE reads:

- ``__pgsub_first``: the chain's first change (``First``), for conflicts;
- ``__pgsub_present``: whether the row exists after the batch;
- ``__pgsub_reinserted``: an insert follows the first change;
- ``__pgsub_tx``: the batch index of the first change's transaction;
- ``__pgsub_keep_<n>``: column n was not sent (unchanged TOAST): keep the
  target's value; present only for columns where that happens;
- ``__pgsub_from_<key>``: for rows whose kept values live at another key
  (an update that changed the key), that key.

A ``MultisetSource`` holds rows to insert (one Arrow row per copy) and rows
to remove (one per distinct row, with how many copies).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa

from apply.batching.collapse import KeyedNet, KeyedRow, MultisetNet, MultisetRow
from apply.columns.columnar import arrow_type, to_arrow
from apply.columns.schema import TargetColumn, TargetSchema
from apply.core.errors import ApplyError
from subscriber.replication.messages import BINARY, TEXT, UNCHANGED, TupleData

PREFIX: Final = "__pgsub_"
FIRST: Final = PREFIX + "first"
PRESENT: Final = PREFIX + "present"
REINSERTED: Final = PREFIX + "reinserted"
TX: Final = PREFIX + "tx"
COUNT: Final = PREFIX + "count"
ROW: Final = PREFIX + "row"
REMOVE: Final = PREFIX + "remove"  # a multiset MERGE row that removes (not adds) copies
_HELPER_TYPES: Final = {
    FIRST: "string",
    PRESENT: "boolean",
    REINSERTED: "boolean",
    TX: "int",
    COUNT: "long",
    ROW: "int",
    REMOVE: "boolean",
}


def helper_spark_type(name: str) -> str:
    """The Spark type of a helper column (``KeyError`` for a value column)."""
    if name in _HELPER_TYPES:
        return _HELPER_TYPES[name]
    if name.startswith(PREFIX + "keep_"):
        return "boolean"
    raise KeyError(name)


def keep_flag(index: int) -> str:
    return f"{PREFIX}keep_{index}"


def from_key(index: int) -> str:
    return f"{PREFIX}from_{index}"


@dataclass(frozen=True, slots=True)
class KeyedSource:
    table: pa.Table
    keep_columns: tuple[int, ...]  # indexes of columns with a keep flag
    moved: bool  # some rows take kept values from another key


@dataclass(frozen=True, slots=True)
class MultisetSource:
    inserts: pa.Table  # one row per copy to add
    removals: pa.Table  # one row per distinct row to remove, with COUNT copies and its ROW
    removed: tuple[MultisetRow, ...]  # removals' rows, by ROW


def check_names(schema: TargetSchema) -> None:
    for column in schema.columns:
        if column.name.startswith(PREFIX):
            raise ApplyError(
                f"column {column.name!r} of {schema.table} uses the prefix {PREFIX!r}, which "
                "pgsub reserves for its own bookkeeping; rename the column"
            )


def _column_values(images: Sequence[TupleData | None], index: int) -> list[bytes | None]:
    return [None if image is None else image.values[index] for image in images]


def binary_columns(images: Sequence[TupleData | None]) -> frozenset[int]:
    """The columns whose values are in binary format (``binary: true``): a column's format
    is its type's, so one image that holds a value of it says."""
    found: set[int] = set()
    for image in images:
        if image is not None and BINARY in image.kinds:
            found.update(i for i, kind in enumerate(image.kinds) if kind == BINARY)
    return frozenset(found)


def _mixed(images: Sequence[TupleData | None], index: int) -> bool:
    """Whether a binary column also holds text values in this batch: only when ``binary``
    changed between transactions of one batch (a staged prepared transaction, say)."""
    return any(image is not None and image.kinds[index] == TEXT for image in images)


def value_arrays(schema: TargetSchema, images: Sequence[TupleData | None]) -> dict[str, pa.Array]:
    """The Arrow column of each of ``schema``'s columns over ``images`` (None: a row of
    NULLs; an unchanged TOASTed value is NULL too)."""
    binary = binary_columns(images)
    arrays: dict[str, pa.Array] = {}
    for i, column in enumerate(schema.columns):
        values = _column_values(images, i)
        if i in binary and _mixed(images, i):
            arrays[column.name] = _value_by_value(values, images, i, schema.columns[i])
        else:
            arrays[column.name] = to_arrow(values, column.type, column.name, binary=i in binary)
    return arrays


def _value_by_value(
    values: list[bytes | None],
    images: Sequence[TupleData | None],
    index: int,
    column: TargetColumn,
) -> pa.Array:
    decoded = [
        None
        if value is None or image is None
        else to_arrow([value], column.type, column.name, binary=image.kinds[index] == BINARY)[0]
        for value, image in zip(values, images, strict=True)
    ]
    return pa.array([None if v is None else v.as_py() for v in decoded], arrow_type(column.type))


def keyed_source(net: KeyedNet, schema: TargetSchema) -> KeyedSource:
    check_names(schema)
    rows: list[KeyedRow] = list(net.rows.values())
    images = [row.image for row in rows]
    arrays = value_arrays(schema, images)
    # Deleted rows carry only their key.
    for position, name in enumerate(net.key_columns):
        index = [c.name for c in schema.columns].index(name)
        column = schema.columns[index]
        arrays[name] = to_arrow(
            [row.key[position] for row in rows],
            column.type,
            name,
            binary=net.key_is_binary(position),
        )
    arrays[FIRST] = pa.array([row.first.value for row in rows], type=pa.string())
    arrays[PRESENT] = pa.array([row.present for row in rows], type=pa.bool_())
    arrays[REINSERTED] = pa.array([row.reinserted for row in rows], type=pa.bool_())
    arrays[TX] = pa.array([row.first_tx for row in rows], type=pa.int32())
    keep: list[int] = []
    if any(row.keeps_target_values for row in rows):
        for i in range(len(schema.columns)):
            flags = [image is not None and image.kinds[i] == UNCHANGED for image in images]
            if any(flags):
                keep.append(i)
                arrays[keep_flag(i)] = pa.array(flags, type=pa.bool_())
    moved = any(row.toast_key is not None for row in rows)
    if moved:
        for position, name in enumerate(net.key_columns):
            column = schema.column(name)
            arrays[from_key(position)] = to_arrow(
                [None if row.toast_key is None else row.toast_key[position] for row in rows],
                column.type,
                name,
                binary=net.key_is_binary(position),
            )
    return KeyedSource(pa.table(arrays), tuple(keep), moved)


def multiset_source(net: MultisetNet, schema: TargetSchema) -> MultisetSource:
    check_names(schema)
    copies: list[TupleData] = []
    removed: list[MultisetRow] = []
    for row in net.rows.values():
        if row.delta > 0:
            copies.extend([row.image] * row.delta)
        else:
            removed.append(row)
    inserts = pa.table(value_arrays(schema, copies)) if copies else empty(schema)
    removal_arrays = value_arrays(schema, [r.image for r in removed])
    removal_arrays[COUNT] = pa.array([-r.delta for r in removed], type=pa.int64())
    removal_arrays[ROW] = pa.array(range(len(removed)), type=pa.int32())
    return MultisetSource(inserts, pa.table(removal_arrays), tuple(removed))


def empty(schema: TargetSchema, extra: Iterable[tuple[str, pa.DataType]] = ()) -> pa.Table:
    fields = [pa.field(c.name, arrow_type(c.type)) for c in schema.columns]
    fields += [pa.field(name, kind) for name, kind in extra]
    return pa.schema(fields).empty_table()
