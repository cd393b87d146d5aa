"""The target Delta tables of one subscription: where they are, their schema, their progress.

Table ``schema.name`` lives at ``<warehouse>/<schema>/<name>``
(``subscriber.replication.names``). ``DeltaTables`` creates and evolves
them (``apply.delta.spark.definition``: only the reader features their data needs),
reads back the LSN each one reached (``applied_lsn``: the latest commit of
this subscription in its history), and hands each write to the writer for
its shape - ``keyed``, ``multiset``, the initial ``copy``, or a change log's
append (``history: changelog``: ``apply.history.changelog``, ``apply.delta.appends``)
- as a ``TargetTable``.

Which engine takes a batch (delta-rs or Spark) is ``apply.delta.placement``'s
choice; what the tables are made with, ``apply.delta.table_options``.

Writes run from several threads at once (one MERGE per table of a batch).
Each thread has its own Spark session (``apply.delta.spark.session.thread_session``:
the same Spark, its own SQL conf), because the idempotent-write settings
are session configuration and must not leak between tables. The Delta
operations this module runs itself go through ``apply.delta.spark.sql``, the form
both a classic session and a Spark Connect session take.

``DeltaTables`` is the ``apply.plans.tables.Tables`` seam: one method per thing the worker
asks, each the dispatch of that one ask to the room that does it (``placement`` picks
delta-rs, pgsub's writer or Spark; the writers live in ``writer`` and ``spark``). What the
asks share - the subscription's options, each table's open state, the reachable store, the
per-table locks - and the helpers over it are ``apply.delta.tables_state.TablesState``,
which it extends; the initial copy's asks are ``apply.delta.table_copies.TableCopies``'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from functools import partial
from typing import Final

import pyarrow as pa
import structlog

from apply.batching.collapse import KeyedNet, Net, net_bytes
from apply.columns.schema import Evolution, TargetSchema
from apply.core.errors import CommitRacedError, ConflictError, TargetTableError
from apply.core.maintenance_policy import MaintenancePolicy
from apply.core.records import (
    MESSAGES_TABLE,
    CommitMark,
    Within,
    WriteResult,
    lsn_from_metadata,
    within_from_metadata,
)
from apply.delta.appends import append_messages
from apply.delta.files.local_store import LocalStore, folders_synced_together, sync_named_folders
from apply.delta.spark.ddl import follow as follow_ddl
from apply.delta.spark.keyed import raised_conflict, staged_keys_unique, write_keyed, write_staged
from apply.delta.spark.maintenance import Grown, Tended, tend
from apply.delta.spark.multiset import write_multiset
from apply.delta.spark.session import SparkErrors
from apply.delta.spark.target import TargetTable
from apply.delta.table_copies import TableCopies
from apply.delta.tables_state import JustCreated
from apply.delta.versions import Witness, write_versions
from apply.delta.writer.live_files import carries
from apply.delta.writer.local_tables import delta_rs_writes, folder
from apply.delta.writer.overwrite import checkpoint_again
from apply.history.changelog import HistoryMode, changelog_schema
from apply.history.stamps import Keeping
from apply.plans.merge_plan import conflict_in
from apply.plans.staging import StagedSource
from apply.schema_changes.ddl import SchemaChange
from conflicts.kinds import DEFAULTS, ConflictKind, Resolution
from subscriber.replication.lsn import ZERO, Lsn

# Tries of a batch whose commit another writer's beat (nothing committed): each on the table
# as that writer left it.
RACE_ATTEMPTS: Final = 3

log = structlog.get_logger(__name__)


class DeltaTables(TableCopies):
    """The target tables of one subscription: the asks of ``Tables``, each a dispatch to the
    room that does it, over ``TablesState`` (the copies: ``TableCopies``)."""

    # -- progress ----------------------------------------------------------------

    def applied_lsn(self, table: str) -> Lsn:
        """The end LSN of the last batch this subscription committed to ``table``."""
        metadata = self._latest_mark(table)
        lsn = lsn_from_metadata(metadata, self.subscription)
        return ZERO if lsn is None else lsn

    def applied_within(self, table: str) -> Within | None:
        """How far into an open transaction the latest commit of this subscription brought
        ``table`` (None: that commit completed its transactions)."""
        return within_from_metadata(self._latest_mark(table), self.subscription)

    def written_together(self) -> AbstractContextManager[None]:
        """The folders naming the block's own commits (a batch's, a loaded table's creation
        and copy) fsynced together at its end."""
        return folders_synced_together()

    def names_durable(self) -> None:
        """Within ``written_together``: the names of the commits made so far durable now."""
        sync_named_folders()

    def holds_commit(self, table: str, version: int, mark: CommitMark) -> bool:
        """Whether version ``version`` of ``table`` is still the commit made for ``mark``
        (``verify_commit``, without its repair)."""
        if not self._on_local_disk:
            return True
        return carries(LocalStore(folder(self.path(table))), version, mark)

    def verify_commit(self, table: str, version: int, mark: CommitMark) -> None:
        """Raise if version ``version`` of ``table`` is no longer the commit made for ``mark``.

        On a local folder Spark's LogStore checks that a version is free, then
        renames its commit into place over whatever is there by then: a user's
        OPTIMIZE or DELETE from another Spark may replace a commit pgsub made
        meanwhile. Read back before the batch is confirmed, such a commit fails
        the batch (applied again on the table as it is), never loses it.
        """
        if not self._on_local_disk:
            return
        path = self.path(table)
        store = LocalStore(folder(path))
        if carries(store, version, mark):
            return
        with self.exclusive(table):  # not while maintenance reads the log
            # A checkpoint pgsub made at that version holds its commit, not the one there now.
            checkpointed = checkpoint_again(store, version)
            self._forget_written(table, path)
        raise TargetTableError(
            f"version {version} of {table} at {path} is no longer the commit pgsub made for "
            f"LSN {mark.lsn}: another engine committed over it (Spark's LogStore on a local "
            "folder renames over a version it found free). Nothing was confirmed; the batch "
            f"is applied again{'; its checkpoint made anew' if checkpointed else ''}. Stop "
            "the other writer, or let it write only while pgsub is stopped (docs/tables.md, "
            '"Other writers")'
        )

    # -- schema ------------------------------------------------------------------

    def prepare(
        self,
        schema: TargetSchema,
        *,
        recreate: bool = False,
        remember: bool = True,
        with_copy: bool = False,
    ) -> Evolution | None:
        """Create the table, or evolve it to ``schema``; None when nothing changed.

        A table this subscription created once and that is gone now (deleted by
        someone else) is not created again empty - that would lose its rows
        silently - unless ``recreate`` (a copy that fills it anew). ``remember``
        False: the caller records the creation (``remember_created``), with others
        in one write, before anything may depend on it. ``with_copy``: this thread
        copies into the table next (``copy_into``), which makes pgsub's own first
        commit of a table created now, together with the copy's rows.
        """
        keeping = self._keeping(schema)  # of the publisher's schema: its key decides
        schema = keeping.stored(schema)
        with self._lock:
            if self._schemas.get(schema.table) == schema:
                return None
        path = self.path(schema.table)
        with self._held(schema.table, f"preparing {path} for {schema.table}"):
            self._durability.known(path, self._latest_version(path))
            evolution = self._create_or_evolve(
                schema, path, keeping, recreate=recreate, remember=remember, with_copy=with_copy
            )
            self._durability.settle(path, self._latest_version(path))
        if self._held_creation(path) is None:  # else known once its copy has made it
            with self._lock:
                self._schemas[schema.table] = schema
        return evolution

    def _create_or_evolve(
        self,
        schema: TargetSchema,
        path: str,
        keeping: Keeping,
        *,
        recreate: bool,
        remember: bool,
        with_copy: bool = False,
    ) -> Evolution:
        """``schema``: the table's own (``keeping.stored``: a change log's and a versions
        table's columns, which have no key)."""
        if not self.exists(schema.table):
            if not self.create_tables:
                raise TargetTableError(
                    f"no Delta table at {path} for {schema.table} and create_tables is off;"
                    " create it, or turn create_tables on"
                )
            created_before = self.created.was_created(schema.table)
            if not recreate and created_before:
                raise TargetTableError(
                    f"the Delta table of {schema.table} at {path} is gone, though "
                    f'subscription "{self.subscription}" created it: deleted by someone '
                    "else? Its changes are not applied to an empty table. Copy it again: "
                    f"`pgsub resync -c <config> {self.subscription} {schema.table}`"
                )
            # A table made again after it was deleted is made by Spark: this process's Spark
            # may hold the deleted table's log, and sees a new one only through its own CREATE.
            if keeping.mode is not keeping.configured:
                log.warning(
                    f"target table kept as a mirror: a {keeping.configured} table needs a key",
                    subscription=self.subscription,
                    table=schema.table,
                    replica_identity="FULL or none",
                    hint="give the table a primary key, then `pgsub resync` it; or keep it as "
                    "a mirror in history.tables to silence this",
                )
            made = self._definition.create(
                self.session(), schema, path, keeping.mode, by_spark=created_before, hold=with_copy
            )
            self._local.created = JustCreated(path, made, schema)  # for its copy, next
            self._placed.forget(schema.table, path)
            self._forget_open(path)
            self._appends.forget(path)
            self._durability.forget(path)
            if made.durable:  # pgsub's own first commit: not read back and fsynced again
                self._durability.known(path, 0)
            with self._lock:
                self._origins.pop(schema.table, None)
            if remember:
                self.created.record_created(schema.table)
            return Evolution(add=schema.columns)
        return self._definition.evolve(self.session(), schema, path, keeping.mode)

    def follow_ddl(
        self, change: SchemaChange, new_types: Mapping[str, str], fills: Mapping[str, object]
    ) -> None:
        """The publisher's schema change of a table at its LSN (``apply.delta.spark.ddl``); a table
        not made yet is made later with its new columns."""
        if not self.exists(change.table):
            return
        path = self.path(change.table)
        keeps_history = self.history.of(change.table) is not HistoryMode.MIRROR
        what = f"following the schema change of {change.table} at LSN {change.lsn} in {path}"
        try:
            with self._held(change.table, what):
                done = follow_ddl(
                    self.session(), path, change, new_types, fills, keeps_history=keeps_history
                )
            self._durability.settle(path, self._latest_version(path))
        finally:
            with self._lock:
                self._schemas.pop(change.table, None)  # prepared again, as it is now
            self._forget_open(path)
            self._appends.forget(path)
        log.info(
            "schema change followed",
            subscription=self.subscription,
            table=change.table,
            lsn=str(change.lsn),
            done=done or ["nothing left to do"],
        )

    # -- writes ------------------------------------------------------------------

    def write(
        self,
        schema: TargetSchema,
        net: Net,
        mark: CommitMark,
        resolutions: Mapping[ConflictKind, Resolution] = DEFAULTS,
    ) -> WriteResult:
        """Apply ``net`` to the table in one Delta commit marked with ``mark``.

        Conflicts are met with ``resolutions``; one whose action is ``error``
        raises ConflictError and nothing is committed. May be called again
        with the same input: a commit already made for ``mark.lsn`` is not
        made twice.
        """
        target = self.target(schema.table)
        try:
            with self.exclusive(schema.table):
                for attempt in range(1, RACE_ATTEMPTS):
                    try:
                        written = self._write(target, schema, net, mark, resolutions)
                        return self._settled(target.path, written, net_bytes(net))
                    except CommitRacedError:
                        # Another writer (a user's OPTIMIZE, say) took the version first and
                        # nothing was committed: the table is read anew and the batch made on it.
                        log.info(
                            "commit raced another writer; writing the batch again",
                            table=schema.table,
                            lsn=str(mark.lsn),
                            attempt=attempt,
                        )
                written = self._write(target, schema, net, mark, resolutions)  # a race raises
                return self._settled(target.path, written, net_bytes(net))
        except ConflictError:
            raise
        except TargetTableError:  # delta-rs's write failed (the table deleted, say)
            with self._lock:
                self._schemas.pop(schema.table, None)  # the next attempt looks at it again
            raise
        except SparkErrors as exc:
            with self._lock:
                self._schemas.pop(schema.table, None)  # the next attempt looks at it again
            kind = conflict_in(str(exc))
            if kind is not None and isinstance(net, KeyedNet):
                soft = self._keeping(schema).stamping.soft
                raise raised_conflict(target, schema, net, kind, soft=soft) from None
            raise TargetTableError(
                f"writing {schema.table} to {target.path} at LSN {mark.lsn} failed: {exc}"
            ) from exc

    def _write(
        self,
        target: TargetTable,
        schema: TargetSchema,
        net: Net,
        mark: CommitMark,
        resolutions: Mapping[ConflictKind, Resolution],
    ) -> WriteResult:
        if isinstance(net, KeyedNet):
            stamps = self._keeping(schema).stamping
            if self._placed.merges_locally(target):
                merges = self._merge_processes or self._local_merges
                written = merges.merge(target.path, schema, net, mark, stamping=stamps)
                # A table too big for delta-rs that gains deletion vectors now is written by
                # pgsub's own path (apply.delta.writer.vector_write) from this batch on.
                if written is None and self._placed.check_size(target):
                    written = merges.merge(target.path, schema, net, mark, stamping=stamps)
                if written is not None:
                    return written
            self._placed.check_size(target)
            origins = self._tracker(schema.table, target.path)
            return write_keyed(
                target, schema, net, mark, resolutions, origins=origins, stamping=stamps
            )
        self._placed.check_size(target)
        return write_multiset(target, schema, net, mark, resolutions)

    def staged_keys_unique(self, stage: StagedSource) -> bool:
        """Whether no key has rows in two of the staged pieces (one Spark job)."""
        return staged_keys_unique(self.target(stage.schema.table), stage)

    def write_staged(
        self,
        schema: TargetSchema,
        stage: StagedSource,
        mark: CommitMark,
        resolutions: Mapping[ConflictKind, Resolution],
        nets: Callable[[], Iterator[KeyedNet]],
    ) -> WriteResult:
        """A large transaction's staged net effect in one commit (``apply.plans.staging``)."""
        target = self.target(schema.table)
        try:
            with self.exclusive(schema.table):
                if self._placed.merges_locally(target):
                    local = self._local_merges
                    written = local.append_staged(target.path, schema, stage, mark)
                    if written is None:
                        written = local.merge_staged(target.path, schema, stage, mark)
                    if written is not None:
                        return self._settled(target.path, written, stage.bytes)
                self._placed.check_size(target)
                written = write_staged(target, schema, stage, mark, resolutions, nets=nets)
                return self._settled(target.path, written, stage.bytes)
        except ConflictError:
            raise
        except SparkErrors as exc:
            with self._lock:
                self._schemas.pop(schema.table, None)
            raise TargetTableError(
                f"writing {schema.table} to {target.path} at LSN {mark.lsn} failed: {exc}"
            ) from exc

    def write_messages(self, rows: pa.Table, mark: CommitMark) -> WriteResult:
        """Append logical decoding messages in one commit carrying ``mark`` (exactly once, as
        any table: a resent batch at or below the table's LSN is dropped by the applier)."""
        with self.exclusive(MESSAGES_TABLE):
            target = self.target(MESSAGES_TABLE)
            return self._settled(target.path, append_messages(target, rows, mark), rows.nbytes)

    def append_changes(self, schema: TargetSchema, rows: pa.Table, mark: CommitMark) -> WriteResult:
        target, stored = self.target(schema.table), changelog_schema(schema)
        what = f"appending to {schema.table} at {target.path} at LSN {mark.lsn}"
        with self._held(schema.table, what):
            written = None
            if self._reachable:
                written = self._appends.append(target, stored, rows, mark)
            if written is None:
                written = target.append(stored, rows, mark)
            return self._settled(target.path, written, rows.nbytes)

    def write_versions(
        self,
        schema: TargetSchema,
        changes: pa.Table,
        mark: CommitMark,
        resolutions: Mapping[ConflictKind, Resolution],
        witness: Witness,
    ) -> WriteResult:
        target = self.target(schema.table)
        what = f"writing the versions of {schema.table} to {target.path} at LSN {mark.lsn}"
        try:
            with self._held(schema.table, what):
                opened = None
                if self._placed.merges_locally(target):
                    opened = self._local_merges.opened(target.path)
                    if not delta_rs_writes(opened.synced().protocol()):
                        opened = None
                if opened is None:
                    self._placed.check_size(target)
                written = write_versions(
                    target, schema, changes, mark, resolutions, witness, opened=opened
                )
                return self._settled(target.path, written, changes.nbytes)
        except TargetTableError:  # open the table afresh next time
            self._forget_open(target.path)
            raise

    # -- maintenance -------------------------------------------------------------

    def tend(
        self, table: str, policy: MaintenancePolicy, *, vacuum: bool, lite: bool = False
    ) -> Tended:
        """Maintenance of ``table`` (``apply.delta.spark.maintenance``): what commits never beside
        the table's writes; VACUUM beside them."""
        return tend(
            self.session(),
            self.path(table),
            policy,
            vacuum=vacuum,
            lite=lite,
            mark=partial(self._latest_mark, table),
            features=Grown(table, self._features(table)),
            held=partial(self._committing, table),
        )
