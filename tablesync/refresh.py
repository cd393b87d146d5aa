"""REFRESH PUBLICATION: which tables a subscription gains and loses, and storing it. Pure but
for the store it is handed (``TableStates``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from apply.core.records import StoredTableState
from tablesync.publication import PublishedTable
from tablesync.state import TableState

if TYPE_CHECKING:
    from tablesync.settings import SyncSettings, TableStates


@dataclass(frozen=True, slots=True)
class Refresh:
    """What REFRESH PUBLICATION changes: tables to add and tables to stop applying."""

    added: tuple[PublishedTable, ...]
    removed: tuple[StoredTableState, ...]


def plan_refresh(stored: dict[int, StoredTableState], published: list[PublishedTable]) -> Refresh:
    now = {t.relid for t in published}
    return Refresh(
        tuple(t for t in published if t.relid not in stored),
        tuple(s for relid, s in stored.items() if relid not in now),
    )


def record_refresh(store: TableStates, settings: SyncSettings, refresh: Refresh) -> None:
    """Store a refresh: new tables INIT (READY without copy_data), removed ones gone."""
    state = TableState.INIT if settings.copy_data else TableState.READY
    rows = [StoredTableState(t.relid, t.schema, t.name, state.value, None) for t in refresh.added]
    rows += [StoredTableState(s.relid, s.schema, s.name, "", None) for s in refresh.removed]
    if rows:
        store.record(settings.subscription, rows)
