"""The apply worker's side of schema changes at their LSN (``apply.schema_changes.ddl``): which
changes of
a transaction it follows, where a batch must be split, and each change made to its table.

A change is followed by the worker that applies its table (the leader, or the table-sync
worker during its catch-up), once: a transaction the table already has (its LSN) is not
followed again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import structlog

from apply.columns.typemap import TypeLookup
from apply.core.batch import Batch, ShouldApply
from apply.core.transactions import MessageChange, RemoteTransaction
from apply.schema_changes.ddl import DdlMessageError, SchemaChange, new_columns, schema_changes
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Relation

log = structlog.get_logger(__name__)


class FollowingTables(Protocol):
    """What the follower takes of ``apply.worker.applier.Tables``."""

    def follow_ddl(
        self, change: SchemaChange, new_types: Mapping[str, str], fills: Mapping[str, object]
    ) -> None: ...


class SchemaFollower:
    def __init__(
        self,
        subscription: str,
        tables: FollowingTables,
        types: TypeLookup,
        applies: ShouldApply,
        applied_lsn: Callable[[str], Lsn],
    ) -> None:
        self.subscription = subscription
        self._tables = tables
        self._types = types
        self._applies = applies
        self._applied_lsn = applied_lsn

    def changes(self, tx: RemoteTransaction) -> list[SchemaChange]:
        """The schema changes of ``tx`` to tables this worker applies and that have not
        followed them yet."""
        if not any(isinstance(c, MessageChange) for c in tx.changes):
            return []
        try:
            changes = schema_changes(tx)
        except DdlMessageError as exc:
            log.warning(
                "schema change message not followed",
                subscription=self.subscription,
                error=str(exc),
                lsn=str(tx.end_lsn),
            )
            return []
        return [
            change
            for change in changes
            if self._applies(change.relation(), tx) and tx.end_lsn > self._applied_lsn(change.table)
        ]

    def at(self, batch: Batch) -> int:
        """The index of the first transaction after the batch's first that changes the columns
        of a table this worker applies (0: none): where the batch is split."""
        for index, tx in enumerate(batch.transactions[1:], start=1):
            if self.changes(tx):
                return index
        return 0

    def follow(self, change: SchemaChange) -> None:
        """``change`` made to its table."""
        columns = new_columns(change, self._types)
        for name in columns.unknown:  # a volatile default: the publisher rewrote its table
            log.warning(
                "column added with a default pgsub cannot give the rows there were",
                subscription=self.subscription,
                table=change.table,
                column=name,
                lsn=str(change.lsn),
                detail="computed row by row (a volatile default), its values are not sent; "
                "NULL in Delta's rows there were",
                hint=f"`pgsub resync -c <config> {self.subscription} {change.table}`",
            )
        self._tables.follow_ddl(change, columns.types, columns.fills)


def guess_renames(table: str, before: Relation, after: Relation) -> None:
    """Columns gone and others new in one Relation change: maybe a rename on the publisher,
    which pgoutput cannot say (it carries no DDL). Logged as the guess it is."""
    old = [c.name for c in before.columns]
    new = [c.name for c in after.columns]
    gone = [name for name in old if name not in new]
    added = [name for name in new if name not in old]
    if gone and added:
        log.warning(
            "columns dropped and added at once: renamed on the publisher?",
            table=table,
            dropped=gone,
            added=added,
            applied_as="new columns from here on; the dropped ones kept in the Delta table, "
            "NULL in rows written from here on",
            detail="pgoutput carries no DDL, so a rename looks like a drop and an add; "
            "`pgsub resync` copies the table again if the old values belong in the new column",
        )
