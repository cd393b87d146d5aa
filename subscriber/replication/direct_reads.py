"""The direct reads of ``PgOutputDecoder`` (no I/O): the messages a backlog of small
transactions is made of - a Begin, a row change in an open transaction, a Commit, and
such a transaction whole - read without a cursor when well formed, the result equal
to ``decode``'s. Anything else, or anything not well formed, goes to ``decode`` itself,
for its error. A backlog of single-row transactions is bound by the receiver's Python a
message (docs/performance.md, "Small transactions handed on whole").
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, cast

from subscriber.replication.errors import ProtocolError
from subscriber.replication.lsn import Lsn, unpacked
from subscriber.replication.messages import (
    Begin,
    BeginPrepare,
    Commit,
    Delete,
    Insert,
    Message,
    Relation,
    Update,
)
from subscriber.replication.reader import tuple_at

# A Begin's and a Commit's fields, after the type byte.
BEGIN_BODY: Final = struct.Struct("!QqI")
COMMIT_BODY: Final = struct.Struct("!BQQq")
_BEGIN_SIZE: Final = 1 + BEGIN_BODY.size  # the whole message, its type byte included
_COMMIT_SIZE: Final = 1 + COMMIT_BODY.size
_BEGIN_TYPE: Final = ord("B")
_COMMIT_TYPE: Final = b"C"
_U32: Final = struct.Struct("!I").unpack_from
# A row change's type and the byte naming its first row image (``decode_change``).
_INSERT, _UPDATE, _DELETE = ord("I"), ord("U"), ord("D")
_NEW, _KEY = ord("N"), ord("K")
_OLD: Final = frozenset(b"KO")
CHANGE_TYPES: Final = frozenset(b"IUD")
# A small transaction read whole (``DirectReads.whole_at``): its xid, final LSN and
# Begin's commit time, its Commit's flags, end LSN and commit time, its row changes, and
# the index of the frame after its Commit.
WholeFields = tuple[int, Lsn, int, int, Lsn, int, tuple[Insert | Update | Delete, ...], int]


class DirectReads:
    """What ``PgOutputDecoder`` reads without a cursor; it keeps the session's state."""

    relations: dict[int, Relation]
    _open: Begin | BeginPrepare | None  # the open (non-streamed) transaction
    _stream_xid: int | None  # the open streamed block

    def decode(self, payload: bytes, lsn: Lsn | None = None) -> Message:
        raise NotImplementedError  # ``PgOutputDecoder.decode``

    def decode_begin(self, payload: bytes, lsn: Lsn | None = None) -> Begin:
        """``decode`` of a Begin message, without a reader when it is well formed and
        may come here; otherwise ``decode`` itself, for its error."""
        if len(payload) != _BEGIN_SIZE or self._open is not None or self._stream_xid is not None:
            return cast(Begin, self.decode(payload, lsn))
        final_lsn, commit_time, xid = BEGIN_BODY.unpack_from(payload, 1)
        begin = self._open = Begin(unpacked(final_lsn), commit_time, xid)
        return begin

    def decode_commit(self, payload: bytes, lsn: Lsn | None = None) -> Commit:
        """``decode`` of a Commit message, as ``decode_begin`` is of a Begin."""
        open_ = self._open
        if len(payload) != _COMMIT_SIZE or not isinstance(open_, Begin):
            return cast(Commit, self.decode(payload, lsn))
        flags, commit_lsn, end_lsn, commit_time = COMMIT_BODY.unpack_from(payload, 1)
        if commit_lsn != open_.final_lsn:
            return cast(Commit, self.decode(payload, lsn))
        self._open = None
        return Commit(flags, unpacked(commit_lsn), unpacked(end_lsn), commit_time)

    def decode_change(self, payload: bytes, lsn: Lsn | None = None) -> Insert | Update | Delete:
        """``decode`` of an Insert, an Update without an old image, or a Delete in an open
        transaction (not a streamed block), read without a cursor when well formed - a
        backlog of small transactions is bound by the receiver's Python a message; any
        other message, or one not well formed, ``decode`` itself, for its error."""
        change = self._plain_change(payload)
        if change is None:
            return cast(Insert | Update | Delete, self.decode(payload, lsn))
        return change

    def _plain_change(self, payload: bytes) -> Insert | Update | Delete | None:
        """``decode_change``'s direct read; None: the message is left to ``decode``."""
        if self._open is None or self._stream_xid is not None:
            return None
        return self._change_within(payload)

    def whole_at(
        self, frames: Sequence[tuple[Lsn, bytes]], at: int, most: int
    ) -> WholeFields | None:
        """The small transaction whose Begin is ``frames[at]`` (frames as (LSN, payload)),
        read whole when it is all there - at most ``most`` row changes ``decode_change``
        reads directly, then its Commit - and well formed: its Begin's and Commit's fields,
        its changes and the index of the frame after it (``WholeFields``), as
        ``decode_begin``, ``decode_change`` and ``decode_commit`` in turn would decode them,
        with no Begin or Commit made. Nothing is kept of it (the session
        is outside a transaction before and after). None: not such a transaction; its
        frames are left to be decoded one at a time."""
        begin = frames[at][1]
        if len(begin) != _BEGIN_SIZE or self._open is not None or self._stream_xid is not None:
            return None
        if begin[0] != _BEGIN_TYPE:
            return None
        changes: list[Insert | Update | Delete] = []
        for index in range(at + 1, min(len(frames), at + most + 2)):
            payload = frames[index][1]
            if payload[:1] == _COMMIT_TYPE:
                if len(payload) != _COMMIT_SIZE:
                    return None
                final_lsn, commit_time, xid = BEGIN_BODY.unpack_from(begin, 1)
                flags, commit_lsn, end_lsn, time = COMMIT_BODY.unpack_from(payload, 1)
                if commit_lsn != final_lsn:
                    return None
                return (
                    xid,
                    unpacked(final_lsn),
                    commit_time,
                    flags,
                    unpacked(end_lsn),
                    time,
                    tuple(changes),
                    index + 1,
                )
            change = self._change_within(payload) if len(changes) < most else None
            if change is None:
                return None
            changes.append(change)
        return None

    def _change_within(self, payload: bytes) -> Insert | Update | Delete | None:
        """A row change in an open transaction read directly; None: left to ``decode``."""
        if len(payload) < 8:
            return None
        relation = self.relations.get(_U32(payload, 1)[0])
        kind, part = payload[0], payload[5]
        if (
            relation is None
            or kind not in CHANGE_TYPES
            or (part not in _OLD if kind == _DELETE else part != _NEW)
        ):
            return None
        try:
            image, end = tuple_at(payload, 6, len(relation.columns))
        except ProtocolError:
            return None
        if end != len(payload):
            return None
        if kind == _UPDATE:
            return Update(relation.oid, image)
        if kind == _INSERT:
            return Insert(relation.oid, image)
        return Delete(relation.oid, image, part == _KEY)
