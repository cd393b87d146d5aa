"""One attempt at streaming a slot into Delta, wired in one place for every role.

An ``ApplyPipeline`` is a receiver thread and an apply thread. The receiver
decodes the stream and assembles complete transactions onto a queue bounded
by row data; while the queue is full it keeps the connection alive
(``Receiver.hold``). Transactions sent again after a reconnect (at or below
the last one queued) are dropped here. The apply worker takes them in
commit order.

The leader and each table-sync worker's catch-up run one of these, built
from the subscription's ``ApplyContext`` and a role (``apply.core.roles``):
what differs between them is a value, not a second wiring.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from apply.arrival.assembly import AssembledTransaction, TransactionAssembler
from apply.arrival.prestage import Prestager
from apply.arrival.queue import TransactionQueue
from apply.arrival.spool import SpoolDirectory, SpooledTransaction
from apply.arrival.spool_layout import SpoolLayout
from apply.batching.conflict_handling import ConflictHandling
from apply.columns.typemap import TypeLookup
from apply.core.batch import Batcher, ShouldApply, TableFilter
from apply.core.records import TableWrites
from apply.core.rendering import TextForms
from apply.core.roles import Leader, Role
from apply.core.transactions import Bounds, RemoteTransaction
from apply.plans.tables import Tables
from apply.worker.applier import BatchApplier
from apply.worker.worker import ApplyWorker
from apply.worker.worker_hooks import CatchUpHooks, LeaderHooks
from conflicts.kinds import ConflictKind, Resolution
from conflicts.reporter import ConflictReporter
from subscriber.metrics import Metrics
from subscriber.replication.commands import StreamOptions
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Relation
from subscriber.replication.progress import Progress
from subscriber.replication.receiver import Receiver, StreamHooks
from subscriber.replication.runs import Decoded
from subscriber.replication.stream_policy import StreamTiming


@dataclass(frozen=True, slots=True)
class ApplyContext:
    """What every pipeline of one subscription shares; built once by the process."""

    subscription: str
    conninfo: str
    options: StreamOptions  # the leader's; a catch-up keeps the publications and origin
    tables: Tables
    types: TypeLookup
    text_forms: TextForms | None  # binary values pgsub has no reader for (apply.core.rendering)
    metrics: Metrics
    reporter: ConflictReporter | None
    resolutions: Mapping[ConflictKind, Resolution]
    bounds: Bounds  # a batch's, and a transaction's before it is spooled
    queue: Bounds  # the receiver's queue
    max_delay: float
    spool_root: Path  # the subscription's spool_dir
    status_interval: float
    wal_receiver_timeout: float
    # Where a transaction larger than a batch is staged to land in one MERGE per table
    # (apply.plans.staging); None: applied in pieces (a Spark whose executors cannot read it).
    staging: Path | None = None
    # What each table's batches wrote, across attempts (``/status``).
    writes: TableWrites = field(default_factory=TableWrites)
    min_changes: int = 0  # a batch that holds this many is due at once (``batch.min_changes``)


GATHER = 64  # complete transactions the receiver queues at once, at most


class _StopRequestedError(Exception):
    """Raised in the receiver's deliver callback when stopping under backpressure."""


def _only(relid: int) -> ShouldApply:
    def applies(relation: Relation, tx: RemoteTransaction) -> bool:
        return relation.oid == relid

    return applies


def _prestager(context: ApplyContext, name: str) -> Prestager | None:
    """Where a pipeline stages its large transactions while they arrive
    (``apply.arrival.prestage``):
    beside their staging at the commit, and only where there is one."""
    if context.staging is None:
        return None
    return Prestager(
        context.subscription,
        context.staging / f"arriving-{name}",
        context.types,
        context.bounds,
        binary_needs_text=context.text_forms is not None,
    )


class ApplyPipeline:
    def __init__(self, context: ApplyContext, role: Role, start: Lsn) -> None:
        if isinstance(role, Leader):
            self.name = context.subscription
            options = context.options
            applies = TableFilter(role.should_apply, role.table_states)
            spools = SpoolDirectory(
                SpoolLayout(context.spool_root).leader,
                on_size=context.metrics.spill_bytes.labels(context.subscription).set,
                prestager=_prestager(context, context.subscription),
            )
            status_interval = context.status_interval
        else:
            self.name = f"sync-{role.relid}"
            # PostgreSQL's sync worker streams with the subscription's binary and origin.
            options = StreamOptions(
                context.options.publications,
                binary=context.options.binary,
                origin=context.options.origin,
                schema_changes=context.options.schema_changes,
            )
            applies = TableFilter(_only(role.relid))  # its one table's changes, always
            spools = SpoolDirectory(
                SpoolLayout(context.spool_root).sync_worker(role.relid),
                prestager=_prestager(context, self.name),
            )
            status_interval = 1.0  # the leader waits on this worker's progress
        self.progress = Progress(start)
        self.spools = spools
        self._applier = BatchApplier(
            context.subscription,
            context.tables,
            context.types,
            applies=applies,
            conflicts=ConflictHandling(context.resolutions, context.reporter),
            staging=context.staging,
            text_forms=context.text_forms,
            messages=options.messages,
        )
        self._queue = TransactionQueue(context.queue)
        self.worker = ApplyWorker(
            context.subscription,
            self._queue,
            applier=self._applier,
            progress=self.progress,
            batcher=Batcher(context.bounds, context.max_delay, min_changes=context.min_changes),
            hooks=(
                LeaderHooks(context.subscription, role, context.metrics, writes=context.writes)
                if isinstance(role, Leader)
                else CatchUpHooks()
            ),
            spools=spools,
        )
        self._assembler = TransactionAssembler(spools, context.bounds, messages=options.messages)
        self._last_queued = start
        self._gathered: list[AssembledTransaction] = []  # complete, not queued yet
        self._stop = threading.Event()
        self.done = threading.Event()  # set when either thread ends
        self._errors: list[BaseException] = []
        self.receiver = Receiver(
            context.conninfo,
            role.slot,
            options,
            self.progress,
            self._deliver,
            timing=StreamTiming(status_interval, context.wal_receiver_timeout),
            hooks=StreamHooks(reconnecting=self._assembler.reset, drained=self._hand_on),
        )
        self._threads: list[threading.Thread] = []

    def _deliver(self, message: Decoded) -> None:
        tx = self._assembler.feed(message)
        if tx is None:
            return  # not complete yet
        if tx.end_lsn <= self._last_queued:
            if isinstance(tx, SpooledTransaction):
                tx.discard()
            return  # sent again after a reconnect
        self._gathered.append(tx)
        self._last_queued = tx.end_lsn
        if len(self._gathered) >= GATHER or not isinstance(tx, RemoteTransaction):
            self._hand_on()

    def _hand_on(self) -> None:
        """Queues the transactions gathered since the last time: when the publisher has
        sent nothing more yet (``StreamHooks.drained``), or a run of ``GATHER`` is
        complete. A full queue holds the receiver here, the connection kept alive."""
        gathered = self._gathered
        while gathered:
            put = self._queue.put_all(gathered, timeout=1.0)
            del gathered[:put]
            if put == 0:
                if self._stop.is_set() or self.receiver.stopping:
                    raise _StopRequestedError
                self.receiver.hold()

    def _spawn(self, role: str, target: Callable[[], None]) -> threading.Thread:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller by stop()
                self._errors.append(exc)
            finally:
                self.done.set()

        thread = threading.Thread(target=run, name=f"{self.name}-{role}", daemon=True)
        thread.start()
        return thread

    def start(self) -> None:
        self._threads = [
            self._spawn("receiver", self.receiver.run),
            self._spawn("apply", lambda: self.worker.run(self._stop)),
        ]

    def wake(self) -> None:
        """Let the apply thread look at the table states now, not at its next idle tick."""
        self._queue.wake()

    def stop(self) -> list[BaseException]:
        """Stop both threads; the errors that ended them (none after a requested stop)."""
        self._stop.set()
        self._queue.wake()
        self.receiver.stop()
        for thread in self._threads:
            thread.join()
        self._applier.close()
        if self.spools.prestager is not None:
            self.spools.prestager.close()
        return [e for e in self._errors if not isinstance(e, _StopRequestedError)]
