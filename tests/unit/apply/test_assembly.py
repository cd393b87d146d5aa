"""Transaction assembly: whole, spilled and streamed transactions, in commit order."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from apply.assembly import TransactionAssembler, UnsupportedStreamError
from apply.spool import FRAME, SpoolDirectory, SpooledTransaction, SpoolError, read_changes
from apply.transactions import Op, RemoteTransaction, RowChange, TruncateChange
from subscriber.lsn import Lsn
from subscriber.messages import (
    Begin,
    Column,
    Commit,
    Insert,
    Relation,
    ReplicaIdentity,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
)
from tests.unit.apply.builders import row

OID = 16384


def rel(*columns: str, xid: int | None = None) -> Relation:
    cols = tuple(Column(c, 23, -1, c == "id") for c in columns)
    return Relation(OID, "public", "t", ReplicaIdentity.DEFAULT, cols, xid)


def ins(value: int, xid: int | None = None) -> Insert:
    return Insert(OID, row(value, "x"), xid)


def ids(tx: RemoteTransaction) -> list[int]:
    out = []
    for change in tx.changes:
        assert isinstance(change, RowChange) and change.new is not None
        value = change.new.values[0]
        assert value is not None
        out.append(int(value))
    return out


def spooled_ids(tx: SpooledTransaction) -> list[int]:
    return [v for piece in tx.pieces(1_000_000) for v in ids(piece)]


@pytest.fixture
def spools(tmp_path: Path) -> SpoolDirectory:
    return SpoolDirectory(tmp_path / "spool")


def commit(at: int) -> Commit:
    return Commit(0, Lsn(at), Lsn(at + 8), 0)


def whole(spools: SpoolDirectory, spill_after: int, rows: int) -> object:
    """A transaction of ``rows`` inserts sent whole (not streamed), as assembled."""
    assembler = TransactionAssembler(spools, spill_after)
    assembler.feed(rel("id", "v"))
    assembler.feed(Begin(Lsn(100), 0, 700))
    for value in range(rows):
        assert assembler.feed(ins(value)) is None
    return assembler.feed(commit(100))


def test_a_whole_transaction_stays_in_memory(spools: SpoolDirectory) -> None:
    tx = whole(spools, spill_after=10, rows=3)
    assert isinstance(tx, RemoteTransaction)
    assert ids(tx) == [0, 1, 2] and tx.end_lsn == Lsn(108)
    assert not any(spools.root.iterdir())


def test_a_transaction_larger_than_a_batch_is_spooled_and_read_back_in_pieces(
    spools: SpoolDirectory,
) -> None:
    tx = whole(spools, spill_after=2, rows=5)
    assert isinstance(tx, SpooledTransaction)
    assert tx.change_count == 5 and tx.xid == 700 and tx.end_lsn == Lsn(108)
    pieces = list(tx.pieces(2))
    assert [(p.first, len(p.changes), p.total, p.partial) for p in pieces] == [
        (0, 2, 5, True),
        (2, 2, 5, True),
        (4, 1, 5, False),
    ]
    assert [v for p in pieces for v in ids(p)] == [0, 1, 2, 3, 4]
    assert spools.bytes > 0
    tx.discard()
    assert not tx.path.exists() and spools.bytes == 0


def test_pieces_cut_exactly_at_the_end_leave_no_empty_last_piece(
    spools: SpoolDirectory,
) -> None:
    tx = whole(spools, spill_after=1, rows=4)
    assert isinstance(tx, SpooledTransaction)
    assert [(p.first, len(p.changes), p.partial) for p in tx.pieces(2)] == [
        (0, 2, True),
        (2, 2, False),
    ]


def test_streamed_transactions_interleave_and_commit_in_their_own_order(
    spools: SpoolDirectory,
) -> None:
    assembler = TransactionAssembler(spools)
    assembler.feed(rel("id", "v"))
    assembler.feed(StreamStart(701, True))
    assembler.feed(ins(1, 701))
    assembler.feed(StreamStop())
    assembler.feed(StreamStart(702, True))
    assembler.feed(ins(10, 702))
    assembler.feed(StreamStop())
    assembler.feed(Begin(Lsn(50), 0, 703))  # a whole transaction between the blocks
    assembler.feed(ins(100))
    whole = assembler.feed(commit(50))
    assert isinstance(whole, RemoteTransaction) and ids(whole) == [100]
    assembler.feed(StreamStart(701, False))
    assembler.feed(ins(2, 701))
    assembler.feed(StreamStop())
    second = assembler.feed(StreamCommit(702, 0, Lsn(200), Lsn(208), 0))
    first = assembler.feed(StreamCommit(701, 0, Lsn(300), Lsn(308), 0))
    assert isinstance(second, SpooledTransaction) and spooled_ids(second) == [10]
    assert isinstance(first, SpooledTransaction) and spooled_ids(first) == [1, 2]
    assert first.final_lsn == Lsn(300) and first.xid == 701


def test_a_subtransaction_abort_drops_it_and_the_subtransactions_after_it(
    spools: SpoolDirectory,
) -> None:
    assembler = TransactionAssembler(spools)
    assembler.feed(rel("id", "v"))
    assembler.feed(StreamStart(700, True))
    assembler.feed(ins(1, 700))
    assembler.feed(ins(2, 701))  # SAVEPOINT a
    assembler.feed(ins(3, 702))  # SAVEPOINT b inside a
    assembler.feed(StreamStop())
    assembler.feed(StreamAbort(700, 701))  # ROLLBACK TO a: b goes too
    assembler.feed(StreamAbort(700, 799))  # a subtransaction never streamed: nothing to do
    assembler.feed(StreamStart(700, False))
    assembler.feed(ins(4, 703))
    assembler.feed(StreamStop())
    tx = assembler.feed(StreamCommit(700, 0, Lsn(300), Lsn(308), 0))
    assert isinstance(tx, SpooledTransaction)
    assert spooled_ids(tx) == [1, 4] and tx.change_count == 2


def test_an_aborted_subtransaction_cut_past_a_frame_boundary(spools: SpoolDirectory) -> None:
    assembler = TransactionAssembler(spools)
    assembler.feed(rel("id", "v"))
    assembler.feed(StreamStart(700, True))
    for value in range(FRAME + 5):
        assembler.feed(ins(value, 700))
    for _ in range(FRAME * 2):
        assembler.feed(ins(-1, 701))
    assembler.feed(StreamStop())
    assembler.feed(StreamAbort(700, 701))
    tx = assembler.feed(StreamCommit(700, 0, Lsn(300), Lsn(308), 0))
    assert isinstance(tx, SpooledTransaction)
    assert spooled_ids(tx) == list(range(FRAME + 5))


def test_a_relation_inside_a_stream_holds_for_its_transaction_until_commit(
    spools: SpoolDirectory,
) -> None:
    assembler = TransactionAssembler(spools)
    old, new = rel("id", "v"), rel("id", "v", "w", xid=700)
    assembler.feed(old)
    assembler.feed(StreamStart(700, True))
    assembler.feed(new)
    assembler.feed(Insert(OID, row(1, "x", "y"), 700))
    assembler.feed(StreamStop())
    assembler.feed(Begin(Lsn(50), 0, 701))
    assembler.feed(ins(2))
    whole = assembler.feed(commit(50))
    assert isinstance(whole, RemoteTransaction)
    assert isinstance(whole.changes[0], RowChange) and whole.changes[0].relation == old
    tx = assembler.feed(StreamCommit(700, 0, Lsn(300), Lsn(308), 0))
    assert isinstance(tx, SpooledTransaction)
    (piece,) = tx.pieces(10)
    assert isinstance(piece.changes[0], RowChange) and piece.changes[0].relation == new
    assert assembler.relations[OID] == new  # replayed at commit, as PostgreSQL does


def test_an_aborted_stream_and_a_reconnect_leave_no_files(spools: SpoolDirectory) -> None:
    assembler = TransactionAssembler(spools, spill_after=1)
    assembler.feed(rel("id", "v"))
    assembler.feed(StreamStart(700, True))
    assembler.feed(ins(1, 700))
    assembler.feed(StreamStop())
    assembler.feed(StreamAbort(700, 700))
    assert not any(spools.root.iterdir())
    assembler.feed(StreamStart(701, True))
    assembler.feed(ins(1, 701))
    assembler.feed(StreamStop())
    assembler.feed(Begin(Lsn(50), 0, 702))
    for value in range(FRAME + 2):  # spilled, and a frame written
        assembler.feed(ins(value))
    assert len(list(spools.root.iterdir())) == 2
    assembler.reset()
    assert not any(spools.root.iterdir()) and spools.bytes == 0


def test_a_block_continuing_an_unknown_transaction_is_refused(spools: SpoolDirectory) -> None:
    with pytest.raises(UnsupportedStreamError, match="first block was not received"):
        TransactionAssembler(spools).feed(StreamStart(700, False))


def test_a_spool_frame_naming_another_class_is_refused(tmp_path: Path) -> None:
    frame = pickle.dumps([Path("/")])
    path = tmp_path / "forged"
    path.write_bytes(len(frame).to_bytes(4, "big") + frame)
    with pytest.raises(SpoolError, match="plain values only"):
        list(read_changes(path))


def test_a_truncated_spool_file_is_an_error_not_a_short_transaction(
    spools: SpoolDirectory,
) -> None:
    tx = whole(spools, spill_after=1, rows=2)
    assert isinstance(tx, SpooledTransaction)
    data = tx.path.read_bytes()
    tx.path.write_bytes(data[:-3])
    with pytest.raises(SpoolError, match="ends inside a frame"):
        list(tx.pieces(10))


def test_every_change_shape_reads_back_equal_and_relations_stay_one_object(
    spools: SpoolDirectory,
) -> None:
    other = Relation(16385, "s", "u", ReplicaIdentity.FULL, (Column("a", 25, -1, True),))
    changes = [
        RowChange(rel("id", "v"), Op.INSERT, row(1, "x"), None),
        RowChange(rel("id", "v"), Op.UPDATE, row(2, ...), row(1, None)),
        RowChange(other, Op.DELETE, None, row("gone")),
        TruncateChange((rel("id", "v"), other), cascade=True, restart_identity=False),
    ] * (FRAME // 2)
    spool = spools.open("shapes", 700)
    for change in changes:
        spool.append(change)
    spool.close()
    read = list(read_changes(spool.path))
    assert read == changes
    first, last = read[0], read[-4]
    assert isinstance(first, RowChange) and isinstance(last, RowChange)
    assert first.relation is last.relation  # one object across frames
