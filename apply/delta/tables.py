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

Why one module of about 700 lines: ``DeltaTables`` is the ``apply.plans.tables.Tables`` seam,
one method per thing the worker asks, and each method is the dispatch of that one ask to
the room that does it (``placement`` picks delta-rs, pgsub's writer or Spark; the
writers live in ``writer`` and ``spark``). What it keeps across those methods - the
subscription's options, each table's open state, the reachable store, the per-table
locks - is the class's state; split by method, every part would need all of it back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pyarrow as pa
import structlog

from apply.batching.collapse import KeyedNet, Net, net_bytes
from apply.batching.copy_source import CopySource
from apply.columns.schema import Evolution, TargetSchema
from apply.core.errors import CommitRacedError, ConflictError, TargetTableError
from apply.core.features import FeatureMode, TableFeatures
from apply.core.maintenance_policy import MaintenancePolicy
from apply.core.records import (
    MESSAGES_TABLE,
    CommitMark,
    Within,
    WriteResult,
    lsn_from_metadata,
    within_from_metadata,
)
from apply.delta.appends import LocalAppends, append_messages
from apply.delta.copy import copy_into, copy_target, kept_copy, write_once
from apply.delta.files.local_store import (
    LocalStore,
    folders_synced_together,
    sync_named_folders,
)
from apply.delta.files.store import commit_name, table_store
from apply.delta.files.store_check import LOCAL_WRITERS, round_trip, writers_for
from apply.delta.marks import latest_mark
from apply.delta.placement import Placement
from apply.delta.spark import sql as delta_sql
from apply.delta.spark.ddl import follow as follow_ddl
from apply.delta.spark.definition import TableDefinition
from apply.delta.spark.detail import detail, log_detail
from apply.delta.spark.keyed import raised_conflict, staged_keys_unique, write_keyed, write_staged
from apply.delta.spark.maintenance import Grown, Tended, tend
from apply.delta.spark.multiset import write_multiset
from apply.delta.spark.origins import OriginTracker
from apply.delta.spark.session import SparkErrors, runs_here, thread_session
from apply.delta.spark.staged_copy import StagedCopy
from apply.delta.spark.target import TargetTable
from apply.delta.state_store import STATE_DIR
from apply.delta.table_options import (
    DEFAULT_OPTIONS,
    CreatedTables,
    Forgetful,
    TableOptions,
)
from apply.delta.versions import Witness, write_versions
from apply.delta.writer.durability import Durability
from apply.delta.writer.live_files import carries, latest_version
from apply.delta.writer.local_tables import (
    delta_rs_writes,
    folder,
    is_table,
)
from apply.delta.writer.overwrite import checkpoint_again
from apply.delta.writer.write_cost import commit_bytes
from apply.history.changelog import HistoryMode, changelog_schema
from apply.history.stamps import PLAIN, Keeping
from apply.plans.merge_plan import conflict_in
from apply.plans.staging import StagedSource
from apply.schema_changes.ddl import SchemaChange
from conflicts.kinds import DEFAULTS, ConflictKind, Resolution
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.names import table_folder

if TYPE_CHECKING:
    import deltalake
    from pyspark.sql import SparkSession

HISTORY_PEEK: Final = 100
# Tries of a batch whose commit another writer's beat (nothing committed): each on the table
# as that writer left it.
RACE_ATTEMPTS: Final = 3

log = structlog.get_logger(__name__)


class DeltaTables:
    """The target tables of one subscription."""

    def __init__(
        self,
        spark: SparkSession,
        warehouse: str,
        subscription: str,
        options: TableOptions = DEFAULT_OPTIONS,
        *,
        created: CreatedTables | None = None,
    ) -> None:
        features, track_origin = options.features, options.track_origin
        shared_tables, maintenance = options.shared_tables, options.maintenance
        self._spark = spark
        self.created = created or Forgetful()
        self.warehouse = warehouse.rstrip("/")
        self._placed = Placement(
            self.warehouse,
            features,
            other_writers=track_origin or shared_tables,
            appended_only=self.appends_changes,
            sees_warehouse=options.spark_sees_warehouse,
        )
        self._on_local_disk = self._placed.on_local_disk
        # delta-rs and pgsub's own writer reach it: a local folder, an object store.
        self._reachable = self._placed.reachable
        self._durability = Durability(self._on_local_disk)
        self._local_merges = self._placed.local_merges
        self.subscription = subscription
        self.create_tables = options.create_tables
        self.track_origin = track_origin
        self.features = features
        self.shared_tables = shared_tables
        self.maintenance = maintenance
        self.history = options.history
        self._appends = LocalAppends()  # their batches, by delta-rs on a local warehouse
        # Logical decoding messages (messages: true): under _pgsub/ unless configured.
        messages = options.messages_path or f"{self.warehouse}/_pgsub/messages"
        self.messages_path = messages.rstrip("/")
        # One writer at a time per table: a batch's MERGE, a copy, or maintenance.
        self._table_locks: dict[str, threading.Lock] = {}
        self._local = threading.local()
        self._schemas: dict[str, TargetSchema] = {}
        self._origins: dict[str, OriginTracker] = {}
        self._lock = threading.Lock()
        self.history_peek = HISTORY_PEEK
        self._writers: int | None = None  # in an object store: by its round trip, once
        self._definition = TableDefinition(
            subscription, features, maintenance, track_origin, shared_tables, self._reachable
        )

    def path(self, table: str) -> str:
        if table == MESSAGES_TABLE:
            return self.messages_path
        return f"{self.warehouse}/{table_folder(table)}"

    def session(self) -> SparkSession:
        session: SparkSession | None = getattr(self._local, "session", None)
        if session is None:
            session = thread_session(self._spark)
            self._local.session = session
        return session

    def exists(self, table: str) -> bool:
        if self._reachable:
            return is_table(self.path(table))
        return delta_sql.is_delta_table(self.session(), self.path(table))

    # -- progress ------------------------------------------------------------

    @property
    def writers(self) -> int:
        """Tables of a batch written at once: ``LOCAL_WRITERS`` on this machine's disk, where
        a table's write is CPU; in an object store, where it is mostly waiting for requests,
        as many as its measured round trip calls for (``writers_for``)."""
        if self._on_local_disk:
            return LOCAL_WRITERS
        if self._writers is None:
            measured = round_trip(self.warehouse) if self._reachable else None
            self._writers = writers_for(measured)
            log.info(
                "tables written at once",
                subscription=self.subscription,
                writers=self._writers,
                round_trip_ms=None if measured is None else round(measured * 1000, 1),
            )
        return self._writers

    def applied_lsn(self, table: str) -> Lsn:
        """The end LSN of the last batch this subscription committed to ``table``."""
        metadata = self._latest_mark(table)
        lsn = lsn_from_metadata(metadata, self.subscription)
        return ZERO if lsn is None else lsn

    def applied_within(self, table: str) -> Within | None:
        """How far into an open transaction the latest commit of this subscription brought
        ``table`` (None: that commit completed its transactions)."""
        return within_from_metadata(self._latest_mark(table), self.subscription)

    def _latest_mark(self, table: str) -> str | None:
        """The ``userMetadata`` of this subscription's latest commit to ``table`` with an LSN
        (``apply.delta.marks``)."""
        path = self.path(table)
        try:
            # Where pgsub reads the log itself, a table without a commit has no mark: it is
            # not asked whether the table exists first (in an object store, a listing more a
            # table at its first batch).
            if not self._reachable and not self.exists(table):
                return None
            return latest_mark(
                self.session,
                path,
                self.subscription,
                local=self._reachable,
                peek=self.history_peek,
            )
        except SparkErrors as exc:
            raise TargetTableError(f"cannot read the history of {path}: {exc}") from exc

    # -- schema --------------------------------------------------------------

    def prepare(
        self, schema: TargetSchema, *, recreate: bool = False, remember: bool = True
    ) -> Evolution | None:
        """Create the table, or evolve it to ``schema``; None when nothing changed.

        A table this subscription created once and that is gone now (deleted by
        someone else) is not created again empty - that would lose its rows
        silently - unless ``recreate`` (a copy that fills it anew). ``remember``
        False: the caller records the creation (``remember_created``), with others
        in one write, before anything may depend on it.
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
                schema, path, keeping, recreate=recreate, remember=remember
            )
            self._durability.settle(path, self._latest_version(path))
        with self._lock:
            self._schemas[schema.table] = schema
        return evolution

    def _create_or_evolve(
        self, schema: TargetSchema, path: str, keeping: Keeping, *, recreate: bool, remember: bool
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
                self.session(), schema, path, keeping.mode, by_spark=created_before
            )
            self._local.created = (path, made.table)  # for this thread's copy into it, next
            self._placed.forget(schema.table, path)
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

    def _latest_version(self, path: str) -> int | None:
        """The latest version of the table at ``path`` on a local warehouse (None elsewhere,
        or no table), read without opening its log (``live_files.latest_version``)."""
        if not self._on_local_disk:
            return None
        version = latest_version(LocalStore(folder(path)))
        return None if version < 0 else version

    def _settled(self, path: str, result: WriteResult, changed: int) -> WriteResult:
        """``result``'s commit, and every commit before it, durable (``apply.delta.
        durability``): what a batch confirms must survive a power loss; with the bytes it
        wrote and the bytes of the rows it changed (``changed``)."""
        self._durability.settle(path, result.version, made_durable=result.durable)
        written = result.written_bytes  # pgsub's own commits count theirs
        if not written and self._reachable and result.version is not None:
            lines = table_store(path).read(commit_name(result.version))  # another engine's
            written = commit_bytes(lines.decode().splitlines()).written
        return replace(result, written_bytes=written, changed_bytes=changed)

    def appends_changes(self, table: str) -> bool:
        return table != MESSAGES_TABLE and self.history.of(table) is HistoryMode.CHANGELOG

    def plain_mirror(self, schema: TargetSchema) -> bool:
        return self._keeping(schema).plain

    def keeps_versions(self, schema: TargetSchema) -> bool:
        return self._keeping(schema).mode is HistoryMode.SCD2

    def _keeping(self, schema: TargetSchema) -> Keeping:
        """How the table of ``schema`` is kept (``history``, ``apply.history.stamps``)."""
        return PLAIN if schema.table == MESSAGES_TABLE else Keeping.of(self.history, schema)

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
            self._local_merges.forget(target.path)
            raise

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
            self._local_merges.forget(path)
            self._appends.forget(path)
        log.info(
            "schema change followed",
            subscription=self.subscription,
            table=change.table,
            lsn=str(change.lsn),
            done=done or ["nothing left to do"],
        )

    def remember_created(self, tables: list[str]) -> None:
        """``prepare(..., remember=False)``'s tables: created by this subscription."""
        self.created.record_created(*tables)

    # -- writes --------------------------------------------------------------

    def target(self, table: str) -> TargetTable:
        """``table`` as its writers see it, from the calling thread's session."""
        return TargetTable(self.session(), table, self.path(table))

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
                written = self._local_merges.merge(target.path, schema, net, mark, stamping=stamps)
                # A table too big for delta-rs that gains deletion vectors now is written by
                # pgsub's own path (apply.delta.writer.vector_write) from this batch on.
                if written is None and self._placed.check_size(target):
                    written = self._local_merges.merge(
                        target.path, schema, net, mark, stamping=stamps
                    )
                if written is not None:
                    return written
            self._placed.check_size(target)
            origins = self._tracker(schema.table, target.path)
            return write_keyed(
                target, schema, net, mark, resolutions, origins=origins, stamping=stamps
            )
        self._placed.check_size(target)
        return write_multiset(target, schema, net, mark, resolutions)

    def write_messages(self, rows: pa.Table, mark: CommitMark) -> WriteResult:
        """Append logical decoding messages in one commit carrying ``mark`` (exactly once, as
        any table: a resent batch at or below the table's LSN is dropped by the applier)."""
        with self.exclusive(MESSAGES_TABLE):
            target = self.target(MESSAGES_TABLE)
            return self._settled(target.path, append_messages(target, rows, mark), rows.nbytes)

    def holds_commit(self, table: str, version: int, mark: CommitMark) -> bool:
        """Whether version ``version`` of ``table`` is still the commit made for ``mark``
        (``verify_commit``, without its repair)."""
        if not self._on_local_disk:
            return True
        return carries(LocalStore(folder(self.path(table))), version, mark)

    def names_durable(self) -> None:
        """Within ``written_together``: the names of the commits made so far durable now."""
        sync_named_folders()

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

    def _forget_written(self, table: str, path: str) -> None:
        """What this process kept of the table's log: read again at its next write."""
        with self._lock:
            self._schemas.pop(table, None)
        self._local_merges.forget(path)
        self._appends.forget(path)

    @contextmanager
    def exclusive(self, table: str) -> Iterator[None]:
        """Hold ``table`` for one writer: a batch's MERGE, a copy or maintenance."""
        with self._lock:
            lock = self._table_locks.setdefault(table, threading.Lock())
        with lock:
            yield

    @contextmanager
    def _held(self, table: str, what: str) -> Iterator[None]:
        """``exclusive``, with a Spark or delta-rs error raised as a TargetTableError saying
        that ``what`` failed."""
        try:
            with self.exclusive(table):
                yield
        except SparkErrors as exc:
            raise TargetTableError(f"{what} failed: {exc}") from exc

    def known(self) -> list[str]:
        """The tables this process prepared (created, evolved or checked)."""
        with self._lock:
            return sorted(self._schemas)

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

    @contextmanager
    def _committing(self, table: str) -> Iterator[None]:
        """``exclusive``, and what was committed meanwhile made durable before the table is
        let go (maintenance's commits, which the next batch's builds on)."""
        path = self.path(table)
        with self.exclusive(table):
            self._durability.known(path, self._latest_version(path))
            try:
                yield
            finally:
                self._durability.settle(path, self._latest_version(path))

    def _features(self, table: str) -> TableFeatures:
        """The features ``table`` may gain: a change log never needs deletion vectors."""
        if not self.appends_changes(table):
            return self.features
        return replace(self.features, deletion_vectors=FeatureMode.NEVER)

    def written_together(self) -> AbstractContextManager[None]:
        """The folders naming a batch's own commits fsynced together at its end."""
        return folders_synced_together()

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
            if self._placed.writes_itself(target.session) and plan is None:
                table = copy_target(target.path, self._just_created(target.path))
            if table is not None:
                rows, own = write_once(target, table, schema, source.blocks(), mark, mode=mode)
                copied_rows: tuple[int, int | None] = (rows, None)
                if own is not None:  # not read back and fsynced again
                    self._durability.settle(target.path, own, made_durable=True)
                # A big table gains deletion vectors now, before READY, and its key index is
                # read: not in its first batch while its changes wait (seconds each).
                gained = self._placed.check_size(target, log_detail(table))
                if self._placed.merges_locally(target) and keeping.plain:
                    self._local_merges.warm(target.path, schema, None if gained else table)
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

    def _just_created(self, path: str) -> deltalake.DeltaTable | None:
        """The table at ``path`` as delta-rs opened it when this thread created it, if that
        was this thread's last creation: the copy into it goes on from it, not from the log
        opened again (a listing and a read of its commit in a bucket). Kept for one table a
        thread, so a table created without a copy holds no store client."""
        made: tuple[str, deltalake.DeltaTable | None] | None = getattr(self._local, "created", None)
        self._local.created = None
        return made[1] if made is not None and made[0] == path else None

    def _holds_rows(self, target: TargetTable) -> bool:
        """Whether the table has data files (a table copied before: a resync)."""
        if not self.exists(target.table):
            return False
        _, size, _ = detail(target.session, target.path)
        return size > 0

    def staged_copy(self, schema: TargetSchema) -> StagedCopy:
        folder = f"_pgsub/copy_staging/{self.subscription}/{table_folder(schema.table)}"
        return StagedCopy(self, schema, f"{self.warehouse}/{folder}")

    def _tracker(self, table: str, path: str) -> OriginTracker:
        with self._lock:
            tracker = self._origins.get(table)
        if tracker is None:
            session = self.session()
            tracker = OriginTracker.opened(
                session, self.subscription, table, path, self.track_origin
            )
            with self._lock:
                self._origins[table] = tracker
        return tracker
