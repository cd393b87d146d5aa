"""What the apply loop leaves to the kind of worker running it: one hook object per kind.

The leader and a table-sync worker's catch-up run the same loop
(``apply.worker.worker.ApplyWorker``): batches, MERGEs, the flush confirmation.
Where they differ, the loop calls its hooks, never asks which kind it is:

- ``LeaderHooks``: honours ``pgsub skip``, records checkpoint rows
  (``Checkpoints``, at most every ``checkpoint_interval``), moves the
  table states on after each batch and when idle (the coordinator's
  ``process_syncing_tables_for_apply``), stages prepared transactions,
  and reports the subscription's metrics;
- ``CatchUpHooks``: none of that. A catch-up's progress is its table's own
  commits; the leader reports for the subscription.

As supabase/etl gives each worker kind one hook object behind one trait.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import structlog

from apply.core.errors import ApplyError
from apply.core.records import TableWrites
from apply.core.roles import Leader, PreparedLeftovers, PreparedTransactions
from subscriber.replication.lsn import Lsn
from subscriber.replication.wire import PG_EPOCH_OFFSET

if TYPE_CHECKING:
    from apply.core.batch import Batch
    from apply.core.records import BatchResult
    from subscriber.metrics import Metrics

log = structlog.get_logger(__name__)


class WorkerHooks(Protocol):
    """The apply loop's calls into its kind of worker."""

    @property
    def skip_lsn(self) -> Lsn | None:
        """``pgsub skip``: the finish LSN of the transaction to apply as empty."""
        ...

    def refresh_skip(self) -> None: ...

    def clear_skip(self) -> None:
        """The skipped transaction's checkpoint is recorded: the setting is done with."""
        ...

    def idle(self, position: Lsn) -> None:
        """Nothing to apply; ``position`` is everything this worker has received."""
        ...

    def applied(
        self,
        lsn: Lsn,
        commit_time: int,
        versions: dict[str, int],
        *,
        now: bool,
        ahead: bool = False,
    ) -> None:
        """Tables committed up to ``lsn`` (their new ``versions``): a checkpoint row is due
        at most every ``checkpoint_interval``, or ``now``; never while a version holds
        transactions past ``lsn`` (``ahead``: the next row comes after a batch that took
        nothing ahead)."""
        ...

    @property
    def runs_ahead(self) -> bool:
        """Whether a batch's writes may take what arrives for their tables meanwhile
        (``apply.worker.writes_ahead.Ahead``)."""
        ...

    @property
    def row_due(self) -> bool:
        """Whether the checkpoint row is due: the next batch then takes nothing ahead."""
        ...

    def record_checkpoint(self) -> None:
        """A checkpoint row of everything applied since the last one, if anything."""
        ...

    def counted(self, operations: Counter[str]) -> None:
        """Changes applied, by operation."""
        ...

    def finished(
        self, batch: Batch, result: BatchResult, seconds: float, changes: int, confirmed: Lsn
    ) -> None:
        """``batch`` is confirmed upstream, and everything through ``confirmed`` (past the
        batch's end when transactions formed while it was written were confirmed as their
        writes ended)."""
        ...

    def prepared(self) -> PreparedTransactions:
        """Where prepared transactions wait for their finish; an error when two-phase is off."""
        ...

    @property
    def isolate_through(self) -> Lsn | None:
        """After a failure: batches up to here hold at most ``isolate_size`` transactions."""
        ...

    @property
    def isolate_size(self) -> int: ...

    @property
    def leftovers(self) -> PreparedLeftovers | None: ...


def _two_phase_off() -> ApplyError:
    return ApplyError(
        "a prepared transaction arrived but two-phase is off for this worker; "
        "restart the subscription"
    )


class LeaderHooks:
    """The leader's part (see the module)."""

    def __init__(
        self,
        subscription: str,
        leader: Leader,
        metrics: Metrics,
        *,
        wall_clock: Callable[[], float] = time.time,
        writes: TableWrites | None = None,
    ) -> None:
        self.subscription = subscription
        self._leader = leader
        self._metrics = metrics
        self._wall_clock = wall_clock
        self._writes = writes or TableWrites()  # each table's bytes written, for /status
        # Table versions applied since the last checkpoint row, and its LSN and commit time.
        self._unrecorded: dict[str, int] = {}
        self._unrecorded_at: tuple[Lsn, int] | None = None
        self._ahead = False  # the last batch took changes past its LSN
        self._recorded_at = -float("inf")

    @property
    def skip_lsn(self) -> Lsn | None:
        return self._leader.skip.skip_lsn

    def refresh_skip(self) -> None:
        self._leader.skip.refresh()

    def clear_skip(self) -> None:
        self._leader.skip.clear_skip()  # tidying: the checkpoint already made it so

    def idle(self, position: Lsn) -> None:
        self._leader.sync_tables(position, position)
        if self._checkpoint_due():
            self.record_checkpoint()

    def applied(
        self,
        lsn: Lsn,
        commit_time: int,
        versions: dict[str, int],
        *,
        now: bool,
        ahead: bool = False,
    ) -> None:
        self._unrecorded.update(versions)
        self._unrecorded_at = (lsn, commit_time)
        self._ahead = ahead
        if now or self._checkpoint_due():
            self.record_checkpoint()

    runs_ahead = True

    @property
    def row_due(self) -> bool:
        return self._checkpoint_due()

    def _checkpoint_due(self) -> bool:
        return time.monotonic() - self._recorded_at >= self._leader.checkpoint_interval

    def record_checkpoint(self) -> None:
        """Not every batch: each table's own commits already carry its LSN (that is what
        makes a restart exactly-once), so the row serves readers who want one LSN for every
        table, and it is one more Delta commit and file. Not after a batch that ran ahead: a
        table's version then holds transactions past the row's LSN, and time travel to the
        row's versions would not be one consistent point (the next batch takes nothing
        ahead, and its row is)."""
        if self._unrecorded_at is None or self._ahead:
            return
        lsn, commit_time = self._unrecorded_at
        self._leader.checkpoints.record(self.subscription, lsn, commit_time, self._unrecorded)
        self._unrecorded = {}
        self._unrecorded_at = None
        self._recorded_at = time.monotonic()

    def counted(self, operations: Counter[str]) -> None:
        for op, count in operations.items():
            self._metrics.changes_applied.labels(self.subscription, op).inc(count)

    def finished(
        self, batch: Batch, result: BatchResult, seconds: float, changes: int, confirmed: Lsn
    ) -> None:
        name = self.subscription
        metrics = self._metrics
        metrics.transactions_applied.labels(name).inc(len(batch.transactions))
        metrics.batch_duration.labels(name).observe(seconds)
        metrics.flushed_lsn.labels(name).set(int(batch.end_lsn))
        commit_unix = batch.commit_time / 1e6 + PG_EPOCH_OFFSET
        metrics.apply_lag.labels(name).set(max(0.0, self._wall_clock() - commit_unix))
        tables = result.tables
        for table in tables:
            metrics.merge_duration.labels(name, table.table).observe(table.seconds)
            written, changed = table.write.written_bytes, table.write.changed_bytes
            metrics.table_bytes_written.labels(name, table.table).inc(written)
            metrics.table_change_bytes.labels(name, table.table).inc(changed)
            self._writes.add(table.table, written, changed)
        if tables:
            log.info(
                "batch applied",
                subscription=name,
                transactions=len(batch.transactions),
                changes=changes,
                tables=len(tables),
                seconds=round(seconds, 3),
                end_lsn=str(batch.end_lsn),
                formed_ahead=result.formed,
                taken_ahead=result.ahead,
            )
        # A sync worker's catch-up reaches at least ``confirmed``: the leader skipped its
        # table's changes in every transaction confirmed, and none is sent again.
        self._leader.sync_tables(batch.end_lsn, confirmed)

    def prepared(self) -> PreparedTransactions:
        if self._leader.prepared is None:
            raise _two_phase_off()
        return self._leader.prepared

    @property
    def isolate_through(self) -> Lsn | None:
        return self._leader.isolate_through

    @property
    def isolate_size(self) -> int:
        return self._leader.isolate_size

    @property
    def leftovers(self) -> PreparedLeftovers | None:
        return self._leader.prepared_leftovers


class CatchUpHooks:
    """A table-sync worker's catch-up: its progress is its table's own commits."""

    skip_lsn = None
    isolate_through = None
    isolate_size = 1
    leftovers = None

    def refresh_skip(self) -> None:
        pass

    def clear_skip(self) -> None:
        pass

    def idle(self, position: Lsn) -> None:
        pass

    def applied(
        self,
        lsn: Lsn,
        commit_time: int,
        versions: dict[str, int],
        *,
        now: bool,
        ahead: bool = False,
    ) -> None:
        pass

    runs_ahead = False  # one table: nothing to take ahead of
    row_due = False

    def record_checkpoint(self) -> None:
        pass

    def counted(self, operations: Counter[str]) -> None:
        pass

    def finished(
        self, batch: Batch, result: BatchResult, seconds: float, changes: int, confirmed: Lsn
    ) -> None:
        pass

    def prepared(self) -> PreparedTransactions:
        raise _two_phase_off()
