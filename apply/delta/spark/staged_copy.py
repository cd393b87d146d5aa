"""A copy staged by range on the executors, so that it resumes after a crash (tablesync.resume).

On a cluster or through Spark Connect the rows of a copy never pass through
the daemon, so they cannot be staged in its spool. The daemon's spool keeps
the manifest and the markers; the rows go to a Delta table under the
warehouse, ``_pgsub/copy_staging/<subscription>/<table>``, partitioned by
the name of the staged part (``pgsub_staged``: ``range-00003``,
``changed``, ``keys``). Each part is one Spark job with one task, which
reads the part on an executor and replaces its partition, so a part read
again after a crash replaces whatever a killed job left.

Landing reads the parts named, drops from those an earlier attempt staged
the rows whose key is in ``keys`` (a left anti join), and writes the rest
into the target in one commit carrying the copy's mark. ``drop`` then
empties the staging table and vacuums it with no retention: nothing but
its log stays behind, unless a killed daemon's job finishes on a Spark
Connect server after that.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from functools import reduce
from typing import TYPE_CHECKING, Final, Protocol

import pyarrow as pa

from apply.columns.columnar import arrow_schema
from apply.columns.schema import TargetSchema, quote
from apply.core.records import CommitMark
from apply.delta.spark import sql as delta_sql
from apply.delta.spark.maintenance import vacuuming
from apply.delta.spark.session import struct

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from apply.delta.spark.target import TargetTable

STAGED: Final = "pgsub_staged"
RETENTION_CHECK: Final = "spark.databricks.delta.retentionDurationCheck.enabled"


class Writers(Protocol):
    """What a staged copy takes from ``DeltaTables``."""

    def session(self) -> SparkSession: ...

    def target(self, table: str) -> TargetTable: ...

    def exclusive(self, table: str) -> AbstractContextManager[None]: ...


class StagedCopy:
    """One table's copy staged at ``path`` (``apply.batching.copy_source.StagedParts``)."""

    def __init__(self, tables: Writers, schema: TargetSchema, path: str) -> None:
        self._tables = tables
        # The creating thread's session: parts are staged by jobs from several threads at
        # once (a session runs concurrent jobs), which need no session of their own.
        self._session = tables.session()
        self.schema = schema
        self.path = path
        self._created = threading.Lock()
        self._exists = False

    def stage(self, read: Callable[[], Iterator[pa.Table]], name: str) -> None:
        with self._created:  # before parts are staged at once: they would all create it
            if not self._exists:
                create(self._session, self.path, self.schema)
                self._exists = True
        stage_part(self._session, self.path, self.schema, read, name)

    def land(
        self, mark: CommitMark, stale: Sequence[str], fresh: Sequence[str], keys: str | None
    ) -> tuple[int, int | None]:
        table = self.schema.table
        with self._tables.exclusive(table):
            target = self._tables.target(table)
            return land(target, self.path, self.schema, mark, stale=stale, fresh=fresh, keys=keys)

    def drop(self) -> None:
        drop(self._session, self.path)


def stage_part(
    session: SparkSession,
    path: str,
    schema: TargetSchema,
    read: Callable[[], Iterator[pa.Table]],
    name: str,
) -> None:
    """One Spark job: a task on an executor runs ``read`` (pickled into it); its rows,
    some or all of ``schema``'s columns, replace part ``name`` of the staging table."""
    arrow = arrow_schema(schema.columns)

    def task(numbers: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in numbers:
            for block in read():
                whole = pa.table(
                    {
                        field.name: (
                            block.column(field.name)
                            if field.name in block.column_names
                            else pa.nulls(block.num_rows, field.type)
                        )
                        for field in arrow
                    }
                ).cast(arrow)
                # An empty batch would end Spark's read of the task's output.
                yield from (b for b in whole.to_batches() if b.num_rows)

    from pyspark.sql import functions as fn

    frame = (
        session.range(0, 1, 1, 1)
        .mapInArrow(task, struct(schema.ddl()))
        .withColumn(STAGED, fn.lit(name))
    )
    (
        frame.write.format("delta")
        .mode("overwrite")
        .partitionBy(STAGED)
        .option("replaceWhere", f"{STAGED} = {delta_sql.sql_string(name)}")
        .save(path)
    )


def land(
    target: TargetTable,
    path: str,
    schema: TargetSchema,
    mark: CommitMark,
    *,
    stale: Sequence[str],
    fresh: Sequence[str],
    keys: str | None,
) -> tuple[int, int | None]:
    """The staged parts into the target in one commit carrying ``mark``: ``fresh`` whole,
    ``stale`` without the rows whose key is in part ``keys``; (rows, version)."""
    session = target.session
    staged = session.read.format("delta").load(path)
    columns = [quote(c.name) for c in schema.columns]
    frames: list[DataFrame] = []
    if fresh:
        frames.append(staged.where(staged[STAGED].isin(list(fresh))).select(*columns))
    if stale:
        kept = staged.where(staged[STAGED].isin(list(stale))).select(*columns)
        if keys is not None:
            again = staged.where(staged[STAGED] == keys).select(*[quote(k) for k in schema.key])
            kept = kept.join(again, on=list(schema.key), how="left_anti")
        frames.append(kept)
    rows = reduce(lambda a, b: a.unionByName(b), frames) if frames else None
    if rows is None:
        rows = session.createDataFrame([], struct(schema.ddl()))
    with target.marked(mark):
        rows.write.format("delta").mode("overwrite").save(target.path)
        version = target.committed_version()
    if version is None:  # Delta skipped the write: this mark's copy was committed before
        return 0, None
    metrics = delta_sql.commit_metrics(session, target.path, version)
    return int(metrics.get("numOutputRows") or 0), version


def create(session: SparkSession, path: str, schema: TargetSchema) -> None:
    """The staging table, empty, unless it is there."""
    if delta_sql.is_delta_table(session, path):
        return
    from pyspark.sql import functions as fn

    empty = session.createDataFrame([], struct(schema.ddl())).withColumn(STAGED, fn.lit(""))
    empty.write.format("delta").mode("append").partitionBy(STAGED).save(path)


def drop(session: SparkSession, path: str) -> None:
    """Empty the staging table and remove its files at once."""
    if not delta_sql.is_delta_table(session, path):
        return
    delta_sql.delete(session, path, "true")
    conf = session.conf
    before = conf.get(RETENTION_CHECK, "true")
    conf.set(RETENTION_CHECK, "false")
    try:
        # A full VACUUM (it runs beside the catch-up): LITE removes only what the log
        # removed, not the files of a killed daemon's jobs that a Spark Connect server ran on
        # and never committed.
        with vacuuming(session):
            session.sql(f"VACUUM {delta_sql.table_ref(path)} RETAIN 0 HOURS").collect()
    finally:
        conf.set(RETENTION_CHECK, before or "true")
