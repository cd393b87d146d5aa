import struct
from collections.abc import Callable

import pytest

from subscriber.replication.errors import ProtocolError
from subscriber.replication.lsn import Lsn, record_end
from subscriber.replication.wire import (
    Keepalive,
    XLogData,
    parse_frame,
    pg_timestamp,
    status_update,
    xlog_frames,
)


def test_lsn_text_round_trip() -> None:
    lsn = Lsn.parse("16/B374D848")
    assert lsn == 0x16_B374D848
    assert str(lsn) == "16/B374D848"
    assert str(Lsn(0)) == "0/0"
    assert Lsn.parse("0/1528540") < Lsn.parse("0/1528570")


@pytest.mark.parametrize(
    ("insert", "end"),
    [
        ("0/1504018", "0/1504000"),  # past a page's short header: the page boundary
        ("0/5000028", "0/5000000"),  # past a segment's first (long) header
        ("0/1504020", "0/1504020"),  # after a record on the page: that record's end
        ("1/0", "1/0"),
    ],
)
def test_the_wal_end_is_the_last_record_end_not_past_a_page_header(insert: str, end: str) -> None:
    assert record_end(Lsn.parse(insert), 8192, 16 << 20) == Lsn.parse(end)


@pytest.mark.parametrize("text", ["", "1", "G/0", "1/2/3", "123456789/0"])
def test_bad_lsn_text_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="not an LSN"):
        Lsn.parse(text)


def test_lsn_range() -> None:
    with pytest.raises(ValueError):
        Lsn(-1)
    with pytest.raises(ValueError):
        Lsn(1 << 64)


def test_xlogdata_and_keepalive_frames() -> None:
    frame = b"w" + struct.pack("!QQq", 10, 20, 30) + b"B..."
    assert parse_frame(frame) == XLogData(Lsn(10), Lsn(20), 30, b"B...")
    assert parse_frame(b"k" + struct.pack("!QqB", 99, 5, 1)) == Keepalive(Lsn(99), 5, True)


@pytest.mark.parametrize("frame", [b"", b"w\x00", b"k" + b"\x00" * 5, b"x" + b"\x00" * 17])
def test_bad_frames_raise_protocol_error(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_frame(frame)


def _libpq(*frames: bytes, then: int = 0) -> Callable[[int], tuple[int, memoryview]]:
    """``get_copy_data`` of a libpq holding ``frames``, then giving ``then`` (0: none left)."""
    given = iter([(len(f), memoryview(f)) for f in frames] + [(then, memoryview(b""))])
    return lambda _: next(given)


def _xlog(start: int, end: int, payload: bytes) -> bytes:
    return b"w" + struct.pack("!QQq", start, end, start * 10) + payload


def test_xlog_frames_takes_every_xlogdata_buffered_and_stops_at_what_is_none() -> None:
    """Each frame's WAL start and payload (its own bytes), the highest position among their
    starts and ends, the last one's WAL end and send time; it stops at a keepalive, handing
    it back whole for ``parse_frame``, and takes on from the frame after it."""
    keepalive = b"k" + struct.pack("!QqB", 0x900, 5, 1)
    get = _libpq(_xlog(0x30, 0x40, b"B1"), _xlog(0x50, 0x48, b"C2"), keepalive, _xlog(7, 8, b"U"))
    out: list[tuple[Lsn, bytes]] = []
    run = xlog_frames(get, out)
    assert out == [(Lsn(0x30), b"B1"), (Lsn(0x50), b"C2")]
    assert all(type(payload) is bytes and type(lsn) is Lsn for lsn, payload in out)
    assert (run.received, run.wal_end, run.send_time) == (0x50, 0x48, 0x50 * 10)
    assert run.stop is not None and bytes(run.stop) == keepalive
    assert run.stop_length == len(keepalive)
    run = xlog_frames(get, out)
    assert out[2:] == [(Lsn(7), b"U")] and run.stop_length == 0


@pytest.mark.parametrize("then", [-1, -2])
def test_xlog_frames_hands_back_the_end_of_the_copy(then: int) -> None:
    out: list[tuple[Lsn, bytes]] = []
    run = xlog_frames(_libpq(_xlog(1, 2, b"B"), then=then), out)
    assert out == [(Lsn(1), b"B")] and run.stop_length == then


def test_xlog_frames_leaves_a_truncated_xlogdata_to_parse_frame() -> None:
    """A 'w' frame shorter than its header is not taken: ``parse_frame`` refuses it."""
    short = b"w" + b"\x00" * 10
    out: list[tuple[Lsn, bytes]] = []
    run = xlog_frames(_libpq(short), out)
    assert out == [] and run.stop is not None
    with pytest.raises(ProtocolError):
        parse_frame(bytes(run.stop))


def test_status_update_layout() -> None:
    msg = status_update(Lsn(3), Lsn(2), Lsn(1), reply_requested=True, now=7)
    assert msg == b"r" + struct.pack("!QQQqB", 3, 2, 1, 7, 1)


def test_pg_timestamp_epoch() -> None:
    assert pg_timestamp(0).isoformat() == "2000-01-01T00:00:00+00:00"
