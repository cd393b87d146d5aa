"""One target table as its writers see it: where it is, a session, and marked commits.

Every write records, atomically with the data, the LSN it brings the table
to (``apply.core.records.CommitMark``):

- Delta's idempotent-write id (``txnAppId = pgsub/<subscription>``,
  ``txnVersion`` = the LSN as an integer), so Delta itself refuses to
  commit the same batch twice;
- the mark in the commit's ``userMetadata`` (JSON), which
  ``DeltaTables.applied_lsn`` reads back from the table's history.

Both are session configuration, so each writer thread has its own Spark
session (``DeltaTables.session``), and ``marked`` sets them around exactly
one commit. The keyed, multiset and copy writers receive a ``TargetTable``
and never call back into ``DeltaTables``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

from apply.batching.source import from_key, helper_spark_type
from apply.columns.schema import TargetSchema, quote
from apply.core.records import CommitMark, WriteResult
from apply.delta.spark import sql as delta_sql
from apply.delta.spark.session import arrow_frame, struct
from apply.plans.merge_plan import MergePlan

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

TXN_APP_ID: Final = "spark.databricks.delta.write.txnAppId"
TXN_VERSION: Final = "spark.databricks.delta.write.txnVersion"
USER_METADATA: Final = "spark.databricks.delta.commitInfo.userMetadata"
LAST_VERSION: Final = "spark.databricks.delta.lastCommitVersionInSession"
MATERIALIZE_SOURCE: Final = "spark.databricks.delta.merge.materializeSource"


class TargetTable:
    """The Delta table of ``table`` at ``path``, written from the calling thread's session."""

    def __init__(self, session: SparkSession, table: str, path: str) -> None:
        self.session = session
        self.table = table
        self.path = path

    @contextmanager
    def marked(self, mark: CommitMark) -> Iterator[SparkSession]:
        """The session, whose next Delta commit carries ``mark``."""
        conf = self.session.conf
        app_id, version = mark.txn
        conf.set(TXN_APP_ID, app_id)
        conf.set(TXN_VERSION, str(version))
        conf.set(USER_METADATA, mark.user_metadata())
        conf.unset(LAST_VERSION)
        try:
            yield self.session
        finally:
            conf.unset(TXN_APP_ID)
            conf.unset(TXN_VERSION)
            conf.unset(USER_METADATA)

    def committed_version(self) -> int | None:
        """The version the session's last commit made (read right after ``marked``)."""
        value = self.session.conf.get(LAST_VERSION, None)
        return int(value) if value not in (None, "") else None

    def frame(self, rows: pa.Table, schema: TargetSchema) -> DataFrame:
        """``rows`` (target columns and the MERGE's helper columns) as a Spark DataFrame."""
        types = {c.name: c.spark_type for c in schema.columns}
        for position, name in enumerate(schema.key):
            types[from_key(position)] = types[name]
        ddl = ", ".join(
            f"{quote(n)} {types.get(n) or helper_spark_type(n)}" for n in rows.column_names
        )
        return arrow_frame(self.session, rows, ddl)

    def staged(self, directory: Path, columns: list[str], schema: TargetSchema) -> DataFrame:
        """The Parquet files under ``directory`` (written by ``apply.plans.staging``) as a frame."""
        types = {c.name: c.spark_type for c in schema.columns}
        ddl = ", ".join(f"{quote(n)} {types.get(n) or helper_spark_type(n)}" for n in columns)
        return self.session.read.schema(struct(ddl)).parquet(str(directory))

    def read(self, version: int | None = None) -> DataFrame:
        """The table, as of ``version`` (None: the latest)."""
        return delta_sql.read(self.session, self.path, version)

    def merge(
        self,
        schema: TargetSchema,
        source: DataFrame,
        plan: MergePlan,
        *,
        reads_target: bool = False,
    ) -> WriteResult:
        """One MERGE of ``source`` by ``plan``; call inside ``marked``.

        A MERGE reads its source twice (to find the files it touches, then to
        write them); Delta copies a source it cannot trust to read the same
        twice. An Arrow source is immutable, so it is not copied, unless it
        ``reads_target`` (a join with the table being merged into).
        """
        self.session.conf.set(MATERIALIZE_SOURCE, "auto" if reads_target else "none")
        counts = delta_sql.merge(self.session, self.path, source, plan)
        return WriteResult(
            schema.table,
            self.committed_version(),
            inserted=int(counts.get("num_inserted_rows") or 0),
            updated=int(counts.get("num_updated_rows") or 0),
            deleted=int(counts.get("num_deleted_rows") or 0),
        )

    def append(self, schema: TargetSchema, rows: pa.Table, mark: CommitMark) -> WriteResult:
        with self.marked(mark):
            self.frame(rows, schema).write.format("delta").mode("append").save(self.path)
            return WriteResult(schema.table, self.committed_version(), inserted=rows.num_rows)

    def overwrite_frame(
        self, schema: TargetSchema, rows: DataFrame, mark: CommitMark, written: int
    ) -> WriteResult:
        """Replace every row with ``rows`` (which may read this table: Delta reads the
        version before), in one commit carrying ``mark``; ``written``: rows the batch wrote."""
        with self.marked(mark):
            rows.write.format("delta").mode("overwrite").save(self.path)
            return WriteResult(schema.table, self.committed_version(), inserted=written)

    def overwrite(self, schema: TargetSchema, rows: pa.Table, mark: CommitMark) -> WriteResult:
        """Replace every row with ``rows``, in one commit carrying ``mark``."""
        with self.marked(mark):
            self.frame(rows, schema).write.format("delta").mode("overwrite").save(self.path)
            return WriteResult(schema.table, self.committed_version(), inserted=rows.num_rows)
