"""The target tables as the apply worker and the table-sync workers write them.

``Tables`` is the port: ``apply.delta.tables.DeltaTables`` implements it on
Delta Lake, and the unit tests' in-memory tables (``tests/unit/apply/memory.py``) stand
in for it, checked against it by mypy. Everything the applier asks of a
table - its progress, its shape, each kind of write - is here, so a reader
of the applier needs nothing of Delta.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from apply.batching.collapse import KeyedNet, Net
from apply.batching.copy_source import CopySource, StagedParts
from apply.columns.schema import Evolution, TargetSchema
from apply.core.records import CommitMark, Within, WriteResult
from apply.history.versions import Conflicted
from apply.plans.staging import StagedSource
from apply.schema_changes.ddl import SchemaChange
from conflicts.findings import Finding
from conflicts.kinds import ConflictKind, Resolution
from subscriber.replication.lsn import Lsn

if TYPE_CHECKING:
    import pyarrow as pa


class Tables(Protocol):
    """The target tables, as the apply worker and the table-sync workers need them
    (``apply.delta.tables.DeltaTables``)."""

    def applied_lsn(self, table: str) -> Lsn: ...

    @property
    def writers(self) -> int:
        """How many tables of a batch are written at once."""
        ...

    def applied_within(self, table: str) -> Within | None: ...

    def prepare(
        self,
        schema: TargetSchema,
        *,
        recreate: bool = ...,
        remember: bool = ...,
        with_copy: bool = ...,
    ) -> Evolution | None: ...

    def remember_created(self, tables: list[str]) -> None: ...

    def write(
        self,
        schema: TargetSchema,
        net: Net,
        mark: CommitMark,
        resolutions: Mapping[ConflictKind, Resolution] = ...,
    ) -> WriteResult: ...

    def staged_keys_unique(self, stage: StagedSource) -> bool: ...

    def write_staged(
        self,
        schema: TargetSchema,
        stage: StagedSource,
        mark: CommitMark,
        resolutions: Mapping[ConflictKind, Resolution],
        nets: Callable[[], Iterator[KeyedNet]],
    ) -> WriteResult: ...

    def written_together(self) -> AbstractContextManager[None]:
        """Table writes run in the block (and in threads started with a copy of its context):
        what they leave to make durable is made so at once when it ends - before a batch is
        confirmed, or an initial load's table counted copied."""
        ...

    @property
    def copy_on_executors(self) -> bool:
        """Whether ``copy_into`` reads ``source.parts`` on Spark executors (a cluster)."""
        ...

    def copy_into(
        self, schema: TargetSchema, source: CopySource, mark: CommitMark, staging: Path
    ) -> tuple[int, int | None]: ...

    def staged_copy(self, schema: TargetSchema) -> StagedParts:
        """Where a copy on the executors stages its parts (``copy_on_executors``)."""
        ...

    def write_messages(self, rows: pa.Table, mark: CommitMark) -> WriteResult: ...

    def names_durable(self) -> None:
        """Within ``written_together``: what the writes that ended left to make durable is
        made so now (a batch confirms them before its last table is written)."""
        ...

    def holds_commit(self, table: str, version: int, mark: CommitMark) -> bool:
        """Whether version ``version`` of ``table`` is still the commit made for ``mark``
        (``verify_commit``, answered)."""
        ...

    def verify_commit(self, table: str, version: int, mark: CommitMark) -> None:
        """Raise a ``TargetTableError`` if version ``version`` of ``table`` is no longer the
        commit made for ``mark`` (another engine replaced it); asked before the commit's
        batch is confirmed upstream."""
        ...

    def appends_changes(self, table: str) -> bool:
        """Whether ``table`` is kept as a change log (``history: changelog``)."""
        ...

    def plain_mirror(self, schema: TargetSchema) -> bool:
        """Whether the table of ``schema`` is kept as PostgreSQL's subscriber keeps it (no
        change log, no column of pgsub's: ``history``)."""
        ...

    def follow_ddl(
        self, change: SchemaChange, new_types: Mapping[str, str], fills: Mapping[str, object]
    ) -> None:
        """Make the publisher's schema change (``apply.schema_changes.ddl``) to the table, at its
        LSN:
        ``new_types``, the Spark type of each retyped column and each added one in
        ``fills`` (its value in the rows there were). Made twice, it changes nothing the
        second time."""
        ...

    def keeps_versions(self, schema: TargetSchema) -> bool:
        """Whether the table of ``schema`` is kept as versions (``history: scd2``)."""
        ...

    def write_versions(
        self,
        schema: TargetSchema,
        changes: pa.Table,
        mark: CommitMark,
        resolutions: Mapping[ConflictKind, Resolution],
        witness: Callable[[Sequence[Conflicted]], list[Finding]],
    ) -> WriteResult:
        """A batch's change rows (``apply.history.changelog.change_rows``) as versions of the table
        (``apply.history.versions``), in one commit marked ``mark`` (made once); ``witness`` turns
        the conflicts met into reports."""
        ...

    def append_changes(self, schema: TargetSchema, rows: pa.Table, mark: CommitMark) -> WriteResult:
        """Append a batch's change log rows (``apply.history.changelog``) in one commit marked
        ``mark``
        (made once: an append already committed for ``mark`` is not made again)."""
        ...
