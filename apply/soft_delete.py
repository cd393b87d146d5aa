"""A table kept with its deleted rows (``history: soft_delete``). Pure.

A soft-delete table is a mirror whose deleted rows stay, marked (PeerDB's
soft deletes, Databricks' SCD type 1 with deletes kept). Its columns are the
publisher's, then pgsub's:

- ``_pgsub_deleted``: whether the publisher deleted the row (a TRUNCATE
  marks every row);
- ``_pgsub_lsn``: the LSN the transaction that last wrote the row committed
  at, as a number: its delete's for a deleted row, the copy's consistent
  point for a row of the initial copy;
- ``_pgsub_commit_time``: that transaction's commit time (NULL for a row of
  the copy).

It is written by the mirror's MERGE with three changes
(``apply.merge_plan.keyed_merge(soft=True)``): a delete marks the row
instead of removing it; a deleted row counts as absent, so an insert of its
key brings it back alive (no insert_exists) and an update or a delete of it
is update_missing / delete_missing, skipped as PostgreSQL skips them; every
row the MERGE writes carries its change's LSN and commit time. The table
needs a key to find a deleted row again: a table without one (``REPLICA
IDENTITY FULL``, or none) is kept as a mirror (``kept_as``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Final

import pyarrow as pa

from apply.changelog import COMMIT_TIME, LSN, PREFIX, HistoryMode, check_reserved
from apply.collapse import KeyedRow
from apply.columnar import arrow_schema
from apply.copy_source import CopySource
from apply.schema import TargetColumn, TargetSchema
from apply.typemap import BOOL, INT8, TIMESTAMPTZ, ColumnType
from subscriber.replication.lsn import Lsn
from subscriber.replication.wire import pg_timestamp

DELETED: Final = PREFIX + "deleted"

_METADATA: Final = (
    TargetColumn(DELETED, ColumnType(BOOL)),
    TargetColumn(LSN, ColumnType(INT8)),
    TargetColumn(COMMIT_TIME, ColumnType(TIMESTAMPTZ)),
)
_TIME: Final = pa.timestamp("us", tz="UTC")


def kept_as(mode: HistoryMode, schema: TargetSchema) -> HistoryMode:
    """How a table of ``schema`` configured as ``mode`` is kept: soft deletes need a key."""
    if mode is HistoryMode.SOFT_DELETE and not schema.key:
        return HistoryMode.MIRROR
    return mode


def soft_delete_schema(schema: TargetSchema) -> TargetSchema:
    """The soft-delete table of a publisher table of ``schema``: its columns and pgsub's,
    the same key."""
    check_reserved(schema, HistoryMode.SOFT_DELETE)
    return TargetSchema(schema.table, schema.columns + _METADATA, schema.key)


def stamped(
    source: pa.Table, rows: Sequence[KeyedRow], commits: Sequence[tuple[int, int]]
) -> pa.Table:
    """A keyed MERGE source (``apply.source``, one row per chain of ``rows``) with the commit
    LSN and time of each chain's last change (``commits``: the batch's, by index)."""
    last = [commits[row.latest_tx] for row in rows]
    return source.append_column(LSN, pa.array([lsn for lsn, _ in last], pa.int64())).append_column(
        COMMIT_TIME, pa.array([pg_timestamp(time) for _, time in last], _TIME)
    )


def live_rows(rows: pa.Table, lsn: int, commit_time: int | None) -> pa.Table:
    """``rows`` (the publisher's columns) as live rows last written at ``lsn``."""
    count = rows.num_rows
    time = None if commit_time is None else pg_timestamp(commit_time)
    return (
        rows.append_column(DELETED, pa.array([False] * count, pa.bool_()))
        .append_column(LSN, pa.array([lsn] * count, pa.int64()))
        .append_column(COMMIT_TIME, pa.array([time] * count, _TIME))
    )


def copied(source: CopySource, schema: TargetSchema, lsn: Lsn) -> CopySource:
    """``source``'s rows as the soft-delete table's rows of a copy at ``lsn``: alive, last
    written at the copy's consistent point, with no commit time."""
    target = arrow_schema(soft_delete_schema(schema).columns)
    blocks, read = source.blocks, source.read

    def stamp(rows: Iterator[pa.Table]) -> Iterator[pa.Table]:
        for block in rows:
            yield live_rows(block, int(lsn), None).select(target.names).cast(target)

    return replace(source, blocks=lambda: stamp(blocks()), read=lambda part: stamp(read(part)))
