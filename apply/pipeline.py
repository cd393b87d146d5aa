"""One attempt at streaming a slot into Delta: a receiver thread and an apply thread.

The receiver decodes the stream and assembles complete transactions onto a
queue bounded by changes; while the queue is full it keeps the connection
alive (``Receiver.hold``). Transactions sent again after a reconnect (at or
below the last one queued) are dropped here. The apply worker takes them in
commit order. The leader and each sync worker's catch-up run one of these.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from apply.applier import BatchApplier
from apply.assembly import TransactionAssembler
from apply.spool import SpoolDirectory, SpooledTransaction
from apply.transactions import Bounds
from apply.worker import ApplyWorker, TransactionQueue
from subscriber.replication.commands import StreamOptions
from subscriber.replication.messages import Message
from subscriber.replication.progress import Progress
from subscriber.replication.receiver import Receiver
from subscriber.replication.tuples import RowChanges
from subscriber.replication.wire import XLogData


class _StopRequestedError(Exception):
    """Raised in the receiver's deliver callback when stopping under backpressure."""


class ApplyPipeline:
    def __init__(
        self,
        name: str,
        *,
        conninfo: str,
        slot: str,
        options: StreamOptions,
        progress: Progress,
        applier: BatchApplier,
        make_worker: Callable[[TransactionQueue], ApplyWorker],
        queue: Bounds,
        spools: SpoolDirectory,
        spill_after: Bounds,
        status_interval: float,
        wal_receiver_timeout: float,
    ) -> None:
        self.name = name
        self.progress = progress
        self._applier = applier
        self._queue = TransactionQueue(queue)
        self.worker = make_worker(self._queue)
        self.spools = spools
        self._assembler = TransactionAssembler(spools, spill_after)
        self._last_queued = progress.flushed
        self._stop = threading.Event()
        self.done = threading.Event()  # set when either thread ends
        self._errors: list[BaseException] = []
        self.receiver = Receiver(
            conninfo,
            slot,
            options,
            progress,
            self._deliver,
            status_interval=status_interval,
            wal_receiver_timeout=wal_receiver_timeout,
            on_reconnect=self._assembler.reset,
        )
        self._threads: list[threading.Thread] = []

    def _deliver(self, message: Message | RowChanges, data: XLogData) -> None:
        tx = self._assembler.feed(message)
        if tx is None:
            return  # not complete yet
        if tx.end_lsn <= self._last_queued:
            if isinstance(tx, SpooledTransaction):
                tx.discard()
            return  # sent again after a reconnect
        while not self._queue.put(tx, timeout=1.0):
            if self._stop.is_set() or self.receiver.stopping:
                raise _StopRequestedError
            self.receiver.hold()
        self._last_queued = tx.end_lsn

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

    def stop(self) -> list[BaseException]:
        """Stop both threads; the errors that ended them (none after a requested stop)."""
        self._stop.set()
        self.receiver.stop()
        for thread in self._threads:
            thread.join()
        self._applier.close()
        return [e for e in self._errors if not isinstance(e, _StopRequestedError)]
