"""Delta operations in the form every kind of Spark session answers: SQL and DataFrames.

pgsub talks to Spark in one of two ways (docs/scale-out.md):

- a classic session (``spark.master``: local or a cluster), driven over py4j;
- a Spark Connect session (``spark.remote: sc://...``), a gRPC client of a
  server that runs delta-spark.

delta-spark's Python API (``DeltaTable.forPath``, ``merge``, ``history``)
needs the JVM in this process, or, over Spark Connect, Delta Connect's
server plugin. Every server with delta-spark answers SQL, so each Delta
operation pgsub makes is written here once, as SQL or the DataFrame API,
and both kinds of session take the same path:

| operation | SQL |
|---|---|
| create a table | ``CREATE TABLE IF NOT EXISTS delta.`path` (...) USING delta TBLPROPERTIES`` |
| MERGE | ``MERGE INTO delta.`path` AS t USING <temporary view> AS s ...`` |
| history, properties | ``DESCRIBE HISTORY``, ``DESCRIBE DETAIL`` |
| delete rows | ``DELETE FROM delta.`path` WHERE ...`` |
| commit marks | session conf (``apply.delta.spark.target``), set per session |

One check keeps a cheaper classic form: whether a path holds a Delta table
is ``DeltaTable.isDeltaTable`` (a look at the log, no Spark job) where the
JVM is here, and ``DESCRIBE DETAIL`` over Spark Connect.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Final

from apply.columns.schema import quote
from apply.delta.spark.session import SparkErrors, is_remote
from apply.plans.merge_plan import MergePlan, merge_sql

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyspark.sql import DataFrame, Row, SparkSession

NOT_A_DELTA_TABLE: Final = "DELTA_MISSING_DELTA_TABLE"
HISTORY_PEEK: Final = 10
_views = itertools.count()


def table_ref(path: str) -> str:
    """The SQL name of the Delta table at ``path``."""
    return f"delta.{quote(path)}"


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def is_delta_table(session: SparkSession, path: str) -> bool:
    """Whether ``path`` holds a Delta table (a missing folder does not)."""
    if not is_remote(session):
        from delta.tables import DeltaTable

        return bool(DeltaTable.isDeltaTable(session, path))
    try:
        session.sql(f"DESCRIBE DETAIL {table_ref(path)}").collect()
    except SparkErrors as exc:
        if NOT_A_DELTA_TABLE in str(exc):
            return False
        raise
    return True


def create_if_not_exists(
    session: SparkSession, path: str, ddl: str, properties: Mapping[str, str]
) -> None:
    """Create the table at ``path`` with columns ``ddl`` (``a int, b string``) and
    ``properties``, unless there is one."""
    settings = ", ".join(f"{sql_string(k)} = {sql_string(v)}" for k, v in properties.items())
    session.sql(
        f"CREATE TABLE IF NOT EXISTS {table_ref(path)} ({ddl}) USING delta"
        + (f" TBLPROPERTIES ({settings})" if settings else "")
    )


def set_properties(session: SparkSession, path: str, properties: Mapping[str, str]) -> None:
    settings = ", ".join(f"{sql_string(k)} = {sql_string(v)}" for k, v in properties.items())
    session.sql(f"ALTER TABLE {table_ref(path)} SET TBLPROPERTIES ({settings})")


def rename_column(session: SparkSession, path: str, old: str, new: str) -> None:
    """A column renamed in the metadata (a table with column mapping)."""
    session.sql(f"ALTER TABLE {table_ref(path)} RENAME COLUMN {quote(old)} TO {quote(new)}")


def drop_column(session: SparkSession, path: str, name: str) -> None:
    """A column dropped from the metadata (a table with column mapping)."""
    session.sql(f"ALTER TABLE {table_ref(path)} DROP COLUMN {quote(name)}")


def detail(session: SparkSession, path: str) -> Row | None:
    """``DESCRIBE DETAIL`` of the table: numFiles, properties, tableFeatures, ..."""
    return session.sql(f"DESCRIBE DETAIL {table_ref(path)}").first()


def properties(session: SparkSession, path: str) -> dict[str, str]:
    row = detail(session, path)
    return dict(row["properties"] or {}) if row is not None else {}


def history(
    session: SparkSession,
    path: str,
    limit: int | None = None,
    columns: tuple[str, ...] = ("version", "operation", "userMetadata"),
) -> list[Row]:
    """The table's latest ``limit`` commits (None: all), newest first."""
    query = f"DESCRIBE HISTORY {table_ref(path)}" + (f" LIMIT {int(limit)}" if limit else "")
    rows = session.sql(query).select(*columns).collect()
    return sorted(rows, key=lambda row: -int(row["version"])) if "version" in columns else rows


def commit_metrics(session: SparkSession, path: str, version: int) -> dict[str, str]:
    """The ``operationMetrics`` of the table's commit ``version`` ({} when it is gone).

    Asked right after the commit, so the newest few commits hold it; the whole
    history is read only when others committed since."""
    for limit in (HISTORY_PEEK, None):
        rows = history(session, path, limit, ("version", "operationMetrics"))
        for row in rows:
            if int(row["version"]) == version:
                return dict(row["operationMetrics"] or {})
        if limit is None or len(rows) < limit or int(rows[-1]["version"]) < version:
            break
    return {}


def delete(session: SparkSession, path: str, where: str) -> None:
    """Delete the rows matching the SQL condition ``where``."""
    session.sql(f"DELETE FROM {table_ref(path)} WHERE {where}")


def read(session: SparkSession, path: str, version: int | None = None) -> DataFrame:
    """The table, as of ``version`` (None: the latest)."""
    reader = session.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(path)


def merge(session: SparkSession, path: str, source: DataFrame, plan: MergePlan) -> dict[str, Any]:
    """One MERGE of ``source`` (alias ``s``) into the table (alias ``t``) by ``plan``;
    the counts it reports (num_inserted_rows, ...; {} when Delta skipped the commit as
    already made)."""
    view = f"pgsub_merge_source_{next(_views)}"
    source.createOrReplaceTempView(view)
    try:
        rows = session.sql(merge_sql(plan, table_ref(path), view)).collect()
    finally:
        session.catalog.dropTempView(view)
    return rows[0].asDict() if rows else {}
