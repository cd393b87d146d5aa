"""The replication connection: the only module that talks to a walsender.

``ReplicationConnection`` runs replication commands (IDENTIFY_SYSTEM, slot
creation and removal, START_REPLICATION) over psycopg's libpq layer with the
simple query protocol, which is all a walsender speaks. ``ReplicationStream``
is the receive side of one START_REPLICATION: it waits on the socket (no
polling, no fixed sleeps) and does what its ``StreamPolicy``
(``subscriber.replication.stream_policy``, pure) decides: answer keepalives
that ask for a reply at once, send standby status updates from ``Progress``
at least every ``status_interval``, ping at half of ``wal_receiver_timeout``
and give up with ``ConnectionLostError`` when the server stays silent for
all of it.
"""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import NoReturn

import psycopg
import structlog
from psycopg import pq

from subscriber.replication import session
from subscriber.replication.commands import (
    SnapshotAction,
    StreamOptions,
    create_slot_command,
    drop_slot_command,
    start_replication_command,
)
from subscriber.replication.copy_out import copy_out
from subscriber.replication.errors import ConnectionLostError, ProtocolError, ReplicationError
from subscriber.replication.lsn import ZERO, Lsn, unpacked
from subscriber.replication.progress import Feedback, Progress
from subscriber.replication.stream_policy import Silence, StreamPolicy
from subscriber.replication.wire import (
    Keepalive,
    XLogData,
    parse_frame,
    status_update,
    xlog_frames,
)

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class SystemIdentity:
    system_id: str
    timeline: int
    xlogpos: Lsn
    dbname: str | None


@dataclass(frozen=True, slots=True)
class SlotInfo:
    slot_name: str
    consistent_point: Lsn
    snapshot_name: str | None


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


class ReplicationConnection:
    """A ``replication=database`` connection to the publisher."""

    def __init__(self, conninfo: str, *, connect_timeout: int = 30) -> None:
        try:
            self._conn = session.connect(
                conninfo, replication=True, connect_timeout=connect_timeout
            )
        except psycopg.OperationalError as exc:
            raise ConnectionLostError(f"cannot open a replication connection: {exc}") from exc
        self.pgconn = self._conn.pgconn

    def __enter__(self) -> ReplicationConnection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def server_version(self) -> int:
        return self._conn.info.server_version

    @property
    def closed(self) -> bool:
        return self._conn.closed

    def close(self) -> None:
        self._conn.close()

    def execute(self, command: str) -> list[dict[str, str | None]]:
        """One command in the simple query protocol; rows as dicts of text."""
        verb = command.split(maxsplit=1)[0]
        result = self._run(command)
        if result.status not in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
            message = result.error_message.decode(errors="replace").strip()
            if self.pgconn.status == pq.ConnStatus.BAD:
                raise ConnectionLostError(f"{verb} failed: {message}")
            raise ReplicationError(f"{verb} failed: {message}")
        names = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
        return [
            {name: _text(result.get_value(row, col)) for col, name in enumerate(names)}
            for row in range(result.ntuples)
        ]

    def _run(self, command: str) -> pq.abc.PGresult:
        """Send one command and wait for its last result on the socket.

        libpq's blocking calls would hold the GIL while they wait on the
        network, freezing every other thread of the daemon; so the command is
        sent, and the socket waited on here, with the GIL released.
        """
        verb = command.split(maxsplit=1)[0]
        pgconn = self.pgconn
        last: pq.abc.PGresult | None = None
        try:
            pgconn.send_query(command.encode())
            with selectors.DefaultSelector() as selector:
                selector.register(pgconn.socket, selectors.EVENT_READ)
                while True:
                    while pgconn.is_busy():
                        selector.select()
                        pgconn.consume_input()
                    result = pgconn.get_result()
                    if result is None:
                        break
                    last = result
                    if result.status in (
                        pq.ExecStatus.COPY_BOTH,
                        pq.ExecStatus.COPY_OUT,
                        pq.ExecStatus.COPY_IN,
                    ):
                        break
        except psycopg.OperationalError as exc:
            raise ConnectionLostError(f"connection lost running {verb}: {exc}") from exc
        if last is None:
            raise ConnectionLostError(f"{verb}: no result from the server")
        return last

    def copy_out(self, command: str) -> Iterator[bytes]:
        """Run ``COPY ... TO STDOUT`` and yield its rows as they arrive (one row each;
        ``subscriber.replication.copy_out``).

        Waits on the socket, never inside libpq, so other threads keep running.
        """
        try:
            yield from copy_out(self.pgconn, command)
        except psycopg.OperationalError as exc:
            raise ConnectionLostError(f"connection lost during COPY: {exc}") from exc
        except psycopg.Error as exc:
            raise ReplicationError(f"COPY failed: {exc}") from exc

    def identify_system(self) -> SystemIdentity:
        row = self.execute("IDENTIFY_SYSTEM")[0]
        return SystemIdentity(
            system_id=row["systemid"] or "",
            timeline=int(row["timeline"] or 0),
            xlogpos=Lsn.parse(row["xlogpos"] or "0/0"),
            dbname=row["dbname"],
        )

    def create_slot(
        self,
        name: str,
        *,
        temporary: bool = False,
        snapshot: SnapshotAction = SnapshotAction.NOTHING,
        two_phase: bool = False,
        failover: bool = False,
    ) -> SlotInfo:
        row = self.execute(
            create_slot_command(
                self.server_version,
                name,
                temporary=temporary,
                snapshot=snapshot,
                two_phase=two_phase,
                failover=failover,
            )
        )[0]
        slot = SlotInfo(
            row["slot_name"] or name,
            Lsn.parse(row["consistent_point"] or "0/0"),
            row["snapshot_name"],
        )
        log.info(
            "replication slot created",
            slot=slot.slot_name,
            consistent_point=str(slot.consistent_point),
            temporary=temporary,
        )
        return slot

    def drop_slot(self, name: str, *, wait: bool = True) -> None:
        self.execute(drop_slot_command(name, wait=wait))
        log.info("replication slot dropped", slot=name)

    def start_replication(
        self,
        slot: str,
        start: Lsn,
        options: StreamOptions,
        progress: Progress,
        *,
        status_interval: float = 10.0,
        wal_receiver_timeout: float = 60.0,
        interrupt: socket.socket | None = None,
    ) -> ReplicationStream:
        command = start_replication_command(
            slot, start, options.pgoutput_options(self.server_version)
        )
        result = self._run(command)
        if result.status != pq.ExecStatus.COPY_BOTH:
            message = result.error_message.decode(errors="replace").strip()
            raise ReplicationError(f"START_REPLICATION on slot {slot} failed: {message}")
        log.info(
            "replication started",
            slot=slot,
            start_lsn=str(start),
            proto_version=options.negotiated_proto(self.server_version),
        )
        return ReplicationStream(
            self,
            progress,
            status_interval=status_interval,
            wal_receiver_timeout=wal_receiver_timeout,
            interrupt=interrupt,
        )


class ReplicationStream:
    """The CopyBoth receive loop of one START_REPLICATION."""

    def __init__(
        self,
        connection: ReplicationConnection,
        progress: Progress,
        *,
        status_interval: float = 10.0,
        wal_receiver_timeout: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        interrupt: socket.socket | None = None,
    ) -> None:
        self._connection = connection
        self._pgconn = connection.pgconn
        self._progress = progress
        self._clock = clock
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._pgconn.socket, selectors.EVENT_READ, "server")
        # A socket another thread writes to, to make a waiting read() return None.
        if interrupt is not None:
            self._selector.register(interrupt, selectors.EVENT_READ, "interrupt")
        self._policy = StreamPolicy.starting(
            clock(), status_interval=status_interval, timeout=wal_receiver_timeout
        )
        self.last_server_time = 0
        self.last_wal_end: Lsn | None = None  # the server's WAL end, as last reported
        self._noted = ZERO  # the highest position this stream told ``progress`` it received
        # The highest position of the frames handed out: told to ``progress`` only when the
        # consumer comes back for more, having taken them in (opened their transactions).
        self._handed = ZERO
        self.last_message_time: float | None = None  # Unix time of any frame, keepalives too
        self.ended = False

    def read(self, timeout: float | None = None) -> XLogData | None:
        """The next XLogData, or None when ``timeout`` seconds pass without one.

        Keepalives are handled here; status updates go out as they fall due.
        """
        deadline = None if timeout is None else self._clock() + timeout
        self._note_received(self._handed)  # the consumer is back: it took in what it was handed
        while True:
            frame = self._next_frame()
            if frame is not None:
                self._arrived()
                message = parse_frame(frame)
                if isinstance(message, Keepalive):
                    self._keepalive(message)
                    continue
                self.last_server_time = message.send_time
                self.last_wal_end = message.wal_end
                self._handed = max(self._handed, message.data_start, message.wal_end)
                return message
            # Nothing buffered: a good moment to report progress, then wait.
            self.send_status()
            now = self._clock()
            silence = self._policy.silence(now)
            if silence is Silence.GIVE_UP:
                raise ConnectionLostError(
                    f"terminating replication stream due to timeout: nothing received for "
                    f"{self._policy.silent_for(now):.0f}s "
                    f"(wal_receiver_timeout {self._policy.timeout:.0f}s)"
                )
            if silence is Silence.PING:
                self.send_status(force=True, reply_requested=True)
            wake = self._policy.wake_at()
            if deadline is not None:
                wake = min(wake, deadline)
            ready = self._selector.select(max(0.0, wake - now))
            for key, _ in ready:
                if key.data == "interrupt":
                    return None
                self._consume()
            if not ready and deadline is not None and self._clock() >= deadline:
                return None  # the socket too has nothing (``timeout=0``: nothing waits)

    def read_all(self, timeout: float | None = None) -> list[tuple[Lsn, bytes]]:
        """Every XLogData libpq holds, as (WAL start, payload) in stream order: at least
        one, waited for as ``read`` waits, or none when ``timeout`` passes first.

        The receiver's path: past the first frame, one flat loop (``wire.xlog_frames``), one
        clock reading for the lot, and no ``XLogData`` made for each frame. As with
        ``read``, ``progress`` counts the lot received when the consumer comes back for more.
        """
        first = self.read(timeout)
        if first is None:
            return []
        out = [(first.data_start, first.payload)]
        received = 0
        while True:
            try:
                run = xlog_frames(self._pgconn.get_copy_data, out)
            except psycopg.OperationalError as exc:
                raise ConnectionLostError(f"replication connection lost: {exc}") from exc
            received = max(received, run.received)
            if run.send_time:  # a keepalive among them may have told more already
                self.last_server_time = max(self.last_server_time, run.send_time)
                self.last_wal_end = unpacked(max(self.last_wal_end or 0, run.wal_end))
            if run.stop_length <= 0:
                if run.stop_length < 0:
                    self._copy_ended(run.stop_length)
                break
            assert run.stop is not None  # a frame of ``stop_length`` bytes
            message = parse_frame(bytes(run.stop))  # refuses what is no frame
            assert isinstance(message, Keepalive)  # an XLogData was taken
            # Its WAL end covers the frames before it, not yet taken in: told later.
            self._keepalive(message, taken_in=False)
        if len(out) > 1:
            self._arrived()
            self._handed = max(self._handed, unpacked(received))
        return out

    def _arrived(self) -> None:
        self._policy.received(self._clock())
        self.last_message_time = time.time()

    def _keepalive(self, message: Keepalive, *, taken_in: bool = True) -> None:
        """``taken_in``: every frame handed out before it was taken in by the consumer."""
        self.last_server_time = message.send_time
        self.last_wal_end = message.wal_end
        if taken_in:
            self._progress.note_received(message.wal_end)
        else:
            self._handed = max(self._handed, message.wal_end)
        if message.reply_requested:
            self.send_status(force=True)

    def _note_received(self, received: Lsn) -> None:
        # Told only when it moves: frames of a burst mostly carry one WAL end. Told only for
        # frames the consumer took in: another thread reads ``progress.done_through``, and a
        # frame counted received before its transaction is opened would count as applied.
        if received > self._noted:
            self._noted = received
            self._progress.note_received(received)

    def hold(self) -> None:
        """Keep the connection alive while the consumer cannot take more (backpressure).

        Reports progress when due, and does not count the pause as silence
        from the server: nothing is read while holding.
        """
        self.send_status()
        self._policy.held(self._clock())

    def _wait_server(self, timeout: float) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._pgconn.socket, selectors.EVENT_READ)
            if selector.select(timeout):
                self._consume()

    def _consume(self) -> None:
        try:
            self._pgconn.consume_input()
        except psycopg.OperationalError as exc:
            raise ConnectionLostError(f"replication connection lost: {exc}") from exc

    def _next_frame(self) -> bytes | None:
        try:
            nbytes, data = self._pgconn.get_copy_data(1)
        except psycopg.OperationalError as exc:
            raise ConnectionLostError(f"replication connection lost: {exc}") from exc
        if nbytes > 0:
            return bytes(data)
        if nbytes == 0:
            return None
        self._copy_ended(nbytes)

    def _copy_ended(self, nbytes: int) -> NoReturn:
        """``get_copy_data`` gave ``nbytes`` < 0: -1, the server ended the copy; -2, an
        error. Either way the stream is over."""
        self.ended = True
        reason = self._final_error() or "the server ended the replication stream"
        raise ConnectionLostError(reason)

    def _final_error(self) -> str | None:
        try:
            result = self._pgconn.get_result()
        except psycopg.OperationalError as exc:
            return str(exc)
        if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
            return result.error_message.decode(errors="replace").strip()
        message = self._pgconn.error_message
        return message.decode(errors="replace").strip() if message else None

    def send_status(self, *, force: bool = False, reply_requested: bool = False) -> Feedback:
        """Report positions when they changed, when asked, or when the interval is up."""
        feedback = self._progress.feedback()
        now = self._clock()
        if not self._policy.should_report(feedback, now, force=force):
            return feedback
        try:
            self._pgconn.put_copy_data(
                status_update(
                    feedback.write,
                    feedback.flush,
                    feedback.apply,
                    reply_requested=reply_requested,
                )
            )
            self._pgconn.flush()
        except psycopg.OperationalError as exc:
            raise ConnectionLostError(f"cannot send a status update: {exc}") from exc
        self._policy.reported(feedback, now)
        return feedback

    def stop(self, timeout: float = 10.0) -> None:
        """End the stream cleanly: a last status update, CopyDone, then close."""
        try:
            if not self.ended and self._pgconn.status == pq.ConnStatus.OK:
                self.send_status(force=True)
                self._pgconn.put_copy_end()
                self._pgconn.flush()
                deadline = self._clock() + timeout
                while self._clock() < deadline:
                    nbytes, _ = self._pgconn.get_copy_data(1)
                    if nbytes < 0:
                        break
                    if nbytes == 0:
                        self._wait_server(max(0.0, deadline - self._clock()))
        except (psycopg.OperationalError, ConnectionLostError, ProtocolError) as exc:
            log.info("replication stream closed uncleanly", error=str(exc))
        finally:
            self._selector.close()
            self._connection.close()
