"""A batch split and collapsed as it forms is the batch split and collapsed at its turn."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import apply.batching.forming
from apply.batching.collapse import KeyedNet, collapse
from apply.batching.forming import Commits, Forming
from apply.core.batch import Batch
from apply.core.transactions import MessageChange, RemoteTransaction
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.messages import Relation
from tests.unit.apply.batching.test_collapse_properties import KEYED, keyed_history
from tests.unit.apply.builders import dele, ins, relation, trunc, tx, upd

T = relation("id", "v")
OTHER = relation("id", "v", oid=16390, name="other")
BAG = relation("a", "b", key=(), name="bag")


@dataclass
class View:
    """The applier's answers, as a test sets them."""

    applied: dict[str, Lsn] = field(default_factory=dict)
    applied_tables: set[str] | None = None  # None: every table
    schemas: dict[str, Relation] = field(default_factory=dict)  # target schemas made ready
    split_only: set[str] = field(default_factory=set)  # history tables
    states: int = 0

    def applies(self, relation: Relation, tx: RemoteTransaction) -> bool:
        return self.applied_tables is None or relation.qualified_name in self.applied_tables

    def known_applied_lsn(self, table: str) -> Lsn | None:
        return self.applied.get(table)

    def formable(self, relation: Relation) -> bool | None:
        if self.schemas.get(relation.qualified_name) != relation:
            return None
        return relation.qualified_name not in self.split_only

    def table_states(self) -> object:
        return self.states

    def ready(self, *relations: Relation) -> View:
        for rel in relations:
            self.schemas[rel.qualified_name] = rel
            self.applied.setdefault(rel.qualified_name, ZERO)
        return self


def formed_at_turn(view: View, batch: Batch) -> Forming:
    forming = Forming(view)
    for transaction in batch.transactions:
        forming.add(transaction)
    return forming


def _transactions(
    history: tuple[list[object], object], data: st.DataObject, *, most: int
) -> list[RemoteTransaction]:
    """The history's changes (no TRUNCATE) cut into transactions of 1 to ``most``."""
    changes = [c for c in history[0] if not isinstance(c, type(trunc(KEYED)))]
    transactions, position, end = [], 0, 100
    while position < len(changes):
        size = data.draw(st.integers(1, most))
        end += 100
        chunk = tuple(changes[position : position + size])
        transactions.append(RemoteTransaction(1, Lsn(end - 8), Lsn(end), 0, chunk))  # type: ignore[arg-type]
        position += size
    return transactions


@settings(max_examples=300, deadline=None)
@given(keyed_history(), st.data())
def test_formed_as_it_arrives_equals_split_and_collapsed_at_the_turn(
    history: tuple[list[object], object], data: st.DataObject
) -> None:
    transactions = _transactions(history, data, most=6)
    assume(transactions)
    batch = Batch(transactions)
    view = View().ready(KEYED)
    fold_every = data.draw(st.integers(1, 8))
    original, apply.batching.forming.FOLD_EVERY = apply.batching.forming.FOLD_EVERY, fold_every  # type: ignore[misc]
    try:
        formed = formed_at_turn(view, batch).take(batch)
    finally:
        apply.batching.forming.FOLD_EVERY = original  # type: ignore[misc]
    work = batch.tables(lambda name: ZERO)
    assert formed is not None
    assert formed.works == work
    assert formed.nets == {KEYED.qualified_name: collapse(work[KEYED.qualified_name])}


def test_what_the_leader_does_not_apply_or_has_applied_is_left_out_as_at_the_turn() -> None:
    view = View(applied_tables={T.qualified_name}).ready(T, OTHER)
    view.applied[T.qualified_name] = Lsn(200)
    batch = Batch(
        [
            tx(ins(T, 1, "a"), ins(OTHER, 1, "x"), end=200),  # T applied it before a crash
            tx(upd(T, 2, "b"), dele(OTHER, 1), end=300),
            tx(ins(T, 3, "c"), upd(T, 2, "c"), end=400),
        ]
    )
    formed = formed_at_turn(view, batch).take(batch)
    assert formed is not None
    at_turn = batch.tables(lambda name: view.applied[name], view.applies)
    assert formed.works == at_turn and list(formed.works) == [T.qualified_name]
    assert formed.nets[T.qualified_name] == collapse(at_turn[T.qualified_name])


def test_a_table_without_a_key_or_kept_as_history_is_split_ahead_and_collapsed_at_its_turn() -> (
    None
):
    view = View(split_only={OTHER.qualified_name}).ready(BAG, OTHER, T)
    batch = Batch([tx(ins(BAG, 1, 2), ins(OTHER, 1, "x"), ins(T, 1, "a"), end=200)])
    formed = formed_at_turn(view, batch).take(batch)
    assert formed is not None
    assert set(formed.works) == {BAG.qualified_name, OTHER.qualified_name, T.qualified_name}
    assert set(formed.nets) == {T.qualified_name}


@pytest.mark.parametrize(
    ("batch", "view"),
    [
        pytest.param(
            Batch([tx(ins(T, 1, "a"), end=200), tx(trunc(T), end=300)]),
            View().ready(T),
            id="a TRUNCATE",
        ),
        pytest.param(
            Batch([tx(MessageChange(Lsn(0x60), True, "pgsub", b"{}"), ins(T, 1, "a"))]),
            View().ready(T),
            id="a message (schema changes come as messages)",
        ),
        pytest.param(
            Batch([tx(ins(T, 1, "a"))]),
            View(schemas={T.qualified_name: T}),
            id="a table not written yet in this run",
        ),
        pytest.param(
            Batch([tx(ins(T, 1, "a"))]),
            View(applied={T.qualified_name: ZERO}),
            id="a target schema not ready",
        ),
        pytest.param(
            Batch([tx(ins(T, 1, "a"), end=200), tx(ins(relation("id", "v", "w"), 2, "b", "c"))]),
            View().ready(T),
            id="columns changed within the batch",
        ),
    ],
)
def test_what_the_turn_could_make_otherwise_is_left_to_the_turn(batch: Batch, view: View) -> None:
    forming = formed_at_turn(view, batch)
    assert forming.abandoned is not None or forming.unformed is not None
    assert forming.take(batch) is None


def test_the_turn_checks_the_table_states_and_schemas_again() -> None:
    view = View().ready(T)
    batch = Batch([tx(ins(T, 1, "a"))])
    forming = formed_at_turn(view, batch)
    view.states += 1  # a table handed over by its sync worker meanwhile
    assert forming.take(batch) is None
    forming = formed_at_turn(view, batch)
    view.schemas[T.qualified_name] = relation("id", "v", "w")  # the table's schema evolved
    assert forming.take(batch) is None


def test_only_the_batch_formed_takes_the_formed_work_and_the_next_forms_anew() -> None:
    view = View().ready(T)
    first, second = tx(ins(T, 1, "a"), end=200), tx(ins(T, 2, "b"), end=300)
    forming = formed_at_turn(view, Batch([first, second]))
    assert forming.take(Batch([first])) is None  # cut before a spooled transaction, say
    forming.add(second)
    formed = forming.take(Batch([second]))
    assert formed is not None
    assert [c.change for c in formed.works[T.qualified_name].changes] == list(second.changes)


def test_an_error_while_forming_is_left_to_the_turn_which_raises_it() -> None:
    class Renamed(View):
        def applies(self, relation: Relation, tx: RemoteTransaction) -> bool:
            raise ValueError("table public.t was renamed to public.u on the publisher")

    view = Renamed().ready(T)
    batch = Batch([tx(ins(T, 1, "a"))])
    forming = formed_at_turn(view, batch)
    assert forming.abandoned is not None and "renamed to public.u" in forming.abandoned
    assert forming.take(batch) is None


@settings(max_examples=300, deadline=None)
@given(keyed_history(), st.data())
def test_a_table_taken_ahead_lands_as_its_two_batches_would_have(
    history: tuple[list[object], object], data: st.DataObject
) -> None:
    """A write of batch N that takes its table's changes from the forming batch N+1 as it
    starts (``take_table``, ``fold_taken``) makes the net effect of N and the transactions
    the take saw together; N+1, at its turn, holds only what arrived after the take - as
    ``Batch.tables`` makes it once the table is at the take's last transaction."""
    transactions = _transactions(history, data, most=4)
    assume(len(transactions) >= 2)
    cut = data.draw(st.integers(1, len(transactions) - 1))
    now, following = transactions[:cut], transactions[cut:]
    seen = data.draw(st.integers(1, len(following)))
    name = KEYED.qualified_name
    net = collapse(Batch(now).tables(lambda table: ZERO)[name])
    assert isinstance(net, KeyedNet)
    net.commits = Commits((), now)  # as the applier sets
    view = View().ready(KEYED)
    forming = Forming(view)
    for transaction in following[:seen]:
        forming.add(transaction)
    taken = forming.take_table(name, KEYED)
    assert taken is not None and taken.transactions == tuple(following[:seen])
    assert forming.pending() == (None, tuple(following[:seen]))  # nothing left of the table
    apply.batching.forming.fold_taken(net, taken, len(now))
    together = Batch(now + following[:seen])
    assert net.rows == collapse(together.tables(lambda table: ZERO)[name]).rows
    commits = [(int(t.end_lsn), t.commit_time) for t in together.transactions]
    assert [net.commits[at] for at in range(len(net.commits))] == commits  # as stamps ask
    assert list(net.commits) == commits and net.commits[-1] == commits[-1]
    assert list(net.commits[1:]) == commits[1:]
    with pytest.raises(IndexError):
        net.commits[len(commits)]
    for transaction in following[seen:]:
        forming.add(transaction)
    rest = Batch(following)
    formed = forming.take(rest)
    assert formed is not None
    view.applied[name] = following[seen - 1].end_lsn  # the taking write's commit
    at_turn = rest.tables(lambda table: view.applied[table])
    assert formed.works == at_turn
    if at_turn:
        assert formed.nets[name] == collapse(at_turn[name])


class _Read(list[RemoteTransaction]):
    """Transactions that count how often they are read through."""

    reads = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.reads += 1
        return super().__iter__()


def test_a_batchs_commits_are_made_once_and_only_when_asked() -> None:
    """A batch of 100,000 transactions made 100,000 pairs that only a stamped table or a
    TRUNCATE reads: they are made when one first asks, then kept for the others."""
    transactions = _Read(tx(end=100 + 10 * n) for n in range(5))
    commits = Commits((), transactions)
    assert len(commits) == 5 and transactions.reads == 0
    assert commits[3] == (130, 0) and commits[-1] == (140, 0)
    assert list(commits[1:3]) == [(110, 0), (120, 0)] and list(commits) == [*commits]
    taken = Commits(commits, [tx(end=500)])  # a take: the batch's, then what it saw
    assert len(taken) == 6 and taken[5] == (500, 0) and taken[4] == (140, 0)
    assert transactions.reads == 1
    with pytest.raises(IndexError):
        commits[5]


def test_only_a_keyed_table_formed_so_far_is_taken_and_what_is_left_stays_pending() -> None:
    view = View(split_only={OTHER.qualified_name}).ready(T, OTHER, BAG)
    first = tx(ins(OTHER, 1, "x"), end=200)
    second = tx(ins(T, 1, "a"), ins(BAG, 1, 2), end=300)
    third = tx(upd(T, 1, "b"), end=400)
    forming = Forming(view)
    for transaction in (first, second, third):
        forming.add(transaction)
    assert forming.take_table(OTHER.qualified_name, OTHER) is None  # kept as history
    assert forming.take_table(BAG.qualified_name, BAG) is None  # no key
    assert forming.take_table(T.qualified_name, relation("id", "v", "w")) is None  # columns
    assert forming.pending() == (0, (first, second, third))
    taken = forming.take_table(T.qualified_name, T)
    assert taken is not None
    assert [(c.tx, c.change) for c in taken.changes] == [
        (1, second.changes[0]),
        (2, third.changes[0]),
    ]
    assert forming.take_table(T.qualified_name, T) is None  # taken once
    assert forming.pending()[0] == 0  # the history table's change waits for the turn
    view.states += 1  # a table handed over meanwhile: nothing more is taken
    forming.add(tx(ins(T, 2, "c"), end=500))
    assert forming.take_table(T.qualified_name, T) is None
    forming.add(
        tx(MessageChange(Lsn(0x250), True, "p", b"x"), end=600)
    )  # abandoned: all of it pending
    assert forming.take_table(T.qualified_name, T) is None
    assert forming.pending()[0] == 0  # all of it pending


def test_a_table_at_its_first_batch_is_left_to_the_turn_and_the_others_are_still_taken() -> None:
    """After a start, each table's first batch in the run comes at its own batch: a table
    whose applied LSN or target schema is not known yet is left to the turn, which splits
    the batch whole, while the other tables are formed and taken; the left table is never
    taken, stays left once its LSN is known (a take would bring it past its changes left
    behind), and keeps the batch's flush before its first change."""
    view = View().ready(T)
    forming = Forming(view)
    first = tx(ins(T, 1, "a"), end=200)
    new_table = tx(ins(OTHER, 1, "x"), end=300)
    forming.add(first)
    assert not forming.first_write  # T's applied LSN is known
    forming.add(new_table)
    assert forming.first_write  # OTHER's first write in this run: the batch is hastened
    assert forming.abandoned is None and forming.unformed is not None
    assert "its first batch in this run" in forming.unformed
    assert forming.pending() == (0, (first, new_table))
    view.ready(OTHER)  # its first batch, written meanwhile, made it known
    later = tx(ins(OTHER, 2, "y"), ins(T, 2, "b"), end=400)
    forming.add(later)
    assert forming.take_table(OTHER.qualified_name, OTHER) is None  # its first change is not here
    taken = forming.take_table(T.qualified_name, T)
    assert taken is not None
    assert [c.change for c in taken.changes] == [first.changes[0], later.changes[1]]
    assert forming.pending() == (1, (first, new_table, later))  # OTHER's first change
    assert forming.take(Batch([first, new_table, later])) is None  # split at its turn
    assert forming.unformed is None and forming.pending() == (None, ())  # the next forms anew
    assert not forming.first_write


def test_a_table_formed_then_left_leaves_its_earlier_changes_to_the_turn_too() -> None:
    view = View().ready(T)
    forming = Forming(view)
    forming.add(tx(ins(T, 1, "a"), end=200))
    del view.applied[T.qualified_name]  # handed to a sync worker and back: read anew
    forming.add(tx(ins(T, 2, "b"), end=300))
    assert forming.take_table(T.qualified_name, T) is None
    assert forming.pending()[0] == 0
