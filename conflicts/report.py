"""A detected conflict as PostgreSQL words it: message, DETAIL, log fields. Pure.

The message is PostgreSQL's (``conflict detected on relation "public.t":
conflict=insert_exists``); DETAIL follows conflict.c's wording with the key,
the existing local row, the remote row and the replica identity, each value
cut at 64 bytes as PostgreSQL cuts them. Conflict events are the only log
events that carry row values (docs/architecture.md); the conflict table keeps
the full values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from conflicts.kinds import ConflictKind, Resolution
from subscriber.replication.lsn import Lsn

MAX_VALUE_BYTES: Final = 64

Row = Mapping[str, str | None]  # column -> PostgreSQL text form (None for NULL)

_WHAT: Final = {
    ConflictKind.INSERT_EXISTS: "Key already exists in the Delta table.",
    ConflictKind.UPDATE_EXISTS: "Key already exists in the Delta table.",
    ConflictKind.UPDATE_MISSING: "Could not find the row to be updated.",
    ConflictKind.DELETE_MISSING: "Could not find the row to be deleted.",
    ConflictKind.UPDATE_ORIGIN_DIFFERS: "Updating the row that was modified by another writer.",
    ConflictKind.DELETE_ORIGIN_DIFFERS: "Deleting the row that was modified by another writer.",
}
_ORIGIN: Final = (ConflictKind.UPDATE_ORIGIN_DIFFERS, ConflictKind.DELETE_ORIGIN_DIFFERS)


@dataclass(frozen=True, slots=True)
class Conflict:
    kind: ConflictKind
    relation: str
    resolution: Resolution
    key: Row  # the key columns (or every column of a table without a key)
    existing: Row | None  # the local row, when there is one
    remote: Row | None  # the remote row (None for a delete)
    replica_identity: Row | None  # the old key sent with an update or delete
    xid: int
    finish_lsn: Lsn
    commit_time: datetime
    origin: str | None = None
    local_version: int | None = None  # the Delta version that last changed the local row

    @property
    def message(self) -> str:
        return f'conflict detected on relation "{self.relation}": conflict={self.kind.value}'

    @property
    def detail(self) -> str:
        parts = []
        if self.kind in (ConflictKind.INSERT_EXISTS, ConflictKind.UPDATE_EXISTS):
            parts.append(f"Key {_tuple(self.key)}")
        if self.existing is not None:
            parts.append(f"existing local row {_values(self.existing)}")
        if self.remote is not None:
            parts.append(f"remote row {_values(self.remote)}")
        if self.replica_identity is not None:
            parts.append(f"replica identity {_tuple(self.replica_identity)}")
        items = "; ".join(parts)
        what = _WHAT[self.kind]
        if self.kind in _ORIGIN and self.local_version is not None:
            what = f"{what[:-1]} in Delta version {self.local_version}."
        return f"{what} {items[:1].upper()}{items[1:]}." if items else what

    def log_fields(self) -> dict[str, object]:
        return {
            "relation": self.relation,
            "conflict": self.kind.value,
            "resolution": self.resolution.value,
            "detail": self.detail,
            "key": _cut_row(self.key),
            "existing_local_row": None if self.existing is None else _cut_row(self.existing),
            "remote_row": None if self.remote is None else _cut_row(self.remote),
            "replica_identity": (
                None if self.replica_identity is None else _cut_row(self.replica_identity)
            ),
            "remote_xid": self.xid,
            "finish_lsn": str(self.finish_lsn),
            "commit_time": self.commit_time.isoformat(),
            "origin": self.origin,
            "local_version": self.local_version,
        }


def cut(value: str | None) -> str | None:
    """A value cut at 64 bytes (on a character boundary), as PostgreSQL cuts it."""
    if value is None:
        return None
    data = value.encode()
    if len(data) <= MAX_VALUE_BYTES:
        return value
    return data[:MAX_VALUE_BYTES].decode(errors="ignore") + "..."


def _cut_row(row: Row) -> dict[str, str | None]:
    return {name: cut(value) for name, value in row.items()}


def _values(row: Row) -> str:
    return "(" + ", ".join("null" if v is None else str(cut(v)) for v in row.values()) + ")"


def _tuple(row: Row) -> str:
    return f"({', '.join(row)})={_values(row)}"
