"""The leader's apply loop: complete transactions in, durable progress out.

The receiver thread assembles transactions and puts them on a
``TransactionQueue``; ``ApplyWorker`` takes them in commit order, forms
batches (``batch.max_changes``, ``max_bytes``, ``max_delay``), applies each to
Delta, records the checkpoint and only then confirms the batch's end LSN to
``Progress`` - the position the receiver reports upstream as flushed. The
queue is bounded by changes, so a slow apply holds back reading (the
receiver keeps answering keepalives while it waits).

After a failed batch, the next attempt applies batches of at most half as
many transactions up to the failed batch's end, and so on after each
failure, until the error names exactly one remote transaction - the one
``pgsub skip`` would skip. A failure that does not come back (the JVM short
of memory) costs one retry, not one batch per transaction.

A spooled transaction (streamed, or larger than a batch) is applied alone,
a piece within the batch bounds at a time read back from its file:
each piece is one Delta commit per table it touches, marked with how far
into the transaction the table is, so that after a crash the resent
transaction resumes per table where it stopped. Only its last piece
records the checkpoint and confirms the transaction upstream.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import structlog

from apply.arrival.assembly import AssembledTransaction, Prepared
from apply.arrival.queue import Queued, TransactionQueue, in_memory_transaction
from apply.arrival.spool import SpoolDirectory, SpooledTransaction, read_changes
from apply.arrival.spool_frames import changes_of, frames_of
from apply.batching.forming import Formed
from apply.core.batch import Batch, Batcher
from apply.core.errors import ApplyError
from apply.core.failpoints import failpoint
from apply.core.records import BatchResult
from apply.core.roles import PreparedTransactions
from apply.core.transactions import (
    Change,
    PreparedFinish,
    RemoteTransaction,
    RowChange,
    TruncateChange,
    operations,
)
from apply.worker.applier import BatchApplier
from apply.worker.worker_hooks import WorkerHooks
from apply.worker.writes_ahead import FORM_EVERY, Ahead, WhileWriting
from subscriber.replication.lsn import Lsn
from subscriber.replication.progress import Progress

log = structlog.get_logger(__name__)

RUN = 256  # the most transactions taken from the queue under one lock


class ApplyWorker:
    """The apply loop of one pipeline; ``hooks`` do what differs between the leader and a
    table-sync worker's catch-up (``apply.worker.worker_hooks``)."""

    def __init__(
        self,
        subscription: str,
        queue: TransactionQueue,
        *,
        applier: BatchApplier,
        progress: Progress,
        batcher: Batcher,
        hooks: WorkerHooks,
        spools: SpoolDirectory | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.subscription = subscription
        self._queue = queue
        self._applier = applier
        self._progress = progress
        self._batcher = batcher
        self._hooks = hooks
        self._spools = spools  # where a prepared transaction is spooled back at its commit
        self._isolate_through = hooks.isolate_through
        self._isolate_size = hooks.isolate_size
        self._leftovers = hooks.leftovers
        self._clear_skip_at: Lsn | None = None
        self._wall_clock = wall_clock
        self.last_commit_time: int | None = None
        self.versions: dict[str, int] = {}  # each table's last Delta version this worker made
        self.in_flight: Batch | None = None
        self.in_flight_since: float | None = None  # Unix time the batch in flight began

    def run(self, stopping: threading.Event) -> None:
        batcher = self._batcher
        # The leader's first look at the tables to sync (their workers started) comes now,
        # not at its first idle tick half a second on: 0.6 of a 2M-row sync's 3.3 s to READY.
        self._hooks.idle(self._progress.flushed)
        while not stopping.is_set():
            self._forget_leftovers()
            wait = batcher.time_left() if len(batcher) else 0.5
            queued = self._queue.get(timeout=max(0.0, min(wait, 0.5)))
            tx = queued.tx if queued is not None else None
            if isinstance(tx, SpooledTransaction | Prepared | PreparedFinish):
                if len(batcher):  # what came before it is applied first: commit order
                    self._apply_formed(forming_next=False)
                if isinstance(tx, Prepared):
                    self._stage_prepared(tx)
                elif isinstance(tx, PreparedFinish):
                    self._finish_prepared(tx, stopping)
                else:
                    self._apply_spooled(tx, stopping)
                continue
            if queued is not None:
                self._add(queued, self._hooks.skip_lsn)
                # What else is waiting joins this batch first: a batch due by the age of its
                # oldest transaction takes everything that arrived while the last one applied.
                tx = self._add_waiting(tx)
            else:
                self._hooks.refresh_skip()
            if len(batcher) and (batcher.due() or self._isolating(tx)):
                self._apply_formed(forming_next=True)
            elif tx is None and not len(batcher):
                # Idle: the position is everything received (PostgreSQL's last_received).
                self._hooks.idle(self._progress.done_through)
        self._hooks.record_checkpoint()  # a clean stop: the next start resumes exactly here

    def _add(self, queued: Queued, skip: Lsn | None) -> None:
        """``queued`` joins the open batch; ``skip``: the skip LSN (``_skipping``)."""
        tx = queued.tx
        assert isinstance(tx, RemoteTransaction)
        if skip is not None and self._skipping(tx, len(tx.changes), skip):
            tx = replace(tx, changes=(), size=0)
        self._batcher.add(tx, arrived=queued.arrived)
        forming = self._applier.forming
        forming.add(tx)
        if forming.first_write:
            self._batcher.hasten()

    def _apply_formed(self, *, forming_next: bool) -> None:
        """The open batch, with its work as it formed; ``forming_next``: the next one forms
        while it is written."""
        batch = self._batcher.take()
        formed = self._applier.forming.take(batch)
        if forming_next:
            self._apply(batch, formed, self._take_arrived, self._ahead())
        else:
            self._apply(batch, formed)

    def _ahead(self) -> Ahead | None:
        """Whether the batch's writes take what arrives for their tables meanwhile and
        confirm what they made durable as they end (``Ahead``): not while batches are
        isolated after a failure or a skip is set. When the checkpoint row is due they take
        nothing (its versions hold nothing past its LSN) but still confirm as they end: the
        flush does not stand still for the row's batch."""
        hooks = self._hooks
        if not hooks.runs_ahead or hooks.skip_lsn is not None:
            return None
        if self._isolate_through is not None or self._clear_skip_at is not None:
            return None
        return Ahead(self._confirm_ahead, takes=not hooks.row_due)

    def _confirm_ahead(self, lsn: Lsn) -> None:
        """Every transaction through ``lsn`` is durable in every table it changes, though
        the batch being written has tables left (``Ahead``)."""
        if self._clear_skip_at is not None and lsn >= self._clear_skip_at:
            return  # a skip is confirmed with its checkpoint row
        if lsn > self._progress.flushed:
            self._progress.confirm_flushed(lsn)

    def _take_arrived(self) -> bool:
        """While a batch is written: the transactions queued since the last look join the
        next batch (``apply.batching.forming``), for ``FORM_EVERY`` seconds at most a look, so
        that a batch whose writes are done is finished then - confirmed, and the next one
        written - and not once a backlog queued meanwhile is formed. False: the next batch
        takes no more now - it is full, the queue's next transaction is spooled or prepared,
        or batches are being isolated."""
        if self._isolate_through is not None:
            return False
        until = time.monotonic() + FORM_EVERY
        self._add_waiting(None, until)
        if self._batcher.full():
            return False
        return not len(self._queue) or time.monotonic() >= until  # out of time: more later

    def _add_waiting(
        self, tx: AssembledTransaction | None, until: float | None = None
    ) -> AssembledTransaction | None:
        """Adds the queued transactions held in memory to the open batch, until it is full or
        one to isolate is in it, or (a monotonic time) ``until``; the last one added (``tx``
        if none). They are taken by runs: one lock, not one a transaction (a backlog of
        single-row ones is 200,000 of them)."""
        while True:
            run = self._queue.take(RUN, accept=in_memory_transaction)
            skip = self._hooks.skip_lsn  # read once a run: a look at the settings each
            for n, queued in enumerate(run):
                if self._batcher.full() or self._isolating(tx):
                    self._queue.give_back(run[n:])
                    return tx
                self._add(queued, skip)
                tx = queued.tx
            if len(run) < RUN or (until is not None and time.monotonic() >= until):
                return tx

    def _skipping(self, tx: AssembledTransaction, changes: int, skip: Lsn | None = None) -> bool:
        """``pgsub skip``: whether ``tx`` finishes at the skip LSN (it is applied as empty);
        ``skip``: that LSN as read for a run of transactions (None: read it now)."""
        if skip is None:
            skip = self._hooks.skip_lsn
        if skip is None or self._clear_skip_at is not None or tx.final_lsn < skip:
            return False
        self._clear_skip_at = tx.end_lsn
        if tx.final_lsn == skip:
            log.info(
                f"logical replication starts skipping transaction at LSN {skip}",
                subscription=self.subscription,
                xid=tx.xid,
                changes=changes,
            )
            return True
        log.warning(
            f'skip-LSN of subscription "{self.subscription}" cleared',
            detail=f"Remote transaction's finish WAL location (LSN) {tx.final_lsn} did not "
            f"match skip-LSN {skip}.",
        )
        return False

    def _apply_spooled(self, tx: SpooledTransaction, stopping: threading.Event) -> None:
        if self._skipping(tx, tx.change_count):
            self._warn_applied_pieces(tx)
            tx.discard()
            self._apply(Batch([tx.head]))
            return
        if self._apply_whole(tx):
            tx.discard()
            return
        for piece in tx.pieces(self._batcher.base):
            if stopping.is_set():
                return  # not confirmed: the publisher sends it again
            if not piece.partial:
                self._apply(Batch([piece]))
                break
            self._apply_piece(Batch([piece]))
        tx.discard()

    def _apply_whole(self, tx: SpooledTransaction) -> bool:
        """The transaction in one commit per table, when the applier can
        (``apply.plans.staging``)."""
        batch = Batch([tx.head])
        with self._in_flight(batch) as started:
            # Counted as each piece passes (holding the pieces would hold the transaction).
            counts: Counter[str] = Counter()
            result = self._applier.apply_whole(tx, self._batcher.base, counts.update)
            if result is None:
                return False
            self._hooks.counted(counts)
            self._finish(batch, result, started, changes=tx.change_count)
        return True

    def _prepared(self) -> PreparedTransactions:
        staging = self._hooks.prepared()
        if self._spools is None:
            raise ApplyError("a prepared transaction arrived but this worker spools nothing")
        return staging

    def _stage_prepared(self, prepared: Prepared) -> None:
        """PREPARE: stage the transaction durably, then confirm past it (it no longer holds
        back the flush of what commits after it)."""
        tx = prepared.tx
        changes: Iterable[Change] = (
            tx.changes if isinstance(tx, RemoteTransaction) else read_changes(tx.path)
        )
        # Skipped (`pgsub skip` at the PREPARE's LSN): staged empty, as PostgreSQL prepares
        # an empty transaction, so that its COMMIT PREPARED finds it.
        count = tx.change_count if isinstance(tx, SpooledTransaction) else len(tx.changes)
        if self._skipping(tx, count):
            changes = ()
        frames = self._prepared().stage(
            self.subscription, prepared.gid, tx.xid, tx.end_lsn, frames_of(changes)
        )
        if isinstance(tx, SpooledTransaction):
            tx.discard()
        failpoint("apply.after_prepare_staged")
        self._record_and_confirm(tx.end_lsn, tx.commit_time)
        self._skip_done(tx.end_lsn)
        log.info(
            "prepared transaction staged",
            subscription=self.subscription,
            gid=prepared.gid,
            xid=tx.xid,
            frames=frames,
            end_lsn=str(tx.end_lsn),
        )

    def _finish_prepared(self, finish: PreparedFinish, stopping: threading.Event) -> None:
        """COMMIT PREPARED: apply the staged transaction, in commit order; ROLLBACK PREPARED:
        drop it. Its staging is forgotten only once its checkpoint records the finish, so
        that a resent finish never finds it gone."""
        staging = self._prepared()
        if finish.commit:
            frames = staging.frames(self.subscription, finish.gid)
            if frames is None:
                raise ApplyError(
                    f'prepared transaction "{finish.gid}" (xid {finish.xid}) is committed '
                    "on the publisher but was never staged here; resync the subscription's "
                    "tables (`pgsub resync`)"
                )
            head = RemoteTransaction(
                finish.xid, finish.final_lsn, finish.end_lsn, finish.commit_time, ()
            )
            self._apply_staged(head, frames, stopping)
            if stopping.is_set() and self._progress.flushed < finish.end_lsn:
                return  # not applied: sent again
        self._record_and_confirm(finish.end_lsn, finish.commit_time)
        failpoint("apply.before_prepared_forgotten")
        staging.forget(self.subscription, finish.gid, finish.xid)
        log.info(
            "prepared transaction committed"
            if finish.commit
            else "prepared transaction rolled back",
            subscription=self.subscription,
            gid=finish.gid,
            xid=finish.xid,
            end_lsn=str(finish.end_lsn),
        )

    def _apply_staged(
        self, head: RemoteTransaction, frames: Iterable[bytes], stopping: threading.Event
    ) -> None:
        """A staged transaction, spooled back to local disk and applied as any spooled one
        (in pieces if it is large; resumed where a table's last piece ended)."""
        assert self._spools is not None
        spool = self._spools.open(f"prepared-{head.xid}", head.xid)
        for change in changes_of(frames):
            spool.append(change)
        spool.close()
        if not spool.changes:  # empty (all of it skipped at its PREPARE)
            spool.discard()
            self._apply(Batch([head]))
            return
        self._spools.track(spool)
        tx = SpooledTransaction(head, spool.path, spool.changes, self._spools.release)
        self._apply_spooled(tx, stopping)

    def _record_and_confirm(self, lsn: Lsn, commit_time: int) -> None:
        """A checkpoint row at ``lsn`` now, then ``lsn`` confirmed upstream."""
        self._hooks.applied(lsn, commit_time, {}, now=True)
        self._progress.confirm_flushed(lsn)

    def _forget_leftovers(self) -> None:
        """Stagings of prepared transactions finished before ``seen_at`` (``PreparedLeftovers``),
        once the flush has passed it."""
        leftovers = self._leftovers
        if leftovers is None or self._progress.done_through < leftovers.seen_at:
            return
        self._leftovers = None
        staging = self._prepared()
        for gid, xid in leftovers.stagings:
            staging.forget(self.subscription, gid, xid)
            log.info(
                "staging of a finished prepared transaction removed",
                subscription=self.subscription,
                gid=gid,
                xid=xid,
                detail="a stop between applying its finish and removing its staging left it",
            )

    def _warn_applied_pieces(self, tx: SpooledTransaction) -> None:
        """Pieces committed before the error that led to the skip stay: a Delta commit is final."""
        tables = {
            relation.qualified_name
            for piece in tx.pieces(self._batcher.base)
            for change in piece.changes
            for relation in (
                (change.relation,)
                if isinstance(change, RowChange)
                else change.relations
                if isinstance(change, TruncateChange)
                else ()
            )
        }
        for table in sorted(tables):
            through = self._applier.applied_through(table, tx.end_lsn)
            if through:
                log.warning(
                    "skipped transaction was partly applied before",
                    subscription=self.subscription,
                    table=table,
                    xid=tx.xid,
                    applied_through=through,
                    of=tx.change_count,
                    detail="Its first pieces were committed to the table before the error; "
                    "they stay. Resync the table for it to equal the publisher.",
                )

    def _apply_piece(self, batch: Batch) -> None:
        """A piece that leaves its transaction open: committed per table, confirmed nowhere."""
        with self._in_flight(batch) as started:
            self._applier.apply(batch)
            failpoint("apply.after_piece")
        piece = batch.transactions[0]
        self._hooks.counted(operations(batch.transactions))
        log.info(
            "transaction piece applied",
            subscription=self.subscription,
            xid=piece.xid,
            through=piece.first + len(piece.changes),
            of=piece.total,
            seconds=round(time.monotonic() - started, 3),
            end_lsn=str(piece.end_lsn),
        )

    def _isolating(self, tx: AssembledTransaction | None) -> bool:
        """Whether the batch holding ``tx`` is to be applied now: after a failure, batches
        up to the failed one's end hold at most ``isolate_size`` transactions."""
        return (
            self._isolate_through is not None
            and tx is not None
            and tx.end_lsn <= self._isolate_through
            and len(self._batcher) >= self._isolate_size
        )

    def _apply(
        self,
        batch: Batch,
        formed: Formed | None = None,
        while_writing: WhileWriting | None = None,
        ahead: Ahead | None = None,
    ) -> None:
        with self._in_flight(batch) as started:
            result = self._applier.apply(batch, formed, while_writing, ahead)
            self._hooks.counted(operations(batch.transactions))
            self._finish(batch, result, started, changes=batch.change_count)
        self._batcher.applied(time.monotonic() - started)

    @contextmanager
    def _in_flight(self, batch: Batch) -> Iterator[float]:
        """``batch`` is in flight (what ``/healthz``'s watchdog times) until its flush is
        confirmed, or until its write raises; yields the monotonic time it began."""
        self.in_flight = batch
        self.in_flight_since = self._wall_clock()
        try:
            yield time.monotonic()
        finally:
            self.in_flight = None
            self.in_flight_since = None

    def _finish(self, batch: Batch, result: BatchResult, started: float, *, changes: int) -> None:
        """After the tables committed: checkpoint, confirm upstream, observe."""
        self._applier.verify(result)  # each commit still the one made (not replaced since)
        failpoint("apply.before_checkpoint")
        self.versions.update(result.versions)
        skipped = self._clear_skip_at is not None and batch.end_lsn >= self._clear_skip_at
        if result.tables or skipped:
            # A skipped transaction writes nothing, but its checkpoint is what makes the skip
            # durable: below the origin LSN, it is never sent again (see SubscriptionRunner).
            self._hooks.applied(
                batch.end_lsn,
                batch.commit_time,
                result.versions,
                now=skipped,
                ahead=result.ahead > 0,
            )
        failpoint("apply.before_flush_report")
        if batch.end_lsn > self._progress.flushed:  # not confirmed already as it was written
            self._progress.confirm_flushed(batch.end_lsn)
        self._skip_done(batch.end_lsn)
        if self._isolate_through is not None and batch.end_lsn >= self._isolate_through:
            self._isolate_through = None
        seconds = time.monotonic() - started
        self.last_commit_time = batch.commit_time
        self._hooks.finished(batch, result, seconds, changes, self._progress.flushed)

    def _skip_done(self, end_lsn: Lsn) -> None:
        """Clear the skip once the skipped transaction's checkpoint is recorded (or the skip
        LSN was passed without a match)."""
        if self._clear_skip_at is None or end_lsn < self._clear_skip_at:
            return
        self._hooks.clear_skip()
        self._clear_skip_at = None
        log.info(
            "logical replication completed skipping transaction",
            subscription=self.subscription,
            end_lsn=str(end_lsn),
        )
