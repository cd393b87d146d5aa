"""CopyBoth framing of a logical replication stream (no I/O).

Server to client: XLogData (``w``) carrying one pgoutput message, and the
primary keepalive (``k``). Client to server: the standby status update
(``r``). Layouts: ../shared/reference/PROTOCOL.md.
"""

from __future__ import annotations

import struct
import time
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


def xlog_header(frame: bytes) -> tuple[int, int, int] | None:
    """An XLogData frame's WAL start, WAL end and send time; None for any other frame
    (``parse_frame`` says what it is, or why it is none)."""
    if len(frame) >= XLOG_PAYLOAD and frame[0] == 0x77:  # 'w'
        return _XLOG_HEADER.unpack_from(frame, 1)
    return None


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
