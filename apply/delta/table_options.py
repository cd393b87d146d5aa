"""What one subscription's tables are made and written with: its table keys, as one value,
and the durable record of the tables it created (``subscriber.runtime.settings``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from apply.core.features import PORTABLE, TableFeatures
from apply.core.maintenance_policy import DEFAULT_POLICY, MaintenancePolicy
from apply.history.changelog import MIRRORS, History

if TYPE_CHECKING:
    from apply.delta.writer.merge_processes import WriterProcesses


class CreatedTables(Protocol):
    """Which target tables a subscription created (``subscriber.runtime.settings``), durably."""

    def was_created(self, table: str) -> bool: ...

    def record_created(self, *tables: str) -> None: ...


class Forgetful:
    """No record of created tables (benchmarks, tools): every missing table is created."""

    def was_created(self, table: str) -> bool:
        return False

    def record_created(self, *tables: str) -> None:
        return None


@dataclass(frozen=True, slots=True)
class TableOptions:
    """How one subscription makes and writes its tables (its config's table keys)."""

    create_tables: bool = True
    track_origin: bool = False  # new tables get row tracking (*_origin_differs)
    features: TableFeatures = PORTABLE
    shared_tables: bool = False  # may write tables another subscription writes
    maintenance: MaintenancePolicy = DEFAULT_POLICY
    messages_path: str | None = None  # messages: true; None: under _pgsub/
    history: History = (
        MIRRORS  # how each table is kept (apply.history.changelog, apply.history.stamps)
    )
    # Whether a Spark elsewhere sees a warehouse folder as the daemon does (spark.sees_warehouse);
    # None: asked once (apply.delta.placement.sees_folder).
    spark_sees_warehouse: bool | None = None
    # Keyed batches of a local warehouse's tables merged in this many processes of their own
    # (apply.delta.writer.merge_processes); 0: by the apply process's writer threads; auto:
    # chosen by the subscription's tables as it starts (DeltaTables.start_writers).
    writer_processes: WriterProcesses = 0
    writer_setup: Callable[[], None] | None = None  # what such a process runs first (its logs)


DEFAULT_OPTIONS: Final = TableOptions()
