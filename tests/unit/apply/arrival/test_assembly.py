"""Transaction assembly: whole, spilled and streamed transactions, in commit order."""

from __future__ import annotations

import pickle
import random
from collections import Counter
from pathlib import Path

import pytest

from apply.arrival.assembly import TransactionAssembler, UnsupportedStreamError
from apply.arrival.spool import (
    SpoolDirectory,
    SpooledTransaction,
    read_changes,
    read_frames,
)
from apply.arrival.spool_frames import FRAME, SpoolError
from apply.columns.change_columns import ChangeColumns
from apply.core.transactions import (
    Bounds,
    Change,
    Op,
    RemoteTransaction,
    RowChange,
    TruncateChange,
    change_size,
)
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import (
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
from subscriber.replication.pgoutput import PgOutputDecoder
from subscriber.replication.runs import RunDecoder, WholeTransaction
from tests.support import pgoutput_builder as pgb
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
    return [v for piece in tx.pieces(Bounds(1_000_000)) for v in ids(piece)]


@pytest.fixture
def spools(tmp_path: Path) -> SpoolDirectory:
    return SpoolDirectory(tmp_path / "spool")


def commit(at: int) -> Commit:
    return Commit(0, Lsn(at), Lsn(at + 8), 0)


def whole(spools: SpoolDirectory, spill_after: int, rows: int) -> object:
    """A transaction of ``rows`` inserts sent whole (not streamed), as assembled."""
    assembler = TransactionAssembler(spools, Bounds(spill_after))
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
    pieces = list(tx.pieces(Bounds(2)))
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
    assert [(p.first, len(p.changes), p.partial) for p in tx.pieces(Bounds(2))] == [
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
    (piece,) = tx.pieces(Bounds(10))
    assert isinstance(piece.changes[0], RowChange) and piece.changes[0].relation == new
    assert assembler.relations[OID] == new  # replayed at commit, as PostgreSQL does


def test_an_aborted_stream_and_a_reconnect_leave_no_files(spools: SpoolDirectory) -> None:
    assembler = TransactionAssembler(spools, spill_after=Bounds(1))
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
        list(tx.pieces(Bounds(10)))


def test_every_change_shape_reads_back_equal_and_relations_stay_one_object(
    spools: SpoolDirectory,
) -> None:
    other = Relation(16385, "s", "u", ReplicaIdentity.FULL, (Column("a", 25, -1, True),))
    changes: list[Change] = [
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


def _assembled(spools: SpoolDirectory, payloads: list[bytes], runs: bool) -> list[list[object]]:
    """Each transaction the stream makes, as its changes, decoded in runs or one by one."""
    decoder = PgOutputDecoder(2)
    assembler = TransactionAssembler(spools, spill_after=Bounds(150))
    made: list[list[object]] = []
    run_decoder = RunDecoder(decoder, max_messages=64)
    for at, payload in enumerate(payloads):
        lsn = Lsn(0x1000 + at)
        decoded = run_decoder.push(payload, lsn) if runs else [decoder.decode(payload, lsn)]
        for message in decoded:
            tx = assembler.feed(message)
            if isinstance(tx, SpooledTransaction):
                made.append([c for piece in tx.pieces(Bounds(1_000)) for c in piece.changes])
                tx.discard()
            elif isinstance(tx, RemoteTransaction):
                made.append(list(tx.changes))
    return made


def test_runs_of_changes_assemble_as_changes_decoded_one_by_one(
    spools: SpoolDirectory,
) -> None:
    """Whole, spilled and streamed transactions (with subtransactions) alike."""
    rng = random.Random(11)

    def image() -> list[pgb.Value]:
        return [str(rng.randint(0, 99)).encode(), rng.choice([b"x", None, "u"])]

    def changes(count: int, xids: list[int] | None = None) -> list[bytes]:
        out = []
        for _ in range(count):
            xid = rng.choice(xids) if xids else None
            pick = rng.randrange(3)
            if pick == 0:
                out.append(pgb.insert(OID, image(), xid))
            elif pick == 1:
                out.append(pgb.update(OID, image(), image(), key=True, xid=xid))
            else:
                out.append(pgb.delete(OID, image(), xid=xid))
        return out

    stream = [pgb.relation(OID, "public", "t", [("id", 23, True), ("v", 25, False)])]
    stream += [pgb.begin(0x100, 700), *changes(100), pgb.commit(0x100, 0x108)]
    stream += [pgb.begin(0x200, 701), *changes(400), pgb.commit(0x200, 0x208)]  # spilled
    stream += [pgb.stream_start(702), *changes(50, [702]), *changes(40, [703])]
    stream += [pgb.stream_stop(), pgb.stream_abort(702, 703)]
    stream += [pgb.stream_start(702, first=False), *changes(70, [702]), pgb.stream_stop()]
    stream += [pgb.stream_commit(702, 0x300, 0x308)]
    one_by_one = _assembled(spools, stream, runs=False)
    assert [len(tx) for tx in one_by_one][:2] == [100, 400]
    assert len(one_by_one[2]) == 120  # subtransaction 703 dropped
    assert _assembled(spools, stream, runs=True) == one_by_one


def test_a_spilled_run_is_spooled_as_columns_and_staged_from_them(
    spools: SpoolDirectory,
) -> None:
    """What a run of one relation's changes spools is its columns (an Arrow frame), and so
    is what the transaction held in memory before it spilled; pieces of whole frames give
    them back, joined per table."""
    decoder = PgOutputDecoder(2)
    assembler = TransactionAssembler(spools, spill_after=Bounds(100))
    run_decoder = RunDecoder(decoder, max_messages=64)
    stream = [pgb.relation(OID, "public", "t", [("id", 23, True), ("v", 25, False)])]
    stream += [pgb.begin(0x100, 700)]
    stream += [pgb.insert(OID, [str(i).encode(), b"x"]) for i in range(300)]
    stream += [pgb.update(OID, [b"7", b"y"], None) for _ in range(3)]
    stream += [pgb.commit(0x100, 0x108)]
    made = []
    for at, payload in enumerate(stream):
        for message in run_decoder.push(payload, Lsn(0x1000 + at)):
            made.append(assembler.feed(message))
    tx = made[-1]
    assert isinstance(tx, SpooledTransaction) and tx.change_count == 303
    frames = list(read_frames(tx.path))
    # What was held in memory before the spill too: every frame is columns.
    assert all(isinstance(f, ChangeColumns) for f in frames) and len(frames) > 2
    one_by_one = list(read_changes(tx.path))
    assert len(one_by_one) == 303
    pieces = list(tx.frames(Bounds(150)))
    assert sum(p.count for p in pieces) == 303 and len(pieces) > 1
    assert [p.first for p in pieces] == [
        sum(q.count for q in pieces[:i]) for i in range(len(pieces))
    ]
    counted: Counter[str] = Counter()
    read: list[Change] = []
    for piece in pieces:
        counted.update(piece.operations())
        columns, rows = piece.split()
        if columns:  # the table's changes in this piece all came as columns
            assert set(columns) == {"public.t"} and not rows.changes
            read.extend(columns["public.t"].row_changes())
        else:
            read.extend(rows.changes)
    assert read == one_by_one
    assert counted == Counter({"INSERT": 300, "UPDATE": 3})


def test_a_transaction_past_the_byte_bound_is_spooled_and_cut_by_bytes(
    spools: SpoolDirectory,
) -> None:
    """Few changes, wide values: the bytes bound spills it and cuts its pieces."""
    wide = "w" * 500
    assembler = TransactionAssembler(spools, Bounds(1000, size=1200))
    assembler.feed(rel("id", "v"))
    assembler.feed(Begin(Lsn(100), 0, 700))
    for value in range(5):
        assert assembler.feed(Insert(OID, row(value, wide))) is None
    tx = assembler.feed(commit(100))
    assert isinstance(tx, SpooledTransaction) and tx.change_count == 5
    pieces = list(tx.pieces(Bounds(1000, size=1000)))
    assert [len(p.changes) for p in pieces] == [2, 2, 1]
    assert [p.size for p in pieces] == [1002, 1002, 501]


def test_runs_count_the_bytes_that_changes_decoded_one_by_one_hold(
    spools: SpoolDirectory,
) -> None:
    """The size a run adds in C equals the sum of its changes' sizes."""
    rng = random.Random(5)
    stream = [pgb.relation(OID, "public", "t", [("id", 23, True), ("v", 25, False)])]
    stream.append(pgb.begin(0x900, 700))
    for n in range(300):
        value = rng.choice([b"x" * rng.randint(0, 40), None, "u"])
        if n % 3 == 0:
            stream.append(pgb.update(OID, [str(n).encode(), value], [b"1", b"old"]))
        else:
            stream.append(pgb.insert(OID, [str(n).encode(), value]))
    stream.append(pgb.commit(0x900, 0x908))
    decoder, sizes = PgOutputDecoder(2), []
    for runs in (True, False):
        assembler = TransactionAssembler(spools, Bounds(10_000))
        run_decoder = RunDecoder(decoder, max_messages=64)
        for at, payload in enumerate(stream):
            lsn = Lsn(0x1000 + at)
            decoded = run_decoder.push(payload, lsn) if runs else [decoder.decode(payload, lsn)]
            for message in decoded:
                tx = assembler.feed(message)
                if tx is not None:
                    assert isinstance(tx, RemoteTransaction)
                    assert tx.size == sum(map(change_size, tx.changes))
                    sizes.append(tx.size)
    assert sizes[0] == sizes[1] > 0


def test_messages_join_their_transaction_or_stand_alone(spools: SpoolDirectory) -> None:
    from apply.core.transactions import MessageChange
    from subscriber.replication.messages import LogicalMessage

    assembler = TransactionAssembler(spools)
    assembler.feed(rel("id", "v"))
    assert assembler.feed(LogicalMessage(False, Lsn(0x40), "audit", b"alone")) is not None
    assembler.feed(Begin(Lsn(100), 0, 700))
    assembler.feed(ins(1))
    assert assembler.feed(LogicalMessage(True, Lsn(0x60), "app", b"in")) is None
    tx = assembler.feed(commit(100))
    assert isinstance(tx, RemoteTransaction)
    assert tx.changes[1] == MessageChange(Lsn(0x60), True, "app", b"in")
    spool = spools.open("frames", 700)
    spool.append(tx.changes[1])
    spool.close()
    assert list(read_changes(spool.path)) == [tx.changes[1]]


def test_small_transactions_handed_on_whole_assemble_as_their_messages(
    spools: SpoolDirectory,
) -> None:
    """A ``WholeTransaction`` makes the transaction its messages make one at a time: the
    same xid, LSNs, commit time, changes and size; spooled past the bounds; its Origin
    (which hands it on as messages) kept."""
    rng = random.Random(3)
    origin = pgb.origin(0x77, "node")
    stream = [pgb.relation(OID, "public", "t", [("id", 23, True), ("v", 25, False)])]
    for n in range(60):
        final = 0x1000 + 0x100 * n
        body = []
        for _ in range(rng.randint(0, 8)):
            key = str(rng.randint(0, 9)).encode()
            pick = rng.randrange(3)
            if pick == 0:
                body.append(pgb.insert(OID, [key, b"v" * rng.randint(0, 90)]))
            elif pick == 1:
                body.append(pgb.update(OID, [key, b"u"], [key, None], key=True))
            else:
                body.append(pgb.delete(OID, [key, None]))
        if n % 7 == 0:
            body.insert(0, origin)
        stream += [pgb.begin(final, 900 + n, commit_time=n), *body]
        stream.append(pgb.commit(final, final + 0x10, commit_time=n))

    def assembled(held: bool) -> tuple[list[object], int]:
        decoder = PgOutputDecoder(2)
        runs = RunDecoder(decoder, held=(lambda: None) if held else None)
        assembler = TransactionAssembler(spools, spill_after=Bounds(5, size=200))
        made: list[object] = []
        whole = 0
        for at, payload in enumerate(stream):
            for message in runs.push(payload, Lsn(0x10 + at)):
                whole += isinstance(message, WholeTransaction)
                tx = assembler.feed(message)
                if isinstance(tx, SpooledTransaction):
                    changes = [c for piece in tx.pieces(Bounds(1_000)) for c in piece.changes]
                    made.append(("spooled", tx.head, changes))
                    tx.discard()
                elif tx is not None:
                    made.append(tx)
        return made, whole

    by_messages, none_whole = assembled(held=False)
    by_whole, whole = assembled(held=True)
    assert none_whole == 0 and whole > 30
    assert by_whole == by_messages
    assert len(by_whole) == 60
    assert any(isinstance(tx, tuple) for tx in by_whole)  # past the bounds: spooled
    assert any(isinstance(tx, RemoteTransaction) and tx.origin == "node" for tx in by_whole)
