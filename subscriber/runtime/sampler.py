"""What a running subscription shows: its positions, lag, tables and errors.

``StatusSampler`` copies them into the subscription's ``/status`` record
(``subscription_status.SubscriptionStatus``) and its metrics, every half
second while an attempt runs, and each table's sync state while the first
start's load runs. It reads the live objects (the receiver's and the apply
worker's positions, the coordinator's table states, the conflict counts)
and is handed the rest: each table's data files, as maintenance found them
(``table_files``), its Delta version, as the apply worker committed it, and
the bytes its batches wrote beside the bytes of the rows they changed.
"""

from __future__ import annotations

import time

from apply.core.records import TableWrites
from apply.worker.worker import ApplyWorker
from conflicts.reporter import ConflictReporter
from subscriber.metrics import Metrics
from subscriber.replication.progress import Progress
from subscriber.replication.receiver import Receiver
from subscriber.replication.wire import PG_EPOCH_OFFSET
from subscriber.runtime.settings import SubscriptionSettings
from subscriber.runtime.slots import Heartbeat, SlotWatch
from subscriber.runtime.subscription_status import SubscriptionStatus
from tablesync.coordinator import SyncCoordinator


class StatusSampler:
    """One subscription's ``/status`` record and metrics, brought up to date on request."""

    def __init__(
        self,
        status: SubscriptionStatus,
        metrics: Metrics,
        *,
        settings: SubscriptionSettings,
        coordinator: SyncCoordinator,
        reporter: ConflictReporter,
        watches: tuple[SlotWatch, Heartbeat],
        writes: TableWrites | None = None,
    ) -> None:
        self.name = status.name
        self.status = status
        self._metrics = metrics
        self._settings = settings
        self._coordinator = coordinator
        self._reporter = reporter
        self._slot_watch, self._heartbeat = watches
        self.versions: dict[str, int] = {}  # each table's last Delta version, across attempts
        self.table_files: dict[str, int] = {}  # each table's data files, as maintenance found
        self._writes = writes or TableWrites()  # what each table's batches wrote

    def sample(self, receiver: Receiver, progress: Progress, worker: ApplyWorker) -> None:
        """Copy positions into the status and the metrics (once every half second)."""
        name, metrics, status = self.name, self._metrics, self.status
        status.state = "streaming" if receiver.streaming.is_set() else status.state
        status.enabled = self._settings.enabled
        metrics.streaming.labels(name).set(1 if receiver.streaming.is_set() else 0)
        status.received_lsn = progress.received
        status.flushed_lsn = progress.flushed
        metrics.received_lsn.labels(name).set(int(progress.received))
        metrics.flushed_lsn.labels(name).set(int(progress.flushed))
        wal_end = receiver.wal_end
        if wal_end is not None:
            status.latest_end_lsn = wal_end
            status.replication_lag_bytes = max(0, int(wal_end) - int(progress.flushed))
            metrics.latest_end_lsn.labels(name).set(int(wal_end))
            metrics.replication_lag_bytes.labels(name).set(status.replication_lag_bytes)
        if receiver.last_receipt is not None:
            status.last_msg_receipt = receiver.last_receipt
            metrics.last_msg_receipt.labels(name).set(receiver.last_receipt)
        if progress.idle:
            metrics.apply_lag.labels(name).set(0)
            status.apply_lag_seconds = 0.0
        elif worker.last_commit_time is not None:
            committed = worker.last_commit_time / 1e6 + PG_EPOCH_OFFSET
            status.apply_lag_seconds = round(max(0.0, time.time() - committed), 3)
        self._slot_watch.sample()
        self._heartbeat.beat()
        status.sync_error_count = self._coordinator.sync_errors
        status.conflicts = dict(self._reporter.counts)
        self.versions.update(worker.versions)
        self.describe_tables()

    def describe_tables(self) -> None:
        """Each table's sync state and copy progress, its Delta version and data files."""
        tables = self._coordinator.describe()
        writes = self._writes.totals()
        for table in tables:
            name = str(table["table"])
            table["delta_version"] = self.versions.get(name)
            table["files"] = self.table_files.get(name)
            written, changed = writes.get(name, (0, 0))
            table["bytes_written"] = written  # since the daemon started
            table["bytes_changed"] = changed
        self.status.tables = tables
