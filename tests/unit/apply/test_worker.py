"""The apply loop with in-memory stand-ins: skips, checkpoints, flush confirmation."""

from __future__ import annotations

import threading

from apply.applier import BatchApplier
from apply.batch import Batcher
from apply.transactions import Bounds
from apply.worker import ApplyWorker, TransactionQueue
from subscriber.metrics import Metrics
from subscriber.replication.lsn import Lsn
from subscriber.replication.progress import Progress
from subscriber.runtime.settings import SKIP_LSN, SubscriptionSettings
from tests.unit.apply.builders import ins, relation, tx
from tests.unit.apply.test_applier import MemoryTables

T = relation("id", "v")


class MemoryLog:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def load(self, subscription: str) -> dict[str, str]:
        return {k: v for k, v in self.values.items() if v}

    def record(self, subscription: str, key: str, value: str) -> None:
        self.values[key] = value


class MemoryCheckpoints:
    def __init__(self) -> None:
        self.recorded: list[Lsn] = []

    def record(self, subscription: str, lsn: Lsn, commit_time: int, versions: object) -> None:
        self.recorded.append(lsn)


def run_until_flushed(worker: ApplyWorker, progress: Progress, lsn: Lsn) -> None:
    stopping = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stopping,))
    thread.start()
    try:
        for _ in range(200):
            if progress.flushed >= lsn:
                break
            threading.Event().wait(0.02)
    finally:
        stopping.set()
        thread.join()
    assert progress.flushed >= lsn


def test_a_skipped_transaction_is_made_durable_by_its_own_checkpoint() -> None:
    """Nothing is written for it, yet its position is recorded: it is never resent."""
    settings_log = MemoryLog()
    settings_log.values[SKIP_LSN] = str(Lsn(200 - 8))
    settings = SubscriptionSettings("s", settings_log)
    settings.refresh(force=True)
    tables = MemoryTables()
    checkpoints = MemoryCheckpoints()
    progress = Progress(Lsn(100))
    queue = TransactionQueue(Bounds(1000))
    worker = ApplyWorker(
        "s",
        queue,
        applier=BatchApplier("s", tables, lambda oid: None),
        checkpoints=checkpoints,  # type: ignore[arg-type]
        progress=progress,
        batcher=Batcher(Bounds(1), 0.0),
        metrics=Metrics(),
        settings=settings,
    )
    queue.put(tx(ins(T, 5, "conflicting"), end=200), timeout=1)
    run_until_flushed(worker, progress, Lsn(200))
    assert tables.rows == {}
    assert checkpoints.recorded == [Lsn(200)]
    assert settings.skip_lsn is None


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
