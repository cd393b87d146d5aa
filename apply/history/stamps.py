"""Tables whose rows carry the commit that last wrote them: a mirror's metadata columns
(``history.metadata_columns``), and a table kept with soft deletes (``history:
soft_delete``). Pure.

Such a table holds the publisher's columns, then pgsub's:

- ``_pgsub_deleted`` (soft deletes only): whether the publisher deleted the
  row (a TRUNCATE marks every row);
- ``_pgsub_lsn``: the LSN the transaction that last wrote the row committed
  at, as a number: its delete's for a deleted row, the copy's consistent
  point for a row of the initial copy;
- ``_pgsub_commit_time``: that transaction's commit time (NULL for a row of
  the copy).

Both are written by the mirror's MERGE (``apply.plans.merge_plan.keyed_merge``
with a ``Stamping``), whose every written row carries its change's LSN and
commit time. With soft deletes (PeerDB's, Databricks' SCD type 1 with
deletes kept) a delete marks the row instead of removing it, and a marked
row counts as absent: an insert of its key brings it back alive (no
insert_exists), an update or a delete of it is update_missing /
delete_missing, skipped as PostgreSQL skips them. Both need a key: a table
without one (``REPLICA IDENTITY FULL``, or none) is a plain mirror
(``stamping``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Final

import pyarrow as pa

from apply.batching.collapse import KeyedRow
from apply.batching.copy_source import CopySource
from apply.columns.columnar import arrow_schema
from apply.columns.schema import TargetColumn, TargetSchema
from apply.columns.typemap import BOOL, INT8, TIMESTAMPTZ, ColumnType
from apply.history.changelog import (
    COMMIT_TIME,
    LSN,
    PREFIX,
    History,
    HistoryMode,
    changelog_schema,
    check_reserved,
)
from apply.history.versions import versions_schema
from subscriber.replication.lsn import Lsn
from subscriber.replication.wire import pg_timestamp

DELETED: Final = PREFIX + "deleted"

_DELETED_COLUMN: Final = TargetColumn(DELETED, ColumnType(BOOL))
_LAST_WRITE: Final = (
    TargetColumn(LSN, ColumnType(INT8)),
    TargetColumn(COMMIT_TIME, ColumnType(TIMESTAMPTZ)),
)
_TIME: Final = pa.timestamp("us", tz="UTC")


class Stamping(Enum):
    """What a keyed table's rows carry beside the publisher's columns."""

    NONE = "none"  # a plain mirror
    LAST_WRITE = "last_write"  # the LSN and time of the last write (metadata columns)
    SOFT_DELETE = "soft_delete"  # those, and deleted rows kept, marked

    @property
    def stamps(self) -> bool:
        return self is not Stamping.NONE

    @property
    def soft(self) -> bool:
        return self is Stamping.SOFT_DELETE


def kept_as(mode: HistoryMode, schema: TargetSchema) -> HistoryMode:
    """How a table of ``schema`` configured as ``mode`` is kept: soft deletes and versions
    need a key."""
    if mode in (HistoryMode.SOFT_DELETE, HistoryMode.SCD2) and not schema.key:
        return HistoryMode.MIRROR
    return mode


def stamping(mode: HistoryMode, schema: TargetSchema, metadata_columns: bool) -> Stamping:
    """What the rows of a table of ``schema``, kept as ``mode``, carry."""
    if not schema.key or mode in (HistoryMode.CHANGELOG, HistoryMode.SCD2):
        return Stamping.NONE
    if mode is HistoryMode.SOFT_DELETE:
        return Stamping.SOFT_DELETE
    return Stamping.LAST_WRITE if metadata_columns else Stamping.NONE


@dataclass(frozen=True, slots=True)
class Keeping:
    """How one table is kept: its mode, what its rows carry, and the mode configured for it
    (which a table without a key may not take)."""

    mode: HistoryMode
    stamping: Stamping
    configured: HistoryMode

    @classmethod
    def of(cls, history: History, schema: TargetSchema) -> Keeping:
        configured = history.of(schema.table)
        mode = kept_as(configured, schema)
        return cls(mode, stamping(mode, schema, history.metadata_columns), configured)

    @property
    def plain(self) -> bool:
        """Kept as PostgreSQL's subscriber keeps it: each key's last image, no pgsub column."""
        return self.mode is HistoryMode.MIRROR and not self.stamping.stamps

    def stored(self, schema: TargetSchema) -> TargetSchema:
        """The Delta table's layout for a publisher table of ``schema``."""
        if self.mode is HistoryMode.CHANGELOG:
            return changelog_schema(schema)
        if self.mode is HistoryMode.SCD2:
            return versions_schema(schema)
        return stamped_schema(schema, self.stamping)


PLAIN: Final = Keeping(HistoryMode.MIRROR, Stamping.NONE, HistoryMode.MIRROR)


def stamped_schema(schema: TargetSchema, stamping: Stamping) -> TargetSchema:
    """The table of a publisher table of ``schema``: its columns and pgsub's, the same key."""
    if not stamping.stamps:
        return schema
    check_reserved(schema, HistoryMode.SOFT_DELETE if stamping.soft else HistoryMode.MIRROR)
    deleted = (_DELETED_COLUMN,) if stamping.soft else ()
    return TargetSchema(schema.table, schema.columns + deleted + _LAST_WRITE, schema.key)


def soft_delete_schema(schema: TargetSchema) -> TargetSchema:
    return stamped_schema(schema, Stamping.SOFT_DELETE)


def stamped(
    source: pa.Table, rows: Sequence[KeyedRow], commits: Sequence[tuple[int, int]]
) -> pa.Table:
    """A keyed MERGE source (``apply.batching.source``, one row per chain of ``rows``) with the
    commit
    LSN and time of each chain's last change (``commits``: the batch's, by index)."""
    last = [commits[row.latest_tx] for row in rows]
    return source.append_column(LSN, pa.array([lsn for lsn, _ in last], pa.int64())).append_column(
        COMMIT_TIME, pa.array([pg_timestamp(time) for _, time in last], _TIME)
    )


def live_rows(rows: pa.Table, lsn: int, commit_time: int | None, stamping: Stamping) -> pa.Table:
    """``rows`` (the publisher's columns) as live rows last written at ``lsn``."""
    count = rows.num_rows
    time = None if commit_time is None else pg_timestamp(commit_time)
    if stamping.soft:
        rows = rows.append_column(DELETED, pa.array([False] * count, pa.bool_()))
    return rows.append_column(LSN, pa.array([lsn] * count, pa.int64())).append_column(
        COMMIT_TIME, pa.array([time] * count, _TIME)
    )


def copied(source: CopySource, schema: TargetSchema, lsn: Lsn, stamping: Stamping) -> CopySource:
    """``source``'s rows as a stamped table's rows of a copy at ``lsn``: alive, last written
    at the copy's consistent point, with no commit time."""
    target = arrow_schema(stamped_schema(schema, stamping).columns)
    blocks, read = source.blocks, source.read

    def stamp(rows: Iterator[pa.Table]) -> Iterator[pa.Table]:
        for block in rows:
            yield live_rows(block, int(lsn), None, stamping).select(target.names).cast(target)

    return replace(source, blocks=lambda: stamp(blocks()), read=lambda part: stamp(read(part)))
