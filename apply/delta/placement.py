"""Which engine writes a table's batch, and when a table gains deletion vectors by its size.

A keyed batch is merged by delta-rs or pgsub's own writer
(``apply.delta.writer.local_merge``) when pgsub reaches the warehouse itself - an
object store, whatever runs Spark (a cluster, a Spark Connect server), or
this machine's disk with Spark in this process - and no other writer's rows
must be told apart (origin tracking, shared tables); anything else goes to
Spark. With ``table_features.deletion_vectors: auto``
a table is sized once per process before its first Spark write, and gains
deletion vectors past ``deletion_vectors_above`` (maintenance looks again
every round, for tables that grow while pgsub runs).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from apply.core.features import FeatureMode, TableFeatures
from apply.delta.spark.definition import gain_by_size
from apply.delta.spark.detail import detail
from apply.delta.spark.session import runs_here
from apply.delta.spark.target import TargetTable
from apply.delta.writer.delta_rs_merge import LOCAL_MERGE_MAX_BYTES
from apply.delta.writer.local_merge import LocalMerges
from apply.delta.writer.local_tables import is_local_folder, reachable


class Placement:
    """Where one subscription's batches are written, table by table."""

    def __init__(
        self,
        warehouse: str,
        features: TableFeatures,
        *,
        other_writers: bool,
        appended_only: Callable[[str], bool],
    ) -> None:
        # A warehouse on this machine's file system, or one pgsub reaches (an object store):
        # delta-rs and pgsub's own writer may write it directly.
        self.on_local_disk = is_local_folder(warehouse)
        self.reachable = reachable(warehouse)
        self.features = features
        # Origin tracking or tables shared with another subscription: Spark's MERGE only.
        self._other_writers = other_writers
        self._appended_only = appended_only  # change logs: nothing a vector would delete
        self._spark_here: bool | None = None  # asked once
        self._sized: set[str] = set()  # tables whose size this process has looked at
        self._lock = threading.Lock()
        # Small keyed tables' batches, by delta-rs; a table that may gain deletion vectors
        # goes to Spark (which looks at its size) once it is large enough for them.
        self.local_merges = LocalMerges(
            min(LOCAL_MERGE_MAX_BYTES, features.deletion_vectors_above)
            if features.deletion_vectors is FeatureMode.AUTO
            else LOCAL_MERGE_MAX_BYTES,
            features=features,
        )

    def spark_here(self, target: TargetTable) -> bool:
        """Whether Spark runs in this process (local mode), not on a cluster."""
        if self._spark_here is None:
            self._spark_here = runs_here(target.session)
        return self._spark_here

    def merges_locally(self, target: TargetTable) -> bool:
        """Whether a keyed batch may be merged by delta-rs (``apply.delta.writer.local_merge``): an
        object store always (the daemon reaches it, as the cluster does), this machine's
        disk when Spark runs here too."""
        if not self.reachable or self._other_writers:
            return False
        return not self.on_local_disk or self.spark_here(target)

    def check_size(self, target: TargetTable) -> bool:
        """Before a table's first Spark write in this process: deletion vectors on if it has
        grown past ``deletion_vectors_above`` (``auto``); whether they were turned on."""
        if self.features.deletion_vectors is not FeatureMode.AUTO:
            return False
        if self._appended_only(target.table):
            return False
        with self._lock:
            if target.table in self._sized:
                return False
            self._sized.add(target.table)
        _, size, properties = detail(target.session, target.path)
        return gain_by_size(
            target.session,
            target.table,
            target.path,
            size=size,
            properties=properties,
            features=self.features,
        )

    def forget(self, table: str, path: str) -> None:
        """A table made anew: opened and sized again at its next write."""
        self.local_merges.forget(path)
        with self._lock:
            self._sized.discard(table)
