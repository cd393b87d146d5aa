"""A batch's table writes while they run: what each took of the next batch, and how far
the flush is confirmed before the last one ends (docs/apply.md, "A table's write takes
what has arrived for it").

``BatchApplier`` (``apply.worker.applier``) starts one ``TableWrite`` a table on its pool;
while they run, ``meanwhile`` lets the next batch form and ``Settling.settle`` confirm
what is durable in every table: the writes that ended are made durable and read back,
and the position moves up to the transaction before the first change not yet in its
table. ``verify`` then reads no commit ``settle`` read.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

from apply.batching.forming import Forming, Taken
from apply.columns.schema import TargetSchema
from apply.core.batch import Batch
from apply.core.records import CommitMark, WriteResult
from apply.plans.tables import Tables
from subscriber.replication.lsn import Lsn

# Called every ``FORM_EVERY`` seconds while a batch's tables are written: it takes what has
# arrived for the next batch. False: it takes no more now.
WhileWriting = Callable[[], bool]
FORM_EVERY = 0.05


@dataclass(frozen=True, slots=True)
class Ahead:
    """A batch whose writes run ahead: each table's write, as it starts, takes the table's
    changes that have arrived for the next batch (``Forming.take_table``), and ``confirm``
    is told, as the writes end, the end LSN through which every transaction is durable in
    every table it changes - before the batch's last table is written. ``takes`` False:
    the writes take nothing (the batch a checkpoint row records), and what they make
    durable is still confirmed as they end."""

    confirm: Callable[[Lsn], None]
    takes: bool = True


@dataclass(frozen=True, slots=True)
class TakenAhead:
    """What a write took of the next batch (``BatchApplier._taking``)."""

    taken: Taken
    mark: CommitMark  # the commit's: the forming batch's last transaction
    batch: Batch  # the batch's transactions, then those the take saw: what errors name


@dataclass(frozen=True, slots=True)
class TableWrite:
    """One table's write of a batch, running on the pool."""

    name: str
    schema: TargetSchema
    mark: CommitMark
    changes: int
    future: Future[tuple[WriteResult, float]]
    first: int = 0  # the index of the first transaction with a change of the table
    taken: list[TakenAhead] = field(default_factory=list)  # set by the write once it took

    @property
    def committed_mark(self) -> CommitMark:
        """What the commit carries: the take's mark if it took, else the batch's."""
        return self.taken[0].mark if self.taken else self.mark


class Settling:
    """The writes of the batch being written that ended durable, and their commits read
    back (``verify`` reads no commit twice)."""

    def __init__(
        self, tables: Tables, forming: Forming, report: Callable[[TableWrite, Batch], None]
    ) -> None:
        """``report``: a settled write's conflicts reported (the log, the counter, the
        conflict table) before its transactions are confirmed."""
        self._tables = tables
        self._forming = forming
        self._report = report
        self._settled: set[str] = set()
        self._verified: set[tuple[str, int]] = set()

    def begin(self) -> None:
        """A new batch: nothing of it settled yet."""
        self._settled.clear()
        self._verified.clear()

    def reported(self, name: str) -> bool:
        """Whether the write of table ``name`` in this batch settled, its conflicts reported."""
        return name in self._settled

    def verified(self) -> set[tuple[str, int]]:
        """The (table, version) commits read back while the batch was written; forgotten."""
        verified, self._verified = self._verified, set()
        return verified

    def settle(self, batch: Batch, writes: list[TableWrite], ahead: Ahead) -> None:
        """The writes that ended made durable (their folders fsynced, each commit read back
        as ``verify`` does) and their conflicts reported, then ``ahead.confirm`` told how
        far every transaction of this batch and of the forming one is: up to the first with
        a change not yet durable in its table."""
        settled = self._settled
        ended = [w for w in writes if w.name not in settled and w.future.done()]
        ended = [w for w in ended if w.future.exception() is None]
        if ended:
            self._tables.names_durable()
            for write in ended:
                version = write.future.result()[0].version
                if version is not None:
                    if not self._tables.holds_commit(write.name, version, write.committed_mark):
                        return  # replaced by another engine: ``verify`` fails the batch
                    self._verified.add((write.name, version))
                settled.add(write.name)
                self._report(write, batch)  # as PostgreSQL reports: before the flush moves
        txs = batch.transactions
        first = min((w.first for w in writes if w.name not in settled), default=None)
        forming_first, forming = self._forming.pending()
        if first is None and forming_first is not None:
            first = len(txs) + forming_first
        if first == 0:
            return
        if first is None:
            last = forming[-1] if forming else txs[-1]
        else:
            last = txs[first - 1] if first <= len(txs) else forming[first - 1 - len(txs)]
        ahead.confirm(last.end_lsn)


def meanwhile(
    writes: list[Future[tuple[WriteResult, float]]],
    call: WhileWriting,
    settle: Callable[[], None] | None = None,
) -> None:
    """Call ``call`` every ``FORM_EVERY`` seconds until ``writes`` are done or it takes no
    more, and ``settle`` until they are done. What arrived is taken in bursts, not woken
    for one transaction at a time: the receiver, which shares Python's lock, is
    interrupted as little as it was before."""
    pending = set(writes)
    taking = True
    while True:
        pending = wait(pending, timeout=FORM_EVERY)[1]
        if settle is not None:
            settle()
        if not pending:
            return
        taking = taking and call()
        if not taking and settle is None:
            return
