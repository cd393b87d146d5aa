"""Row images of many change messages at once, into Arrow columns (no I/O).

In a large transaction, thousands of Insert, Update and Delete messages in
a row describe the same relation. Read one at a time, each value costs a
Python step; here the messages of one relation are joined into one buffer
and walked a column at a time with numpy, one array operation per column
for all of them. What comes out is ``TupleColumns``: the kinds as a
rows x columns byte matrix and, per column, an Arrow binary array of the
values' bytes (null where the column is NULL or unchanged).

This module only reads what is well formed. ``walk_changes`` returns None
for anything else - a length past the message end, an unknown kind, a
column count that is not the relation's, bytes left over - and the caller
decodes those messages one by one instead, so that the error names the
first bad message exactly as ``PgOutputDecoder.decode`` always does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Final, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from subscriber.replication.messages import (
    BINARY,
    NULL,
    TEXT,
    UNCHANGED,
    Delete,
    Insert,
    TupleData,
    Update,
)

_T = TypeVar("_T")
Positions = npt.NDArray[np.int64]
Bytes = npt.NDArray[np.uint8]

INSERT: Final = ord("I")
UPDATE: Final = ord("U")
DELETE: Final = ord("D")
_NEW: Final = ord("N")
_KEY: Final = ord("K")
_OLD: Final = ord("O")
# A run past this many bytes would overflow Arrow's 32-bit offsets; it is
# decoded message by message.
_MAX_OFFSET: Final = 2**31 - 1
# Zero bytes after the last message: any read at most this far past a message's
# end stays in the buffer, and is then found out of bounds by the checks.
_PAD: Final = bytes(16)
_IS_VALUE: Final = np.zeros(256, dtype=np.bool_)
_IS_VALUE[[TEXT, BINARY]] = True
_IS_KIND: Final = _IS_VALUE.copy()
_IS_KIND[[NULL, UNCHANGED]] = True
_NO_VALUES: Final = pa.array([], type=pa.binary())


@dataclass(frozen=True, slots=True)
class TupleColumns:
    """Row images of one relation, a column at a time.

    ``kinds`` holds ``rows * columns`` bytes, row after row, each one of
    NULL/UNCHANGED/TEXT/BINARY; ``values[c]`` has a value per row, null
    unless the kind is TEXT or BINARY.
    """

    rows: int
    kinds: bytes
    values: tuple[pa.BinaryArray, ...]

    def images(self) -> list[TupleData]:
        """One ``TupleData`` per row, built by numpy, Arrow and ``zip`` rather than per value."""
        columns = len(self.values)
        if columns == 0:
            return [TupleData(b"", ()) for _ in range(self.rows)]
        # Fixed-width byte strings: numpy drops trailing NULs, and no kind is NUL.
        kinds: list[bytes] = np.frombuffer(self.kinds, dtype=f"S{columns}").tolist()
        values = zip(*(column.to_pylist() for column in self.values), strict=True)
        return list(map(TupleData, kinds, values))


@dataclass(frozen=True, slots=True)
class WalkedChanges:
    """Change messages of one relation: their types, old and new images.

    ``old_rows`` and ``new_rows`` say which of the messages (by index)
    carry each image; ``old_is_key`` is per message with an old image.
    """

    types: bytes
    old_is_key: bytes
    old_rows: Positions
    new_rows: Positions
    old: TupleColumns
    new: TupleColumns

    def images(self) -> tuple[list[TupleData | None], list[TupleData | None]]:
        """Each message's new and old image (None where it has none)."""
        count = len(self.types)
        return (
            _spread(self.new.images(), self.new_rows, count),
            _spread(self.old.images(), self.old_rows, count),
        )


class RunBuffer:
    """A run of messages joined into one byte array that any in-range index can read."""

    def __init__(self, payloads: Sequence[bytes]) -> None:
        # Arrow joins the messages and measures them in one pass in C.
        joined = pa.array([*payloads, _PAD], type=pa.large_binary())
        _, offsets, data = joined.buffers()
        count = len(payloads)
        bounds: Positions = np.frombuffer(offsets, dtype=np.int64, count=count + 2)
        self.arrow: pa.Buffer = data
        self.data: Bytes = np.frombuffer(data, dtype=np.uint8, count=int(bounds[-1]))
        self.size = int(bounds[count])
        self.starts: Positions = bounds[:count]
        self.ends: Positions = bounds[1 : count + 1]
        self.no_empty_message = bool((self.ends > self.starts).all())
        self._every_other: pa.Array | None = None

    def every_other(self, rows: int) -> pa.Array:
        """0, 2, 4, ... 2 x (rows - 1): the same for every column of a walk, so made once."""
        taken = self._every_other
        if taken is None or len(taken) != rows:
            taken = self._every_other = pa.array(np.arange(0, 2 * rows, 2, dtype=np.int64))
        return taken

    def u8(self, at: Positions) -> npt.NDArray[np.int64]:
        return self.data[at].astype(np.int64)

    def u32(self, at: Positions) -> npt.NDArray[np.int64]:
        """Big-endian unsigned 32-bit integers at ``at``: four byte gathers and shifts
        (faster than gathering (n, 4) blocks and viewing them as ``>u4``)."""
        d = self.data
        value = (
            (d[at].astype(np.uint32) << 24)
            | (d[at + 1].astype(np.uint32) << 16)
            | (d[at + 2].astype(np.uint32) << 8)
            | d[at + 3]
        )
        return value.astype(np.int64)

    def relation_oids(self, streamed: bool) -> npt.NDArray[np.int64]:
        """Each message's relation OID (garbage for a message too short to have one)."""
        return self.u32(self.starts + (5 if streamed else 1))

    def xids(self) -> npt.NDArray[np.int64]:
        """Each streamed message's xid."""
        return self.u32(self.starts + 1)


def walk_changes(
    buf: RunBuffer, messages: Positions, relation_oid: int, columns: int, streamed: bool
) -> WalkedChanges | None:
    """Reads the Insert/Update/Delete ``messages`` (indexes into ``buf``) of one relation.

    None unless every one of them is well formed.
    """
    starts, ends = buf.starts[messages], buf.ends[messages]
    types = buf.u8(starts)
    at = starts + (9 if streamed else 5)  # past the type, the xid when streamed, the OID
    ok = (at + 1 <= ends) & (buf.u32(at - 4) == relation_oid)
    part = buf.u8(at)
    is_insert, is_update, is_delete = types == INSERT, types == UPDATE, types == DELETE
    has_old = (is_update & ((part == _KEY) | (part == _OLD))) | is_delete
    has_new = is_insert | is_update
    ok &= is_insert | is_update | is_delete
    ok &= ~is_insert | (part == _NEW)
    ok &= ~is_delete | (part == _KEY) | (part == _OLD)
    ok &= ~is_update | (part == _KEY) | (part == _OLD) | (part == _NEW)
    if not ok.all():
        return None
    at += 1
    old_rows = np.flatnonzero(has_old)
    old = _walk_images(buf, at, ends, old_rows, columns)
    if old is None:
        return None
    # Updates with an old image go on with 'N' and the new image.
    with_both = np.flatnonzero(has_old & has_new)
    if not (buf.u8(at[with_both]) == _NEW).all():
        return None
    at[with_both] += 1
    new_rows = np.flatnonzero(has_new)
    new = _walk_images(buf, at, ends, new_rows, columns)
    if new is None:
        return None
    if not (at == ends).all():
        return None
    return WalkedChanges(
        types=types.astype(np.uint8).tobytes(),
        old_is_key=(part[old_rows] == _KEY).astype(np.uint8).tobytes(),
        old_rows=old_rows,
        new_rows=new_rows,
        old=old,
        new=new,
    )


def _walk_images(
    buf: RunBuffer, at: Positions, ends: Positions, rows: Positions, columns: int
) -> TupleColumns | None:
    """The images starting at ``at[rows]``; moves those positions past them."""
    if len(rows) == 0:
        return TupleColumns(0, b"", (_NO_VALUES,) * columns)
    walked = _walk_tuples(buf, at[rows], ends[rows], columns)
    if walked is None:
        return None
    images, image_ends = walked
    at[rows] = image_ends
    return images


def _walk_tuples(
    buf: RunBuffer, at: Positions, ends: Positions, columns: int
) -> tuple[TupleColumns, Positions] | None:
    """TupleData starting at ``at`` in each message: its columns and where each ends."""
    rows = len(at)
    data = buf.data
    ok = (at + 2 <= ends) & (((data[at].astype(np.int64) << 8) | data[at + 1]) == columns)
    if not ok.all():
        return None
    at = at + 2
    kinds = np.empty((rows, columns), dtype=np.uint8)
    values = []
    for c in range(columns):
        # Every read stays in the buffer: `at` is at most the message's end here, and
        # the buffer has _PAD bytes after the last message.
        kind = data[at]
        is_value = _IS_VALUE[kind]
        # Read unsigned, a negative length is past any message's end.
        length = np.where(is_value, buf.u32(at + 1), 0)
        after = at + np.where(is_value, 5 + length, 1)
        if not (_IS_KIND[kind] & (after <= ends)).all():
            return None
        kinds[:, c] = kind
        column = _gather(buf, at + 5, length, is_value)
        if column is None:
            return None
        values.append(column)
        at = after
    return TupleColumns(rows, kinds.tobytes(), tuple(values)), at


def _gather(
    buf: RunBuffer, starts: Positions, lengths: Positions, present: npt.NDArray[np.bool_]
) -> pa.BinaryArray | None:
    """An Arrow binary column of the byte ranges (start, length); null where not present.

    The ranges lie in buffer order, so the whole buffer reads as one binary
    array of 2 x rows items - each range, then the gap to the next - and
    Arrow's ``take`` of every other item copies the values out in C.
    """
    rows = len(starts)
    # A NULL's empty range may start a few bytes past its message (in the padding
    # after the last one): the final gap ends at the very end of the buffer.
    end = len(buf.data)
    if end > _MAX_OFFSET:
        return None
    offsets = np.empty(2 * rows + 1, dtype=np.int32)
    offsets[0:-1:2] = starts
    offsets[1::2] = starts + lengths
    offsets[-1] = end
    validity = None
    nulls = rows - int(np.count_nonzero(present))
    if nulls:
        interleaved = np.ones(2 * rows, dtype=np.bool_)
        interleaved[0::2] = present
        validity = pa.py_buffer(np.packbits(interleaved, bitorder="little"))
    ranges = pa.Array.from_buffers(
        pa.binary(), 2 * rows, [validity, pa.py_buffer(offsets), buf.arrow], null_count=-1
    )
    column: pa.BinaryArray = pc.take(ranges, buf.every_other(rows), boundscheck=False)
    return column


# One row change as the apply side takes it: (relation OID, message type byte,
# new image, old image, whether the old image is key-only, xid when streamed).
Row = tuple[int, int, TupleData | None, TupleData | None, bool, int | None]


@dataclass(frozen=True, slots=True)
class ChangeGroup:
    """Messages of a run: those of one relation, walked, or a few decoded one by one."""

    relation_oid: int  # of the walked messages
    messages: Positions  # indexes in the run
    walked: WalkedChanges | None = None
    decoded: tuple[Insert | Update | Delete, ...] = ()

    def rows(self, xids: Iterable[int | None]) -> list[Row]:
        if self.walked is None:
            return [_row(message) for message in self.decoded]
        walked = self.walked
        new, old = walked.images()
        is_key = _spread([k == 1 for k in walked.old_is_key], walked.old_rows, len(walked.types))
        return list(
            zip(
                repeat(self.relation_oid),
                walked.types,
                new,
                old,
                (k is True for k in is_key),
                xids,
                strict=False,
            )
        )


@dataclass(frozen=True, slots=True)
class RowChanges:
    """Consecutive Insert/Update/Delete messages decoded together.

    Made by ``PgOutputDecoder.decode_changes``, not a message of the wire:
    the changes of one transaction (or one streamed block) in stream order,
    grouped by relation. ``xids`` is each message's xid inside a streamed
    block (subtransactions have their own), None outside one.
    """

    count: int
    groups: tuple[ChangeGroup, ...]
    xids: tuple[int, ...] | None = None

    def rows(self) -> list[Row]:
        """Every change, in stream order."""
        if len(self.groups) == 1:
            group = self.groups[0]
            return group.rows(self.xids if self.xids is not None else repeat(None, self.count))
        ordered: list[Row | None] = [None] * self.count
        for group in self.groups:
            indexes = group.messages.tolist()
            xids = [None] * len(indexes) if self.xids is None else [self.xids[i] for i in indexes]
            for index, row in zip(indexes, group.rows(xids), strict=True):
                ordered[index] = row
        return [row for row in ordered if row is not None]

    def messages(self) -> list[Insert | Update | Delete]:
        """Every change as the message ``PgOutputDecoder.decode`` would have made of it."""
        return [_message(row) for row in self.rows()]


def _spread(values: list[_T], rows: Positions, count: int) -> list[_T | None]:
    if len(rows) == count:
        return list(values)
    spread: list[_T | None] = [None] * count
    for index, value in zip(rows.tolist(), values, strict=True):
        spread[index] = value
    return spread


def _row(message: Insert | Update | Delete) -> Row:
    match message:
        case Insert(relation_oid=oid, new=new, xid=xid):
            return (oid, INSERT, new, None, False, xid)
        case Update(relation_oid=oid, new=new, old=old, old_is_key=is_key, xid=xid):
            return (oid, UPDATE, new, old, is_key, xid)
        case Delete(relation_oid=oid, old=old, old_is_key=is_key, xid=xid):
            return (oid, DELETE, None, old, is_key, xid)


def _message(row: Row) -> Insert | Update | Delete:
    oid, kind, new, old, is_key, xid = row
    if kind == INSERT:
        assert new is not None
        return Insert(oid, new, xid)
    if kind == UPDATE:
        assert new is not None
        return Update(oid, new, old, is_key, xid)
    assert old is not None
    return Delete(oid, old, is_key, xid)
