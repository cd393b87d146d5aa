"""Keeping Delta tables healthy for months: compaction, old files, expired ids and log entries.

Every batch is one commit and a few files in each table it touches; at one
batch a second that is tens of thousands of small files a day. ``tend``
looks at one table and does what is due:

- deletion vectors on, once a target table has grown past
  ``table_features.deletion_vectors_above`` (``auto``: apply.core.features);
- OPTIMIZE when the table holds more than ``compact_files`` data files, of
  its small files only (below ``COMPACT_BELOW``; by delta-rs, without a
  JVM, where the whole table is that small and pgsub reaches it:
  ``apply.delta.writer.compaction``): the big files a copy
  wrote are left as they are, unless deletion vectors have removed more
  than ``PURGE_ABOVE`` of their rows - so a big table updated at random is
  not rewritten whole every few minutes;
- VACUUM once per ``vacuum_interval``, keeping ``retention`` of history:
  pgsub's own where it reaches the table (``apply.delta.writer.vacuum``:
  Delta's full VACUUM without a JVM, a few requests); elsewhere Spark's,
  ``LITE`` (the files the log says were removed; seconds), and a full
  VACUUM, which lists the folder for files no commit names (what a killed
  job left), when ``lite`` is off or LITE finds the log cut short. VACUUM
  runs beside the table's writers: it deletes only files that no commit of
  the last ``retention`` names and that are older than it - never a file a
  writer is making -, and it commits nothing (Delta's VACUUM START/END
  entries are off for it), so it conflicts with no writer and leaves no
  commit with an older mark after a newer one. A full VACUUM held a 1M-row
  table's batches for 52-82 s when it ran under the write lock
  (docs/performance.md, "The 150-minute soak");
- Delta itself checkpoints the log every 10 commits and, at a checkpoint,
  deletes log entries older than ``delta.logRetentionDuration`` and
  idempotent-write ids older than ``delta.setTransactionRetentionDuration``;
  ``retention_properties`` sets both (and the deleted-file retention VACUUM
  honours) to ``retention`` on every table pgsub creates or tends (by
  delta-rs where pgsub reaches the table and delta-rs writes it:
  ``apply.delta.writer.compaction.properties_set_here``).

Time travel to a checkpoint row of ``_pgsub/checkpoints`` therefore works for
``retention``; older rows are pruned (``CheckpointStore.prune``).

A table's applied LSN is read back from the mark of its latest commit by
this subscription, so maintenance commits carry that same mark
(``mark()``, read in the write lock): log cleanup can never leave a table's history without it.
What commits (the properties, the features, OPTIMIZE) runs in ``held``,
the table's write lock: never beside the table's own MERGE. Whether
anything is due is read before, without it: a round that finds nothing
to commit neither holds a table's batches nor asks Spark anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from apply.core.errors import TargetTableError
from apply.core.features import TableFeatures, size_gain
from apply.core.maintenance_policy import PURGE_ABOVE, MaintenancePolicy, retention_properties
from apply.delta.files.store import table_store
from apply.delta.spark import sql as delta_sql
from apply.delta.spark.definition import gain_by_size
from apply.delta.spark.detail import detail
from apply.delta.spark.session import SparkErrors
from apply.delta.spark.target import USER_METADATA
from apply.delta.writer.compaction import compacted_here, properties_set_here
from apply.delta.writer.live_files import UnreadableLogError, newest_commit
from apply.delta.writer.local_tables import reachable
from apply.delta.writer.vacuum import vacuum as swept

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# OPTIMIZE rewrites the files below this size only (Delta's own default: 1 GiB, so every
# file of a table below a GiB, each time) ...
COMPACT_BELOW: Final = 32 * 2**20
# ... into files of up to this size (Delta's default, a GiB, would make one ever-growing file
# that the next compaction rewrites again);
COMPACT_INTO: Final = 128 * 2**20
# and a file whose rows deletion vectors have removed past PURGE_ABOVE.


@dataclass(frozen=True, slots=True)
class Grown:
    """A target table whose size may call for deletion vectors (``table_features``)."""

    table: str
    features: TableFeatures


@dataclass(frozen=True, slots=True)
class Tended:
    """What ``tend`` did to one table."""

    files_before: int
    files_after: int
    compacted: bool
    vacuumed: bool
    seconds: float
    deleted: int | None = None  # the files a VACUUM deleted (None: Spark's, not counted)


def tend(
    session: SparkSession,
    path: str,
    policy: MaintenancePolicy,
    *,
    vacuum: bool,
    mark: Callable[[], str | None],
    lite: bool = False,
    features: Grown | None = None,
    held: Callable[[], AbstractContextManager[object]] = nullcontext,
) -> Tended:
    """Compact ``path`` if it holds too many files, vacuum it if ``vacuum``, turn deletion
    vectors on if it grew past ``features``' size (a target table); see the module.
    ``held()`` is the table's write lock, held for what commits, not for VACUUM.
    The VACUUM is pgsub's own (``apply.delta.writer.vacuum``) where pgsub reaches the
    table; Spark's elsewhere, or where pgsub does not read the table's log."""
    started = time.monotonic()
    table = delta_sql.table_ref(path)
    wanted = retention_properties(policy)
    try:
        # Looked at without holding the table: most rounds find nothing to commit, and then
        # neither hold its batches nor ask Spark anything about it.
        before, size, properties = detail(session, path)
        compacted = False
        if _due(policy, wanted, features, before, size, properties):
            before, compacted = _commit_due(
                session, path, policy, wanted, mark=mark, features=features, held=held
            )
        after = detail(session, path)[0] if compacted else before
        deleted = None
        if vacuum:
            hours = max(1, round(policy.retention / 3600))
            try:
                if not reachable(path):
                    raise UnreadableLogError(path)
                deleted = len(swept(table_store(path), hours * 3600.0).deleted)
            except UnreadableLogError:
                _vacuum(session, table, hours, lite=lite)
    except SparkErrors as exc:
        raise TargetTableError(f"maintenance of {path} failed: {exc}") from exc
    return Tended(before, after, compacted, vacuum, time.monotonic() - started, deleted)


def _due(
    policy: MaintenancePolicy,
    wanted: dict[str, str],
    features: Grown | None,
    files: int,
    size: int,
    properties: dict[str, str],
) -> bool:
    """Whether the table, as ``detail`` found it, needs a commit: its history's properties,
    deletion vectors by size, or a compaction."""
    return (
        files > policy.compact_files
        or _unset(wanted, properties)
        or (features is not None and size_gain(properties, size, features.features) is not None)
    )


def _commit_due(
    session: SparkSession,
    path: str,
    policy: MaintenancePolicy,
    wanted: dict[str, str],
    *,
    mark: Callable[[], str | None],
    features: Grown | None,
    held: Callable[[], AbstractContextManager[object]],
) -> tuple[int, bool]:
    """What ``_due`` found, done in the table's write lock and as of it: (the data files
    before, whether it compacted them)."""
    with held():
        before, size, properties = detail(session, path)
        carried = mark()  # in the lock: no newer commit comes before this one's
        compacted = before > policy.compact_files
        by_spark = compacted and not compacted_here(
            path, size, below=COMPACT_BELOW, into=COMPACT_INTO, mark=carried
        )
        unset = _unset(wanted, properties) and not properties_set_here(path, wanted, mark=carried)
        grows = features is not None and size_gain(properties, size, features.features) is not None
        if by_spark or unset or grows:
            with _carrying(session, carried):
                if unset:
                    delta_sql.set_properties(session, path, wanted)
                if features is not None:
                    gain_by_size(
                        session,
                        features.table,
                        path,
                        size=size,
                        properties=properties,
                        features=features.features,
                    )
                if by_spark:
                    _compact_small_files(session, delta_sql.table_ref(path))
    return before, compacted


def _unset(wanted: dict[str, str], properties: dict[str, str]) -> bool:
    """Whether a property of ``wanted`` differs on the table."""
    return any(properties.get(name) != value for name, value in wanted.items())


@contextmanager
def _carrying(session: SparkSession, mark: str | None) -> Iterator[None]:
    """Spark's commits inside carry ``mark`` (the table's latest, as its ``userMetadata``)."""
    if mark is not None:
        session.conf.set(USER_METADATA, mark)
    try:
        yield
    finally:
        session.conf.unset(USER_METADATA)


def is_delta_table(session: SparkSession, path: str) -> bool:
    """Whether ``path`` holds a Delta table with a commit: read from its log where pgsub
    reaches it (no JVM), asked of Spark elsewhere."""
    if reachable(path):
        import obstore

        try:
            return newest_commit(table_store(path)) >= 0
        except (OSError, ValueError, obstore.exceptions.BaseError) as exc:
            raise TargetTableError(f"cannot read the log of {path}: {exc}") from exc
    try:
        return delta_sql.is_delta_table(session, path)
    except SparkErrors as exc:
        raise TargetTableError(f"cannot look at {path}: {exc}") from exc


# Delta's VACUUM START / VACUUM END commits, off for pgsub's VACUUMs (see the module). LITE
# finds where the last VACUUM stopped in _delta_log/_last_vacuum_info, not in those commits.
VACUUM_LOGGING: Final = "spark.databricks.delta.vacuum.logging.enabled"
# A full VACUUM lists the table's folders in a Spark job of this many tasks: Spark's default,
# 10,000, took 40 s for a table of one folder on a local Spark (16: 2.2 s); pgsub's tables
# hold few folders.
LISTING_TASKS: Final = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
VACUUM_SETTINGS: Final = {VACUUM_LOGGING: "false", LISTING_TASKS: "16"}


@contextmanager
def settings(session: SparkSession, wanted: dict[str, str]) -> Iterator[None]:
    """The session's SQL conf set to ``wanted`` inside, its own values after."""
    conf = session.conf
    before = {name: conf.get(name, None) for name in wanted}
    for name, setting in wanted.items():
        conf.set(name, setting)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                conf.unset(name)
            else:
                conf.set(name, value)


def vacuuming(session: SparkSession) -> AbstractContextManager[None]:
    """``VACUUM_SETTINGS`` for the VACUUMs run inside."""
    return settings(session, VACUUM_SETTINGS)


def _vacuum(session: SparkSession, table: str, hours: int, *, lite: bool) -> None:
    """VACUUM, committing nothing: it runs beside the table's writers (see the module)."""
    with vacuuming(session):
        if lite:
            try:
                session.sql(f"VACUUM {table} LITE RETAIN {hours} HOURS")
                return
            except SparkErrors as exc:
                if "VACUUM_LITE" not in str(exc):
                    raise
                # The log no longer names every file removed since the last VACUUM.
        session.sql(f"VACUUM {table} RETAIN {hours} HOURS")


def _compact_small_files(session: SparkSession, table: str) -> None:
    """OPTIMIZE of the files below ``COMPACT_BELOW`` (and of those deletion vectors have
    emptied past ``PURGE_ABOVE``), into files of up to ``COMPACT_INTO``."""
    compaction = {
        "spark.databricks.delta.optimize.minFileSize": str(COMPACT_BELOW),
        "spark.databricks.delta.optimize.maxFileSize": str(COMPACT_INTO),
        "spark.databricks.delta.optimize.maxDeletedRowsRatio": str(PURGE_ABOVE),
    }
    with settings(session, compaction):
        session.sql(f"OPTIMIZE {table}")
