"""Batches of complete transactions, in commit order, split by target table.

Pure. ``Batcher`` collects transactions until its bounds - ``max_changes``
row changes or ``max_bytes`` of row data - or until it is due by time:
``max_delay`` after the batch before was taken, or after its own first
transaction arrived if that is earlier (a transaction after a quiet spell
is written at once; a steady stream is written at most once per
``max_delay``); or, sooner, once it holds ``min_changes`` (group commit: a
batch that already carries that many changes is written as soon as the
writer is free). So a commit's fixed cost - its files, its requests in a
bucket - is paid for at least ``min_changes`` changes or at most once per
``max_delay``, and a high rate is not held back. A batch that holds a
table's first write in the run is due at once as well (``hasten``: after a
start, the tables' one-time costs are paid in batches that follow each
other as the writer frees, not after a wait). A transaction is never
split, so one larger than the bounds
makes a batch of its own. While the target lags - a full batch took longer
than ``max_delay`` to apply - the change bound doubles, up to ``GROWTH``
times ``max_changes``, and it returns to ``max_changes`` with the first
batch smaller than the configured bounds: a MERGE's fixed cost (a big table's scan, a
commit) is then paid less often exactly when pgsub falls behind, and the
byte bound, the memory a batch holds, stays. ``Batch.tables``
splits a batch into per-table work, dropping for each table what it has
already applied (its applied LSN, read back from Delta after a crash) and
what the leader does not apply for that table (a table still being
synchronised): docs/architecture.md, "The path of a change".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Final

from apply.core.transactions import (
    Bounds,
    MessageChange,
    RemoteTransaction,
    RowChange,
    TruncateChange,
)
from subscriber.replication.frozen import quick
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.messages import Relation


@quick
@dataclass(frozen=True, slots=True)
class TableChange:
    """A change of one table with the index of its transaction in the batch."""

    tx: int
    change: RowChange | TruncateChange
    position: int = 0  # the change's position in its whole transaction (pieces counted)


@dataclass
class TableWork:
    """What a batch does to one target table, in commit order."""

    relation: Relation  # the table's latest description within the batch
    changes: list[TableChange] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.relation.qualified_name


# (relation, transaction) -> whether the leader applies this change now.
ShouldApply = Callable[[Relation, RemoteTransaction], bool]


def _unchanging() -> None:
    return None


@dataclass(frozen=True, slots=True)
class TableFilter:
    """Which tables' changes a worker applies now: ``should_apply``, and what its answers
    follow (the table states), compared between a batch's forming and its turn
    (``apply.batching.forming``)."""

    should_apply: ShouldApply
    states: Callable[[], object] = _unchanging


# (table, end LSN of a spooled transaction) -> how many of its first changes the table
# has applied already (a piece committed before a crash).
AppliedThrough = Callable[[str, Lsn], int]


@dataclass
class Batch:
    transactions: list[RemoteTransaction]

    @property
    def end_lsn(self) -> Lsn:
        return self.transactions[-1].end_lsn if self.transactions else ZERO

    @property
    def commit_time(self) -> int:
        return self.transactions[-1].commit_time if self.transactions else 0

    @property
    def change_count(self) -> int:
        return sum(len(t.changes) for t in self.transactions)

    def tables(
        self,
        applied_lsn: Callable[[str], Lsn],
        should_apply: ShouldApply | None = None,
        applied_through: AppliedThrough | None = None,
    ) -> dict[str, TableWork]:
        """Per-table work keyed by ``schema.name``.

        A transaction is dropped for a table when its end LSN is at or below
        the table's applied LSN: that table committed it before a crash. Of a
        piece of a spooled transaction, the changes a table committed in an
        earlier piece are dropped the same way (``applied_through``).
        """
        work: dict[str, TableWork] = {}
        applied: dict[str, Lsn] = {}
        through: dict[str, int] = {}

        def add(
            relation: Relation, index: int, ordinal: int, change: RowChange | TruncateChange
        ) -> None:
            name = relation.qualified_name
            tx = self.transactions[index]
            # Asked first: a table that a sync worker writes has no applied LSN of ours yet.
            if should_apply is not None and not should_apply(relation, tx):
                return
            if name not in applied:
                applied[name] = applied_lsn(name)
            if tx.end_lsn <= applied[name]:
                return
            if tx.total is not None and applied_through is not None:
                if name not in through:
                    through[name] = applied_through(name, tx.end_lsn)
                if tx.first + ordinal < through[name]:
                    return
            entry = work.get(name)
            if entry is None:
                entry = work[name] = TableWork(relation)
            entry.relation = relation
            entry.changes.append(TableChange(index, change, tx.first + ordinal))

        for relation, index, ordinal, change in self._table_changes():
            add(relation, index, ordinal, change)
        return work

    def relations(self) -> Iterator[tuple[Relation, RemoteTransaction]]:
        """Each table a row change or truncate of the batch names, with its transaction, in
        order (a table as often as it is named)."""
        for relation, index, _, _ in self._table_changes():
            yield relation, self.transactions[index]

    def _table_changes(
        self,
    ) -> Iterator[tuple[Relation, int, int, RowChange | TruncateChange]]:
        """Each table a change names, with its transaction's index, the change's ordinal in
        it and the change (a truncate once per table it names), in order."""
        for index, tx in enumerate(self.transactions):
            for ordinal, change in enumerate(tx.changes):
                if isinstance(change, RowChange):
                    yield change.relation, index, ordinal, change
                elif isinstance(change, TruncateChange):
                    for relation in change.relations:
                        yield relation, index, ordinal, change

    def messages(
        self, applied_lsn: Lsn = ZERO, applied_through: int = 0
    ) -> list[tuple[int, MessageChange]]:
        """The batch's logical decoding messages, in order, with their transaction's index,
        less those the messages table has: transactions at or below ``applied_lsn``, and of
        a piece of a spooled transaction, its first ``applied_through`` changes (as
        ``tables`` does for a table)."""
        found = []
        for index, tx in enumerate(self.transactions):
            if tx.end_lsn <= applied_lsn:
                continue
            for ordinal, change in enumerate(tx.changes):
                if not isinstance(change, MessageChange):
                    continue
                if tx.total is not None and tx.first + ordinal < applied_through:
                    continue
                found.append((index, change))
        return found


DEFAULT_BOUNDS = Bounds(100_000)

# A batch holds at most this many times ``max_changes`` while the target lags.
GROWTH: Final = 4


class Batcher:
    """Collects transactions until a batch is due."""

    def __init__(
        self,
        bounds: Bounds = DEFAULT_BOUNDS,
        max_delay: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        min_changes: int = 0,
    ) -> None:
        if max_delay < 0:
            raise ValueError("max_delay must not be negative")
        self.min_changes = min_changes  # 0: every batch waits its max_delay
        self.base = bounds  # as configured; ``bounds`` grows from it while the target lags
        self.bounds = bounds
        self.max_delay = max_delay
        self._clock = clock
        self._taken_full = False
        self._transactions: list[RemoteTransaction] = []
        self._changes = 0
        self._size = 0
        self._started: float | None = None  # when the open batch's oldest arrived
        self._hastened = False  # due at once: it holds a table's first write (``hasten``)
        self._last_taken = clock()  # when the batch before it was taken (or the batcher made)

    def __len__(self) -> int:
        return len(self._transactions)

    @property
    def changes(self) -> int:
        return self._changes

    def add(self, tx: RemoteTransaction, arrived: float | None = None) -> None:
        """Add ``tx``; ``arrived`` (on the batcher's clock) is when it was received: a batch
        is due ``max_delay`` after its oldest transaction arrived, not after it was added."""
        at = self._clock() if arrived is None else arrived
        if self._started is None or at < self._started:
            self._started = at
        self._transactions.append(tx)
        self._changes += len(tx.changes)
        self._size += tx.size

    def hasten(self) -> None:
        """The open batch holds a table's first write in this run: it is due at once. That
        write carries the table's one-time costs (its log opened, its marks read, deletion
        vectors turned on, its key index read), so after a start the tables' first batches
        follow each other as the writer frees - small, then larger as the writes take
        longer - instead of one batch that waits ``max_delay`` and then pays every
        table's costs at once. A table's changes hasten batches only until its first write
        is applied, so what this adds is a few commits a table a run."""
        if self._transactions:
            self._hastened = True

    def full(self) -> bool:
        return self.bounds.reached(self._changes, self._size)

    def due(self) -> bool:
        if not self._transactions:
            return False
        grouped = self._hastened or 0 < self.min_changes <= self._changes
        return grouped or self.full() or self.time_left() <= 0

    def time_left(self) -> float:
        """Seconds until the open batch is due by time (``max_delay`` when empty, 0 when
        hastened): at ``max_delay`` after the batch before was taken or after its oldest
        transaction arrived, whichever was first."""
        if self._started is None:
            return self.max_delay
        if self._hastened:
            return 0.0
        since = min(self._started, self._last_taken)
        return since + self.max_delay - self._clock()

    def applied(self, seconds: float) -> None:
        """The batch last taken was applied in ``seconds``. One that held at least the
        configured bounds and took longer than ``max_delay`` says the target lags: the next
        may be twice as large. One below the configured bounds (the backlog is gone) brings
        the bounds back to them."""
        if not self._taken_full:
            self.bounds = self.base
        elif seconds > self.max_delay:
            grown = min(2 * self.bounds.changes, GROWTH * self.base.changes)
            self.bounds = replace(self.bounds, changes=grown)

    def take(self) -> Batch:
        self._taken_full = self.base.reached(self._changes, self._size)
        self._last_taken = self._clock()
        batch = Batch(self._transactions)
        self._transactions = []
        self._changes = 0
        self._size = 0
        self._started = None
        self._hastened = False
        return batch
