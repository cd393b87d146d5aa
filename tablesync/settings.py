"""What table synchronization takes from the subscription: its settings, and the store
of table states (the seam ``apply.delta.state_store.TableStateStore`` fills)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from apply.core.records import StoredTableState


@dataclass(frozen=True, slots=True)
class SyncSettings:
    """What table synchronization takes from the subscription's config."""

    subscription: str
    copy_data: bool = True
    max_sync_workers: int = 2
    retry_interval: float = 5.0  # wal_retrieve_retry_interval
    max_retry_interval: float = 300.0  # the longest wait after consecutive failures


class TableStates(Protocol):
    """The stored table states (``apply.delta.state_store.TableStateStore``)."""

    def load(self, subscription: str) -> dict[int, StoredTableState]: ...

    def record(self, subscription: str, states: list[StoredTableState]) -> datetime:
        """Appends ``states``; returns the time they are recorded at."""
        ...
