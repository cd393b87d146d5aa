"""Batch bounds: complete transactions only, bounded by changes and delay."""

import pytest

from apply.core.batch import Batcher
from apply.core.transactions import Bounds
from tests.unit.apply.builders import ins, relation, tx

T = relation("id", "v")


def test_batch_is_due_by_changes() -> None:
    batcher = Batcher(Bounds(3), max_delay=60, clock=lambda: 0.0)
    batcher.add(tx(ins(T, 1, "a"), ins(T, 2, "b")))
    assert not batcher.due()
    batcher.add(tx(ins(T, 3, "c"), end=200))
    assert batcher.due()
    batch = batcher.take()
    assert len(batch.transactions) == 2 and batch.end_lsn == 200 and len(batcher) == 0


def test_batch_is_due_by_delay() -> None:
    now = [0.0]
    batcher = Batcher(Bounds(1000), max_delay=1.0, clock=lambda: now[0])
    assert not batcher.due()  # empty: never due
    batcher.add(tx(ins(T, 1, "a")))
    now[0] = 0.5
    assert not batcher.due() and batcher.time_left() == 0.5
    now[0] = 1.0
    assert batcher.due()


def test_a_batch_holding_min_changes_is_due_at_once_a_trickle_waits_its_delay() -> None:
    """Group commit (``batch.min_changes``): at a high rate a batch is written as soon as
    the writer takes it; at a low one it still carries ``max_delay`` worth of changes."""
    now = [0.0]
    batcher = Batcher(Bounds(1000), max_delay=1.0, clock=lambda: now[0], min_changes=3)
    batcher.add(tx(ins(T, 1, "a"), ins(T, 2, "b")))
    assert not batcher.due()  # two changes: a trickle, 1 s to wait
    batcher.add(tx(ins(T, 3, "c"), end=200))
    assert batcher.due() and batcher.time_left() == 1.0  # three, long before max_delay
    assert batcher.take().change_count == 3
    batcher.add(tx(ins(T, 4, "d")))
    now[0] = 1.0
    assert batcher.due()  # the trickle's one change, at its max_delay
    unbounded = Batcher(Bounds(1000), max_delay=1.0, clock=lambda: 0.0)  # min_changes 0
    unbounded.add(tx(*(ins(T, i, "x") for i in range(999))))
    assert not unbounded.due()


def test_a_batch_holding_a_tables_first_write_is_due_at_once_until_taken() -> None:
    """``hasten``: a batch with a table's first write in the run (its one-time costs) does
    not wait ``max_delay`` nor ``min_changes``; the batch after it waits as before, and an
    empty batcher is never hastened."""
    now = [0.0]
    batcher = Batcher(Bounds(1000), max_delay=1.0, clock=lambda: now[0], min_changes=1000)
    batcher.hasten()
    assert not batcher.due()  # nothing to write
    batcher.add(tx(ins(T, 1, "a")))
    assert not batcher.due() and batcher.time_left() == 1.0
    batcher.hasten()
    assert batcher.due() and batcher.time_left() == 0.0
    assert batcher.take().change_count == 1
    batcher.add(tx(ins(T, 2, "b")))
    assert not batcher.due() and batcher.time_left() == 1.0  # the next waits its max_delay
    now[0] = 1.0
    assert batcher.due()


def test_after_a_quiet_spell_a_transaction_is_due_at_once_a_stream_once_per_delay() -> None:
    """Due by time ``max_delay`` after the batch before was taken: a transaction that comes
    after a quiet spell is written at once (not a second later, as when a batch waited its
    own transaction's ``max_delay``); a steady stream still makes one batch per ``max_delay``."""
    now = [0.0]
    batcher = Batcher(Bounds(1000), max_delay=1.0, clock=lambda: now[0])
    now[0] = 5.0
    batcher.add(tx(ins(T, 1, "a")))
    assert batcher.due()  # the last batch (none: the batcher's start) 5 s ago
    batcher.take()
    now[0] = 5.1
    batcher.add(tx(ins(T, 2, "b")))
    assert not batcher.due() and batcher.time_left() == pytest.approx(0.9)  # one per max_delay
    now[0] = 6.0
    assert batcher.due()


def test_a_transaction_larger_than_the_bound_is_one_batch() -> None:
    batcher = Batcher(Bounds(2), max_delay=60, clock=lambda: 0.0)
    batcher.add(tx(*(ins(T, i, "x") for i in range(10))))
    assert batcher.due() and batcher.take().change_count == 10


def test_batch_is_due_by_bytes_of_row_data() -> None:
    """Wide rows close a batch long before its change count does (``batch.max_bytes``)."""
    wide = "x" * 1000
    batcher = Batcher(Bounds(1000, size=2500), max_delay=60, clock=lambda: 0.0)
    batcher.add(tx(ins(T, 1, wide), ins(T, 2, wide)))
    assert not batcher.due()
    batcher.add(tx(ins(T, 3, wide), end=200))
    assert batcher.due() and batcher.take().change_count == 3


def test_a_batch_is_due_by_the_age_of_its_oldest_transaction_not_when_it_was_added() -> None:
    """Transactions that waited in the queue while the last batch applied are not held back
    another ``max_delay`` once the worker gets to them."""
    batcher = Batcher(Bounds(1000), max_delay=1.0, clock=lambda: 10.0)
    batcher.add(tx(ins(T, 1, "a")), arrived=8.5)
    assert batcher.due() and batcher.time_left() == -0.5
    batcher.take()
    batcher.add(tx(ins(T, 2, "b")), arrived=9.5)
    assert not batcher.due()


def test_batches_grow_while_the_target_lags_and_shrink_once_it_keeps_up() -> None:
    """A full batch slower than ``max_delay`` doubles the change bound, up to ``GROWTH`` times
    ``max_changes``; the byte bound stays; the first batch below the configured bounds
    resets it."""
    from apply.core.batch import GROWTH

    batcher = Batcher(Bounds(2, size=10_000), max_delay=1.0, clock=lambda: 0.0)
    sizes = []
    for end in range(1, 5):
        batcher.add(tx(*(ins(T, i, "x") for i in range(batcher.bounds.changes)), end=100 * end))
        assert batcher.due()
        batcher.take()
        batcher.applied(5.0)  # slower than max_delay: lagging
        sizes.append(batcher.bounds.changes)
    assert sizes == [4, 8, 8, 8] and GROWTH == 4
    assert batcher.bounds.size == 10_000
    # Less than the grown bound, as much as the configured one: still lagging.
    batcher.add(tx(*(ins(T, i, "x") for i in range(3)), end=1000))
    batcher.take()
    batcher.applied(5.0)
    assert batcher.bounds.changes == 8
    batcher.add(tx(ins(T, 1, "x"), end=1100))  # below the configured bounds: caught up
    batcher.take()
    batcher.applied(5.0)
    assert batcher.bounds == Bounds(2, size=10_000)


def test_a_full_batch_applied_within_max_delay_does_not_grow() -> None:
    batcher = Batcher(Bounds(2), max_delay=1.0, clock=lambda: 0.0)
    batcher.add(tx(ins(T, 1, "x"), ins(T, 2, "y")))
    batcher.take()
    batcher.applied(0.5)
    assert batcher.bounds == Bounds(2)
