import struct

import pytest

from subscriber.replication.errors import ProtocolError
from subscriber.replication.lsn import Lsn, record_end
from subscriber.replication.wire import (
    Keepalive,
    XLogData,
    parse_frame,
    pg_timestamp,
    status_update,
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


def test_status_update_layout() -> None:
    msg = status_update(Lsn(3), Lsn(2), Lsn(1), reply_requested=True, now=7)
    assert msg == b"r" + struct.pack("!QQQqB", 3, 2, 1, 7, 1)


def test_pg_timestamp_epoch() -> None:
    assert pg_timestamp(0).isoformat() == "2000-01-01T00:00:00+00:00"
