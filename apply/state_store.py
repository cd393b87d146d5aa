"""The subscription state kept under ``<warehouse>/_pgsub/``, in Delta tables.

``checkpoints``: one row per applied batch - subscription, end LSN, commit
time of its last transaction, and the Delta version each table reached.
Its latest LSN is the subscription's origin (where streaming resumes), and
the versions let readers time-travel every table to one transaction
boundary (DESIGN section 4).

``table_states``: an append-only log of table state changes (PostgreSQL's
pg_subscription_rel); the latest row per table is its state. Appends never
conflict with each other, so sync workers and the leader can record
concurrently.

Both live where the warehouse is, so a pod can be replaced with nothing lost.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

import pyarrow as pa
from py4j.protocol import Py4JError  # type: ignore[import-untyped]
from pyspark.errors import PySparkException

from apply.errors import TargetTableError
from conflicts.report import Conflict
from subscriber.lsn import ZERO, Lsn
from subscriber.wire import pg_timestamp

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

STATE_DIR: Final = "_pgsub"
CHECKPOINT_SCHEMA: Final = pa.schema(
    [
        pa.field("subscription", pa.string()),
        pa.field("lsn", pa.int64()),
        pa.field("lsn_text", pa.string()),
        pa.field("commit_time", pa.timestamp("us", tz="UTC")),
        pa.field("tables", pa.map_(pa.string(), pa.int64())),
        pa.field("recorded_at", pa.timestamp("us", tz="UTC")),
    ]
)
_CHECKPOINT_DDL: Final = (
    "subscription string, lsn long, lsn_text string, commit_time timestamp, "
    "tables map<string,long>, recorded_at timestamp"
)


class CheckpointStore:
    def __init__(self, spark: SparkSession, warehouse: str) -> None:
        self._spark = spark
        self.path = f"{warehouse.rstrip('/')}/{STATE_DIR}/checkpoints"

    def _exists(self) -> bool:
        from delta.tables import DeltaTable

        return bool(DeltaTable.isDeltaTable(self._spark, self.path))

    def origin_lsn(self, subscription: str) -> Lsn:
        """The end LSN of the subscription's last recorded batch (0/0 when none)."""
        from pyspark.sql import functions as fn

        try:
            if not self._exists():
                return ZERO
            row = (
                self._spark.read.format("delta")
                .load(self.path)
                .where(fn.col("subscription") == subscription)
                .agg(fn.max("lsn").alias("lsn"))
                .first()
            )
        except (PySparkException, Py4JError) as exc:
            raise TargetTableError(f"cannot read checkpoints at {self.path}: {exc}") from exc
        return Lsn(int(row["lsn"])) if row is not None and row["lsn"] is not None else ZERO

    def record(
        self, subscription: str, lsn: Lsn, commit_time: int, versions: dict[str, int]
    ) -> None:
        rows = pa.table(
            {
                "subscription": [subscription],
                "lsn": [int(lsn)],
                "lsn_text": [str(lsn)],
                "commit_time": [pg_timestamp(commit_time)],
                "tables": [list(versions.items())],
                "recorded_at": [datetime.now(UTC)],
            },
            schema=CHECKPOINT_SCHEMA,
        )
        try:
            frame = self._spark.createDataFrame(rows, schema=_CHECKPOINT_DDL)
            (
                frame.write.format("delta")
                .mode("append")
                .option("delta.autoOptimize.autoCompact", "true")
                .save(self.path)
            )
        except (PySparkException, Py4JError) as exc:
            raise TargetTableError(f"cannot record a checkpoint at {self.path}: {exc}") from exc


_STATE_DDL: Final = (
    "subscription string, relid long, schema_name string, table_name string, state string, "
    "lsn long, recorded_at timestamp"
)


@dataclass(frozen=True, slots=True)
class StoredTableState:
    relid: int
    schema: str
    name: str
    state: str  # pg_subscription_rel.srsubstate letter; "" when the table left the subscription
    lsn: Lsn | None


class TableStateStore:
    def __init__(self, spark: SparkSession, warehouse: str) -> None:
        self._spark = spark
        self.path = f"{warehouse.rstrip('/')}/{STATE_DIR}/table_states"
        self._lock = threading.Lock()

    def load(self, subscription: str) -> dict[int, StoredTableState]:
        """The latest state of each table of ``subscription`` (tables that left excluded)."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as fn

        try:
            if not DeltaTable.isDeltaTable(self._spark, self.path):
                return {}
            rows = (
                self._spark.read.format("delta")
                .load(self.path)
                .where(fn.col("subscription") == subscription)
                .orderBy("recorded_at")
                .collect()
            )
        except (PySparkException, Py4JError) as exc:
            raise TargetTableError(f"cannot read table states at {self.path}: {exc}") from exc
        latest: dict[int, StoredTableState] = {}
        for row in rows:
            lsn = None if row["lsn"] is None else Lsn(int(row["lsn"]))
            latest[int(row["relid"])] = StoredTableState(
                int(row["relid"]), row["schema_name"], row["table_name"], row["state"], lsn
            )
        return {relid: s for relid, s in latest.items() if s.state}

    def record(self, subscription: str, states: list[StoredTableState]) -> None:
        now = datetime.now(UTC)
        rows = pa.table(
            {
                "subscription": [subscription] * len(states),
                "relid": [s.relid for s in states],
                "schema_name": [s.schema for s in states],
                "table_name": [s.name for s in states],
                "state": [s.state for s in states],
                "lsn": [None if s.lsn is None else int(s.lsn) for s in states],
                "recorded_at": [now] * len(states),
            },
            schema=pa.schema(
                [
                    ("subscription", pa.string()),
                    ("relid", pa.int64()),
                    ("schema_name", pa.string()),
                    ("table_name", pa.string()),
                    ("state", pa.string()),
                    ("lsn", pa.int64()),
                    ("recorded_at", pa.timestamp("us", tz="UTC")),
                ]
            ),
        )
        with self._lock:  # one writer at a time keeps recorded_at in order
            try:
                frame = self._spark.createDataFrame(rows, schema=_STATE_DDL)
                frame.write.format("delta").mode("append").save(self.path)
            except (PySparkException, Py4JError) as exc:
                raise TargetTableError(f"cannot record table states at {self.path}: {exc}") from exc


_CONFLICT_DDL: Final = (
    "subscription string, relation string, type string, resolution string, key string, "
    "existing_local_row string, remote_row string, replica_identity string, remote_xid long, "
    "finish_lsn string, commit_time timestamp, origin string, detected_at timestamp"
)


class ConflictStore:
    """``_pgsub/conflicts``: every conflict with its full values (JSON), for repair."""

    def __init__(self, spark: SparkSession, warehouse: str) -> None:
        self._spark = spark
        self.path = f"{warehouse.rstrip('/')}/{STATE_DIR}/conflicts"

    def record(self, subscription: str, conflicts: Sequence[Conflict]) -> None:
        def text(row: object) -> str | None:
            return None if row is None else json.dumps(row, ensure_ascii=False)

        now = datetime.now(UTC)
        rows = [
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
            )
            for c in conflicts
        ]
        try:
            frame = self._spark.createDataFrame(rows, schema=_CONFLICT_DDL)
            frame.write.format("delta").mode("append").save(self.path)
        except (PySparkException, Py4JError) as exc:
            raise TargetTableError(f"cannot record conflicts at {self.path}: {exc}") from exc


_SETTING_DDL: Final = "subscription string, key string, value string, recorded_at timestamp"


class SettingsStore:
    """``_pgsub/subscription_settings``: what ``pgsub skip/enable/disable`` set (append-only).

    The latest value of each (subscription, key) counts; an empty value clears it.
    """

    def __init__(self, spark: SparkSession, warehouse: str) -> None:
        self._spark = spark
        self.path = f"{warehouse.rstrip('/')}/{STATE_DIR}/subscription_settings"

    def load(self, subscription: str) -> dict[str, str]:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as fn

        try:
            if not DeltaTable.isDeltaTable(self._spark, self.path):
                return {}
            rows = (
                self._spark.read.format("delta")
                .load(self.path)
                .where(fn.col("subscription") == subscription)
                .orderBy("recorded_at")
                .collect()
            )
        except (PySparkException, Py4JError) as exc:
            raise TargetTableError(f"cannot read settings at {self.path}: {exc}") from exc
        latest = {row["key"]: row["value"] for row in rows}
        return {key: value for key, value in latest.items() if value}

    def record(self, subscription: str, key: str, value: str) -> None:
        try:
            frame = self._spark.createDataFrame(
                [(subscription, key, value, datetime.now(UTC))], schema=_SETTING_DDL
            )
            frame.write.format("delta").mode("append").save(self.path)
        except (PySparkException, Py4JError) as exc:
            raise TargetTableError(f"cannot record a setting at {self.path}: {exc}") from exc
