"""A bounds-checked cursor over one pgoutput message (no I/O).

Every read checks that the message holds it and raises ``ProtocolError``
with the offset where it does not; ``tuple_at`` reads a row image
(TupleData) in one inlined loop, since row images are most of what a
stream carries (the cursor's ``tuple_data``, and the decoder's
``decode_change`` without a cursor). ``subscriber.replication.pgoutput``
reads each message with one.
"""

from __future__ import annotations

import struct
from typing import Final

from subscriber.replication.errors import ProtocolError
from subscriber.replication.lsn import Lsn, unpacked
from subscriber.replication.messages import BINARY, NULL, TEXT, UNCHANGED, TupleData

_I16: Final = struct.Struct("!h")
_I32: Final = struct.Struct("!i")
_U32: Final = struct.Struct("!I")
_I64: Final = struct.Struct("!q")
_U64: Final = struct.Struct("!Q")
_LENGTH: Final = _I32.unpack_from  # a TupleData column's length


class MessageReader:
    """A cursor over one message; every read checks the bounds."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int = 1) -> None:
        self.buf = buf
        self.pos = pos

    def _unpack(self, fmt: struct.Struct) -> tuple[int, ...]:
        values = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return values

    def u8(self) -> int:
        if self.pos >= len(self.buf):
            raise ProtocolError("message ends early", offset=self.pos)
        value = self.buf[self.pos]
        self.pos += 1
        return value

    def i16(self) -> int:
        return self._unpack(_I16)[0]

    def i32(self) -> int:
        return self._unpack(_I32)[0]

    def u32(self) -> int:
        return self._unpack(_U32)[0]

    def i64(self) -> int:
        return self._unpack(_I64)[0]

    def lsn(self) -> Lsn:
        return unpacked(self._unpack(_U64)[0])

    def string(self) -> str:
        end = self.buf.find(b"\0", self.pos)
        if end < 0:
            raise ProtocolError("string without a terminating NUL", offset=self.pos)
        text = self.buf[self.pos : end].decode()
        self.pos = end + 1
        return text

    def raw(self, length: int) -> bytes:
        if length < 0 or self.pos + length > len(self.buf):
            raise ProtocolError(f"length {length} runs past the message end", offset=self.pos)
        data = self.buf[self.pos : self.pos + length]
        self.pos += length
        return data

    def tuple_data(self, expected_columns: int) -> TupleData:
        """TupleData at the cursor (``tuple_at``)."""
        data, self.pos = tuple_at(self.buf, self.pos, expected_columns)
        return data

    def expect(self, *allowed: int) -> int:
        at = self.pos
        byte = self.u8()
        if byte not in allowed:
            names = "/".join(repr(chr(a)) for a in allowed)
            raise ProtocolError(f"expected {names}, got {byte:#04x}", offset=at)
        return byte

    def finish(self) -> None:
        if self.pos != len(self.buf):
            raise ProtocolError(
                f"{len(self.buf) - self.pos} unexpected bytes after the message", offset=self.pos
            )


def tuple_at(buf: bytes, pos: int, expected_columns: int) -> tuple[TupleData, int]:
    """The TupleData at ``pos`` of ``buf`` and where it ends; inlined for speed: row
    images are most of what a stream carries."""
    size = len(buf)
    if pos + 2 > size:
        raise ProtocolError("TupleData ends early", offset=pos)
    ncols = (buf[pos] << 8) | buf[pos + 1]
    if ncols != expected_columns:
        raise ProtocolError(
            f"TupleData has {ncols} columns, the relation has {expected_columns}", offset=pos
        )
    pos += 2
    values: list[bytes | None] = []
    append = values.append
    kinds = bytearray(ncols)
    for i in range(ncols):
        if pos >= size:
            raise ProtocolError("TupleData ends early", offset=pos)
        kind = kinds[i] = buf[pos]
        if kind in (TEXT, BINARY):
            if pos + 5 > size:
                raise ProtocolError("TupleData ends early", offset=pos)
            length = _LENGTH(buf, pos + 1)[0]
            start = pos + 5
            pos = start + length
            if length < 0 or pos > size:
                raise ProtocolError(
                    f"column length {length} runs past the message end", offset=start - 4
                )
            append(buf[start:pos])
        elif kind in (NULL, UNCHANGED):
            append(None)
            pos += 1
        else:
            raise ProtocolError(f"unknown TupleData column kind {kind:#04x}", offset=pos)
    return TupleData(bytes(kinds), tuple(values)), pos
