"""Which engine writes a table's batch, and when a table gains deletion vectors by its size.

A keyed batch is merged by delta-rs or pgsub's own writer
(``apply.delta.writer.local_merge``) when pgsub writes the warehouse itself
(``writes_itself``) - an object store, whatever runs Spark (a cluster, a
Spark Connect server); this machine's disk with Spark in this process, or
with a Spark that sees the same folder (``spark.sees_warehouse``; a
cluster's driver is this process, a Spark Connect server is asked once,
``sees_folder``) - and no
other writer's rows must be told apart (origin tracking, shared tables);
anything else goes to Spark. With ``table_features.deletion_vectors: auto``
a table is sized once per process before its first Spark write, and gains
deletion vectors past ``deletion_vectors_above`` (maintenance looks again
every round, for tables that grow while pgsub runs).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from apply.core.features import FeatureMode, TableFeatures
from apply.delta.spark.definition import gain_by_size
from apply.delta.spark.detail import detail
from apply.delta.spark.session import SparkErrors, is_remote, runs_here
from apply.delta.spark.target import TargetTable
from apply.delta.state_store import STATE_DIR
from apply.delta.writer.delta_rs_merge import LOCAL_MERGE_MAX_BYTES
from apply.delta.writer.local_merge import LocalMerges
from apply.delta.writer.local_tables import folder, is_local_folder, reachable

if TYPE_CHECKING:
    from apply.delta.spark.session import SparkSession

log = structlog.get_logger(__name__)


class Placement:
    """Where one subscription's batches are written, table by table."""

    def __init__(
        self,
        warehouse: str,
        features: TableFeatures,
        *,
        other_writers: bool,
        appended_only: Callable[[str], bool],
        sees_warehouse: bool | None = None,
    ) -> None:
        # A warehouse on this machine's file system, or one pgsub reaches (an object store):
        # delta-rs and pgsub's own writer may write it directly.
        self.warehouse = warehouse
        self.on_local_disk = is_local_folder(warehouse)
        self.reachable = reachable(warehouse)
        self.features = features
        # Origin tracking or tables shared with another subscription: Spark's MERGE only.
        self._other_writers = other_writers
        self._appended_only = appended_only  # change logs: nothing a vector would delete
        self._spark_here: bool | None = None  # asked once
        # Whether a Spark elsewhere sees this machine's warehouse folder: None, asked once.
        self._sees: bool | None = sees_warehouse
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

    def spark_here(self, session: SparkSession) -> bool:
        """Whether Spark runs in this process (local mode), not on a cluster."""
        if self._spark_here is None:
            self._spark_here = runs_here(session)
        return self._spark_here

    def writes_itself(self, session: SparkSession) -> bool:
        """Whether pgsub writes the warehouse itself (delta-rs, its own writer: copies, small
        tables' batches) where Spark would see what it wrote: an object store always (the
        daemon reaches it, as the cluster does); this machine's disk when Spark runs here
        too, or sees the same folder (``spark.sees_warehouse``)."""
        if not self.reachable:
            return False
        if not self.on_local_disk or self.spark_here(session):
            return True
        if self._sees is None:
            with self._lock:
                if self._sees is None:
                    self._sees = sees_folder(session, self.warehouse)
                    if self._sees:
                        log.info(
                            "spark sees the warehouse folder: pgsub copies and merges small "
                            "tables itself",
                            warehouse=self.warehouse,
                        )
        return self._sees

    def merges_locally(self, target: TargetTable) -> bool:
        """Whether a keyed batch may be merged by delta-rs (``apply.delta.writer.local_merge``):
        where pgsub writes the warehouse itself and no other writer's rows must be told
        apart."""
        return not self._other_writers and self.writes_itself(target.session)

    def check_size(
        self, target: TargetTable, known: tuple[int, int, dict[str, str]] | None = None
    ) -> bool:
        """Before a table's first Spark write in this process: deletion vectors on if it has
        grown past ``deletion_vectors_above`` (``auto``); whether they were turned on.
        ``known``: the table's ``detail`` as its writer just read it (a copy), not asked
        again."""
        if self.features.deletion_vectors is not FeatureMode.AUTO:
            return False
        if self._appended_only(target.table):
            return False
        with self._lock:
            if target.table in self._sized:
                return False
            self._sized.add(target.table)
        _, size, properties = known if known is not None else detail(target.session, target.path)
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


def sees_folder(session: SparkSession, warehouse: str) -> bool:
    """Whether ``session``'s Spark sees the local folder ``warehouse`` as this process does.

    A cluster's driver is this process: it does, and its executors must, as
    Spark's own writes there need (docs/scale-out.md). A Spark Connect
    server is asked: a file of a fresh name written under ``_pgsub/``, listed
    by the server (no job). No - an error, another listing - keeps every
    write of the warehouse on Spark, as it must be where the server's disk is
    not this machine's."""
    if not is_remote(session):
        return True
    probe = Path(folder(warehouse)) / STATE_DIR / "seen-by-spark" / f"{uuid.uuid4().hex}.txt"
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text("pgsub: is this folder the Spark Connect server's too?\n")
    try:
        listed = session.read.text(probe.as_uri()).inputFiles()
        seen = [Path(name).name for name in listed] == [probe.name]
        reason = None if seen else f"the server listed {listed}"
    except SparkErrors as exc:
        seen, reason = False, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    finally:
        probe.unlink(missing_ok=True)
    if not seen:
        log.warning(
            "spark does not see the warehouse folder as pgsub does: every write goes to Spark",
            warehouse=warehouse,
            reason=reason,
            detail="the Spark Connect server must see the warehouse folder, or it must be an "
            "object store (docs/scale-out.md); spark.sees_warehouse: true or false answers "
            "without this check",
        )
    return seen
