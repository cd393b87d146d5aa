"""A table kept as a change log (``history: changelog``): every change a row, in commit order.
Pure.

A mirror table holds each key's last image; a change log table holds one
row per change the publisher sent, appended in commit order, the natural
input of a downstream incremental job (docs/tables.md, "History"). Its
columns are the publisher's, then pgsub's:

- ``_pgsub_op``: ``insert``, ``update``, ``delete``, ``truncate``, or
  ``copy`` for a row of the initial copy (or of a resync), which starts
  with a ``truncate`` row at the copy's LSN;
- ``_pgsub_lsn``: the LSN the change's transaction committed at (the copy's
  consistent point for ``copy`` rows), as a number; ``_pgsub_seq``: the
  change's position in its transaction. Together they order the log;
- ``_pgsub_xid``, ``_pgsub_commit_time``: the transaction's;
- ``_pgsub_unchanged``: the columns an update did not send (unchanged
  TOASTed values: NULL in the row, their value is that of the key's
  previous row);
- ``_pgsub_old_<key column>``: the old key of an update that changed it.

A delete's row holds what the publisher sent of the old row: the key
(all of it under ``REPLICA IDENTITY FULL``); a truncate's row holds no
value. The log is written exactly once as any table is: each append
carries the batch's mark, and a resent transaction at or below the table's
LSN is dropped before it is turned into rows (``apply.core.batch``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Final

import pyarrow as pa

from apply.batching.collapse import Layout
from apply.batching.copy_source import CopySource
from apply.batching.source import value_arrays
from apply.columns.columnar import arrow_schema
from apply.columns.schema import TargetColumn, TargetSchema
from apply.columns.typemap import INT8, TEXT, TIMESTAMPTZ, ColumnType
from apply.core.batch import Batch, TableWork
from apply.core.errors import ApplyError
from apply.core.transactions import Op, RowChange
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import UNCHANGED, TupleData
from subscriber.replication.wire import pg_timestamp

PREFIX: Final = "_pgsub_"
OP: Final = PREFIX + "op"
LSN: Final = PREFIX + "lsn"
SEQ: Final = PREFIX + "seq"
XID: Final = PREFIX + "xid"
COMMIT_TIME: Final = PREFIX + "commit_time"
UNCHANGED_COLUMNS: Final = PREFIX + "unchanged"
OLD: Final = PREFIX + "old_"

_METADATA: Final = (
    TargetColumn(OP, ColumnType(TEXT)),
    TargetColumn(LSN, ColumnType(INT8)),
    TargetColumn(SEQ, ColumnType(INT8)),
    TargetColumn(XID, ColumnType(INT8)),
    TargetColumn(COMMIT_TIME, ColumnType(TIMESTAMPTZ)),
    TargetColumn(UNCHANGED_COLUMNS, ColumnType(TEXT, is_array=True)),
)


class HistoryMode(StrEnum):
    MIRROR = "mirror"  # each key's last image, as PostgreSQL's subscriber keeps it
    SOFT_DELETE = "soft_delete"  # a mirror whose deleted rows stay, marked (apply.history.stamps)
    CHANGELOG = "changelog"  # every change a row, appended in commit order
    SCD2 = "scd2"  # a row per version of each key, valid from / to (apply.history.versions)


@dataclass(frozen=True, slots=True)
class History:
    """How a subscription keeps its tables (config ``history``): ``mode``, but for ``tables``
    (qualified name -> mode); ``metadata_columns``: a mirror's rows stamped."""

    mode: HistoryMode = HistoryMode.MIRROR
    tables: Mapping[str, HistoryMode] = field(default_factory=dict)
    # Mirrors' rows carry the LSN and time of their last write (``apply.history.stamps``).
    metadata_columns: bool = False

    def of(self, table: str) -> HistoryMode:
        return self.tables.get(table, self.mode)


MIRRORS: Final = History()  # the default: every table a mirror


class Operation(StrEnum):
    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    TRUNCATE = "truncate"
    COPY = "copy"


class ReservedColumnError(ApplyError):
    """A publisher column whose name a change log table uses for its own columns."""


def check_reserved(schema: TargetSchema, mode: HistoryMode) -> None:
    """Refuse a publisher column named as pgsub's own columns of a table kept as ``mode``."""
    for column in schema.columns:
        if column.name.startswith(PREFIX):
            raise ReservedColumnError(
                f"column {column.name!r} of {schema.table} starts with {PREFIX!r}, which a "
                f"table kept as a {mode.value} (history: {mode.value}) uses for its own "
                "columns; rename the column on the publisher, or keep the table as a mirror"
            )


def changelog_schema(schema: TargetSchema) -> TargetSchema:
    """The change log table of a publisher table of ``schema``: its columns, pgsub's, and the
    old key's; no key of its own (rows are only appended)."""
    check_reserved(schema, HistoryMode.CHANGELOG)
    old_key = tuple(TargetColumn(OLD + name, schema.column(name).type) for name in schema.key)
    return TargetSchema(schema.table, schema.columns + _METADATA + old_key, ())


def change_rows(work: TableWork, schema: TargetSchema, batch: Batch) -> pa.Table:
    """Every change of ``work`` as a row of the change log table of ``schema``, in order."""
    layout = Layout(work.relation)
    names = [c.name for c in schema.columns]
    positions = [names.index(name) for name in schema.key]  # of the key, read once
    images: list[TupleData | None] = []
    old_keys: list[TupleData | None] = []
    ops: list[str] = []
    for entry in work.changes:
        change = entry.change
        if not isinstance(change, RowChange):
            images.append(None)
            old_keys.append(None)
            ops.append(Operation.TRUNCATE.value)
            continue
        new = None if change.new is None else layout.normalize(change.new, change.relation)
        old = None if change.old is None else layout.normalize(change.old, change.relation)
        if change.op is Op.DELETE:
            images.append(old)
            old_keys.append(None)
        else:
            images.append(new)
            old_keys.append(_moved_key(old, new, positions) if change.op is Op.UPDATE else None)
        ops.append(Operation[change.op.name].value)
    txs = [batch.transactions[entry.tx] for entry in work.changes]
    arrays = value_arrays(schema, images)
    arrays[OP] = pa.array(ops, pa.string())
    arrays[LSN] = pa.array([int(tx.end_lsn) for tx in txs], pa.int64())
    arrays[SEQ] = pa.array([entry.position for entry in work.changes], pa.int64())
    arrays[XID] = pa.array([tx.xid for tx in txs], pa.int64())
    arrays[COMMIT_TIME] = pa.array(
        [pg_timestamp(tx.commit_time) for tx in txs], pa.timestamp("us", tz="UTC")
    )
    arrays[UNCHANGED_COLUMNS] = pa.array(
        [_unchanged(image, schema) for image in images], pa.list_(pa.string())
    )
    if schema.key:
        keys = value_arrays(
            TargetSchema(schema.table, tuple(schema.columns[p] for p in positions), ()),
            old_keys,
        )
        for name in schema.key:
            arrays[OLD + name] = keys[name]
    return pa.table(arrays).cast(arrow_schema(changelog_schema(schema).columns))


def _moved_key(
    old: TupleData | None, new: TupleData | None, positions: list[int]
) -> TupleData | None:
    """The old key of an update that changed it (None: the key stayed, or there is none)."""
    if old is None or new is None or not positions:
        return None
    if all(old.values[p] == new.values[p] for p in positions):
        return None
    return _select(old, positions)


def _select(image: TupleData, positions: list[int]) -> TupleData:
    return TupleData(
        bytes(image.kinds[p] for p in positions), tuple(image.values[p] for p in positions)
    )


def _unchanged(image: TupleData | None, schema: TargetSchema) -> list[str] | None:
    if image is None or UNCHANGED not in image.kinds:
        return None
    return [
        c.name for c, kind in zip(schema.columns, image.kinds, strict=True) if kind == UNCHANGED
    ]


def copied(source: CopySource, schema: TargetSchema, lsn: Lsn) -> CopySource:
    """``source``'s rows as the change log rows of a copy at ``lsn``: a ``truncate`` row, then
    a ``copy`` row per row, in one commit (a resync empties the table for a reader who
    replays the log)."""
    target = arrow_schema(changelog_schema(schema).columns)
    blocks, read = source.blocks, source.read

    def stamp(rows: Iterator[pa.Table]) -> Iterator[pa.Table]:
        for block in rows:
            yield _stamped(block, target, Operation.COPY, int(lsn), 1)

    def read_part(part: tuple[bool, object]) -> Iterator[pa.Table]:
        first, inner = part
        if first:
            return iter([_stamped(None, target, Operation.TRUNCATE, int(lsn), 0)])
        return stamp(read(inner))

    def all_blocks() -> Iterator[pa.Table]:
        yield from read_part((True, None))
        yield from stamp(blocks())

    parts = [(True, None)] + [(False, part) for part in source.parts]
    return replace(source, blocks=all_blocks, parts=parts, read=read_part)


def _stamped(
    block: pa.Table | None, target: pa.Schema, op: Operation, lsn: int, seq: int
) -> pa.Table:
    """``block`` (the publisher's columns; None: one row without values) with pgsub's."""
    rows = 1 if block is None else block.num_rows
    columns = {}
    for column in target:
        name = column.name
        if block is not None and name in block.column_names:
            columns[name] = block[name]
        elif name == OP:
            columns[name] = pa.array([op.value] * rows, pa.string())
        elif name == LSN:
            columns[name] = pa.array([lsn] * rows, pa.int64())
        elif name == SEQ:
            columns[name] = pa.array([seq] * rows, pa.int64())
        else:
            columns[name] = pa.nulls(rows, column.type)
    return pa.table(columns).cast(target)
