"""Which rows of a target table another writer changed last: the *_origin_differs source.

PostgreSQL compares the replication origin stamped on the local row with
the remote transaction's. A Delta table has no per-row origin, but with row
tracking (``delta.enableRowTracking``, set on the tables pgsub creates when
``track_origin`` is on) each row carries ``_metadata.row_commit_version``:
the table version that last inserted or changed it. A version is *ours* when its commit carries
this subscription's mark in ``userMetadata`` (``apply.core.records.CommitMark``);
any other commit that can hold rows is another writer's. So a row is
foreign when its row commit version is one of those foreign versions.

The tracker keeps, per table, the foreign versions that still have live
rows (pruned with one scan of the row-version column whenever new foreign
commits appear, and after a batch overwrote foreign rows) and the last
version it has read the history up to. On the conflict-free path, where
only this subscription writes the table, it costs nothing: the MERGE's own
version tells whether another commit came in between (it is then not the
next one), and only then is the history read.

A table without row tracking (``track_origin: false``, the default, or a
table created by hand) is not checked for *_origin_differs; with
``track_origin: true`` pgsub logs once per such table that it cannot tell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import structlog

from apply.core.records import read_mark
from apply.delta.spark import sql as delta_sql

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = structlog.get_logger(__name__)

ROW_TRACKING: Final = "delta.enableRowTracking"
ROW_VERSION: Final = "_metadata.row_commit_version"
HISTORY_PEEK: Final = 100

# Commits that change no rows; anything else by another writer may hold some.
NO_ROWS: Final = frozenset(
    {
        "CREATE TABLE",
        "ADD COLUMNS",
        "CHANGE COLUMN",
        "RENAME COLUMN",
        "DROP COLUMNS",
        "SET TBLPROPERTIES",
        "UNSET TBLPROPERTIES",
        "ADD CONSTRAINT",
        "DROP CONSTRAINT",
        "OPTIMIZE",  # row tracking keeps each row's commit version through compaction
        "VACUUM START",
        "VACUUM END",
        "UPGRADE PROTOCOL",
        "DELETE",
    }
)


def marked_by(user_metadata: str | None, subscription: str) -> bool:
    """Whether a commit carries ``subscription``'s mark."""
    return read_mark(user_metadata).get("subscription") == subscription


class OriginTracker:
    """The foreign row versions of one target table."""

    def __init__(self, subscription: str, table: str, path: str, enabled: bool) -> None:
        self.subscription = subscription
        self.table = table
        self.path = path
        self.enabled = enabled
        self.foreign: frozenset[int] = frozenset()
        self.seen: int | None = None  # the history is read up to this version

    @classmethod
    def opened(
        cls, session: SparkSession, subscription: str, table: str, path: str, wanted: bool
    ) -> OriginTracker:
        """The tracker of the table at ``path``, started; ``wanted`` (``track_origin``) and
        the table has no row tracking: a warning says what is not detected."""
        enabled = delta_sql.properties(session, path).get(ROW_TRACKING) == "true"
        tracker = cls(subscription, table, path, enabled)
        if wanted and not enabled:
            log.warning(
                "update_origin_differs and delete_origin_differs are not detected for this table",
                table=table,
                path=path,
                hint=f"it has no row tracking; set its table property {ROW_TRACKING} = true",
            )
        tracker.start(session)
        return tracker

    def start(self, session: SparkSession) -> None:
        """Read the whole history once (the first write of this process to the table)."""
        if self.enabled and self.seen is None:
            self._read(session, None)

    def has_new_commits(self, session: SparkSession) -> bool:
        """Whether a commit follows the last one read (a file check, no history scan)."""
        if not self.enabled:
            return False
        if self.seen is None:
            return True
        return _commit_exists(session, self.path, self.seen + 1)

    def catch_up(self, session: SparkSession) -> None:
        """Read the commits after the last one read; ``foreign`` is then current."""
        if self.enabled:
            self._read(session, None)

    def committed(self, session: SparkSession, version: int | None) -> None:
        """Our commit ``version`` landed: read the commits that came in between, if any."""
        if not self.enabled or version is None:
            return
        if self.seen is not None and version > self.seen + 1:
            self._read(session, version - 1)
        if self.seen is not None and version == self.seen + 1:
            self.seen = version

    def rewritten(self, version: int | None) -> None:
        """Every row of the table is now ours (an overwrite)."""
        self.foreign = frozenset()
        if version is not None and self.seen is not None and version == self.seen + 1:
            self.seen = version

    def prune(self, session: SparkSession, at: int | None = None) -> None:
        """Keep the foreign versions that still have rows in the table (as of version ``at``)."""
        if not self.foreign:
            return
        from pyspark.sql import functions as fn

        live = (
            delta_sql.read(session, self.path, at)
            .select(fn.col(ROW_VERSION).alias("v"))
            .where(fn.col("v").isin(sorted(self.foreign)))
            .distinct()
            .collect()
        )
        self.foreign = frozenset(int(r["v"]) for r in live)

    def _read(self, session: SparkSession, upto: int | None) -> None:
        after = -1 if self.seen is None else self.seen
        rows = delta_sql.history(session, self.path, HISTORY_PEEK)
        if not rows or min(r["version"] for r in rows) > after + 1:
            rows = delta_sql.history(session, self.path)
        rows = [r for r in rows if r["version"] > after and (upto is None or r["version"] <= upto)]
        if not rows:
            return
        new = {
            int(r["version"])
            for r in rows
            if r["operation"] not in NO_ROWS and not marked_by(r["userMetadata"], self.subscription)
        }
        self.seen = max(int(r["version"]) for r in rows)
        if new:
            log.info(
                "another writer changed the target table",
                table=self.table,
                versions=sorted(new),
                note="pgsub changes to those rows are reported as *_origin_differs",
            )
            self.foreign = self.foreign | new
            self.prune(session, upto)


def _commit_exists(session: SparkSession, path: str, version: int) -> bool:
    """Whether the table has a commit file for ``version`` (Spark Connect: via the history)."""
    jvm: Any = getattr(session, "_jvm", None)  # absent on Spark Connect
    jsc: Any = getattr(session, "_jsc", None)
    if jvm is not None and jsc is not None:
        log_file = jvm.org.apache.hadoop.fs.Path(f"{path}/_delta_log/{version:020d}.json")
        return bool(log_file.getFileSystem(jsc.hadoopConfiguration()).exists(log_file))
    latest = delta_sql.history(session, path, 1, ("version",))
    return bool(latest) and int(latest[0]["version"]) >= version
