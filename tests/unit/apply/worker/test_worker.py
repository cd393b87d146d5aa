"""The apply loop with in-memory stand-ins: skip, one-at-a-time retries, resumed pieces, queue."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from apply.arrival.assembly import AssembledTransaction, Prepared, TransactionAssembler
from apply.arrival.queue import TransactionQueue
from apply.arrival.spool import SpoolDirectory, SpooledTransaction
from apply.batching.collapse import Net
from apply.batching.conflict_handling import ConflictHandling
from apply.batching.error_context import TransactionError
from apply.columns.schema import TargetSchema
from apply.core.batch import Batcher, TableFilter
from apply.core.errors import ApplyError, TargetTableError
from apply.core.records import CommitMark, Within, WriteResult
from apply.core.roles import Leader, PreparedLeftovers
from apply.core.transactions import (
    Bounds,
    MessageChange,
    PreparedFinish,
    RemoteTransaction,
    operations,
)
from apply.worker.applier import BatchApplier
from apply.worker.worker import ApplyWorker
from apply.worker.worker_hooks import CatchUpHooks, LeaderHooks
from conflicts.findings import Finding
from conflicts.report import Conflict
from conflicts.reporter import ConflictReporter
from subscriber.metrics import Metrics
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Begin, Commit, Insert, Relation
from subscriber.replication.progress import Progress
from tests.unit.apply.builders import dele, ins, relation, row, trunc, tx, upd
from tests.unit.apply.memory import MemoryCheckpoints, MemorySkip, MemoryStaging, MemoryTables

T = relation("id", "v")
S = relation("id", "v", oid=16391, name="s")  # a table a sync worker holds (``syncing``)
BATCH = Bounds(1000)


class Harness:
    """A leader's apply worker over in-memory tables, run on a thread until a position."""

    def __init__(
        self,
        tables: MemoryTables | None = None,
        *,
        bounds: Bounds = BATCH,
        skip: Lsn | None = None,
        isolate_through: Lsn | None = None,
        isolate_size: int = 1,
        checkpoint_interval: float = 0.0,
        max_delay: float = 0.05,
        queue_clock: Callable[[], float] = time.monotonic,
        spools: SpoolDirectory | None = None,
        leftovers: PreparedLeftovers | None = None,
        catch_up: bool = False,
        conflicts: ConflictHandling | None = None,
        syncing: frozenset[str] = frozenset(),
    ) -> None:
        """``syncing``: tables a sync worker holds (the leader applies none of their
        changes)."""
        self.tables = tables or MemoryTables()
        self.staging = MemoryStaging()
        self.checkpoints = MemoryCheckpoints()
        self.skip = MemorySkip(skip)
        self.synced: list[Lsn] = []  # the leader's position at each look at the tables
        self.confirmed: list[Lsn] = []  # and how far it had confirmed upstream then
        self.progress = Progress(Lsn(0))
        self.metrics = Metrics()
        self.queue = TransactionQueue(Bounds(100_000), clock=queue_clock)

        def should_apply(relation: Relation, remote: RemoteTransaction) -> bool:
            return relation.qualified_name not in syncing

        leader = Leader(
            "s",
            self.checkpoints,
            should_apply=should_apply,
            table_states=lambda: None,
            sync_tables=self._sync_tables,
            skip=self.skip,
            isolate_through=isolate_through,
            isolate_size=isolate_size,
            checkpoint_interval=checkpoint_interval,
            prepared=self.staging,
            prepared_leftovers=leftovers,
        )
        self.worker = ApplyWorker(
            "s",
            self.queue,
            applier=BatchApplier(
                "s",
                self.tables,
                lambda oid: None,
                applies=TableFilter(should_apply) if syncing else None,
                conflicts=conflicts,
            ),
            progress=self.progress,
            batcher=Batcher(bounds, max_delay=max_delay),
            hooks=CatchUpHooks() if catch_up else LeaderHooks("s", leader, self.metrics),
            spools=spools,
        )

    def _sync_tables(self, position: Lsn, confirmed: Lsn) -> None:
        self.synced.append(position)
        self.confirmed.append(confirmed)

    def run(self, *txs: AssembledTransaction, until: Lsn) -> None:
        """Apply ``txs`` until ``until`` is confirmed; the worker's error, if it fails."""
        for item in txs:
            assert self.queue.put(item, timeout=1)
        stopping, failed = threading.Event(), []

        def work() -> None:
            try:
                self.worker.run(stopping)
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=work)
        thread.start()
        try:
            for _ in range(500):
                if failed or self.progress.flushed >= until:
                    break
                threading.Event().wait(0.01)
        finally:
            stopping.set()
            thread.join()
        if failed:
            raise failed[0]
        assert self.progress.flushed >= until


class RefusesBad(MemoryTables):
    """A table that cannot hold the value 'bad' (as a value out of a column's range)."""

    def write(self, schema: TargetSchema, net: Net, mark: CommitMark, *args: object) -> WriteResult:
        for chain in getattr(net, "rows", {}).values():
            if chain.image is not None and b"bad" in chain.image.values:
                raise ApplyError("column v: a value the target type cannot hold")
        return super().write(schema, net, mark)


def test_a_skipped_transaction_is_made_durable_by_its_own_checkpoint() -> None:
    """Nothing is written for it, yet its position is recorded: it is never resent."""
    harness = Harness(skip=Lsn(200 - 8), bounds=Bounds(1))
    harness.run(tx(ins(T, 5, "conflicting"), end=200), until=Lsn(200))
    assert harness.tables.rows == {}
    assert harness.checkpoints.recorded == [Lsn(200)]
    assert harness.skip.skip_lsn is None and harness.skip.cleared == 1


def test_a_skip_that_matches_no_transaction_is_cleared_and_nothing_is_skipped() -> None:
    """A later transaction passed the skip LSN: PostgreSQL clears it with a warning."""
    harness = Harness(skip=Lsn(150), bounds=Bounds(1))
    harness.run(tx(ins(T, 1, "a"), end=100), tx(ins(T, 2, "b"), end=300), until=Lsn(300))
    assert harness.tables.keys() == [1, 2]


def test_after_a_failed_batch_transactions_are_applied_one_at_a_time_to_name_the_failing_one() -> (
    None
):
    batch = (
        tx(ins(T, 1, "a"), end=100, xid=701),
        tx(ins(T, 2, "bad"), end=200, xid=702),
        tx(ins(T, 3, "c"), end=300, xid=703),
    )
    first = Harness(RefusesBad())
    with pytest.raises(TransactionError) as err:
        first.run(*batch, until=Lsn(300))
    assert err.value.finish_lsn is None  # three transactions in one batch: which one?
    assert "in the 3 transactions finished from 0/5C to 0/124" in str(err.value)
    assert first.checkpoints.recorded == []
    # The retry, as SubscriptionRunner makes it: one transaction per batch up to the failed end.
    retry = Harness(RefusesBad(), isolate_through=err.value.batch.end_lsn)
    with pytest.raises(TransactionError) as again:
        retry.run(*batch, until=Lsn(300))
    assert again.value.finish_lsn == Lsn(200 - 8)
    assert "in transaction 702 finished at 0/C0" in str(again.value)
    assert retry.checkpoints.recorded == [Lsn(100)] and retry.tables.keys() == [1]


class ReplacedAfterItsCommit(MemoryTables):
    """Another engine renames its own commit over the one just made (Spark's local LogStore
    checks that a version is free, then renames over whatever is there by then)."""

    def write(self, schema: TargetSchema, net: Net, mark: CommitMark, *args: object) -> WriteResult:
        written = super().write(schema, net, mark)
        assert written.version is not None
        self.replaced.add(written.version)
        return written


def test_a_commit_another_engine_replaced_is_never_confirmed() -> None:
    """The batch's commit is read back before its LSN is confirmed or checkpointed: replaced,
    the batch fails (and is applied again on the table as it is), nothing is confirmed."""
    harness = Harness(ReplacedAfterItsCommit())
    with pytest.raises(TargetTableError, match="replaced"):
        harness.run(tx(ins(T, 1, "a"), end=100), until=Lsn(100))
    assert harness.progress.flushed == Lsn(0)
    assert harness.checkpoints.recorded == []


def test_a_batch_is_in_flight_until_confirmed_and_not_after_its_write_raised() -> None:
    """/healthz times the batch in flight: a write that raised leaves none behind (the
    supervisor's backoff is not a hung MERGE), nor does a confirmed one."""
    done = Harness()
    done.run(tx(ins(T, 1, "a"), end=100), until=Lsn(100))
    assert done.worker.in_flight is None and done.worker.in_flight_since is None
    failed = Harness(RefusesBad())
    with pytest.raises(TransactionError):
        failed.run(tx(ins(T, 2, "bad"), end=200), until=Lsn(200))
    assert failed.worker.in_flight is None and failed.worker.in_flight_since is None


def test_retries_halve_the_failed_batch_until_one_transaction_is_named() -> None:
    """Four transactions failed together: the retry applies two at a time (a failure that
    does not come back costs one retry), the failing pair is halved again, and the error
    then names the one transaction."""
    batch = tuple(
        tx(ins(T, n, "bad" if n == 3 else "ok"), end=100 * n, xid=700 + n) for n in (1, 2, 3, 4)
    )
    halves = Harness(RefusesBad(), isolate_through=Lsn(400), isolate_size=2)
    with pytest.raises(TransactionError) as err:
        halves.run(*batch, until=Lsn(400))
    assert "in the 2 transactions finished from" in str(err.value)
    assert halves.checkpoints.recorded == [Lsn(200)] and halves.tables.keys() == [1, 2]
    assert len(err.value.batch.transactions) == 2
    single = Harness(RefusesBad(), isolate_through=Lsn(400), isolate_size=1)
    with pytest.raises(TransactionError) as again:
        single.run(*batch[2:], until=Lsn(400))
    assert "in transaction 703 finished at" in str(again.value)


def spooled(tmp_path: Path, keys: range, end: int) -> SpooledTransaction:
    """One transaction of inserts, sent whole and spooled (it outgrew the memory bounds)."""
    assembler = TransactionAssembler(SpoolDirectory(tmp_path / "spool"), Bounds(2))
    assembler.feed(T)
    assembler.feed(Begin(Lsn(end - 8), 0, 900))
    for key in keys:
        assembler.feed(Insert(T.oid, row(key, "v")))
    made = assembler.feed(Commit(0, Lsn(end - 8), Lsn(end), 0))
    assert isinstance(made, SpooledTransaction)
    return made


def test_a_transaction_partly_applied_before_a_crash_resumes_after_the_pieces_it_has(
    tmp_path: Path,
) -> None:
    """The table committed the first piece (4 changes) before the crash; the resent
    transaction is cut into other pieces (3), and only changes 4..9 are applied."""
    tables = MemoryTables()
    tables.rows["public.t"] = {str(k).encode(): (str(k).encode(), b"v") for k in range(4)}
    tables.within["public.t"] = Within(Lsn(0x500), 4)
    harness = Harness(tables, bounds=Bounds(3))
    harness.run(spooled(tmp_path, range(10), end=0x500), until=Lsn(0x500))
    assert tables.keys() == list(range(10))  # 0..3 again would have been insert_exists
    throughs = [m.within.through for _, m in tables.commits if m.within is not None]
    # Pieces 0..2 (nothing left to apply), 3..5 (only 4 and 5), 6..8, then 9 with the LSN.
    assert throughs == [6, 9]
    assert tables.lsn["public.t"] == Lsn(0x500)
    assert harness.checkpoints.recorded == [Lsn(0x500)]  # once, with the last piece


def test_checkpoint_rows_are_recorded_at_most_every_interval_and_on_stop() -> None:
    """Each table's commits carry its LSN; the checkpoint row is for readers, not per batch."""
    harness = Harness(bounds=Bounds(1), checkpoint_interval=3600)
    harness.run(*(tx(ins(T, n, "v"), end=100 * n) for n in range(1, 4)), until=Lsn(300))
    assert harness.checkpoints.recorded == [Lsn(100), Lsn(300)]  # the first, then at stop
    assert harness.progress.flushed == Lsn(300)  # confirmed all along, not at the row


def test_what_waited_in_the_queue_is_applied_in_one_batch_at_once() -> None:
    """Three transactions queued 10 s ago: one batch with all three, without waiting
    ``max_delay`` again (the batch's age is its oldest transaction's)."""
    harness = Harness(max_delay=5.0, queue_clock=lambda: time.monotonic() - 10)
    harness.run(*(tx(ins(T, n, "v"), end=100 * n) for n in range(1, 4)), until=Lsn(300))
    assert len(harness.tables.commits) == 1 and harness.tables.keys() == [1, 2, 3]


def test_a_tables_first_write_in_the_run_is_not_held_for_max_delay_its_next_is() -> None:
    """A batch holding a table's first write in the run is due at once (its one-time costs
    are not paid after a wait of ``max_delay``, ``Batcher.hasten``); the table's next
    change waits ``max_delay`` as before."""
    harness = Harness(max_delay=30.0)
    harness.run(tx(ins(T, 1, "a"), end=100), until=Lsn(100))  # fails after 5 s, not 30
    assert harness.tables.keys() == [1]
    assert harness.queue.put(tx(ins(T, 2, "b"), end=200), timeout=1)
    stopping = threading.Event()
    thread = threading.Thread(target=harness.worker.run, args=(stopping,))
    thread.start()
    try:
        _until(lambda: not len(harness.queue))  # taken into the open batch
        time.sleep(0.2)  # a hastened batch would be written meanwhile
        assert harness.progress.flushed == Lsn(100)  # T is known now: it waits its 30 s
    finally:
        stopping.set()
        thread.join()


def test_the_queue_holds_back_wide_transactions_by_bytes() -> None:
    """A full queue by bytes refuses the next transaction until one is taken."""
    queue = TransactionQueue(Bounds(1000, size=3000))
    wide = "x" * 1000
    assert queue.put(tx(ins(T, 1, wide), ins(T, 2, wide)), timeout=0)
    assert not queue.put(tx(ins(T, 3, wide), ins(T, 4, wide), end=200), timeout=0)
    assert queue.get(timeout=0) is not None
    assert queue.put(tx(ins(T, 3, wide), ins(T, 4, wide), end=200), timeout=0)
    assert not queue.put(tx(ins(T, 5, wide), end=300), timeout=0.01)
    # Any transaction passes an empty queue, however large.
    assert queue.get(timeout=0) is not None
    assert queue.put(tx(*(ins(T, n, wide) for n in range(10)), end=400), timeout=0)


def test_a_woken_queue_ends_the_wait_under_way_and_keeps_what_it_holds() -> None:
    """``wake`` (a table moved on, a stop) ends a ``get`` at once, as a latch does."""
    queue = TransactionQueue(Bounds(1000))
    threading.Timer(0.05, queue.wake).start()
    started = time.monotonic()
    assert queue.get(timeout=30) is None
    assert time.monotonic() - started < 10
    assert queue.get(timeout=0.01) is None  # one wake ends one wait
    queue.wake()
    assert queue.put(tx(ins(T, 1, "v")), timeout=0)
    got = queue.get(timeout=0)  # what the queue holds comes first
    assert got is not None and got.tx.end_lsn == Lsn(100)
    assert queue.get(timeout=0) is None and len(queue) == 0


def finish(gid: str, *, end: int, commit: bool = True, xid: int = 700) -> PreparedFinish:
    return PreparedFinish(gid, xid, commit, Lsn(end - 8), Lsn(end), 0)


def test_a_prepared_transaction_is_staged_then_applied_at_its_commit_prepared(
    tmp_path: Path,
) -> None:
    """PREPARE: staged and confirmed, the table untouched; COMMIT PREPARED applies it in its
    place (after what committed between), then forgets the staging."""
    harness = Harness(spools=SpoolDirectory(tmp_path))
    harness.run(Prepared("g1", tx(ins(T, 1, "prepared"), end=100)), until=Lsn(100))
    assert harness.tables.rows == {} and list(harness.staging.staged) == [("s", "g1")]
    assert harness.checkpoints.recorded == [Lsn(100)]  # durable: the PREPARE is not resent
    harness.run(tx(ins(T, 2, "between"), end=200, xid=701), finish("g1", end=300), until=Lsn(300))
    assert harness.tables.keys() == [1, 2]
    assert [mark.lsn for _, mark in harness.tables.commits] == [Lsn(200), Lsn(300)]
    assert harness.staging.staged == {}


def test_a_rolled_back_prepared_transaction_applies_nothing(tmp_path: Path) -> None:
    harness = Harness(spools=SpoolDirectory(tmp_path))
    harness.run(
        Prepared("g1", tx(ins(T, 1, "undone"), end=100)),
        finish("g1", end=200, commit=False),
        until=Lsn(200),
    )
    assert harness.tables.rows == {} and harness.staging.staged == {}
    assert harness.checkpoints.recorded == [Lsn(100), Lsn(200)]


def test_a_skip_at_the_prepare_stages_it_empty_as_postgresql_prepares_it_empty(
    tmp_path: Path,
) -> None:
    harness = Harness(spools=SpoolDirectory(tmp_path), skip=Lsn(100 - 8))
    harness.run(Prepared("g1", tx(ins(T, 1, "skipped"), end=100)), until=Lsn(100))
    assert harness.skip.skip_lsn is None and harness.skip.cleared == 1
    harness.run(finish("g1", end=200), until=Lsn(200))
    assert harness.tables.rows == {}


def test_a_commit_prepared_of_a_transaction_never_staged_stops_with_what_to_do(
    tmp_path: Path,
) -> None:
    harness = Harness(spools=SpoolDirectory(tmp_path))
    with pytest.raises(ApplyError, match=r'"g9" \(xid 700\).*pgsub resync'):
        harness.run(finish("g9", end=200), until=Lsn(200))
    assert harness.progress.flushed < Lsn(200)


def test_leftover_stagings_are_forgotten_once_the_flush_passes_where_they_were_seen(
    tmp_path: Path,
) -> None:
    """A staging whose finish was applied before a crash is forgotten only past ``seen_at``:
    before it, its COMMIT PREPARED could still come; the xid guards against a reused gid."""
    leftovers = PreparedLeftovers((("old", 600), ("reused", 601)), seen_at=Lsn(300))
    harness = Harness(spools=SpoolDirectory(tmp_path), leftovers=leftovers)
    harness.staging.staged[("s", "old")] = (600, [])
    harness.staging.staged[("s", "reused")] = (602, [])  # prepared again since: kept
    harness.run(tx(ins(T, 1, "a"), end=200), until=Lsn(200))
    assert set(harness.staging.staged) == {("s", "old"), ("s", "reused")}
    harness.run(tx(ins(T, 2, "b"), end=300), until=Lsn(300))
    harness.run(tx(ins(T, 3, "c"), end=400), until=Lsn(400))  # next time round the loop
    assert set(harness.staging.staged) == {("s", "reused")}


def applied_changes(harness: Harness) -> float | None:
    return harness.metrics.registry.get_sample_value(
        "pgsub_changes_applied_total", {"subscription": "s", "op": "INSERT"}
    )


def test_a_catch_up_applies_and_confirms_but_leaves_the_subscription_to_the_leader(
    tmp_path: Path,
) -> None:
    """A table-sync worker's catch-up (``CatchUpHooks``): its tables committed and its flush
    confirmed, but no checkpoint row, no table-state step, no skip, no metrics; a prepared
    transaction is an error (two-phase is the leader's)."""
    leader = Harness(skip=Lsn(100 - 8))
    leader.run(tx(ins(T, 1, "a"), end=100), tx(ins(T, 2, "b"), end=200), until=Lsn(200))
    assert leader.tables.keys() == [2]  # the leader skipped the first
    assert leader.checkpoints.recorded and leader.synced and applied_changes(leader) == 1

    catch_up = Harness(skip=Lsn(100 - 8), catch_up=True, spools=SpoolDirectory(tmp_path))
    catch_up.run(tx(ins(T, 1, "a"), end=100), tx(ins(T, 2, "b"), end=200), until=Lsn(200))
    assert catch_up.tables.keys() == [1, 2]
    assert catch_up.checkpoints.recorded == [] and catch_up.synced == []
    assert applied_changes(catch_up) is None
    with pytest.raises(ApplyError, match="two-phase is off"):
        catch_up.run(Prepared("g1", tx(ins(T, 3, "p"), end=300)), until=Lsn(300))


def test_the_leader_looks_at_the_tables_to_sync_as_it_starts_not_after_a_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sync workers start with the leader, not at its first idle tick: that came after the
    queue's first wait, half a second (0.6 s of a 2M-row table's 3.3 s to READY)."""
    harness = Harness()
    looks_before_the_first_wait: list[int] = []
    get = harness.queue.get

    def first_wait_noted(*args: Any, **kwargs: Any) -> Any:
        if not looks_before_the_first_wait:
            looks_before_the_first_wait.append(len(harness.synced))
        return get(*args, **kwargs)

    monkeypatch.setattr(harness.queue, "get", first_wait_noted)
    harness.run(tx(ins(T, 1, "a"), end=100), until=Lsn(100))
    assert looks_before_the_first_wait == [1]
    assert harness.synced[0] == Lsn(0)  # the position confirmed so far


class HeldWrites(MemoryTables):
    """Every write waits until released: what arrives meanwhile forms the next batch."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.release = threading.Event()

    def write(self, schema: TargetSchema, net: Net, mark: CommitMark, *args: Any) -> WriteResult:
        self.writing.set()
        assert self.release.wait(10)
        return super().write(schema, net, mark, *args)


@contextlib.contextmanager
def _first_held(
    harness: Harness, tables: HeldWrites, first: AssembledTransaction
) -> Iterator[None]:
    """The worker running for the block, the write of its first batch (``first``) held
    until ``tables.release`` is set; stopped after it."""
    stopping = threading.Event()
    thread = threading.Thread(target=harness.worker.run, args=(stopping,))
    assert harness.queue.put(first, timeout=1)
    thread.start()
    try:
        assert tables.writing.wait(10)
        yield
    finally:
        tables.release.set()
        stopping.set()
        thread.join()


def test_the_next_batch_forms_while_one_is_written_and_lands_as_it_would_have() -> None:
    tables = HeldWrites()
    harness = Harness(tables, max_delay=0.0)
    with capture_logs() as logs, _first_held(harness, tables, tx(ins(T, 1, "a"), end=100)):
        assert harness.queue.put(tx(upd(T, 1, "b"), end=200), timeout=1)
        assert harness.queue.put(tx(ins(T, 2, "c"), end=300), timeout=1)
        deadline = time.monotonic() + 10
        while len(harness.queue) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not len(harness.queue), "taken while the first batch was written"
        tables.release.set()
        while harness.progress.flushed < Lsn(300) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert harness.progress.flushed == Lsn(300)
    assert tables.rows["public.t"] == {b"1": (b"1", b"b"), b"2": (b"2", b"c")}
    batches = [e for e in logs if e["event"] == "batch applied"]
    assert [(e["transactions"], e["formed_ahead"]) for e in batches] == [(1, False), (2, True)]


def test_a_batch_whose_writes_are_done_is_confirmed_before_a_backlog_queued_meanwhile_is_formed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a batch is written, 1,000 transactions queue, each 2 ms to form: once the
    write is done, the batch is confirmed after a look or two (``FORM_EVERY``), not once
    all of them have joined the next batch (2 s), and every row lands."""
    tables = HeldWrites()
    harness = Harness(tables, bounds=Bounds(100_000), max_delay=0.0)
    formed: list[Lsn] = []
    add = harness.worker._add

    def slow_add(queued: Any, skip: Any) -> Any:
        formed.append(queued.tx.end_lsn)
        time.sleep(0.002)
        return add(queued, skip)

    monkeypatch.setattr(harness.worker, "_add", slow_add)
    stopping = threading.Event()
    thread = threading.Thread(target=harness.worker.run, args=(stopping,))
    assert harness.queue.put(tx(ins(T, 1, "a"), end=100), timeout=1)
    thread.start()
    try:
        assert tables.writing.wait(10)
        backlog = [tx(ins(T, n, "v"), end=100 * n) for n in range(2, 1002)]
        assert harness.queue.put_all(backlog, timeout=1) == len(backlog)
        _until(lambda: len(formed) > 2)  # the backlog is being formed: the write ends now
        tables.release.set()
        _until(lambda: harness.progress.flushed >= Lsn(100))
        formed_when_confirmed = len(formed)
        _until(lambda: harness.progress.flushed >= Lsn(100_100))
    finally:
        tables.release.set()
        stopping.set()
        thread.join()
    assert formed_when_confirmed < 500, formed_when_confirmed
    assert harness.tables.keys() == list(range(1, 1002))


def test_a_run_is_queued_as_far_as_there_is_room_and_taken_back_in_order() -> None:
    """``put_all`` queues a run up to the bounds (the first always, into an empty queue);
    ``take`` hands a run on under one lock, and what ``give_back`` returns comes first
    again, in its order, with the bounds' counts restored."""
    queue = TransactionQueue(Bounds(3))
    run = [tx(ins(T, n, "v"), end=100 * n) for n in range(1, 6)]
    assert queue.put_all(run, timeout=0) == 3
    assert queue.put_all(run[3:], timeout=0.01) == 0  # full: 3 changes of 3
    taken = queue.take(10, accept=lambda tx: True)
    assert [q.tx.end_lsn for q in taken] == [Lsn(100), Lsn(200), Lsn(300)]
    queue.give_back(taken[1:])
    assert queue.put_all(run[3:], timeout=0) == 1  # room for one: two given back
    assert [q.tx.end_lsn for q in queue.take(10, accept=lambda tx: True)] == [
        Lsn(200),
        Lsn(300),
        Lsn(400),
    ]
    assert queue.take(10, accept=lambda tx: tx.end_lsn < Lsn(500)) == []


def test_a_backlog_longer_than_a_run_is_batched_to_its_bounds_in_commit_order() -> None:
    """600 queued transactions, taken from the queue by runs of ``RUN``: the first batch
    closes at its bounds (250 changes) in the middle of a run, the rest of the run waits in
    the queue in its order for the next (formed while the first is written, it may grow to
    four times the bounds: ``Batcher``), and every row lands."""
    harness = Harness(bounds=Bounds(250), max_delay=0.0)
    harness.run(*(tx(ins(T, n, "v"), end=100 * n) for n in range(1, 601)), until=Lsn(60_000))
    assert harness.tables.keys() == list(range(1, 601))
    marks = [mark.lsn for _, mark in harness.tables.commits]
    assert marks[0] == Lsn(25_000) and marks[-1] == Lsn(60_000) and marks == sorted(marks)


U = relation("id", "v", oid=16390, name="u")


class GatedWrites(MemoryTables):
    """One writer; a table's write waits at its gate, if it has one, once it started."""

    writers = 1

    def __init__(self) -> None:
        super().__init__()
        self.gates: dict[str, threading.Event] = {}
        self.writing: dict[str, threading.Event] = {}

    def write(self, schema: TargetSchema, net: Net, mark: CommitMark, *args: Any) -> WriteResult:
        gate = self.gates.get(schema.table)
        if gate is not None:
            self.writing.setdefault(schema.table, threading.Event()).set()
            assert gate.wait(10)
        return super().write(schema, net, mark, *args)

    def started(self, table: str) -> bool:
        return self.writing.setdefault(table, threading.Event()).wait(10)


def _errors(worker: ApplyWorker, stopping: threading.Event) -> list[BaseException]:
    """Run ``worker`` until ``stopping``; the error it ended with, if any."""
    try:
        worker.run(stopping)
    except BaseException as exc:
        return [exc]
    return []


def _until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_tables_are_looked_at_with_what_was_confirmed_past_the_batch() -> None:
    """While a batch is written, a transaction of a table a sync worker holds arrives: the
    leader skips its change and confirms the transaction as the batch's write ends. The
    look at the tables after the batch (``sync_tables``) is told so: a sync worker waiting
    for CATCHUP must catch up that far, or the change - never sent again - is lost (CI,
    2026-12-02: a table handed over after a kill missed a row)."""
    tables = GatedWrites()
    harness = Harness(
        tables, max_delay=0.0, checkpoint_interval=3600, syncing=frozenset({"public.s"})
    )
    stopping = threading.Event()
    thread = threading.Thread(target=harness.worker.run, args=(stopping,))
    gate = threading.Event()
    try:
        assert harness.queue.put(tx(ins(T, 0, "z"), end=50), timeout=1)
        thread.start()
        _until(lambda: harness.progress.flushed >= Lsn(50))  # the table known, a row made
        tables.gates["public.t"] = gate
        assert harness.queue.put(tx(ins(T, 1, "a"), end=100), timeout=1)
        assert tables.started("public.t")
        assert harness.queue.put(tx(ins(S, 1, "a"), end=200), timeout=1)
        _until(lambda: not len(harness.queue))  # formed while the batch is written
        gate.set()
        _until(lambda: Lsn(100) in harness.synced)
    finally:
        gate.set()
        stopping.set()
        thread.join()
    look = harness.synced.index(Lsn(100))  # the look after the batch ending at 100
    assert harness.confirmed[look] == Lsn(200)  # the skipped transaction, confirmed
    assert "public.s" not in tables.rows


def _t_then_u_while_batch_two_arrives(checkpoint_interval: float) -> tuple[GatedWrites, Harness]:
    """Batch 1 writes t, then u (one writer); while t is written, changes of both arrive
    for batch 2. The flush moves as each write ends durable - to the last transaction
    before the first change still unwritten (100, while u's is held) - not at the batch's
    end; then to batch 2's end."""
    tables = GatedWrites()
    harness = Harness(tables, max_delay=0.0, checkpoint_interval=checkpoint_interval)
    stopping = threading.Event()
    thread = threading.Thread(target=harness.worker.run, args=(stopping,))
    a, b = threading.Event(), threading.Event()
    try:
        assert harness.queue.put(tx(ins(T, 0, "z"), ins(U, 0, "z"), end=50), timeout=1)
        thread.start()
        _until(lambda: harness.progress.flushed >= Lsn(50))  # both tables known, a row made
        tables.gates.update({"public.t": a, "public.u": b})
        assert harness.queue.put_all([tx(ins(T, 1, "a"), end=100), tx(ins(U, 1, "a"), end=200)], 1)
        assert tables.started("public.t")
        harness.queue.put_all([tx(upd(T, 1, "b"), end=300), tx(ins(U, 2, "c"), end=400)], 1)
        _until(lambda: not len(harness.queue))  # in the forming batch 2
        a.set()
        assert tables.started("public.u")
        _until(lambda: harness.progress.flushed >= Lsn(100))
        time.sleep(0.2)
        assert harness.progress.flushed == Lsn(100)  # u's changes from LSN 200 are unwritten
        b.set()
        _until(lambda: harness.progress.flushed >= Lsn(400))
    finally:
        a.set()
        b.set()
        stopping.set()
        thread.join()
    assert tables.rows["public.t"] == {b"0": (b"0", b"z"), b"1": (b"1", b"b")}
    assert tables.rows["public.u"] == {b"0": (b"0", b"z"), b"1": (b"1", b"a"), b"2": (b"2", b"c")}
    return tables, harness


def test_a_tables_write_takes_what_arrived_for_it_and_the_flush_moves_before_the_batch_ends() -> (
    None
):
    """u's write, starting after batch 2's changes arrived, takes u's and commits u at
    their last transaction; t's, started before, leaves t's to batch 2. No checkpoint row
    is recorded at a batch whose commits ran ahead."""
    tables, harness = _t_then_u_while_batch_two_arrives(checkpoint_interval=3600)
    commits = [(table, mark.lsn) for table, mark in tables.commits]
    assert commits == [
        ("public.t", Lsn(50)),
        ("public.u", Lsn(50)),
        ("public.t", Lsn(200)),  # at batch 1's end
        ("public.u", Lsn(400)),  # batch 1's change and the one it took of batch 2
        ("public.t", Lsn(400)),  # batch 2: t's change only
    ]
    # No row at 200 (u's version held 400's change); batch 2 took nothing: its row, on stop.
    assert harness.checkpoints.recorded == [Lsn(50), Lsn(400)]


def test_the_checkpoint_rows_batch_takes_nothing_yet_its_flush_moves_as_its_writes_end() -> None:
    """A row due at every batch: no write takes what arrived for the next batch (the row's
    versions hold nothing past its LSN), yet the flush moves as each write ends durable -
    it used to stand still for the row's batch, a bump in the lag of about one batch once
    per ``checkpoint_interval``."""
    tables, harness = _t_then_u_while_batch_two_arrives(checkpoint_interval=0.0)
    commits = [(table, mark.lsn) for table, mark in tables.commits]
    assert commits == [
        ("public.t", Lsn(50)),
        ("public.u", Lsn(50)),
        ("public.t", Lsn(200)),
        ("public.u", Lsn(200)),  # took nothing of batch 2
        ("public.t", Lsn(400)),
        ("public.u", Lsn(400)),
    ]
    assert harness.checkpoints.recorded[:3] == [Lsn(50), Lsn(200), Lsn(400)]


def test_a_conflict_in_a_change_taken_ahead_names_its_own_transaction() -> None:
    tables = GatedWrites()
    harness = Harness(tables, max_delay=0.0, checkpoint_interval=3600)
    stopping, failed = threading.Event(), []
    a = threading.Event()
    thread = threading.Thread(target=lambda: failed.extend(_errors(harness.worker, stopping)))
    try:
        assert harness.queue.put(tx(ins(T, 0, "z"), ins(U, 0, "z"), end=50), timeout=1)
        thread.start()
        _until(lambda: harness.progress.flushed >= Lsn(50))
        tables.gates["public.t"] = a
        assert harness.queue.put_all([tx(ins(T, 1, "a"), end=100), tx(ins(U, 1, "a"), end=200)], 1)
        assert tables.started("public.t")
        harness.queue.put_all([tx(ins(U, 0, "again"), end=300, xid=733)], 1)
        _until(lambda: not len(harness.queue))
        a.set()
        _until(lambda: bool(failed))
    finally:
        a.set()
        stopping.set()
        thread.join()
    error = failed[0]
    assert isinstance(error, TransactionError)
    assert error.tx is not None and error.tx.xid == 733 and error.finish_lsn == Lsn(300 - 8)
    assert harness.progress.flushed == Lsn(100)  # t's write ended; u's failed: not past it


class MissingTwo(HeldWrites):
    """Row 2's write meets update_missing (another writer deleted it), resolved and written."""

    def write(self, schema: TargetSchema, net: Net, mark: CommitMark, *args: Any) -> WriteResult:
        written = super().write(schema, net, mark, *args)
        missing = [
            Finding("update_missing", r.first_tx, r.key, r.image, None)
            for r in getattr(net, "rows", {}).values()
            if r.key[0] == b"2"
        ]
        return WriteResult(written.table, written.version, conflicts=tuple(missing))


class FlushAtReport(ConflictReporter):
    """Records, with each conflict, the position confirmed upstream as it was reported."""

    def __init__(self, progress: Progress) -> None:
        super().__init__("s", Metrics(), None)
        self.progress = progress
        self.flushed_at: list[tuple[str, Lsn]] = []

    def report(self, conflicts: Sequence[Conflict]) -> None:
        self.flushed_at.extend((c.kind.value, self.progress.flushed) for c in conflicts)
        super().report(conflicts)


def test_a_conflict_is_reported_before_its_transaction_is_confirmed() -> None:
    """A batch formed while the last was written confirms its transactions as its writes
    end; its conflicts (the log, the counter, the conflict table) are reported before that,
    as PostgreSQL reports before its flush moves - once, not again when the batch ends."""
    tables = MissingTwo()
    reporter = FlushAtReport(Progress(Lsn(0)))
    handling = ConflictHandling(reporter=reporter)
    # No checkpoint row due (its batch takes nothing ahead).
    harness = Harness(tables, max_delay=0.0, checkpoint_interval=3600, conflicts=handling)
    reporter.progress = harness.progress  # the worker's own
    with capture_logs() as logs, _first_held(harness, tables, tx(ins(T, 1, "a"), end=100)):
        assert harness.queue.put(tx(upd(T, 2, "b"), end=200), timeout=1)
        _until(lambda: not len(harness.queue))  # formed while the first is written
        tables.release.set()
        _until(lambda: harness.progress.flushed >= Lsn(200))
    batches = [e for e in logs if e["event"] == "batch applied"]
    assert [e["formed_ahead"] for e in batches] == [False, True]
    assert reporter.flushed_at == [("update_missing", Lsn(100))]


def test_a_batchs_changes_are_counted_by_operation() -> None:
    """What ``pgsub_changes_applied_total`` counts of a batch: row changes by their
    operation, a TRUNCATE and a logical decoding message by theirs."""
    message = MessageChange(Lsn(0x60), True, "app", b"x")
    counted = operations(
        [
            tx(ins(T, 1, "a"), upd(T, 1, "b"), ins(T, 2, "c"), end=100),
            tx(dele(T, 2), trunc(T), message, end=200),
            tx(end=300),
        ]
    )
    assert counted == {"INSERT": 2, "UPDATE": 1, "DELETE": 1, "TRUNCATE": 1, "MESSAGE": 1}
