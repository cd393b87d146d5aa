"""Who runs an apply pipeline, as values: the leader, or a table-sync worker's catch-up.

Pure. Both run the same pipeline (``apply.worker.pipeline``) - receiver, batches,
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

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from apply.core.batch import ShouldApply
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


class PreparedTransactions(Protocol):
    """Where PREPAREd transactions wait for their COMMIT/ROLLBACK PREPARED, durably
    (``apply.delta.state_store.PreparedStore``)."""

    def stage(
        self, subscription: str, gid: str, xid: int, end_lsn: Lsn, frames: Iterable[bytes]
    ) -> int: ...

    def frames(self, subscription: str, gid: str) -> Iterator[bytes] | None: ...

    def forget(self, subscription: str, gid: str | None = None, xid: int | None = None) -> None: ...


@dataclass(frozen=True, slots=True)
class PreparedLeftovers:
    """Stagings whose transaction the publisher no longer held prepared when its WAL ended at
    ``seen_at`` (``catalog.wal_end``). Their COMMIT/ROLLBACK PREPARED lies before ``seen_at``:
    once the flush passes it, one still staged was left by a crash between applying its finish
    and forgetting it, and is forgotten."""

    stagings: tuple[tuple[str, int], ...]  # (gid, xid)
    seen_at: Lsn


@dataclass(frozen=True, slots=True)
class Leader:
    """The subscription's leader apply worker."""

    slot: str
    checkpoints: Checkpoints
    should_apply: ShouldApply
    # What ``should_apply`` answers from (the table states), compared between a batch's forming
    # and its turn (``apply.batching.forming``).
    table_states: Callable[[], object]
    # Called after each batch and when idle, with the leader's position and how far it has
    # confirmed upstream (past the batch's end when transactions formed while it was written
    # were confirmed as their writes ended): the table-sync coordinator's
    # process_syncing_tables_for_apply.
    sync_tables: Callable[[Lsn, Lsn], None]
    skip: SkipSetting
    # After a failed batch: up to here, batches of at most ``isolate_size`` transactions -
    # half the failed batch's, so that repeated failures home in on the one transaction the
    # error then names, while a passing failure (the JVM short of memory) costs one retry.
    isolate_through: Lsn | None = None
    isolate_size: int = 1
    # Seconds between checkpoint rows (one per batch at most; ApplyWorker.record_checkpoint).
    checkpoint_interval: float = 0.0
    # two_phase: where prepared transactions are staged (None: two-phase is off).
    prepared: PreparedTransactions | None = None
    prepared_leftovers: PreparedLeftovers | None = None


@dataclass(frozen=True, slots=True)
class CatchUp:
    """A table-sync worker's catch-up on its own slot, for one table."""

    relid: int
    slot: str


Role = Leader | CatchUp
