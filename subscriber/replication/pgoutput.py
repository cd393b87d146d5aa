"""Decoder of pgoutput messages, protocol versions 1 to 4 (no I/O).

``PgOutputDecoder.decode`` takes the payload of one XLogData message and
returns one message value from ``subscriber.replication.messages``. It keeps what the
stream carries from message to message: the Relation and Type caches (keyed
by OID, replaced when a new Relation arrives), whether a streamed block is
open (changes inside one carry an xid) and the open transaction (so that a
Commit must match its Begin). Anything that does not follow the protocol
raises ``ProtocolError`` naming the message type, offset and LSN - never
another exception, and never a silent skip.

Row values are not converted here: TupleData keeps the raw bytes of each
column, so that they can be turned into typed columns a batch at a time.
``decode_changes`` takes a run of consecutive Insert/Update/Delete messages
at once and reads the row images of each relation's messages a column at a
time (``subscriber.replication.tuples``); the result equals decoding them one by one,
errors included. What a backlog of small transactions is made of is read without a
cursor (``subscriber.replication.direct_reads``, which the decoder extends).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np

from subscriber.replication.direct_reads import (
    BEGIN_BODY,
    COMMIT_BODY,
    DirectReads,
)
from subscriber.replication.errors import ProtocolError
from subscriber.replication.lsn import Lsn, unpacked
from subscriber.replication.messages import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    ReplicaIdentity,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from subscriber.replication.reader import MessageReader
from subscriber.replication.tuples import ChangeGroup, RowChanges, RunBuffer, walk_changes

_STREAM_COMMIT: Final = struct.Struct("!IBQQq")
_PREPARE_HEAD: Final = struct.Struct("!BQQqI")
_BEGIN_PREPARE_HEAD: Final = struct.Struct("!QQqI")
_ROLLBACK_PREPARED_HEAD: Final = struct.Struct("!BQQqqI")

_IDENTITIES: Final = {ord(r.value): r for r in ReplicaIdentity}
# Fewer messages of one relation than this are decoded one by one: below it,
# numpy's fixed cost per call outweighs what the column-wise walk saves.
WALK_AT_LEAST: Final = 32


class PgOutputDecoder(DirectReads):
    """Decodes one replication session's pgoutput messages, in order."""

    def __init__(self, proto_version: int = 1, *, parallel_streaming: bool = False) -> None:
        if proto_version not in (1, 2, 3, 4):
            raise ValueError(f"pgoutput protocol version {proto_version} is not 1 to 4")
        self.proto_version = proto_version
        self.parallel_streaming = parallel_streaming
        self.relations: dict[int, Relation] = {}
        self.types: dict[int, Type] = {}
        self._stream_xid: int | None = None  # open streamed block
        self._open: Begin | BeginPrepare | None = None  # open (non-streamed) transaction
        self._handlers: dict[int, Callable[[MessageReader], Message]] = {
            ord("B"): self._begin,
            ord("C"): self._commit,
            ord("O"): self._origin,
            ord("R"): self._relation,
            ord("Y"): self._type,
            ord("I"): self._insert,
            ord("U"): self._update,
            ord("D"): self._delete,
            ord("T"): self._truncate,
            ord("M"): self._message,
        }
        if proto_version >= 2:
            self._handlers.update(
                {
                    ord("S"): self._stream_start,
                    ord("E"): self._stream_stop,
                    ord("c"): self._stream_commit,
                    ord("A"): self._stream_abort,
                }
            )
        if proto_version >= 3:
            self._handlers.update(
                {
                    ord("b"): self._begin_prepare,
                    ord("P"): self._prepare,
                    ord("K"): self._commit_prepared,
                    ord("r"): self._rollback_prepared,
                    ord("p"): self._stream_prepare,
                }
            )

    def reset(self) -> None:
        """Forget session state: a new connection resends Relation and Type messages."""
        self.relations.clear()
        self.types.clear()
        self._stream_xid = None
        self._open = None

    def decode(self, payload: bytes, lsn: Lsn | None = None) -> Message:
        if not payload:
            raise ProtocolError("empty pgoutput message", lsn=lsn)
        handler = self._handlers.get(payload[0])
        if handler is None:
            raise ProtocolError(
                f"unknown message type {payload[0]:#04x} for protocol version {self.proto_version}",
                msg_type=chr(payload[0]),
                offset=0,
                lsn=lsn,
            )
        reader = MessageReader(payload)
        try:
            message = handler(reader)
            reader.finish()
        except ProtocolError as exc:
            raise ProtocolError(
                exc.reason,
                msg_type=chr(payload[0]),
                offset=exc.offset if exc.offset is not None else reader.pos,
                lsn=lsn,
            ) from None
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise ProtocolError(
                str(exc), msg_type=chr(payload[0]), offset=reader.pos, lsn=lsn
            ) from exc
        return message

    def decode_changes(self, payloads: Sequence[bytes], lsns: Sequence[Lsn]) -> RowChanges:
        """Consecutive Insert/Update/Delete messages, decoded together.

        The same changes, and the same ``ProtocolError`` for the first bad
        message, as ``decode`` of each in turn; ``lsns`` are the messages'
        own, for that error.
        """
        if len(payloads) != len(lsns):
            raise ValueError("one LSN per message")
        walked = self._walk_run(payloads, lsns)
        if walked is None:
            everything = self._one_by_one(payloads, lsns, np.arange(len(payloads)))
            return RowChanges(len(payloads), (everything,))
        groups, xids = walked
        return RowChanges(len(payloads), groups, xids)

    def _walk_run(
        self, payloads: Sequence[bytes], lsns: Sequence[Lsn]
    ) -> tuple[tuple[ChangeGroup, ...], tuple[int, ...] | None] | None:
        """Each relation's messages walked (a few decoded one by one); None to decode all so."""
        if not payloads or not self._in_transaction_or_block():
            return None
        buf = RunBuffer(payloads)
        if not buf.no_empty_message:
            return None
        streamed = self._stream_xid is not None
        oids = buf.relation_oids(streamed)
        single = bool((oids == oids[0]).all())
        groups: list[ChangeGroup] = []
        leftover: list[np.ndarray] = []
        for oid in (int(oids[0]),) if single else np.unique(oids).tolist():
            messages = np.arange(len(payloads)) if single else np.flatnonzero(oids == oid)
            if len(messages) < WALK_AT_LEAST:
                leftover.append(messages)
                continue
            relation = self.relations.get(oid)
            if relation is None:
                return None
            walked = walk_changes(buf, messages, oid, len(relation.columns), streamed)
            if walked is None:
                return None
            groups.append(ChangeGroup(oid, messages, walked))
        if leftover:
            groups.append(self._one_by_one(payloads, lsns, np.sort(np.concatenate(leftover))))
        xids = tuple(buf.xids().tolist()) if streamed else None
        return tuple(groups), xids

    def _in_transaction_or_block(self) -> bool:
        return self._open is not None or self._stream_xid is not None

    def _one_by_one(
        self, payloads: Sequence[bytes], lsns: Sequence[Lsn], messages: np.ndarray
    ) -> ChangeGroup:
        decoded: list[Insert | Update | Delete] = []
        for index in messages.tolist():
            message = self.decode(payloads[index], lsns[index])
            if not isinstance(message, Insert | Update | Delete):
                raise ProtocolError(
                    f"{type(message).__name__} among the row changes of a run",
                    msg_type=chr(payloads[index][0]),
                    offset=0,
                    lsn=lsns[index],
                )
            decoded.append(message)
        oid = decoded[0].relation_oid if decoded else 0
        return ChangeGroup(oid, messages, decoded=tuple(decoded))

    # -- transactions ----------------------------------------------------

    def _begin(self, r: MessageReader) -> Begin:
        final_lsn, commit_time, xid = r._unpack(BEGIN_BODY)
        self._no_open_transaction("Begin")
        begin = Begin(unpacked(final_lsn), commit_time, xid)
        self._open = begin
        return begin

    def _commit(self, r: MessageReader) -> Commit:
        flags, commit_lsn, end_lsn, commit_time = r._unpack(COMMIT_BODY)
        if not isinstance(self._open, Begin):
            raise ProtocolError("Commit without a Begin", offset=0)
        if commit_lsn != self._open.final_lsn:
            raise ProtocolError(
                f"Commit LSN {Lsn(commit_lsn)} does not match its Begin's final "
                f"LSN {self._open.final_lsn} (xid {self._open.xid})",
                offset=2,
            )
        self._open = None
        return Commit(flags, unpacked(commit_lsn), unpacked(end_lsn), commit_time)

    def _origin(self, r: MessageReader) -> Origin:
        return Origin(r.lsn(), r.string())

    def _begin_prepare(self, r: MessageReader) -> BeginPrepare:
        prepare_lsn, end_lsn, prepare_time, xid = r._unpack(_BEGIN_PREPARE_HEAD)
        self._no_open_transaction("Begin Prepare")
        begin = BeginPrepare(Lsn(prepare_lsn), Lsn(end_lsn), prepare_time, xid, r.string())
        self._open = begin
        return begin

    def _prepare(self, r: MessageReader) -> Prepare:
        flags, prepare_lsn, end_lsn, prepare_time, xid = r._unpack(_PREPARE_HEAD)
        prepare = Prepare(flags, Lsn(prepare_lsn), Lsn(end_lsn), prepare_time, xid, r.string())
        if not isinstance(self._open, BeginPrepare):
            raise ProtocolError("Prepare without a Begin Prepare", offset=0)
        if prepare.prepare_lsn != self._open.prepare_lsn or prepare.gid != self._open.gid:
            raise ProtocolError(
                f"Prepare {prepare.gid!r} at {prepare.prepare_lsn} does not match Begin Prepare "
                f"{self._open.gid!r} at {self._open.prepare_lsn}",
                offset=2,
            )
        self._open = None
        return prepare

    def _commit_prepared(self, r: MessageReader) -> CommitPrepared:
        flags, commit_lsn, end_lsn, commit_time, xid = r._unpack(_PREPARE_HEAD)
        self._no_open_transaction("Commit Prepared")
        return CommitPrepared(flags, Lsn(commit_lsn), Lsn(end_lsn), commit_time, xid, r.string())

    def _rollback_prepared(self, r: MessageReader) -> RollbackPrepared:
        flags, prep_end, rb_end, prep_time, rb_time, xid = r._unpack(_ROLLBACK_PREPARED_HEAD)
        self._no_open_transaction("Rollback Prepared")
        return RollbackPrepared(
            flags, Lsn(prep_end), Lsn(rb_end), prep_time, rb_time, xid, r.string()
        )

    def _no_open_transaction(self, what: str) -> None:
        if self._open is not None:
            raise ProtocolError(
                f"{what} while transaction {self._open.xid} is still open", offset=0
            )
        if self._stream_xid is not None:
            raise ProtocolError(f"{what} inside the streamed block of {self._stream_xid}", offset=0)

    # -- streamed transactions -------------------------------------------

    def _stream_start(self, r: MessageReader) -> StreamStart:
        xid = r.u32()
        first = r.u8()
        self._no_open_transaction("Stream Start")
        self._stream_xid = xid
        return StreamStart(xid, first == 1)

    def _stream_stop(self, r: MessageReader) -> StreamStop:
        if self._stream_xid is None:
            raise ProtocolError("Stream Stop without a Stream Start", offset=0)
        self._stream_xid = None
        return StreamStop()

    def _stream_commit(self, r: MessageReader) -> StreamCommit:
        xid, flags, commit_lsn, end_lsn, commit_time = r._unpack(_STREAM_COMMIT)
        self._no_open_transaction("Stream Commit")
        return StreamCommit(xid, flags, Lsn(commit_lsn), Lsn(end_lsn), commit_time)

    def _stream_abort(self, r: MessageReader) -> StreamAbort:
        xid = r.u32()
        subxid = r.u32()
        self._no_open_transaction("Stream Abort")
        if self.parallel_streaming:
            return StreamAbort(xid, subxid, r.lsn(), r.i64())
        return StreamAbort(xid, subxid)

    def _stream_prepare(self, r: MessageReader) -> StreamPrepare:
        flags, prepare_lsn, end_lsn, prepare_time, xid = r._unpack(_PREPARE_HEAD)
        self._no_open_transaction("Stream Prepare")
        return StreamPrepare(flags, Lsn(prepare_lsn), Lsn(end_lsn), prepare_time, xid, r.string())

    # -- catalog ---------------------------------------------------------

    def _xid(self, r: MessageReader) -> int | None:
        return r.u32() if self._stream_xid is not None else None

    def _relation(self, r: MessageReader) -> Relation:
        xid = self._xid(r)
        oid = r.u32()
        namespace = r.string() or "pg_catalog"
        name = r.string()
        at = r.pos
        identity = _IDENTITIES.get(r.u8())
        if identity is None:
            raise ProtocolError("unknown replica identity", offset=at)
        ncols = r.i16()
        if ncols < 0:
            raise ProtocolError(f"negative column count {ncols}", offset=r.pos - 2)
        columns = []
        for _ in range(ncols):
            flags = r.u8()
            columns.append(
                Column(name=r.string(), type_oid=r.u32(), typmod=r.i32(), is_key=bool(flags & 1))
            )
        relation = Relation(oid, namespace, name, identity, tuple(columns), xid)
        self.relations[oid] = relation
        return relation

    def _type(self, r: MessageReader) -> Type:
        xid = self._xid(r)
        type_ = Type(r.u32(), r.string() or "pg_catalog", r.string(), xid)
        self.types[type_.oid] = type_
        return type_

    # -- changes ---------------------------------------------------------

    def _in_change_context(self) -> None:
        if self._open is None and self._stream_xid is None:
            raise ProtocolError("change outside a transaction", offset=0)

    def _known_relation(self, r: MessageReader) -> Relation:
        at = r.pos
        oid = r.u32()
        relation = self.relations.get(oid)
        if relation is None:
            raise ProtocolError(
                f"change for relation OID {oid} without a preceding Relation message", offset=at
            )
        return relation

    def _insert(self, r: MessageReader) -> Insert:
        self._in_change_context()
        xid = self._xid(r)
        relation = self._known_relation(r)
        r.expect(ord("N"))
        return Insert(relation.oid, r.tuple_data(len(relation.columns)), xid)

    def _update(self, r: MessageReader) -> Update:
        self._in_change_context()
        xid = self._xid(r)
        relation = self._known_relation(r)
        ncols = len(relation.columns)
        part = r.expect(ord("K"), ord("O"), ord("N"))
        if part == ord("N"):
            return Update(relation.oid, r.tuple_data(ncols), None, False, xid)
        old = r.tuple_data(ncols)
        r.expect(ord("N"))
        return Update(relation.oid, r.tuple_data(ncols), old, part == ord("K"), xid)

    def _delete(self, r: MessageReader) -> Delete:
        self._in_change_context()
        xid = self._xid(r)
        relation = self._known_relation(r)
        part = r.expect(ord("K"), ord("O"))
        return Delete(relation.oid, r.tuple_data(len(relation.columns)), part == ord("K"), xid)

    def _truncate(self, r: MessageReader) -> Truncate:
        self._in_change_context()
        xid = self._xid(r)
        count = r.i32()
        options = r.u8()
        if count < 0 or r.pos + 4 * count != len(r.buf):
            raise ProtocolError(
                f"Truncate of {count} relations does not fit the message", offset=r.pos - 5
            )
        oids = []
        for _ in range(count):
            oids.append(self._known_relation(r).oid)
        return Truncate(tuple(oids), bool(options & 1), bool(options & 2), xid)

    def _message(self, r: MessageReader) -> LogicalMessage:
        xid = self._xid(r)
        flags = r.u8()
        lsn = r.lsn()
        prefix = r.string()
        length = r.i32()
        return LogicalMessage(bool(flags & 1), lsn, prefix, r.raw(length), xid)
