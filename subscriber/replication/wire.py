"""CopyBoth framing of a logical replication stream (no I/O).

Server to client: XLogData (``w``) carrying one pgoutput message, and the
primary keepalive (``k``). Client to server: the standby status update
(``r``). Layouts: ../shared/reference/PROTOCOL.md.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from subscriber.replication.errors import ProtocolError
from subscriber.replication.lsn import Lsn, unpacked

_XLOG_HEADER: Final = struct.Struct("!QQq")
_KEEPALIVE: Final = struct.Struct("!QqB")
_STATUS: Final = struct.Struct("!cQQQqB")

# Seconds from the Unix epoch to PostgreSQL's (2000-01-01 00:00:00 UTC).
PG_EPOCH_OFFSET: Final = 946_684_800
_PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)


def pg_now() -> int:
    """Now in microseconds since the PostgreSQL epoch."""
    return time.time_ns() // 1000 - PG_EPOCH_OFFSET * 1_000_000


def pg_timestamp(micros: int) -> datetime:
    """A PostgreSQL wire timestamp as an aware UTC datetime."""
    return _PG_EPOCH + timedelta(microseconds=micros)


@dataclass(frozen=True, slots=True)
class XLogData:
    data_start: Lsn
    wal_end: Lsn
    send_time: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Keepalive:
    wal_end: Lsn
    send_time: int
    reply_requested: bool


# Where an XLogData frame's payload begins: its type byte, then the header.
XLOG_PAYLOAD: Final = 1 + _XLOG_HEADER.size


# libpq's next CopyData frame, as psycopg's ``PGconn.get_copy_data(1)`` gives it: its
# length (0: none is buffered; -1: the copy ended; -2: an error) and its bytes.
GetCopyData = Callable[[int], tuple[int, memoryview]]


@dataclass(slots=True)
class XLogRun:
    """What ``xlog_frames`` took: the highest WAL position of its frames (their starts and
    ends, as PostgreSQL's apply worker counts ``last_received``), the last one's WAL end
    and send time (0: none was taken), and the frame that stopped it - its length as
    ``GetCopyData`` gave it (0: none was left) and its bytes."""

    received: int = 0
    wal_end: int = 0
    send_time: int = 0
    stop_length: int = 0
    stop: memoryview | None = None


def xlog_frames(get_copy_data: GetCopyData, out: list[tuple[Lsn, bytes]]) -> XLogRun:
    """Appends to ``out`` each XLogData frame libpq holds, as (WAL start, payload) in
    stream order, until one that is not an XLogData (a keepalive, the end of the copy,
    what ``parse_frame`` refuses: the caller's to handle) or none is buffered.

    The receiver's loop over a backlog's frames - three a single-row transaction - made
    flat: each frame's bytes copied once (its payload), no call a frame but libpq's and
    the header's unpacking (docs/performance.md, "The backlog's three threads, less
    Python each")."""
    append = out.append
    unpack = _XLOG_HEADER.unpack_from
    received = end = sent = 0
    while True:
        length, data = get_copy_data(1)
        if length < XLOG_PAYLOAD or data[0] != 0x77:  # not a 'w' with a whole header
            return XLogRun(received, end, sent, length, data)
        start, end, sent = unpack(data, 1)
        append((unpacked(start), bytes(data[XLOG_PAYLOAD:])))
        received = max(received, start)
        received = max(received, end)


def parse_frame(frame: bytes) -> XLogData | Keepalive:
    """One CopyData payload from the walsender."""
    if not frame:
        raise ProtocolError("empty CopyData message")
    kind = frame[0]
    try:
        if kind == 0x77:  # 'w'
            start, end, sent = _XLOG_HEADER.unpack_from(frame, 1)
            return XLogData(unpacked(start), unpacked(end), sent, frame[1 + _XLOG_HEADER.size :])
        if kind == 0x6B:  # 'k'
            if len(frame) != 1 + _KEEPALIVE.size:
                raise ProtocolError(f"keepalive of {len(frame)} bytes", msg_type="k")
            end, sent, reply = _KEEPALIVE.unpack_from(frame, 1)
            return Keepalive(unpacked(end), sent, reply == 1)
    except struct.error as exc:
        raise ProtocolError(f"truncated frame: {exc}", msg_type=chr(kind), offset=1) from exc
    raise ProtocolError(f"unknown CopyData message type {kind:#04x}", offset=0)


def status_update(
    write: Lsn, flush: Lsn, apply: Lsn, *, reply_requested: bool = False, now: int | None = None
) -> bytes:
    """A standby status update telling the server how far we have come."""
    return _STATUS.pack(
        b"r", write, flush, apply, pg_now() if now is None else now, 1 if reply_requested else 0
    )
