"""What every ask of a subscription's Delta tables needs (``TablesState``).

``apply.delta.tables.DeltaTables`` answers the worker's asks (the ``apply.plans.tables.Tables``
seam); this is the state those answers share and the helpers over it: the subscription's
options, where each table lives (``path``) and which engine reaches it (``Placement``:
delta-rs, pgsub's own writer or Spark), each thread's Spark session, the per-table locks
(``exclusive``: one writer at a time per table), the durability of each table's commits
(``Durability``), the schemas prepared in this process, and what pgsub last read of each
table's log (forgotten with ``_forget_written`` when another engine moved it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

import structlog

from apply.columns.schema import TargetSchema
from apply.core.errors import TargetTableError
from apply.core.features import FeatureMode, TableFeatures
from apply.core.records import MESSAGES_TABLE, WriteResult
from apply.delta.appends import LocalAppends
from apply.delta.files.local_store import LocalStore
from apply.delta.files.store import commit_name, table_store
from apply.delta.files.store_check import LOCAL_WRITERS, round_trip, writers_for
from apply.delta.marks import latest_mark
from apply.delta.placement import Placement
from apply.delta.spark import sql as delta_sql
from apply.delta.spark.definition import TableDefinition
from apply.delta.spark.detail import detail
from apply.delta.spark.origins import OriginTracker
from apply.delta.spark.session import SparkErrors, thread_session
from apply.delta.spark.target import TargetTable
from apply.delta.table_options import DEFAULT_OPTIONS, CreatedTables, Forgetful, TableOptions
from apply.delta.writer.creation import Created, HeldCreation
from apply.delta.writer.durability import Durability
from apply.delta.writer.live_files import latest_version
from apply.delta.writer.local_tables import folder, is_table
from apply.delta.writer.merge_processes import MergeProcesses, auto_processes, usable_cpus
from apply.delta.writer.write_cost import commit_bytes
from apply.history.changelog import HistoryMode
from apply.history.stamps import PLAIN, Keeping
from subscriber.replication.names import table_folder

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

HISTORY_PEEK: Final = 100

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class JustCreated:
    """The table a thread created last (``DeltaTables.prepare``), for its copy next."""

    path: str
    made: Created
    schema: TargetSchema  # as ``prepare`` knows the table once it is made

    @property
    def held(self) -> HeldCreation | None:
        return self.made.held


class TablesState:
    """The state of one subscription's target tables, and the helpers every ask uses."""

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
        # Keyed batches: by this process's writer threads, or in writer processes (local
        # disk); ``auto``: chosen by the subscription's tables as it starts (``start_writers``).
        self._writer_processes = options.writer_processes
        self._writer_setup = options.writer_setup
        self._merge_processes: MergeProcesses | None = None  # the processes written by
        self._owned_processes: MergeProcesses | None = None  # those started, to close
        self._writers_started = False
        self.subscription = subscription
        self.create_tables = options.create_tables
        self.track_origin = track_origin
        self.features = features
        if options.writer_processes != "auto":
            self._merge_processes = self._processes(options.writer_processes)
            self._owned_processes = self._merge_processes
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

    def target(self, table: str) -> TargetTable:
        """``table`` as its writers see it, from the calling thread's session."""
        return TargetTable(self.session(), table, self.path(table))

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

    def _forget_written(self, table: str, path: str) -> None:
        """What this process kept of the table's log: read again at its next write."""
        with self._lock:
            self._schemas.pop(table, None)
        self._forget_open(path)
        self._appends.forget(path)

    def _forget_open(self, path: str) -> None:
        """The table's open log and key index, here and in its writer process, dropped."""
        self._local_merges.forget(path)
        if self._owned_processes is not None:
            self._owned_processes.forget(path)

    def writer_pids(self) -> list[int]:
        """The running writer processes' ids (``writer_processes``; none by default)."""
        return [] if self._owned_processes is None else self._owned_processes.pids()

    def _processes(self, count: int) -> MergeProcesses | None:
        if not count or not self._on_local_disk:
            return None
        return MergeProcesses(
            count, self._local_merges.max_bytes, self.features, self._writer_setup
        )

    def start_writers(self, tables: int) -> None:
        """The writer processes, if any, started in the background as the subscription of
        ``tables`` tables starts; ``auto`` chooses them now (``auto_processes``), once, and
        the threads write until they have all started: from then on each table is written
        by its process until the daemon stops."""
        if self._writers_started:
            return
        self._writers_started = True
        if self._writer_processes != "auto" or not self._on_local_disk:
            if self._merge_processes is not None:
                self._merge_processes.start()
            return
        cpus = usable_cpus()
        count = auto_processes(tables, cpus)
        log.info(
            "writer processes chosen",
            subscription=self.subscription,
            processes=count,
            tables=tables,
            cpus=cpus,
            setting="auto",
        )
        processes = self._owned_processes = self._processes(count)
        if processes is not None:
            processes.start(then=lambda: self._write_by(processes))

    def _write_by(self, processes: MergeProcesses) -> None:
        """The processes take the keyed tables over from the threads, once each has opened
        those it will write; the threads' open tables are let go (their memory)."""
        with self._lock:
            keyed = [(self.path(t), s) for t, s in self._schemas.items() if s.key]
        processes.take_over(keyed)
        self._merge_processes = processes
        for path, _ in keyed:
            self._local_merges.forget(path)
        log.info(
            "tables written by writer processes", subscription=self.subscription, opened=len(keyed)
        )

    def close(self) -> None:
        """The writer processes, if any, ended (the subscription stops)."""
        if self._owned_processes is not None:
            self._owned_processes.close()

    def appends_changes(self, table: str) -> bool:
        return table != MESSAGES_TABLE and self.history.of(table) is HistoryMode.CHANGELOG

    def plain_mirror(self, schema: TargetSchema) -> bool:
        return self._keeping(schema).plain

    def keeps_versions(self, schema: TargetSchema) -> bool:
        return self._keeping(schema).mode is HistoryMode.SCD2

    def _keeping(self, schema: TargetSchema) -> Keeping:
        """How the table of ``schema`` is kept (``history``, ``apply.history.stamps``)."""
        return PLAIN if schema.table == MESSAGES_TABLE else Keeping.of(self.history, schema)

    def _features(self, table: str) -> TableFeatures:
        """The features ``table`` may gain: a change log never needs deletion vectors."""
        if not self.appends_changes(table):
            return self.features
        return replace(self.features, deletion_vectors=FeatureMode.NEVER)

    def remember_created(self, tables: list[str]) -> None:
        """``prepare(..., remember=False)``'s tables: created by this subscription."""
        self.created.record_created(*tables)

    def known(self) -> list[str]:
        """The tables this process prepared (created, evolved or checked)."""
        with self._lock:
            return sorted(self._schemas)

    def _just_created(self, path: str) -> JustCreated | None:
        """How this thread created the table at ``path``, if that was its last creation: the
        copy into it goes on from delta-rs's opening of it, not from the log opened again (a
        listing and a read of its commit in a bucket), or makes its held first commit. Kept
        for one table a thread, so a table created without a copy holds no store client."""
        made: JustCreated | None = getattr(self._local, "created", None)
        self._local.created = None
        return made if made is not None and made.path == path else None

    def _held_creation(self, path: str) -> HeldCreation | None:
        """The first commit of the table at ``path`` this thread held back for its copy."""
        made: JustCreated | None = getattr(self._local, "created", None)
        return made.made.held if made is not None and made.path == path else None

    def _holds_rows(self, target: TargetTable) -> bool:
        """Whether the table has data files (a table copied before: a resync)."""
        if not self.exists(target.table):
            return False
        _, size, _ = detail(target.session, target.path)
        return size > 0

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
