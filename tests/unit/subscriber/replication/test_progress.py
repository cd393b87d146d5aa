import pytest

from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Begin, Commit, StreamAbort, StreamCommit, StreamStart
from subscriber.replication.pgoutput import PgOutputDecoder
from subscriber.replication.progress import Progress, ProgressError
from subscriber.replication.receiver import Backoff, TransactionTracker
from subscriber.replication.runs import RunDecoder, WholeTransaction
from tests.support import pgoutput_builder as b


def test_flush_only_moves_forward() -> None:
    progress = Progress(Lsn(100))
    progress.confirm_flushed(Lsn(200))
    with pytest.raises(ProgressError, match="backwards"):
        progress.confirm_flushed(Lsn(150))


def test_idle_progress_confirms_received() -> None:
    progress = Progress(Lsn(100))
    progress.note_received(Lsn(500))
    feedback = progress.feedback()
    assert (feedback.write, feedback.flush) == (Lsn(500), Lsn(500))


def test_pending_transaction_holds_flush_back() -> None:
    progress = Progress(Lsn(100))
    tracker = TransactionTracker(progress)
    tracker.observe(Begin(Lsn(300), 0, 7))
    progress.note_received(Lsn(250))
    assert progress.feedback().flush == Lsn(100)
    tracker.observe(Commit(0, Lsn(300), Lsn(310), 0))
    progress.note_received(Lsn(400))
    # Handed on but not durable yet: still held back.
    assert progress.feedback().flush == Lsn(100)
    progress.confirm_flushed(Lsn(310))
    assert progress.feedback().flush == Lsn(400)


def test_streamed_transaction_is_pending_until_commit_or_abort() -> None:
    progress = Progress(Lsn(100))
    tracker = TransactionTracker(progress)
    tracker.observe(StreamStart(9, True))
    tracker.observe(StreamStart(9, False))
    progress.note_received(Lsn(900))
    assert progress.feedback().flush == Lsn(100)
    tracker.observe(StreamAbort(9, 10))  # subtransaction abort: still open
    assert progress.feedback().flush == Lsn(100)
    tracker.observe(StreamCommit(9, 0, Lsn(950), Lsn(960), 0))
    progress.confirm_flushed(Lsn(960))
    assert progress.feedback().flush == Lsn(960)
    tracker.observe(StreamStart(11, True))
    tracker.observe(StreamAbort(11, 11))
    progress.note_received(Lsn(1000))
    assert progress.feedback().flush == Lsn(1000)


def test_reconnect_forgets_open_transactions() -> None:
    progress = Progress(Lsn(100))
    tracker = TransactionTracker(progress)
    tracker.observe(Begin(Lsn(300), 0, 7))
    tracker.reset()
    progress.note_received(Lsn(200))
    assert progress.feedback().flush == Lsn(200)


def test_backoff_is_capped_exponential() -> None:
    backoff = Backoff(initial=1.0, cap=8.0)
    delays = [backoff.next_delay() for _ in range(6)]
    assert 0.8 <= delays[0] <= 1.0
    assert 1.6 <= delays[1] <= 2.0
    assert all(d <= 8.0 for d in delays)
    assert delays[-1] >= 6.4
    backoff.reset()
    assert backoff.next_delay() <= 1.0


def test_a_transaction_held_to_be_whole_holds_flush_back_from_its_begin() -> None:
    """The receiver holds a small transaction's Begin until its Commit (``RunDecoder``):
    the slot's flush stays put from the Begin, whether the transaction is then handed on
    whole or as its messages, and counts it open once."""
    relation = b.relation(16384, "public", "t", [("id", 23, True)])
    for between in ([], [relation]):  # whole; a Relation inside: handed on as messages
        progress = Progress(Lsn(100))
        tracker = TransactionTracker(progress)
        runs = RunDecoder(PgOutputDecoder(2), held=tracker.held)
        runs.decoder.decode(relation)
        stream = [b.begin(0x300, 7), *between, b.insert(16384, [b"1"]), b.commit(0x300, 0x310)]
        handed: list[object] = []
        for at, payload in enumerate(stream):
            for decoded in runs.push(payload, Lsn(0x200 + at)):
                tracker.observe(decoded)
                handed.append(decoded)
            progress.note_received(Lsn(0x500))  # the server's WAL end, past the commit
            if at < len(stream) - 1:
                assert progress.feedback().flush == Lsn(100), (between, at)
        assert isinstance(handed[0], WholeTransaction) is (not between)
        progress.confirm_flushed(Lsn(0x310))
        assert progress.feedback().flush == Lsn(0x500)  # idle: opened once, closed once


def test_a_transaction_read_whole_in_one_step_holds_flush_back_until_applied() -> None:
    """A small transaction all in one read (``RunDecoder.push_all``) is never counted open -
    it is handed on before the read's frames count as received - but as handed on: the slot's
    flush stays put until it is applied, then moves to what was received."""
    relation = b.relation(16384, "public", "t", [("id", 23, True)])
    progress = Progress(Lsn(100))
    tracker = TransactionTracker(progress)
    held: list[int] = []

    def hold() -> None:
        held.append(1)
        tracker.held()

    runs = RunDecoder(PgOutputDecoder(2), held=hold)
    runs.decoder.decode(relation)
    stream = [b.begin(0x300, 7), b.insert(16384, [b"1"]), b.commit(0x300, 0x310)]
    frames = [(Lsn(0x200 + at), payload) for at, payload in enumerate(stream)]
    handed = list(runs.push_all(frames))
    assert [type(d) for d in handed] == [WholeTransaction] and held == []
    for decoded in handed:
        tracker.observe(decoded)
    progress.note_received(Lsn(0x500))  # the next read: the server's WAL end, past the commit
    assert progress.feedback().flush == Lsn(100)
    progress.confirm_flushed(Lsn(0x310))
    assert progress.feedback().flush == Lsn(0x500)
