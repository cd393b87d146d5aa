"""Who runs an apply pipeline, as values: the leader, or a table-sync worker's catch-up.

Pure. Both run the same pipeline (``apply.pipeline``) - receiver, batches,
MERGE - and differ only in what this module says:

- ``Leader``: streams the subscription's slot; applies the tables the
  table-sync coordinator says it applies; records a checkpoint after each
  batch, honours ``pgsub skip``, lets the coordinator move tables on, and
  reports the subscription's metrics.
- ``CatchUp``: streams one sync slot and applies one table's changes only,
  up to the LSN the leader gave it; its progress is the table's own commits.

The leader's collaborators are seams (``Checkpoints``, ``SkipSetting``), so
that the worker's logic runs in unit tests with stand-ins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from apply.batch import ShouldApply
from subscriber.replication.lsn import Lsn


class Checkpoints(Protocol):
    """Where the leader records each applied batch (``apply.delta.state_store``)."""

    def record(
        self, subscription: str, lsn: Lsn, commit_time: int, versions: dict[str, int]
    ) -> None: ...


class SkipSetting(Protocol):
    """``pgsub skip`` as the leader reads it (``subscriber.runtime.settings``)."""

    @property
    def skip_lsn(self) -> Lsn | None: ...

    def refresh(self, *, force: bool = False) -> None: ...

    def clear_skip(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Leader:
    """The subscription's leader apply worker."""

    slot: str
    checkpoints: Checkpoints
    should_apply: ShouldApply
    # Called after each batch and when idle, with the leader's position: the table-sync
    # coordinator's process_syncing_tables_for_apply.
    sync_tables: Callable[[Lsn], None]
    skip: SkipSetting
    # After a failed batch: apply one transaction at a time up to here, so that the error
    # names exactly one transaction.
    isolate_through: Lsn | None = None
    # Seconds between checkpoint rows (one per batch at most; ApplyWorker.record_checkpoint).
    checkpoint_interval: float = 0.0


@dataclass(frozen=True, slots=True)
class CatchUp:
    """A table-sync worker's catch-up on its own slot, for one table."""

    relid: int
    slot: str


Role = Leader | CatchUp
