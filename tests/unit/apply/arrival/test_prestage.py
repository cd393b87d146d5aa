"""A spooled transaction staged while it arrives (apply.arrival.prestage), on a real spool file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from apply.arrival.prestage import Prestager
from apply.arrival.spool import Spool, SpoolDirectory
from apply.columns.change_columns import ChangeColumns
from apply.core.transactions import Bounds
from tests.unit.apply.builders import ins, relation, upd

KEYED = relation("id", "v")
BAG = relation("a", "b", key=())


@pytest.fixture
def prestager(tmp_path: Path) -> Iterator[Prestager]:
    made = Prestager(
        "sub1", tmp_path / "arriving", lambda oid: None, Bounds(4), binary_needs_text=False
    )
    yield made
    made.close()


def spools(tmp_path: Path, prestager: Prestager) -> SpoolDirectory:
    return SpoolDirectory(tmp_path / "spool", prestager=prestager)


def test_frames_are_staged_in_pieces_as_they_are_spooled(
    tmp_path: Path, prestager: Prestager
) -> None:
    spool = spools(tmp_path, prestager).open("stream-7", 7, prestaged=True)
    prestage = spool.prestage
    assert prestage is not None
    spool.append_columns(ChangeColumns.of(KEYED, [ins(KEYED, i, "a") for i in range(1, 4)]), 7)
    spool.append_columns(ChangeColumns.of(KEYED, [ins(KEYED, i, "b") for i in range(4, 7)]), 7)
    spool.append_columns(ChangeColumns.of(KEYED, [upd(KEYED, 9, "c")]), 7)
    prestage.finish()
    staged = prestage.result()
    assert staged is not None
    (stage,) = staged.stages.values()
    # Bounds of 4 changes: the first two frames are one piece (3, then 6 >= 4), the last one.
    assert stage.pieces == 2 and stage.rows == 7 and stage.keys_unique() is True
    assert staged.changes == 7 and staged.operations == {"INSERT": 6, "UPDATE": 1}
    assert staged.relations == {"public.t": KEYED}
    prestage.discard()
    assert not staged.root.exists()


def rows_after_columns(spool: Spool) -> None:
    spool.append_columns(ChangeColumns.of(KEYED, [ins(KEYED, i, "a") for i in range(1, 6)]), 7)
    spool.append(ins(KEYED, 10, "row"), 7)
    spool.close()


def subtransaction_rolled_back(spool: Spool) -> None:
    spool.append_columns(ChangeColumns.of(KEYED, [ins(KEYED, 1, "a")]), 7)
    spool.append_columns(ChangeColumns.of(KEYED, [ins(KEYED, 2, "sub")]), 8)
    spool.abort_subxact(8)


def keyless(spool: Spool) -> None:
    spool.append_columns(ChangeColumns.of(BAG, [ins(BAG, 1, "x")]), 7)


@pytest.mark.parametrize(
    ("spooled", "why"),
    [
        (rows_after_columns, "changes that did not come as columns (TOAST, messages, TRUNCATE)"),
        (subtransaction_rolled_back, "a subtransaction rolled back"),
        (keyless, "table public.t has no key"),
    ],
)
def test_what_the_prestage_cannot_take_is_staged_at_the_commit(
    tmp_path: Path, prestager: Prestager, spooled: Callable[[Spool], None], why: str
) -> None:
    spool = spools(tmp_path, prestager).open("stream-7", 7, prestaged=True)
    prestage = spool.prestage
    assert prestage is not None
    spooled(spool)
    prestage.finish()
    assert prestage.result() is None
    assert prestage.abandoned == why
    assert not list((tmp_path / "arriving").rglob("*.parquet"))  # what it staged is gone


def test_only_the_assemblers_spools_are_prestaged(tmp_path: Path, prestager: Prestager) -> None:
    directory = spools(tmp_path, prestager)
    assert directory.open("prepared-7", 7).prestage is None
    assert SpoolDirectory(tmp_path / "other").open("stream-7", 7, prestaged=True).prestage is None
