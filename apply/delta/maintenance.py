"""Keeping Delta tables healthy for months: compaction, old files, expired ids and log entries.

Every batch is one commit and a few files in each table it touches; at one
batch a second that is tens of thousands of small files a day. ``tend``
looks at one table and does what is due:

- OPTIMIZE (bin-packing small files) when the table holds more than
  ``compact_files`` data files - and, with deletion vectors, purges them in
  the same pass (``REORG TABLE ... APPLY (PURGE)``);
- VACUUM once per ``vacuum_interval``, keeping ``retention`` of history;
- Delta itself checkpoints the log every 10 commits and, at a checkpoint,
  deletes log entries older than ``delta.logRetentionDuration`` and
  idempotent-write ids older than ``delta.setTransactionRetentionDuration``;
  ``retention_properties`` sets both (and the deleted-file retention VACUUM
  honours) to ``retention`` on every table pgsub creates or tends.

Time travel to a checkpoint row of ``_pgsub/checkpoints`` therefore works for
``retention``; older rows are pruned (``CheckpointStore.prune``).

A table's applied LSN is read back from the mark of its latest commit by
this subscription, so maintenance commits carry that same mark
(``mark``): log cleanup can never leave a table's history without it.
The caller holds the table's write lock: maintenance never runs beside the
table's own MERGE.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from apply.delta import sql as delta_sql
from apply.delta.session import SparkErrors
from apply.delta.target import USER_METADATA
from apply.errors import TargetTableError
from apply.maintenance_policy import MaintenancePolicy, retention_properties

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True, slots=True)
class Tended:
    """What ``tend`` did to one table."""

    files_before: int
    files_after: int
    compacted: bool
    vacuumed: bool
    seconds: float


def tend(
    session: SparkSession,
    path: str,
    policy: MaintenancePolicy,
    *,
    vacuum: bool,
    mark: str | None,
    deletion_vectors: bool = False,
) -> Tended:
    """Compact ``path`` if it holds too many files, vacuum it if ``vacuum``; see the module."""
    started = time.monotonic()
    table = delta_sql.table_ref(path)
    try:
        before, properties = _detail(session, table)
        wanted = retention_properties(policy)
        if mark is not None:
            session.conf.set(USER_METADATA, mark)
        try:
            if any(properties.get(name) != value for name, value in wanted.items()):
                delta_sql.set_properties(session, path, wanted)
            compacted = before > policy.compact_files
            if compacted:
                if deletion_vectors:
                    session.sql(f"REORG TABLE {table} APPLY (PURGE)")
                session.sql(f"OPTIMIZE {table}")
            if vacuum:
                hours = max(1, round(policy.retention / 3600))
                session.sql(f"VACUUM {table} RETAIN {hours} HOURS")
        finally:
            session.conf.unset(USER_METADATA)
        after = _detail(session, table)[0] if compacted else before
    except SparkErrors as exc:
        raise TargetTableError(f"maintenance of {path} failed: {exc}") from exc
    return Tended(before, after, compacted, vacuum, time.monotonic() - started)


def is_delta_table(session: SparkSession, path: str) -> bool:
    try:
        return delta_sql.is_delta_table(session, path)
    except SparkErrors as exc:
        raise TargetTableError(f"cannot look at {path}: {exc}") from exc


def _detail(session: SparkSession, table: str) -> tuple[int, dict[str, str]]:
    """The table's data file count and properties."""
    row = session.sql(f"DESCRIBE DETAIL {table}").select("numFiles", "properties").first()
    if row is None:
        return 0, {}
    return int(row["numFiles"] or 0), dict(row["properties"] or {})
