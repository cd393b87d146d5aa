"""The subscription state kept under ``<warehouse>/_pgsub/``, in Delta tables.

``checkpoints``: one row per applied batch - subscription, end LSN, commit
time of its last transaction, and the Delta version each table reached.
Its latest LSN is the subscription's origin (where streaming resumes), and
the versions let readers time-travel every table to one transaction
boundary.

``table_states``: an append-only log of table state changes (PostgreSQL's
pg_subscription_rel); the latest row per table is its state. Appends never
conflict with each other, so sync workers and the leader can record
concurrently.

``conflicts``: every conflict with its full values. ``subscription_settings``:
what ``pgsub skip/enable/disable`` set (the latest value per key counts).

All live where the warehouse is, so a pod can be replaced with nothing lost,
and all are append-only: appends never conflict with each other. A delete
(``prune``, ``forget``) or a compaction does conflict with an append made
meanwhile (Delta's optimistic commits: "a concurrent transaction deleted data
this operation read"), so in one process each state table has one writer at
a time (``writing``): the apply worker's checkpoint, the maintenance thread's
prune and compaction. VACUUM commits nothing and takes no turn.

Where pgsub reaches the warehouse itself - a local folder, an object store
(``apply.delta.files.storage``) - appends and reads go through delta-rs (tens of
milliseconds, no Spark job): a state change is on the sync path of
every table, and a cold JVM took seconds per change. Deletes, the prepared
transactions' frames and any table delta-rs may not write (a writer feature
it lacks) stay with Spark; both write the same Delta log.

Why one module: the five stores are one pattern (``_StateTable``: a Delta table under
``_pgsub/``, one writer at a time in a process, delta-rs where it may write, else
Spark) with a few lines of rows each; apart they would repeat that base or import it
from a module of its own for 60 lines apiece.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa

from apply.core.errors import TargetTableError
from apply.core.records import StoredTableState
from apply.delta.spark import sql as delta_sql
from apply.delta.spark.session import SparkErrors
from apply.delta.spark.sql import sql_string
from apply.delta.writer.local_tables import (
    append_rows,
    delta_rs_can_write,
    is_table,
    opened,
    reachable,
    read_subscription,
)
from conflicts.report import Conflict
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.wire import pg_timestamp

if TYPE_CHECKING:
    from pyspark.sql import Row, SparkSession

STATE_DIR: Final = "_pgsub"

# One lock per state table's path, shared by every store object of this process.
_WRITERS: dict[str, threading.Lock] = {}
_WRITERS_GUARD = threading.Lock()


def _writer(path: str) -> threading.Lock:
    with _WRITERS_GUARD:
        return _WRITERS.setdefault(path, threading.Lock())


class _StateTable:
    """One append-only Delta table under ``<warehouse>/_pgsub/``."""

    name: str = ""
    ddl: str = ""

    def __init__(self, spark: SparkSession | Callable[[], SparkSession], warehouse: str) -> None:
        # Or what makes a session when first needed: admin commands on a local warehouse
        # mostly never need one (delta-rs reads and appends).
        self._session_source = spark
        self.path = f"{warehouse.rstrip('/')}/{STATE_DIR}/{self.name}"
        self._reachable = reachable(warehouse)  # delta-rs reads and appends it
        self._delta_rs: bool | None = None  # decided once the table exists
        self._writing = _writer(self.path)

    def writing(self) -> threading.Lock:
        """The table's writer turn in this process (see the module): held by every append
        and delete here, and by maintenance while it commits."""
        return self._writing

    @property
    def _spark(self) -> SparkSession:
        source = self._session_source
        return source() if callable(source) else source

    def _by_delta_rs(self) -> bool:
        """Whether delta-rs reads and appends: a warehouse pgsub reaches (a local folder, an
        object store), and a table it may write."""
        if not self._reachable:
            return False
        if self._delta_rs is None:
            if not is_table(self.path):
                return True  # delta-rs makes it
            self._delta_rs = delta_rs_can_write(self.path)
        return self._delta_rs

    def _arrow(self, subscription: str) -> pa.Table | None:
        return read_subscription(self.path, subscription)

    def _rows(self, subscription: str) -> list[Row] | list[dict[str, Any]]:
        """The subscription's rows, oldest first (none when the table does not exist yet)."""
        from pyspark.sql import functions as fn

        if self._by_delta_rs():
            rows = self._arrow(subscription)
            if rows is None:
                return []
            ordered: list[dict[str, Any]] = rows.sort_by("recorded_at").to_pylist()
            return ordered
        try:
            if not delta_sql.is_delta_table(self._spark, self.path):
                return []
            return list(
                self._spark.read.format("delta")
                .load(self.path)
                .where(fn.col("subscription") == subscription)
                .orderBy("recorded_at")
                .collect()
            )
        except SparkErrors as exc:
            raise TargetTableError(f"cannot read {self.path}: {exc}") from exc

    def forget(self, subscription: str) -> None:
        """Delete every row of ``subscription`` (``pgsub drop``)."""

        self._delete(f"subscription = {sql_string(subscription)}")

    def _delete(self, condition: str) -> None:
        """Delete the rows matching the Spark SQL ``condition``, in this table's turn."""
        try:
            with self._writing:
                if delta_sql.is_delta_table(self._spark, self.path):
                    delta_sql.delete(self._spark, self.path, condition)
        except SparkErrors as exc:
            raise TargetTableError(f"cannot delete from {self.path}: {exc}") from exc

    def _append(self, rows: list[tuple[Any, ...]]) -> None:
        """Append ``rows`` (tuples in ``ddl`` order)."""
        try:
            with self._writing:
                if self._by_delta_rs():
                    append_rows(self.path, self.ddl, rows)
                    return
                frame = self._spark.createDataFrame(rows, schema=self.ddl)
                # mergeSchema: a column added by a newer pgsub joins an older table.
                writer = frame.write.format("delta").mode("append")
                writer.option("mergeSchema", "true").save(self.path)
        except SparkErrors as exc:
            raise TargetTableError(f"cannot write to {self.path}: {exc}") from exc


class CheckpointStore(_StateTable):
    name = "checkpoints"
    ddl = (
        "subscription string, lsn long, lsn_text string, commit_time timestamp, "
        "tables map<string,long>, recorded_at timestamp"
    )

    def origin_lsn(self, subscription: str) -> Lsn:
        """The end LSN of the subscription's last recorded batch (0/0 when none).

        One aggregate, whatever the number of rows: start-up does not grow with
        the batches ever applied.
        """
        from pyspark.sql import functions as fn

        if self._by_delta_rs():
            import pyarrow.compute as pc

            rows = self._arrow(subscription)
            if rows is None or rows.num_rows == 0:
                return ZERO
            return Lsn(int(pc.max(rows.column("lsn")).as_py()))
        try:
            if not delta_sql.is_delta_table(self._spark, self.path):
                return ZERO
            row = (
                self._spark.read.format("delta")
                .load(self.path)
                .where(fn.col("subscription") == subscription)
                .agg(fn.max("lsn").alias("lsn"))
                .first()
            )
        except SparkErrors as exc:
            raise TargetTableError(f"cannot read {self.path}: {exc}") from exc
        return ZERO if row is None or row["lsn"] is None else Lsn(int(row["lsn"]))

    def prune(self, subscription: str, older_than: datetime) -> None:
        """Forget rows recorded before ``older_than`` (past the maintenance retention, time
        travel to their versions may fail), keeping the subscription's latest row.

        In the table's writer turn: a checkpoint recorded meanwhile would fail
        the delete, or be failed by it. On a local warehouse delta-rs deletes
        (milliseconds; Spark's DELETE took seconds, the checkpoints waiting).
        """
        latest = int(self.origin_lsn(subscription))
        if not self._by_delta_rs():
            self._delete(
                f"subscription = {sql_string(subscription)}"
                f" AND recorded_at < TIMESTAMP {sql_string(older_than.isoformat())}"
                f" AND lsn < {latest}"
            )
            return
        import deltalake

        before = older_than.astimezone(UTC).isoformat()
        timestamp = """'Timestamp(Microsecond, Some("UTC"))'"""
        try:
            with self._writing:
                if latest:  # else no table, or no row of the subscription
                    opened(self.path).delete(
                        f"subscription = {_standard_string(subscription)}"
                        f" AND recorded_at < arrow_cast({_standard_string(before)}, {timestamp})"
                        f" AND lsn < {latest}"
                    )
        except (deltalake.exceptions.DeltaError, OSError) as exc:
            raise TargetTableError(f"cannot prune {self.path}: {exc}") from exc

    def record(
        self, subscription: str, lsn: Lsn, commit_time: int, versions: dict[str, int]
    ) -> None:
        now = datetime.now(UTC)
        self._append([(subscription, int(lsn), str(lsn), pg_timestamp(commit_time), versions, now)])


def _standard_string(text: str) -> str:
    """``text`` as a standard SQL string literal (delta-rs's DataFusion: quotes doubled,
    backslashes as they are)."""
    return "'" + text.replace("'", "''") + "'"


def _aware(at: datetime | None) -> datetime | None:
    """PySpark's collect() gives timestamps as naive local times: as UTC instants."""
    return at.astimezone(UTC) if at is not None and at.tzinfo is None else at


class TableStateStore(_StateTable):
    name = "table_states"
    ddl = (
        "subscription string, relid long, schema_name string, table_name string, state string, "
        "lsn long, recorded_at timestamp"
    )

    def __init__(self, spark: SparkSession | Callable[[], SparkSession], warehouse: str) -> None:
        super().__init__(spark, warehouse)
        self._lock = threading.Lock()

    def load(self, subscription: str) -> dict[int, StoredTableState]:
        """The latest state of each table of ``subscription`` (tables that left excluded)."""
        latest: dict[int, StoredTableState] = {}
        for row in self._rows(subscription):
            lsn = None if row["lsn"] is None else Lsn(int(row["lsn"]))
            latest[int(row["relid"])] = StoredTableState(
                int(row["relid"]),
                row["schema_name"],
                row["table_name"],
                row["state"],
                lsn,
                recorded_at=_aware(row["recorded_at"]),
            )
        return {relid: s for relid, s in latest.items() if s.state}

    def record(self, subscription: str, states: list[StoredTableState]) -> datetime:
        """Appends ``states``; returns the time they are recorded at."""
        now = datetime.now(UTC)
        rows = [
            (
                subscription,
                s.relid,
                s.schema,
                s.name,
                s.state,
                None if s.lsn is None else int(s.lsn),
                now,
            )
            for s in states
        ]
        with self._lock:  # one writer at a time keeps recorded_at in order
            self._append(rows)
        return now


class ConflictStore(_StateTable):
    """Every conflict with its full values (JSON), for repair."""

    name = "conflicts"
    ddl = (
        "subscription string, relation string, type string, resolution string, key string, "
        "existing_local_row string, remote_row string, replica_identity string, "
        "remote_xid long, finish_lsn string, commit_time timestamp, origin string, "
        "recorded_at timestamp, local_version long"
    )

    def counts(self, subscription: str) -> dict[str, int]:
        """How many conflicts of each kind the table holds for ``subscription``."""
        from pyspark.sql import functions as fn

        if self._by_delta_rs():
            found = self._arrow(subscription)
            if found is None:
                return {}
            counted = found.group_by("type").aggregate([("type", "count")])
            return dict(
                zip(counted["type"].to_pylist(), counted["type_count"].to_pylist(), strict=True)
            )
        try:
            if not delta_sql.is_delta_table(self._spark, self.path):
                return {}
            rows = (
                self._spark.read.format("delta")
                .load(self.path)
                .where(fn.col("subscription") == subscription)
                .groupBy("type")
                .count()
                .collect()
            )
        except SparkErrors as exc:
            raise TargetTableError(f"cannot read {self.path}: {exc}") from exc
        return {str(row["type"]): int(row["count"]) for row in rows}

    def record(self, subscription: str, conflicts: Sequence[Conflict]) -> None:
        def text(row: object) -> str | None:
            return None if row is None else json.dumps(row, ensure_ascii=False)

        now = datetime.now(UTC)
        self._append(
            [
                (
                    subscription,
                    c.relation,
                    c.kind.value,
                    c.resolution.value,
                    text(dict(c.key)),
                    text(None if c.existing is None else dict(c.existing)),
                    text(None if c.remote is None else dict(c.remote)),
                    text(None if c.replica_identity is None else dict(c.replica_identity)),
                    c.xid,
                    str(c.finish_lsn),
                    c.commit_time,
                    c.origin,
                    now,
                    c.local_version,
                )
                for c in conflicts
            ]
        )


class SettingsStore(_StateTable):
    """What ``pgsub skip/enable/disable`` set; an empty value clears a key."""

    name = "subscription_settings"
    ddl = "subscription string, key string, value string, recorded_at timestamp"

    def load(self, subscription: str) -> dict[str, str]:
        latest = {row["key"]: row["value"] for row in self._rows(subscription)}
        return {key: value for key, value in latest.items() if value}

    def record(self, subscription: str, key: str, value: str, *more: tuple[str, str]) -> None:
        """``key`` set to ``value`` (and each of ``more``'s), in one write."""
        now = datetime.now(UTC)
        self._append([(subscription, k, v, now) for k, v in ((key, value), *more)])


class PreparedStore(_StateTable):
    """Prepared remote transactions (``two_phase``), staged until COMMIT/ROLLBACK PREPARED.

    Each as its spool frames (``apply.arrival.spool.frames_of``), one row a frame, written and
    read ``CHUNK`` frames at a time so that memory does not grow with the transaction.
    In the warehouse, not on local disk: a replaced pod still has what it prepared.
    """

    name = "prepared"
    ddl = (
        "subscription string, gid string, xid long, end_lsn long, seq int, frame binary, "
        "recorded_at timestamp"
    )
    CHUNK = 50

    def stage(
        self, subscription: str, gid: str, xid: int, end_lsn: Lsn, frames: Iterable[bytes]
    ) -> int:
        """Stage a prepared transaction (replacing what an earlier try left); frames written."""
        self.forget(subscription, gid)
        now = datetime.now(UTC)
        chunk: list[tuple[object, ...]] = []
        written = 0
        for seq, frame in enumerate(frames):
            chunk.append((subscription, gid, xid, int(end_lsn), seq, frame, now))
            if len(chunk) >= self.CHUNK:
                self._append(chunk)
                written += len(chunk)
                chunk = []
        if chunk or not written:
            self._append(chunk or [(subscription, gid, xid, int(end_lsn), -1, b"", now)])
            written += len(chunk)
        return written

    def frames(self, subscription: str, gid: str) -> Iterator[bytes] | None:
        """The staged frames in order (None: nothing is staged under ``gid``)."""
        from pyspark.sql import functions as fn

        rows = self._matching(subscription, gid)
        if rows is None:
            return None
        last = rows.agg(fn.max("seq").alias("last"), fn.count("*").alias("n")).first()
        if last is None or not int(last["n"]):
            return None
        return self._read(rows, int(last["last"]))

    def _read(self, rows: Any, last: int) -> Iterator[bytes]:
        from pyspark.sql import functions as fn

        for low in range(0, last + 1, self.CHUNK):
            part = (
                rows.where((fn.col("seq") >= low) & (fn.col("seq") < low + self.CHUNK))
                .orderBy("seq")
                .select("frame")
                .collect()
            )
            yield from (bytes(row["frame"]) for row in part)

    def _matching(self, subscription: str, gid: str) -> Any:
        from pyspark.sql import functions as fn

        try:
            if not delta_sql.is_delta_table(self._spark, self.path):
                return None
            return (
                self._spark.read.format("delta")
                .load(self.path)
                .where((fn.col("subscription") == subscription) & (fn.col("gid") == gid))
            )
        except SparkErrors as exc:
            raise TargetTableError(f"cannot read {self.path}: {exc}") from exc

    def forget(self, subscription: str, gid: str | None = None, xid: int | None = None) -> None:
        """Delete the staging of ``gid`` (only if it is ``xid``'s, given one; every staging
        of ``subscription`` without a ``gid``)."""

        condition = f"subscription = {sql_string(subscription)}"
        if gid is not None:
            condition += f" AND gid = {sql_string(gid)}"
        if xid is not None:
            condition += f" AND xid = {int(xid)}"
        self._delete(condition)

    def staged(self, subscription: str) -> list[tuple[str, int]]:
        """The (gid, xid) staged for ``subscription``: prepared, not yet seen finished."""
        from pyspark.sql import functions as fn

        if self._by_delta_rs():
            found = self._arrow(subscription)
            if found is None:
                return []
            pairs = zip(found["gid"].to_pylist(), found["xid"].to_pylist(), strict=True)
            return sorted({(str(gid), int(xid)) for gid, xid in pairs})
        try:
            if not delta_sql.is_delta_table(self._spark, self.path):
                return []
            rows = (
                self._spark.read.format("delta")
                .load(self.path)
                .where(fn.col("subscription") == subscription)
                .select("gid", "xid")
                .distinct()
                .collect()
            )
        except SparkErrors as exc:
            raise TargetTableError(f"cannot read {self.path}: {exc}") from exc
        return sorted((str(row["gid"]), int(row["xid"])) for row in rows)


STATE_TABLES: Final = (
    CheckpointStore,
    TableStateStore,
    ConflictStore,
    SettingsStore,
    PreparedStore,
)
