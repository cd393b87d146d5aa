"""Keeps a subscription's stream going: connect, stream, reconnect with backoff.

Each (re)connection starts from ``Progress.flushed`` - the last position
durable at the target - so a lost connection loses nothing, and nothing at or
below the flush point is decoded twice. Decoded messages go to ``deliver``
in stream order, on the receiver's thread; consecutive row changes go as
one ``RowChanges`` run when there are enough of them to decode a column at
a time, and a small transaction as one ``WholeTransaction``
(``subscriber.replication.runs``). The receiver also keeps the pending-work
bookkeeping of ``Progress`` (which transactions are open, which were
handed on), since it sees every transaction boundary.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from subscriber.replication.commands import Streaming, StreamOptions
from subscriber.replication.errors import ConnectionLostError
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Prepare,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
)
from subscriber.replication.pgoutput import PgOutputDecoder
from subscriber.replication.progress import Progress
from subscriber.replication.runs import Decoded, RunDecoder, WholeTransaction
from subscriber.replication.stream import ReplicationConnection, ReplicationStream
from subscriber.replication.stream_policy import DEFAULT_TIMING, StreamTiming

log = structlog.get_logger(__name__)


@dataclass
class Backoff:
    """Capped exponential backoff with jitter; reset once a stream delivers."""

    initial: float = 1.0
    cap: float = 30.0
    attempt: int = field(default=0, init=False)

    def next_delay(self) -> float:
        delay = min(self.cap, self.initial * (1 << min(self.attempt, 30)))
        self.attempt += 1
        jitter: float = random.uniform(0.8, 1.0)  # noqa: S311 - jitter, not security
        return delay * jitter

    def reset(self) -> None:
        self.attempt = 0


class TransactionTracker:
    """Tells ``Progress`` which transactions are open and which were handed on."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._streamed: set[int] = set()
        self._holding = False  # a Begin held for a whole transaction counts as open

    def reset(self) -> None:
        self._streamed.clear()
        self._holding = False
        self._progress.reset_open()

    def held(self) -> None:
        """A Begin is held for a whole transaction (``RunDecoder``): open from here."""
        self._progress.open_transaction()
        self._holding = True

    def observe(self, message: Decoded) -> None:
        progress = self._progress
        if type(message) is WholeTransaction and not self._holding:
            progress.handed_out(message.end_lsn)  # read whole in one step: never open
            return
        match message:
            case WholeTransaction(end_lsn=end):  # its Begin was held: open since
                self._holding = False
                progress.close_transaction(end)
            case Begin() if self._holding:
                self._holding = False  # held, then handed on as it was: opened already
            case Begin() | BeginPrepare():
                progress.open_transaction()
            case Commit(end_lsn=end) | Prepare(end_lsn=end):
                progress.close_transaction(end)
            case StreamStart(xid=xid) if xid not in self._streamed:
                self._streamed.add(xid)
                progress.open_transaction()
            case StreamCommit(xid=xid, end_lsn=end) | StreamPrepare(xid=xid, end_lsn=end):
                if xid in self._streamed:
                    self._streamed.discard(xid)
                    progress.close_transaction(end)
                else:
                    progress.handed_out(end)
            case StreamAbort(xid=xid, subxid=subxid) if xid == subxid and xid in self._streamed:
                self._streamed.discard(xid)
                progress.close_transaction(None)
            case CommitPrepared(end_lsn=end) | RollbackPrepared(rollback_end_lsn=end):
                progress.handed_out(end)
            case _:
                pass


# A decoded message, a run of row changes or a small transaction, in stream order.
Deliver = Callable[[Decoded], None]


def _nothing() -> None:
    pass


@dataclass(frozen=True, slots=True)
class StreamHooks:
    """What the consumer of ``deliver`` is told besides each message."""

    # The connection was lost: what was partly received will be sent again.
    reconnecting: Callable[[], None] = _nothing
    # Nothing the publisher sent is left to read (the loop is about to wait for more), or
    # the connection was lost: the moment to hand on what ``deliver`` gathered.
    drained: Callable[[], None] = _nothing


class Receiver:
    """Runs the receive loop of one subscription until ``stop()``."""

    def __init__(
        self,
        conninfo: str,
        slot: str,
        options: StreamOptions,
        progress: Progress,
        deliver: Deliver,
        *,
        timing: StreamTiming = DEFAULT_TIMING,
        backoff: Backoff | None = None,
        hooks: StreamHooks = StreamHooks(),
    ) -> None:
        self._conninfo = conninfo
        self._slot = slot
        self._options = options
        self.progress = progress
        self._deliver = deliver
        self._timing = timing
        self._backoff = backoff or Backoff()
        self._hooks = hooks
        self._tracker = TransactionTracker(progress)
        self._stopping = threading.Event()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self.connections = 0
        self.streaming = threading.Event()
        self._last_receipt: float | None = None  # of the streams before the current one
        self._stream: ReplicationStream | None = None

    @property
    def wal_end(self) -> Lsn | None:
        stream = self._stream
        return None if stream is None else stream.last_wal_end

    @property
    def last_receipt(self) -> float | None:
        """Unix time of the last message from the publisher, keepalives included (as
        PostgreSQL's last_msg_receipt_time): read while the stream waits inside ``read``."""
        stream = self._stream
        current = stream.last_message_time if stream is not None else None
        return current or self._last_receipt

    def hold(self) -> None:
        """Called by ``deliver`` while it waits for room: keeps the stream alive."""
        if self._stream is not None:
            self._stream.hold()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):  # the loop may have ended and closed it
            self._wake_writer.send(b"x")

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    self._stream_once()
                except ConnectionLostError as exc:
                    self._hooks.drained()
                    self.streaming.clear()
                    self._tracker.reset()
                    self._hooks.reconnecting()
                    if self._stopping.is_set():
                        break
                    delay = self._backoff.next_delay()
                    log.warning(
                        "replication connection lost",
                        slot=self._slot,
                        error=str(exc),
                        resume_lsn=str(self.progress.flushed),
                        retry_in=round(delay, 1),
                    )
                    self._stopping.wait(delay)
        finally:
            self._wake_reader.close()
            self._wake_writer.close()

    def _stream_once(self) -> None:
        connection = ReplicationConnection(self._conninfo)
        try:
            version = connection.server_version
            decoder = PgOutputDecoder(
                self._options.negotiated_proto(version),
                parallel_streaming=self._options.streaming is Streaming.PARALLEL,
            )
            stream = connection.start_replication(
                self._slot,
                self.progress.flushed,
                self._options,
                self.progress,
                status_interval=self._timing.status_interval,
                wal_receiver_timeout=self._timing.wal_receiver_timeout,
                interrupt=self._wake_reader,
            )
        except BaseException:
            connection.close()
            raise
        self.connections += 1
        self.streaming.set()
        self._stream = stream
        runs = RunDecoder(decoder, held=self._tracker.held)
        try:
            while not self._stopping.is_set():
                frames = stream.read_all(timeout=0)
                if not frames:
                    self._hooks.drained()
                    frames = stream.read_all()
                    if not frames:
                        continue
                self._backoff.reset()
                for decoded in runs.push_all(frames):
                    self._tracker.observe(decoded)
                    self._deliver(decoded)
        finally:
            self.streaming.clear()
            self._last_receipt = stream.last_message_time or self._last_receipt
            self._stream = None
            stream.stop()
