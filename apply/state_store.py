"""The subscription state kept under ``<warehouse>/_pgsub/``, in Delta tables.

``checkpoints``: one row per applied batch - subscription, end LSN, commit
time of its last transaction, and the Delta version each table reached.
Its latest LSN is the subscription's origin (where streaming resumes), and
the versions let readers time-travel every table to one transaction
boundary (DESIGN section 4). It lives where the warehouse is, so a pod can
be replaced with nothing lost.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

import pyarrow as pa
from py4j.protocol import Py4JError  # type: ignore[import-untyped]
from pyspark.errors import PySparkException

from apply.errors import TargetTableError
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
