"""The queue from the receiver to the apply worker, bounded by row data in memory.

The receiver puts complete transactions on it in commit order, the apply
worker takes them; a full queue holds the receiver back (it keeps answering
keepalives meanwhile). Each entry records when it arrived: a batch is due
by the age of its oldest transaction.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from apply.arrival.assembly import AssembledTransaction
from apply.core.transactions import Bounds, RemoteTransaction
from subscriber.replication.frozen import quick


def in_memory_transaction(tx: AssembledTransaction) -> bool:
    return isinstance(tx, RemoteTransaction)


def _in_memory(tx: AssembledTransaction) -> tuple[int, int]:
    """The changes and bytes of row data ``tx`` holds in memory (a spooled one: one, none)."""
    return (len(tx.changes), tx.size) if isinstance(tx, RemoteTransaction) else (1, 0)


@quick
@dataclass(frozen=True, slots=True)
class Queued:
    tx: AssembledTransaction
    arrived: float  # when the receiver queued it (monotonic clock)


class TransactionQueue:
    """Transactions from the receiver to the apply worker, bounded by row data in memory.

    A transaction larger than the bounds is still accepted when the queue is
    empty, so that any transaction can pass.
    """

    def __init__(self, bounds: Bounds, clock: Callable[[], float] = time.monotonic) -> None:
        self._bounds = bounds
        self._clock = clock
        self._items: deque[Queued] = deque()
        self._changes = 0
        self._size = 0
        self._cond = threading.Condition()
        self._woken = False

    def wake(self) -> None:
        """End the ``get`` under way, or the next, at once with None (PostgreSQL sets the apply
        worker's latch): a table-sync worker moved a table on, or the worker is stopping."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def _room_for(self, changes: int, size: int) -> bool:
        bounds = self._bounds
        return not self._items or (
            self._changes + changes <= bounds.changes and self._size + size <= bounds.size
        )

    def put(self, tx: AssembledTransaction, timeout: float) -> bool:
        """False when there was no room within ``timeout`` seconds."""
        return self.put_all([tx], timeout) == 1

    def put_all(self, txs: Sequence[AssembledTransaction], timeout: float) -> int:
        """How many of ``txs``, from the first, were queued: as many as there is room for,
        after waiting up to ``timeout`` seconds for room for the first. One lock and one
        wake-up for a run of transactions: a backlog of small ones is handed on by runs."""
        with self._cond:
            first = _in_memory(txs[0])
            if not self._cond.wait_for(lambda: self._room_for(*first), timeout):
                return 0
            arrived = self._clock()
            put = 0
            for tx in txs:
                changes, size = _in_memory(tx)
                if not self._room_for(changes, size):
                    break
                self._items.append(Queued(tx, arrived))
                self._changes += changes
                self._size += size
                put += 1
            self._cond.notify_all()
            return put

    def get(
        self,
        timeout: float,
        accept: Callable[[AssembledTransaction], bool] = lambda tx: True,
    ) -> Queued | None:
        """The oldest transaction, within ``timeout``, if ``accept`` takes it."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._items) or self._woken, timeout):
                return None
            if not self._items:
                self._woken = False
                return None
            if not accept(self._items[0].tx):
                return None
            queued = self._items.popleft()
            changes, size = _in_memory(queued.tx)
            self._changes -= changes
            self._size -= size
            self._cond.notify_all()
            return queued

    def take(self, most: int, accept: Callable[[AssembledTransaction], bool]) -> list[Queued]:
        """Up to ``most`` transactions from the oldest, as long as ``accept`` takes them,
        without waiting: a run taken under one lock (``give_back`` returns what is not
        used)."""
        with self._cond:
            taken: list[Queued] = []
            items = self._items
            while items and len(taken) < most and accept(items[0].tx):
                queued = items.popleft()
                changes, size = _in_memory(queued.tx)
                self._changes -= changes
                self._size -= size
                taken.append(queued)
            if taken:
                self._cond.notify_all()
            return taken

    def give_back(self, unused: Sequence[Queued]) -> None:
        """Puts ``unused`` - the end of a run ``take`` gave - back in front, in its order."""
        with self._cond:
            for queued in reversed(unused):
                self._items.appendleft(queued)
                changes, size = _in_memory(queued.tx)
                self._changes += changes
                self._size += size

    def __len__(self) -> int:
        return len(self._items)
