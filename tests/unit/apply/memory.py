"""In-memory stand-ins for the apply worker's collaborators: tables, checkpoints, skip, staging.

``MemoryTables`` keeps, per table, its rows by key and the marks its commits
carried, the way a Delta table's history holds them: ``applied_lsn`` and
``applied_within`` answer from those marks, and an insert whose key is
already there raises ``ConflictError`` as the MERGE's ``raise_error`` does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from apply.batching.collapse import KeyedNet, Net
from apply.batching.copy_source import StagedParts
from apply.columns.schema import Evolution, TargetSchema
from apply.core.errors import ConflictError, TargetTableError
from apply.core.records import CommitMark, Within, WriteResult
from apply.history.versions import (
    CURRENT,
    VALID_FROM,
    VALID_TO,
    VALID_TO_TIME,
    Conflicted,
    touched_keys,
    versioned,
)
from apply.plans.staging import StagedSource
from apply.schema_changes.ddl import SchemaChange
from conflicts.findings import Finding
from conflicts.kinds import DEFAULTS, ConflictKind, First, Resolution
from subscriber.replication.lsn import ZERO, Lsn


class MemoryTables:
    def __init__(self) -> None:
        self.lsn: dict[str, Lsn] = {}
        self.within: dict[str, Within | None] = {}
        self.rows: dict[str, dict[bytes | None, tuple[bytes | None, ...]]] = {}
        self.commits: list[tuple[str, CommitMark]] = []
        self.messages: list[dict[str, Any]] = []
        self.change_logs: set[str] = set()  # tables kept as change logs
        self.logged: dict[str, list[dict[str, Any]]] = {}  # their rows
        self.followed: list[SchemaChange] = []  # schema changes, in order
        self.version_tables: set[str] = set()  # tables kept as versions (scd2)
        self.versions: dict[str, list[dict[str, Any]]] = {}  # their rows
        self.reads = 0
        self.replaced: set[int] = set()  # versions another engine took over after the commit

    writers = 4

    def applied_lsn(self, table: str) -> Lsn:
        self.reads += 1
        return self.lsn.get(table, ZERO)

    def applied_within(self, table: str) -> Within | None:
        return self.within.get(table)

    def prepare(
        self,
        schema: TargetSchema,
        *,
        recreate: bool = False,
        remember: bool = True,
        with_copy: bool = False,
    ) -> Evolution | None:
        return None

    def remember_created(self, tables: list[str]) -> None:
        return None

    def write(
        self,
        schema: TargetSchema,
        net: Net,
        mark: CommitMark,
        resolutions: Mapping[ConflictKind, Resolution] = DEFAULTS,
    ) -> WriteResult:
        assert isinstance(net, KeyedNet)
        rows = self.rows.setdefault(schema.table, {})
        clashes = [
            Finding(ConflictKind.INSERT_EXISTS.value, r.first_tx, r.key, r.image, None)
            for r in net.rows.values()
            if r.first is First.INSERT and r.key[0] in rows
        ]
        if clashes and resolutions[ConflictKind.INSERT_EXISTS] is Resolution.ERROR:
            raise ConflictError(ConflictKind.INSERT_EXISTS.value, schema.table, clashes)
        for r in net.rows.values():
            if r.present and r.image is not None:
                rows[r.key[0]] = r.image.values
            else:
                rows.pop(r.key[0], None)
        if mark.within is None:
            self.lsn[schema.table] = mark.lsn
        self.within[schema.table] = mark.within
        self.commits.append((schema.table, mark))
        return WriteResult(schema.table, len(self.commits))

    # What only Spark does (tests/integration has them): staged transactions, a copy.
    copy_on_executors = False

    def written_together(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def staged_keys_unique(self, stage: StagedSource) -> bool:
        raise NotImplementedError("staged transactions are read by Spark")

    def write_staged(
        self,
        schema: TargetSchema,
        stage: StagedSource,
        mark: CommitMark,
        resolutions: Mapping[ConflictKind, Resolution],
        nets: Callable[[], Iterator[KeyedNet]],
    ) -> WriteResult:
        raise NotImplementedError("staged transactions are merged by Spark")

    def copy_into(
        self, schema: TargetSchema, source: Any, mark: CommitMark, staging: Path
    ) -> tuple[int, int | None]:
        raise NotImplementedError("the copy needs a publisher")

    def staged_copy(self, schema: TargetSchema) -> StagedParts:
        raise NotImplementedError("a staged copy is Spark's")

    def write_messages(self, rows: Any, mark: CommitMark) -> WriteResult:
        self.messages.extend(rows.to_pylist())
        self.lsn["pgsub:messages"] = mark.lsn
        self.commits.append(("pgsub:messages", mark))
        return WriteResult("pgsub:messages", len(self.commits))

    def holds_commit(self, table: str, version: int, mark: CommitMark) -> bool:
        return version not in self.replaced and self.commits[version - 1] == (table, mark)

    def names_durable(self) -> None:
        pass

    def verify_commit(self, table: str, version: int, mark: CommitMark) -> None:
        if not self.holds_commit(table, version, mark):
            raise TargetTableError(f"version {version} of {table} was replaced")

    def appends_changes(self, table: str) -> bool:
        return table in self.change_logs

    def plain_mirror(self, schema: TargetSchema) -> bool:
        return schema.table not in self.change_logs and not self.keeps_versions(schema)

    def follow_ddl(
        self, change: SchemaChange, new_types: Mapping[str, str], fills: Mapping[str, object]
    ) -> None:
        self.followed.append(change)

    def keeps_versions(self, schema: TargetSchema) -> bool:
        return schema.table in self.version_tables and bool(schema.key)

    def write_versions(
        self,
        schema: TargetSchema,
        changes: Any,
        mark: CommitMark,
        resolutions: Mapping[ConflictKind, Resolution],
        witness: Callable[[Sequence[Conflicted]], list[Finding]],
    ) -> WriteResult:
        """``apply.history.versions`` over a list of rows: the Delta writer's lookup and MERGE."""
        kept = self.versions.setdefault(schema.table, [])
        keys = set(touched_keys(changes, schema))
        current = [v for v in kept if v[CURRENT] and tuple(v[k] for k in schema.key) in keys]
        out = versioned(changes, schema, current, resolutions)
        found = witness(out.conflicts)
        if out.stop is not None:
            raise ConflictError(out.stop.kind.value, schema.table, found)
        closing = {(tuple(c[k] for k in schema.key), c[VALID_FROM]): c for c in out.closes}
        for version in kept:
            close = closing.get((tuple(version[k] for k in schema.key), version[VALID_FROM]))
            if close is None and out.truncated is not None and version[CURRENT]:
                close = {VALID_TO: out.truncated[0], VALID_TO_TIME: out.truncated[1]}
            if close is not None and version[CURRENT]:
                version |= {VALID_TO: close[VALID_TO], VALID_TO_TIME: close[VALID_TO_TIME]}
                version[CURRENT] = False
        kept[:] = [v for v in kept if v[VALID_TO] != v[VALID_FROM]] + out.opens
        self.lsn[schema.table] = mark.lsn
        self.within[schema.table] = mark.within
        self.commits.append((schema.table, mark))
        return WriteResult(schema.table, len(self.commits), conflicts=tuple(found))

    def append_changes(self, schema: TargetSchema, rows: Any, mark: CommitMark) -> WriteResult:
        self.logged.setdefault(schema.table, []).extend(rows.to_pylist())
        self.lsn[schema.table] = mark.lsn
        self.within[schema.table] = mark.within
        self.commits.append((schema.table, mark))
        return WriteResult(schema.table, len(self.commits), inserted=rows.num_rows)

    def keys(self, table: str = "public.t") -> list[int]:
        return sorted(int(k) for k in self.rows.get(table, {}) if k is not None)


class MemoryCheckpoints:
    def __init__(self) -> None:
        self.recorded: list[Lsn] = []

    def record(
        self, subscription: str, lsn: Lsn, commit_time: int, versions: dict[str, int]
    ) -> None:
        self.recorded.append(lsn)


class MemorySkip:
    """``pgsub skip`` as the worker reads it."""

    def __init__(self, skip_lsn: Lsn | None = None) -> None:
        self.skip_lsn = skip_lsn
        self.cleared = 0

    def refresh(self, *, force: bool = False) -> None:
        return None

    def clear_skip(self) -> None:
        self.skip_lsn = None
        self.cleared += 1


class MemoryStaging:
    """Prepared transactions staged as ``apply.delta.state_store.PreparedStore`` does."""

    def __init__(self) -> None:
        self.staged: dict[tuple[str, str], tuple[int, list[bytes]]] = {}

    def stage(
        self, subscription: str, gid: str, xid: int, end_lsn: Lsn, frames: Iterable[bytes]
    ) -> int:
        self.staged[(subscription, gid)] = (xid, list(frames))
        return len(self.staged[(subscription, gid)][1])

    def frames(self, subscription: str, gid: str) -> Iterator[bytes] | None:
        found = self.staged.get((subscription, gid))
        return iter(found[1]) if found is not None else None

    def forget(self, subscription: str, gid: str | None = None, xid: int | None = None) -> None:
        for key, (staged_xid, _) in list(self.staged.items()):
            if key[0] == subscription and gid in (None, key[1]) and xid in (None, staged_xid):
                del self.staged[key]
