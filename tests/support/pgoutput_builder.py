"""Builds pgoutput messages byte by byte, for hand-made decoder edge cases."""

from __future__ import annotations

import struct
from collections.abc import Sequence


def cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def xid_prefix(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack("!I", xid)


def begin(final_lsn: int, xid: int, commit_time: int = 0) -> bytes:
    return b"B" + struct.pack("!QqI", final_lsn, commit_time, xid)


def commit(commit_lsn: int, end_lsn: int, commit_time: int = 0) -> bytes:
    return b"C" + struct.pack("!BQQq", 0, commit_lsn, end_lsn, commit_time)


def relation(
    oid: int,
    namespace: str,
    name: str,
    columns: Sequence[tuple[str, int, bool]],
    identity: bytes = b"d",
    xid: int | None = None,
) -> bytes:
    body = b"R" + xid_prefix(xid) + struct.pack("!I", oid) + cstr(namespace) + cstr(name)
    body += identity + struct.pack("!h", len(columns))
    for col_name, type_oid, key in columns:
        body += bytes([1 if key else 0]) + cstr(col_name) + struct.pack("!Ii", type_oid, -1)
    return body


# bytes -> 't' value; None -> 'n'; the string 'u' -> unchanged TOAST;
# a bytearray -> 'b' (binary-format) value.
Value = bytes | bytearray | str | None


def tuple_data(values: Sequence[Value]) -> bytes:
    body = struct.pack("!h", len(values))
    for value in values:
        if value is None:
            body += b"n"
        elif value == "u":
            body += b"u"
        elif isinstance(value, bytearray):
            body += b"b" + struct.pack("!i", len(value)) + value
        else:
            assert isinstance(value, bytes)
            body += b"t" + struct.pack("!i", len(value)) + value
    return body


def insert(oid: int, values: Sequence[Value], xid: int | None = None) -> bytes:
    return b"I" + xid_prefix(xid) + struct.pack("!I", oid) + b"N" + tuple_data(values)


def update(
    oid: int,
    new: Sequence[Value],
    old: Sequence[Value] | None = None,
    key: bool = False,
    xid: int | None = None,
) -> bytes:
    """An Update; with ``old``, a 'K' (``key``) or 'O' old image before the new one."""
    head = b"U" + xid_prefix(xid) + struct.pack("!I", oid)
    if old is not None:
        head += (b"K" if key else b"O") + tuple_data(old)
    return head + b"N" + tuple_data(new)


def delete(oid: int, old: Sequence[Value], key: bool = True, xid: int | None = None) -> bytes:
    part = b"K" if key else b"O"
    return b"D" + xid_prefix(xid) + struct.pack("!I", oid) + part + tuple_data(old)


def stream_start(xid: int, first: bool = True) -> bytes:
    return b"S" + struct.pack("!IB", xid, 1 if first else 0)


def stream_stop() -> bytes:
    return b"E"


def stream_abort(xid: int, subxid: int) -> bytes:
    return b"A" + struct.pack("!II", xid, subxid)


def stream_commit(xid: int, commit_lsn: int, end_lsn: int, commit_time: int = 0) -> bytes:
    return b"c" + struct.pack("!IBQQq", xid, 0, commit_lsn, end_lsn, commit_time)


def origin(origin_lsn: int, name: str) -> bytes:
    return b"O" + struct.pack("!Q", origin_lsn) + cstr(name)
