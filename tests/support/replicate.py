"""Running a real subscription in the test process: publisher -> pgsub -> Delta.

``Replication`` runs a ``SubscriptionRunner`` (the daemon's own code, with
its receiver and apply threads) against a test publisher and a temporary
warehouse, and waits until everything the publisher committed so far is
applied: the runner is idle and has received past the publisher's WAL
position.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from apply.delta.state_store import CheckpointStore
from subscriber.metrics import Metrics
from subscriber.replication.lsn import Lsn
from subscriber.replication.names import table_folder
from subscriber.runtime.config import SubscriptionConfig
from subscriber.runtime.subscription import SubscriptionRunner
from tests.support.oracle import DELTA_RS, SPARK, assert_delta_equals_publisher
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase


class Replication:
    def __init__(
        self,
        publisher: PgDatabase,
        spark: Any,
        warehouse: Path,
        *,
        name: str = "sub1",
        publications: tuple[str, ...] = ("pub",),
        **settings: Any,
    ) -> None:
        self.publisher = publisher
        self.spark = spark
        self.warehouse = warehouse
        self.metrics = Metrics()
        defaults: dict[str, Any] = {
            "copy_data": False,
            "status_interval": 1,
            "wal_retrieve_retry_interval": 0.5,
            # Beside the test's warehouse, one spool per warehouse as the daemon's default
            # is; not that default's /tmp/pgsub-<uid>, where each run left a folder.
            "spool_dir": Path(f"{warehouse}.spool-{name}"),
        }
        self.config = SubscriptionConfig(
            name=name,
            connection=publisher.dsn,
            publications=list(publications),
            **{**defaults, **settings},
        )
        self.checkpoints = CheckpointStore(spark, str(warehouse))
        self.runner: SubscriptionRunner | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Replication:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, *, wait: bool = True) -> Replication:
        """Run the subscription; with ``wait``, until it streams."""
        self._stopping = threading.Event()
        self.runner = SubscriptionRunner(
            self.config, self.spark, str(self.warehouse), self.checkpoints, self.metrics
        )
        self._thread = threading.Thread(target=self.runner.run, args=(self._stopping,), daemon=True)
        self._thread.start()
        runner = self.runner
        if not wait:
            return self
        try:
            wait_until(lambda: runner.ready, timeout=120, what="the subscription to stream")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
            assert not self._thread.is_alive(), "the subscription did not stop"

    def all_ready(self) -> bool:
        """Whether every table of the subscription is READY."""
        from tablesync.state import TableState

        assert self.runner is not None
        statuses = self.runner.coordinator.statuses
        return bool(statuses) and all(s.state is TableState.READY for s in statuses)

    def caught_up(self, timeout: float = 120) -> None:
        """Wait until every transaction committed on the publisher so far is applied."""
        # From the insert position: with synchronous_commit off the write position lags commits.
        target = self.publisher.wal_end()

        def done() -> bool:
            runner = self.runner
            assert runner is not None
            progress = runner.progress
            if runner.status.state == "error" and runner.status.error_count > 20:
                raise AssertionError(f"subscription keeps failing: {runner.status.last_error}")
            return progress is not None and progress.done_through >= target

        wait_until(
            done, timeout=timeout, interval=0.2, what=f"the subscriber to apply up to {target}"
        )

    def failed_at(self, timeout: float = 120) -> Lsn:
        """Wait for an apply error naming its transaction; that transaction's finish LSN."""
        import re

        runner = self.runner
        assert runner is not None

        def logged() -> re.Match[str] | None:
            return re.search(r"finished at ([0-9A-F]+/[0-9A-F]+)", runner.status.last_error or "")

        wait_until(logged, timeout=timeout, what="an apply error naming its transaction")
        found = logged()
        assert found is not None
        return Lsn.parse(found.group(1))

    def skip(self, lsn: Lsn) -> None:
        """``pgsub skip`` for this subscription."""
        from subscriber.runtime import admin
        from subscriber.runtime.config import Config

        config = Config(warehouse=str(self.warehouse), subscriptions=[self.config])
        admin.skip(config, self.config, lsn)

    def path(self, table: str) -> str:
        return str(self.warehouse / table_folder(table))

    def assert_equal(
        self, *tables: str, key: tuple[str, ...] = (), readers: Sequence[str] = (SPARK, DELTA_RS)
    ) -> None:
        """Each table equals the publisher's, read by Spark and by delta-rs (by default)."""
        with self.publisher.connect() as conn:
            for table in tables:
                assert_delta_equals_publisher(
                    conn, table, self.spark, self.path(table), key, readers
                )

    def rows(self, table: str) -> list[dict[str, Any]]:
        return [
            r.asDict() for r in self.spark.read.format("delta").load(self.path(table)).collect()
        ]
