"""The next batch split by table and collapsed while it forms, so that at its turn its
writes start at once (docs/apply.md, "Formed while the last batch is written").

A batch's own Python work before its writes is two loops over its changes:
splitting them by table (``Batch.tables``) and folding each table's into its
net effect (``apply.batching.collapse``). ``Forming`` does both a transaction at a time,
as the worker adds transactions to the open batch, and the worker adds them
while the batch before is written (the MERGE runs in Spark or delta-rs,
outside Python's lock). At the batch's turn only the write is left.

Forming is exact or nothing: the formed work must be what ``Batch.tables``
and ``collapse`` would make of the batch at its turn. It is abandoned - the
batch is then split and collapsed at its turn, as before - on what could
make them differ, and ``take`` checks at the turn what could have changed
since:

- a table the applier has not written yet in this run (its applied LSN is
  read from Delta at its first batch, and its schema made ready there).
  This one leaves only that table to the turn (``unformed``): the batch is
  split and collapsed at its turn, but the other tables are still formed
  and a write of the batch before may take theirs (``take_table``) - after
  a start or an initial sync, a table's first batch comes at a different
  batch for each of 1,000 tables, and every batch until the last had taken
  nothing;
- a TRUNCATE, a logical decoding message (schema changes arrive as
  messages), a piece of a spooled transaction;
- a table whose columns change within the batch;
- the table states ``should_apply`` answers from (a table handed over by
  its sync worker, resynced, removed), compared at the turn;
- a table's target schema, compared at the turn;
- an error while forming (a renamed table, say): the turn meets it again,
  and raises it with the batch's context.

The applied LSNs need no check at the turn: the batch's transactions all end
after the batch before, so a table that batch commits keeps them as before.
Only a keyed table's changes are collapsed ahead; a table without a key, a
history table or one whose binary values are rendered at its turn is split
ahead and collapsed at its turn.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol, overload

from apply.batching.collapse import KeyedNet, Layout, fold_keyed, is_keyed
from apply.core.batch import Batch, TableChange, TableWork
from apply.core.transactions import MessageChange, RemoteTransaction, RowChange
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Relation

FOLD_EVERY: Final = 256  # changes of a table held before they are folded into its net effect


class FormingView(Protocol):
    """What the applier tells the forming batch (``BatchApplier``)."""

    def applies(self, relation: Relation, tx: RemoteTransaction) -> bool:
        """``should_apply``: whether the leader applies ``tx``'s changes of ``relation``."""
        ...

    def known_applied_lsn(self, table: str) -> Lsn | None:
        """The table's applied LSN when this run has it (None: read at the batch's turn)."""
        ...

    def formable(self, relation: Relation) -> bool | None:
        """Whether the table's changes are collapsed ahead (True) or only split (False);
        None: not ahead at all (its target schema is not ready for ``relation``)."""
        ...

    def table_states(self) -> object:
        """What ``applies`` answers from, compared at the turn."""
        ...


@dataclass
class _Table:
    work: TableWork
    net: KeyedNet | None  # None: collapsed at the batch's turn
    folded: int = 0  # of ``work.changes``


@dataclass
class Formed:
    """A batch's work split by table, and each keyed table's net effect."""

    works: dict[str, TableWork]
    nets: dict[str, KeyedNet]


@dataclass(frozen=True, slots=True)
class Taken:
    """A table's changes taken out of the forming batch by its write in the batch before,
    as that write starts (``Forming.take_table``)."""

    changes: list[TableChange]  # each indexed by its transaction in ``transactions``
    transactions: tuple[RemoteTransaction, ...]  # the forming batch's so far, in order


@dataclass
class Forming:
    """The open batch's work, formed as its transactions are added.

    Added to by the apply thread; a write of the batch before takes its table's changes out
    (``take_table``) from a writer thread, so both hold ``_lock``."""

    view: FormingView
    abandoned: str | None = None  # why (None: formed so far)
    # Why the batch is split and collapsed at its turn though its other tables are formed
    # and may be taken (None: formed so far); the tables left to the turn, and the index of
    # the first transaction with a change of one.
    unformed: str | None = None
    # Whether it holds a table's first write in this run (its applied LSN not known yet):
    # such a batch is due as soon as the writer is free (``Batcher.hasten``).
    first_write: bool = False
    _left: set[str] = field(default_factory=set)
    _left_first: int | None = None
    _txs: list[RemoteTransaction] = field(default_factory=list)
    _states: object = None
    _tables: dict[str, _Table] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, tx: RemoteTransaction) -> None:
        """``tx`` joins the open batch (after every transaction added before it)."""
        with self._lock:
            self._add(tx)

    def _add(self, tx: RemoteTransaction) -> None:
        index = len(self._txs)
        self._txs.append(tx)
        if self.abandoned is not None:
            return
        if index == 0:
            self._states = self.view.table_states()
        if tx.total is not None:
            self._abandon("a piece of a spooled transaction")
            return
        for ordinal, change in enumerate(tx.changes):
            if type(change) is not RowChange:  # a Change is one of three
                message = isinstance(change, MessageChange)
                self._abandon("a logical decoding message" if message else "a TRUNCATE")
                return
            try:
                self._add_change(index, ordinal, tx, change)
            except Exception as exc:  # noqa: BLE001 - met again at the batch's turn, and raised
                self._abandon(f"{type(exc).__name__}: {exc}")
            if self.abandoned is not None:
                return

    def _add_change(
        self, index: int, ordinal: int, tx: RemoteTransaction, change: RowChange
    ) -> None:
        relation = change.relation
        name = relation.qualified_name
        if not self.view.applies(relation, tx):
            return
        if name in self._left:
            self._leave(name, index, self.unformed or "")
            return
        applied = self.view.known_applied_lsn(name)
        if applied is None:
            self.first_write = True
            self._leave(name, index, f"{name}: its first batch in this run")
            return
        if tx.end_lsn <= applied:
            return
        table = self._tables.get(name)
        if table is None:
            formable = self.view.formable(relation)
            if formable is None:
                self._leave(name, index, f"{name}: its target schema is not ready for them")
                return
            net = _empty_net(relation) if formable and is_keyed(relation) else None
            table = self._tables[name] = _Table(TableWork(relation), net)
        elif relation is not table.work.relation and relation != table.work.relation:
            self._abandon(f"{name}: its columns changed within the batch")
            return
        table.work.changes.append(TableChange(index, change, tx.first + ordinal))
        if table.net is not None and len(table.work.changes) - table.folded >= FOLD_EVERY:
            _fold(table)

    def _abandon(self, why: str) -> None:
        self.abandoned = why
        self._tables = {}

    def _leave(self, name: str, index: int, why: str) -> None:
        """The table's changes in this batch, from the transaction ``index`` on and any
        formed before, left to the batch's turn, which splits and collapses the batch whole
        (``why``); the other tables' are still formed and may be taken. A table left is
        never taken: its changes are not all here, and a take brings its table to the
        forming batch's last transaction."""
        self.unformed = self.unformed or why
        self._left.add(name)
        formed = self._tables.pop(name, None)
        firsts = [index] if formed is None else [index, formed.work.changes[0].tx]
        if self._left_first is not None:
            firsts.append(self._left_first)
        self._left_first = min(firsts)

    def take(self, batch: Batch) -> Formed | None:
        """The formed work when it is ``batch``'s, as ``Batch.tables`` and ``collapse`` would
        make it now; None: split and collapse ``batch`` at its turn. The next batch forms
        anew."""
        with self._lock:
            try:
                formed = self._formed(batch)
            except Exception:  # noqa: BLE001 - met again at the batch's turn, and raised
                formed = None
            self.abandoned, self._txs, self._states = None, [], None
            self.unformed, self._left, self._left_first = None, set(), None
            self._tables, self.first_write = {}, False
        return formed

    def take_table(self, name: str, relation: Relation) -> Taken | None:
        """The table's changes in the forming batch so far, taken out of it for the write of
        the batch before, which starts now: that write brings the table to the forming
        batch's last transaction, so a table's changes wait for its next write, not for every
        table of the batch before and then of their own (docs/apply.md, "A table's write
        takes what has arrived for it"). None: none are taken - the table has none, its
        columns are not ``relation``'s, its changes are not collapsed ahead (no key, history
        kept), the batch is abandoned or its table states moved."""
        with self._lock:
            table = self._tables.get(name)
            if self.abandoned is not None or table is None or table.net is None:
                return None
            if relation is not table.work.relation and relation != table.work.relation:
                return None
            if self.view.table_states() != self._states:
                return None
            del self._tables[name]
            return Taken(table.work.changes, tuple(self._txs))

    def pending(self) -> tuple[int | None, tuple[RemoteTransaction, ...]]:
        """The forming batch's transactions so far, and the index of the first with a change
        not taken out yet (None: none has). An abandoned batch: all of them pending."""
        with self._lock:
            txs = tuple(self._txs)
            if self.abandoned is not None:
                return (0 if txs else None), txs
            firsts = [table.work.changes[0].tx for table in self._tables.values()]
            if self._left_first is not None:
                firsts.append(self._left_first)
            return min(firsts, default=None), txs

    def _formed(self, batch: Batch) -> Formed | None:
        if self.abandoned is not None or self.unformed is not None or not batch.transactions:
            return None
        txs = self._txs
        if len(txs) != len(batch.transactions) or txs[-1] is not batch.transactions[-1]:
            return None  # not the batch formed (one cut by a spooled transaction, say)
        if self.view.table_states() != self._states:
            return None
        for table in self._tables.values():
            if self.view.formable(table.work.relation) is None:
                return None
        nets = {}
        for name, table in self._tables.items():
            if table.net is not None:
                _fold(table)
                nets[name] = table.net
        return Formed({name: table.work for name, table in self._tables.items()}, nets)


def fold_taken(net: KeyedNet, taken: Taken, before: int) -> None:
    """Fold the changes ``taken`` from the forming batch into ``net``, the net effect of a
    batch of ``before`` transactions: the net effect of that batch followed by the
    transactions ``taken`` saw, each change counted at its transaction's place in both."""
    changes = [TableChange(c.tx + before, c.change, c.position) for c in taken.changes]
    fold_keyed(net, changes, Layout(net.relation))
    net.commits = Commits(net.commits, taken.transactions)


class Commits(Sequence[tuple[int, int]]):
    """The commits (``KeyedNet.commits``: end LSN, commit time) of ``before`` followed by
    those of ``transactions``, made when first asked: a batch's (``before`` empty) and a
    take's (its batch's and the transactions it saw). Only a stamped table or a TRUNCATE
    asks. Made for each table that took ahead (about 500 a batch at 1,000 tables), a
    take's pairs were 14% of the samples holding Python's lock (docs/performance.md, "Many
    tables after a start: the first batches"); made for each batch, a backlog's 100,000
    were 3.5% of its drain's ("A batch's commits made when asked")."""

    def __init__(
        self, before: Sequence[tuple[int, int]], transactions: Sequence[RemoteTransaction]
    ) -> None:
        self._before = before
        self._transactions = transactions
        self._pairs: list[tuple[int, int]] | None = None

    def _made(self) -> list[tuple[int, int]]:
        pairs = self._pairs
        if pairs is None:  # two writers asking at once make the same list: either is kept
            made = ((int(tx.end_lsn), tx.commit_time) for tx in self._transactions)
            pairs = self._pairs = [*self._before, *made]
        return pairs

    def __len__(self) -> int:
        return len(self._before) + len(self._transactions)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._made())

    @overload
    def __getitem__(self, index: int) -> tuple[int, int]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[int, int]]: ...
    def __getitem__(self, index: int | slice) -> tuple[int, int] | Sequence[tuple[int, int]]:
        return self._made()[index]


def _empty_net(relation: Relation) -> KeyedNet:
    return KeyedNet(relation, tuple(c.name for c in relation.columns if c.is_key))


def _fold(table: _Table) -> None:
    """Fold the table's changes added since the last fold into its net effect."""
    assert table.net is not None
    changes = table.work.changes
    fold_keyed(table.net, changes[table.folded :], Layout(table.work.relation))
    table.folded = len(changes)
