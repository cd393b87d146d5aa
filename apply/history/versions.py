"""A table kept as versions (``history: scd2``): one row per version of each key. Pure.

Slowly changing dimension type 2, as Databricks' ``STORED AS SCD TYPE 2``
keeps it. The table holds the publisher's columns, then pgsub's:

- ``_pgsub_valid_from_lsn`` / ``_pgsub_valid_from_time``: the commit LSN
  and time of the transaction that wrote this version (the copy's
  consistent point, and no time, for a version of the initial copy);
- ``_pgsub_valid_to_lsn`` / ``_pgsub_valid_to_time``: those of the
  transaction that replaced or deleted it (NULL while it is current);
- ``_pgsub_current``: whether it is the key's current version.

A version is a transaction's net effect on a key: what a reader of the
publisher could see. An update closes the key's current version and opens
a new one; a delete closes it; a key change closes the old key's and opens
the new key's; a TRUNCATE closes every current version. A version opened
and closed by the same transaction is never written.

The versions are built from the batch's change rows (``apply.history.changelog``,
one per change, in commit order) against the keys' current versions,
looked up before: an update takes an unchanged TOASTed value from the
version it closes, and each change is judged as PostgreSQL's subscriber
judges it (insert_exists, update_exists, update_missing, delete_missing),
met with the configured action. The writer then closes the looked-up
versions and appends the new ones in one MERGE (``apply.plans.merge_plan.versions_merge``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

import pyarrow as pa

from apply.batching.collapse import Layout
from apply.batching.copy_source import CopySource
from apply.columns.columnar import arrow_schema
from apply.columns.schema import TargetColumn, TargetSchema
from apply.columns.typemap import BOOL, INT8, TIMESTAMPTZ, ColumnType
from apply.core.batch import TableWork
from apply.core.transactions import Op, RowChange
from apply.history.changelog import (
    COMMIT_TIME,
    LSN,
    OLD,
    OP,
    PREFIX,
    UNCHANGED_COLUMNS,
    HistoryMode,
    Operation,
    check_reserved,
)
from conflicts.findings import Finding
from conflicts.kinds import ConflictKind, Resolution
from subscriber.replication.lsn import Lsn

VALID_FROM: Final = PREFIX + "valid_from_lsn"
VALID_FROM_TIME: Final = PREFIX + "valid_from_time"
VALID_TO: Final = PREFIX + "valid_to_lsn"
VALID_TO_TIME: Final = PREFIX + "valid_to_time"
CURRENT: Final = PREFIX + "current"

_VERSION_COLUMNS: Final = (
    TargetColumn(VALID_FROM, ColumnType(INT8)),
    TargetColumn(VALID_FROM_TIME, ColumnType(TIMESTAMPTZ)),
    TargetColumn(VALID_TO, ColumnType(INT8)),
    TargetColumn(VALID_TO_TIME, ColumnType(TIMESTAMPTZ)),
    TargetColumn(CURRENT, ColumnType(BOOL)),
)

Key = tuple[Any, ...]
Row = dict[str, Any]
At = tuple[int, datetime | None]  # a commit's LSN and time


def versions_schema(schema: TargetSchema) -> TargetSchema:
    """The versions table of a publisher table of ``schema``: its columns and pgsub's; no
    key of its own (a key has a row per version)."""
    check_reserved(schema, HistoryMode.SCD2)
    return TargetSchema(schema.table, schema.columns + _VERSION_COLUMNS, ())


@dataclass(frozen=True, slots=True)
class Conflicted:
    """A change that conflicted: ``change`` indexes the batch's change rows; ``existing``:
    the key's current version it met (None: none)."""

    kind: ConflictKind
    change: int
    existing: Row | None
    action: Resolution


@dataclass(slots=True)
class Versioned:
    """What a batch does to a versions table."""

    closes: list[Row] = field(default_factory=list)  # table versions closed: key, from, to
    opens: list[Row] = field(default_factory=list)  # new versions, whole (some closed already)
    truncated: At | None = None  # the first TRUNCATE's commit
    conflicts: list[Conflicted] = field(default_factory=list)

    @property
    def stop(self) -> Conflicted | None:
        """The first conflict whose action is to stop the apply."""
        return next((c for c in self.conflicts if c.action is Resolution.ERROR), None)


@dataclass(slots=True)
class _Version:
    row: Row
    in_table: bool  # looked up in the table (else opened by this batch)


def touched_keys(changes: pa.Table, schema: TargetSchema) -> list[Key]:
    """Every key the change rows name: new, old, and the old of a key change."""
    keys: set[Key] = set()
    columns = [changes[k].to_pylist() for k in schema.key]
    olds = [changes[OLD + k].to_pylist() for k in schema.key]
    for i in range(changes.num_rows):
        key = tuple(column[i] for column in columns)
        if all(value is not None for value in key):
            keys.add(key)
        old = tuple(column[i] for column in olds)
        if all(value is not None for value in old):
            keys.add(old)
    return sorted(keys, key=repr)


def versioned(
    changes: pa.Table,
    schema: TargetSchema,
    current: Sequence[Row],
    resolutions: Mapping[ConflictKind, Resolution],
) -> Versioned:
    """The versions the change rows ``changes`` open and close, against ``current`` (the
    table's current versions of their keys, as rows of ``versions_schema``)."""
    walk = _Walk(schema, current, resolutions)
    for index, row in enumerate(changes.to_pylist()):
        walk.change(index, row)
    out = walk.out
    # A version a transaction opened and closed again was never seen by a reader.
    out.opens = [v for v in out.opens if v[VALID_TO] is None or v[VALID_TO] != v[VALID_FROM]]
    return out


class _Walk:
    """The change rows one at a time, each key's current version kept as they go."""

    def __init__(
        self,
        schema: TargetSchema,
        current: Sequence[Row],
        resolutions: Mapping[ConflictKind, Resolution],
    ) -> None:
        self.key_names = schema.key
        self.names = [c.name for c in schema.columns]
        self.found = {self.key_of(row): _Version(row, True) for row in current}
        self.state: dict[Key, _Version | None] = {}  # what the batch made of a key
        self.emptied = False  # a TRUNCATE went by: no version in the table is current now
        self.resolutions = resolutions
        self.out = Versioned()

    def key_of(self, row: Row, prefix: str = "") -> Key:
        return tuple(row[prefix + k] for k in self.key_names)

    def now(self, key: Key) -> _Version | None:
        if key in self.state:
            return self.state[key]
        return None if self.emptied else self.found.get(key)

    def change(self, index: int, row: Row) -> None:
        op, at = Operation(row[OP]), (row[LSN], row[COMMIT_TIME])
        if op is Operation.TRUNCATE:
            self.truncate(at)
        elif op is Operation.INSERT:
            self.insert(index, row, at)
        elif op is Operation.DELETE:
            self.delete(index, row, at)
        else:
            self.update(index, row, at)

    def truncate(self, at: At) -> None:
        if self.out.truncated is None:
            self.out.truncated = at  # closes every version of the table still current
        for key, version in list(self.state.items()):
            if version is not None:
                self.close(key, version, at)
        self.state.clear()
        self.emptied = True

    def insert(self, index: int, row: Row, at: At) -> None:
        key = self.key_of(row)
        met = self.now(key)
        if met is not None:
            if self.conflict(ConflictKind.INSERT_EXISTS, index, met) is not Resolution.APPLY_REMOTE:
                return
            self.close(key, met, at)
        self.open(key, row, at)

    def delete(self, index: int, row: Row, at: At) -> None:
        key = self.key_of(row)
        met = self.now(key)
        if met is None:
            self.conflict(ConflictKind.DELETE_MISSING, index, None)
            return
        self.close(key, met, at)

    def update(self, index: int, row: Row, at: At) -> None:
        key, old = self.key_of(row), self.key_of(row, OLD)
        moved = all(value is not None for value in old)
        before = old if moved else key
        met = self.now(before)
        unchanged = row[UNCHANGED_COLUMNS] or []
        if met is None:
            action = self.conflict(ConflictKind.UPDATE_MISSING, index, None)
            if action is Resolution.APPLY_REMOTE and not unchanged:  # a whole row: inserted
                taken = self.now(key) if moved else None
                if taken is not None:
                    self.close(key, taken, at)
                self.open(key, row, at)
            return
        if moved and (taken := self.now(key)) is not None:
            if (
                self.conflict(ConflictKind.UPDATE_EXISTS, index, taken)
                is not Resolution.APPLY_REMOTE
            ):
                return
            self.close(key, taken, at)
        whole = row | {name: met.row.get(name) for name in unchanged}  # TOAST: the last value
        self.close(before, met, at)
        self.open(key, whole, at)

    def conflict(self, kind: ConflictKind, index: int, met: _Version | None) -> Resolution:
        action = self.resolutions[kind]
        existing = None if met is None else met.row
        self.out.conflicts.append(Conflicted(kind, index, existing, action))
        return action

    def close(self, key: Key, version: _Version, at: At) -> None:
        lsn, time = at
        if version.in_table:
            closed = {k: version.row[k] for k in self.key_names}
            closed |= {VALID_FROM: version.row[VALID_FROM], VALID_TO: lsn, VALID_TO_TIME: time}
            self.out.closes.append(closed)
        else:
            version.row |= {VALID_TO: lsn, VALID_TO_TIME: time, CURRENT: False}
        self.state[key] = None

    def open(self, key: Key, row: Row, at: At) -> None:
        lsn, time = at
        opened = {name: row[name] for name in self.names}
        opened |= {VALID_FROM: lsn, VALID_FROM_TIME: time, VALID_TO: None}
        opened |= {VALID_TO_TIME: None, CURRENT: True}
        self.out.opens.append(opened)
        self.state[key] = _Version(opened, False)


def versions_source(versioned: Versioned, schema: TargetSchema) -> pa.Table:
    """The MERGE source of ``versioned``: the closes (``_pgsub_current`` NULL), then the
    opens, as rows of ``versions_schema``."""
    stored = arrow_schema(versions_schema(schema).columns)
    closes = [
        {name: close.get(name) for name in stored.names} | {CURRENT: None}
        for close in versioned.closes
    ]
    return pa.Table.from_pylist(closes + versioned.opens, schema=stored)


def copied(source: CopySource, schema: TargetSchema, lsn: Lsn) -> CopySource:
    """``source``'s rows as the first versions of a copy at ``lsn``: current, valid from the
    copy's consistent point, with no time."""
    target = arrow_schema(versions_schema(schema).columns)
    blocks, read = source.blocks, source.read

    def stamp(rows: Iterator[pa.Table]) -> Iterator[pa.Table]:
        for block in rows:
            yield first_versions(block, int(lsn)).select(target.names).cast(target)

    return replace(source, blocks=lambda: stamp(blocks()), read=lambda part: stamp(read(part)))


def first_versions(rows: pa.Table, lsn: int) -> pa.Table:
    """``rows`` (the publisher's columns) as current versions from ``lsn`` (a copy)."""
    count = rows.num_rows
    time = pa.timestamp("us", tz="UTC")
    return (
        rows.append_column(VALID_FROM, pa.array([lsn] * count, pa.int64()))
        .append_column(VALID_FROM_TIME, pa.nulls(count, time))
        .append_column(VALID_TO, pa.nulls(count, pa.int64()))
        .append_column(VALID_TO_TIME, pa.nulls(count, time))
        .append_column(CURRENT, pa.array([True] * count, pa.bool_()))
    )


def findings(
    work: TableWork, schema: TargetSchema, conflicts: Sequence[Conflicted]
) -> list[Finding]:
    """``conflicts`` (met by the change rows of ``work``) as the applier reports them: the
    key and the row as they arrived, the current version met as text."""
    layout = Layout(work.relation)
    names = [c.name for c in schema.columns]
    positions = [names.index(k) for k in schema.key]
    out = []
    for conflict in conflicts:
        entry = work.changes[conflict.change]
        change = entry.change
        if not isinstance(change, RowChange):
            continue
        new = None if change.new is None else layout.normalize(change.new, change.relation)
        old = None if change.old is None else layout.normalize(change.old, change.relation)
        missing = conflict.kind in (ConflictKind.UPDATE_MISSING, ConflictKind.DELETE_MISSING)
        keyed = old if (missing and old is not None) or new is None else new
        if keyed is None:
            continue
        existing = None
        if conflict.existing is not None:
            existing = {name: _text(conflict.existing.get(name)) for name in names}
        out.append(
            Finding(
                conflict.kind.value,
                entry.tx,
                tuple(keyed.values[p] for p in positions),
                None if change.op is Op.DELETE else new,
                existing,
                resolution=conflict.action.value,
                key_kinds=bytes(keyed.kinds[p] for p in positions),
            )
        )
    return out


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "t" if value else "f"
    return str(value)
