"""Prometheus metrics: their names and labels are a contract (dashboards and alerts use them).

One ``Metrics`` per daemon, on its own registry, served at ``/metrics``.
LSNs are exported as numbers (bytes of WAL), so differences are byte lags.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

SUB = ("subscription",)
REL = ("subscription", "relation")
_BATCH_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 300)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # No *_created series beside each counter and histogram: a timestamp per label set,
        # which no dashboard or alert uses.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.received_lsn = Gauge(
            "pgsub_received_lsn", "Last WAL position received", SUB, registry=r
        )
        self.flushed_lsn = Gauge(
            "pgsub_flushed_lsn", "Last WAL position durable in Delta and confirmed", SUB, registry=r
        )
        self.latest_end_lsn = Gauge(
            "pgsub_latest_end_lsn", "Last WAL position reported by the publisher", SUB, registry=r
        )
        self.last_msg_receipt = Gauge(
            "pgsub_last_msg_receipt_timestamp_seconds",
            "Unix time of the last message received from the publisher",
            SUB,
            registry=r,
        )
        self.consecutive_failures = Gauge(
            "pgsub_consecutive_failures",
            "Attempts of the apply worker that failed in a row (0 once it makes progress)",
            SUB,
            registry=r,
        )
        self.apply_lag = Gauge(
            "pgsub_apply_lag_seconds",
            "Now minus the commit time of the last applied transaction (0 when caught up)",
            SUB,
            registry=r,
        )
        self.replication_lag_bytes = Gauge(
            "pgsub_replication_lag_bytes",
            "Publisher WAL end minus the flushed position",
            SUB,
            registry=r,
        )
        self.apply_errors = Counter("pgsub_apply_errors", "Apply worker errors", SUB, registry=r)
        self.sync_errors = Counter("pgsub_sync_errors", "Table-sync worker errors", SUB, registry=r)
        self.conflicts = Counter("pgsub_conflicts", "Conflicts by kind", (*REL, "type"), registry=r)
        self.transactions_applied = Counter(
            "pgsub_transactions_applied", "Remote transactions applied", SUB, registry=r
        )
        self.changes_applied = Counter(
            "pgsub_changes_applied",
            "Remote row changes applied, by operation",
            (*SUB, "op"),
            registry=r,
        )
        self.batch_duration = Histogram(
            "pgsub_batch_duration_seconds",
            "Time to apply a batch to every table",
            SUB,
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.merge_duration = Histogram(
            "pgsub_merge_duration_seconds",
            "Time of one table's Delta commit in a batch",
            REL,
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.table_state = Gauge(
            "pgsub_table_state", "1 for the table's current state", (*REL, "state"), registry=r
        )
        self.tablesync_rows_copied = Counter(
            "pgsub_tablesync_rows_copied", "Rows copied by table-sync workers", REL, registry=r
        )
        self.tablesync_rows_estimated = Gauge(
            "pgsub_tablesync_rows_estimated",
            "Estimated rows of tables being copied (pg_class.reltuples)",
            REL,
            registry=r,
        )
        self.workers = Gauge("pgsub_workers", "Running workers by type", (*SUB, "type"), registry=r)
        self.spill_bytes = Gauge(
            "pgsub_spill_bytes", "Bytes of streamed transactions spooled to disk", SUB, registry=r
        )
        self.subscription_enabled = Gauge(
            "pgsub_subscription_enabled", "1 when the subscription is enabled", SUB, registry=r
        )
        self.streaming = Gauge(
            "pgsub_subscription_streaming",
            "1 while the subscription streams from its slot (what /readyz waits for)",
            SUB,
            registry=r,
        )
        self.maintenance = Counter(
            "pgsub_maintenance",
            "Maintenance operations done on a table (optimize, vacuum, prune)",
            (*REL, "operation"),
            registry=r,
        )
        self.maintenance_errors = Counter(
            "pgsub_maintenance_errors", "Failed maintenance of a table", REL, registry=r
        )
        self.maintenance_duration = Histogram(
            "pgsub_maintenance_duration_seconds",
            "Time of one table's maintenance (with its compaction or vacuum)",
            SUB,
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.slot_retained_wal = Gauge(
            "pgsub_slot_retained_wal_bytes",
            "WAL the publisher keeps for the subscription's slot (its position - restart_lsn)",
            SUB,
            registry=r,
        )
        self.slot_safe_wal_size = Gauge(
            "pgsub_slot_safe_wal_size_bytes",
            "WAL the publisher may still write before max_slot_wal_keep_size invalidates the "
            "slot (absent when there is no limit)",
            SUB,
            registry=r,
        )
        self.slot_wal_status = Gauge(
            "pgsub_slot_wal_status",
            "1 for the slot's wal_status (reserved, extended, unreserved, lost)",
            (*SUB, "status"),
            registry=r,
        )
        self.table_bytes_written = Counter(
            "pgsub_table_bytes_written",
            "Bytes the table's batches wrote: data and deletion vector files, commit files",
            REL,
            registry=r,
        )
        self.table_change_bytes = Counter(
            "pgsub_table_change_bytes",
            "Bytes of the rows the table's batches changed, as the publisher sent them",
            REL,
            registry=r,
        )
        self.table_files = Gauge(
            "pgsub_table_files",
            "Data files in the table's current version (after maintenance, when it ran)",
            REL,
            registry=r,
        )
