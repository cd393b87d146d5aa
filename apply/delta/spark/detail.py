"""A table's data file count, bytes of data and properties, asked without holding it.

Read by delta-rs from the table's log where pgsub reaches the warehouse (a
local folder, an object store: milliseconds), by Spark's ``DESCRIBE DETAIL``
otherwise. Maintenance sizes each table with it
every round, a table's first Spark write looks whether it has outgrown
``deletion_vectors_above``, and a schema change whether a rewrite is cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apply.core.errors import TargetTableError
from apply.delta.spark import sql as delta_sql
from apply.delta.writer.local_tables import opened, reachable

if TYPE_CHECKING:
    import deltalake
    from pyspark.sql import SparkSession


def detail(session: SparkSession, path: str) -> tuple[int, int, dict[str, str]]:
    """The table's data file count, bytes of data and properties: read by delta-rs where
    pgsub reaches the table (milliseconds), by Spark's ``DESCRIBE DETAIL`` otherwise. A warm Spark
    session took 7-15 s to bring its snapshot over the 30-40 commits pgsub made to a big
    table since the last round, while the table's batches waited for it
    (docs/performance.md, "Big tables")."""
    if reachable(path):
        import deltalake

        try:
            return log_detail(opened(path))
        except (deltalake.exceptions.DeltaError, OSError) as exc:
            raise TargetTableError(f"reading the log of {path} failed: {exc}") from exc
    row = (
        session.sql(f"DESCRIBE DETAIL {delta_sql.table_ref(path)}")
        .select("numFiles", "sizeInBytes", "properties")
        .first()
    )
    if row is None:
        return 0, 0, {}
    return int(row["numFiles"] or 0), int(row["sizeInBytes"] or 0), dict(row["properties"] or {})


def log_detail(table: deltalake.DeltaTable) -> tuple[int, int, dict[str, str]]:
    """``detail`` of a table delta-rs has open, as of its snapshot."""
    import pyarrow as pa

    sizes = pa.table(table.get_add_actions(flatten=True)).column("size_bytes").to_pylist()
    return len(sizes), sum(sizes), dict(table.metadata().configuration)
