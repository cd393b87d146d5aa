"""The initial copy into a subscription's target tables: ``DeltaTables``' copy asks.

A copy goes one of three ways (``apply.delta.copy``): pgsub's own commit
of the blocks read here (``write_once``; ``write_first`` where the table's
creation was held back for the copy, which then makes it), a Spark commit
of them staged as Parquet, or Spark tasks reading ranges on a cluster.
After pgsub's own copy, a big table gains deletion vectors before READY and
its key index is read (``_after_copy``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from apply.batching.copy_source import CopySource
from apply.columns.schema import TargetSchema
from apply.core.errors import CommitRacedError, TargetTableError
from apply.core.records import CommitMark
from apply.delta.copy import copy_into, copy_target, kept_copy, write_first, write_once
from apply.delta.spark.detail import log_detail
from apply.delta.spark.session import runs_here
from apply.delta.spark.staged_copy import StagedCopy
from apply.delta.spark.target import TargetTable
from apply.delta.state_store import STATE_DIR
from apply.delta.tables_state import JustCreated, TablesState
from apply.delta.writer.local_tables import folder
from apply.history.stamps import Keeping
from subscriber.replication.names import table_folder

if TYPE_CHECKING:
    import deltalake


class TableCopies(TablesState):
    """The copy asks of ``apply.plans.tables.Tables``, over ``TablesState``."""

    @property
    def copy_on_executors(self) -> bool:
        """A cluster's copy, unless pgsub writes the warehouse folder Spark sees itself."""
        session = self.session()
        if runs_here(session):
            return False
        return not (self._on_local_disk and self._placed.writes_itself(session))

    def copy_into(
        self, schema: TargetSchema, source: CopySource, mark: CommitMark, staging: Path
    ) -> tuple[int, int | None]:
        """Replace the table's rows with ``source``'s (the initial copy); (rows, version).

        ``staging``: a local directory for the blocks (emptied before and after).
        """
        target = self.target(schema.table)
        keeping = self._keeping(schema)
        kept = kept_copy(keeping, schema, source, mark.lsn, lambda: self._holds_rows(target))
        source, schema, mode, plan = kept.source, kept.schema, kept.mode, kept.plan
        with self.exclusive(schema.table):
            table = None
            created = self._just_created(target.path)
            writes_itself = self._placed.writes_itself(target.session) and plan is None
            if created is not None and created.held is not None:
                if writes_itself and created.held.appendable():
                    return self._copy_creating(target, created, schema, source, mark, keeping)
                self._commit_held(target.path, created)  # the creation first, on its own
            if writes_itself:
                table = copy_target(target.path, created.made.table if created else None)
            if table is not None:
                rows, own = write_once(target, table, schema, source.blocks(), mark, mode=mode)
                copied_rows: tuple[int, int | None] = (rows, None)
                if own is not None:  # not read back and fsynced again
                    self._durability.settle(target.path, own, made_durable=True)
                self._after_copy(target, schema, keeping, log_detail(table), table)
            else:
                read_here = not self.copy_on_executors
                if read_here and not self._placed.spark_here(target.session):
                    # Staged where the Spark that lands it sees them: the shared warehouse.
                    shared = Path(folder(self.warehouse)) / STATE_DIR / "copy-staging"
                    staging = shared / self.subscription / staging.name
                copied_rows = copy_into(
                    target, schema, source, mark, staging, mode=mode, plan=plan, read_here=read_here
                )
            self._durability.settle(target.path, self._latest_version(target.path))
            return copied_rows

    def _copy_creating(
        self,
        target: TargetTable,
        created: JustCreated,
        schema: TargetSchema,
        source: CopySource,
        mark: CommitMark,
        keeping: Keeping,
    ) -> tuple[int, int | None]:
        """The copy into a table whose creation was held back for it: one commit, the
        table's version 0, with its rows; the table known prepared once it is made."""
        held = created.held
        assert held is not None
        try:
            appended = write_first(target, held, schema, source.blocks(), mark)
        except CommitRacedError as exc:
            raise TargetTableError(
                f"copying {schema.table} into {target.path} failed: another writer created"
                " the table meanwhile; it is copied again by its sync worker"
            ) from exc
        self._durability.settle(target.path, 0, made_durable=True)
        with self._lock:
            self._schemas[created.schema.table] = created.schema
        known = (appended.files, appended.data_size, dict(held.properties))
        self._after_copy(target, schema, keeping, known)
        return appended.rows, None

    def _after_copy(
        self,
        target: TargetTable,
        schema: TargetSchema,
        keeping: Keeping,
        known: tuple[int, int, dict[str, str]],
        table: deltalake.DeltaTable | None = None,
    ) -> None:
        """After a copy by pgsub's own writer (``known``: the table's detail now; ``table``:
        as delta-rs has it open, if it does): a big table gains deletion vectors now, before
        READY, and its key index is read - not in its first batch while its changes wait
        (seconds each). A table without deletion vectors has no index to read."""
        gained = self._placed.check_size(target, known)
        if not (self._placed.merges_locally(target) and keeping.plain):
            return
        if self._merge_processes is not None:  # where its batches are merged, not waited
            # for: the process runs it before the table's next ask
            self._merge_processes.warm(target.path, schema)
        elif table is not None or gained:
            self._local_merges.warm(target.path, schema, None if gained else table)

    def _commit_held(self, path: str, created: JustCreated) -> None:
        """A held creation made alone, before a copy that cannot make it (the Spark ways)."""
        held = created.held
        assert held is not None
        if held.commit():
            self._durability.known(path, 0)
        with self._lock:
            self._schemas[created.schema.table] = created.schema

    def staged_copy(self, schema: TargetSchema) -> StagedCopy:
        folder = f"_pgsub/copy_staging/{self.subscription}/{table_folder(schema.table)}"
        return StagedCopy(self, schema, f"{self.warehouse}/{folder}")
