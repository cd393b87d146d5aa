"""Positions the stream reports upstream, and who may move them.

- ``received`` (the write position): moved by the stream as frames arrive.
- ``flushed``: moved by the apply side once a transaction's effects are
  durable in every target table. It only moves forward; a move backwards is
  a bug that could lose data, so it raises.
- Whether work is pending: the consumer that assembles transactions (on the
  stream's thread) says when a transaction opens and when a complete one is
  handed on. With nothing open and everything handed on already flushed,
  the flush position reported is the received one, so that an idle slot,
  or one whose changes are all filtered out, does not hold WAL.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from subscriber.replication.lsn import ZERO, Lsn


class ProgressError(AssertionError):
    """A position moved backwards."""


@dataclass(frozen=True, slots=True)
class Feedback:
    write: Lsn
    flush: Lsn
    apply: Lsn


class Progress:
    def __init__(self, flushed: Lsn = ZERO) -> None:
        self._lock = threading.Lock()
        self._received = flushed
        self._flushed = flushed
        self._handed_out = flushed
        self._open = 0

    @property
    def received(self) -> Lsn:
        return self._received

    @property
    def flushed(self) -> Lsn:
        return self._flushed

    def note_received(self, lsn: Lsn) -> None:
        with self._lock:
            self._received = max(self._received, lsn)

    def open_transaction(self) -> None:
        """A transaction (or streamed transaction) began and is not handed on yet."""
        with self._lock:
            self._open += 1

    def close_transaction(self, end_lsn: Lsn | None) -> None:
        """The open transaction was handed on (``end_lsn``) or dropped (None)."""
        with self._lock:
            if self._open == 0:
                raise ProgressError("close_transaction without an open transaction")
            self._open -= 1
            if end_lsn is not None and end_lsn > self._handed_out:
                self._handed_out = end_lsn

    def handed_out(self, end_lsn: Lsn) -> None:
        """A complete transaction was handed on without having been opened here."""
        with self._lock:
            self._handed_out = max(self._handed_out, end_lsn)

    def reset_open(self) -> None:
        """The connection was lost: transactions in flight will be sent again."""
        with self._lock:
            self._open = 0

    def confirm_flushed(self, lsn: Lsn) -> None:
        """Everything up to ``lsn`` is durable at the target."""
        with self._lock:
            if lsn < self._flushed:
                raise ProgressError(f"flush position moved backwards: {self._flushed} -> {lsn}")
            self._flushed = lsn
            self._received = max(self._received, lsn)

    @property
    def idle(self) -> bool:
        with self._lock:
            return self._idle()

    def _idle(self) -> bool:
        return self._open == 0 and self._flushed >= self._handed_out

    def feedback(self) -> Feedback:
        with self._lock:
            flush = max(self._flushed, self._received) if self._idle() else self._flushed
            return Feedback(write=self._received, flush=flush, apply=flush)

    @property
    def done_through(self) -> Lsn:
        """Everything of the stream up to here is applied (idle: all that was received).

        Read in one step: another thread asking "applied up to a target?" asks this, not
        ``idle`` then ``received``, between which a transaction may arrive and open.
        """
        return self.feedback().flush


class HeldProgress(Progress):
    """Reports its starting position as flushed forever: reading consumes nothing.

    For tools that only look at a slot (``pgsub peek``, benchmarks).
    """

    def feedback(self) -> Feedback:
        return Feedback(write=self.received, flush=self.flushed, apply=self.flushed)
