"""What ``/status`` and ``/readyz`` show for a subscription, as the runner keeps it."""

from __future__ import annotations

from dataclasses import dataclass, field

from subscriber.replication.lsn import Lsn


@dataclass
class SubscriptionStatus:
    """What ``/status`` and ``/readyz`` show for a subscription."""

    name: str
    slot: str = ""
    enabled: bool = True
    two_phase: str = "off"  # off | pending | enabled (pg_subscription.subtwophasestate)
    state: str = "starting"  # starting | streaming | error | stopped | disabled
    received_lsn: Lsn | None = None
    flushed_lsn: Lsn | None = None
    latest_end_lsn: Lsn | None = None
    replication_lag_bytes: int | None = None  # the publisher's WAL end minus flushed
    apply_lag_seconds: float | None = None  # now minus the last applied commit (0 when idle)
    last_msg_receipt: float | None = None  # unix time of the last message or keepalive
    last_error: str | None = None
    last_error_at: float | None = None
    last_error_finish_lsn: Lsn | None = None  # what `pgsub skip` takes
    error_count: int = 0  # apply errors (pg_stat_subscription_stats.apply_error_count)
    sync_error_count: int = 0
    conflicts: dict[str, int] = field(default_factory=dict)  # by kind, since the start
    consecutive_failures: int = 0  # attempts that failed in a row, with no progress between
    retry_at: float | None = None  # unix time of the next attempt after a failure
    slot_retained_wal_bytes: int | None = None  # what the slot makes the publisher keep
    slot_wal_status: str | None = None  # reserved | extended | unreserved | lost
    slot_safe_wal_size: int | None = None  # bytes before max_slot_wal_keep_size (None: no limit)
    tables: list[dict[str, object]] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "slot": self.slot,
            "enabled": self.enabled,
            "two_phase": self.two_phase,
            "state": self.state,
            "received_lsn": lsn_text(self.received_lsn),
            "flushed_lsn": lsn_text(self.flushed_lsn),
            "latest_end_lsn": lsn_text(self.latest_end_lsn),
            "replication_lag_bytes": self.replication_lag_bytes,
            "apply_lag_seconds": self.apply_lag_seconds,
            "last_msg_receipt": self.last_msg_receipt,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "last_error_finish_lsn": lsn_text(self.last_error_finish_lsn),
            "error_count": self.error_count,
            "sync_error_count": self.sync_error_count,
            "conflicts": dict(self.conflicts),
            "consecutive_failures": self.consecutive_failures,
            "retry_at": self.retry_at,
            "slot_retained_wal_bytes": self.slot_retained_wal_bytes,
            "slot_wal_status": self.slot_wal_status,
            "slot_safe_wal_size": self.slot_safe_wal_size,
            "tables": self.tables,
        }


def lsn_text(lsn: Lsn | None) -> str | None:
    return None if lsn is None else str(lsn)
