"""Transaction assembly: decoded messages in, complete remote transactions out.

``TransactionAssembler.feed`` takes the messages of one replication session
in stream order and returns a transaction when a Commit (or a Stream
Commit) closes one; everything else returns None. What comes out is in
commit order:

- a ``RemoteTransaction`` with its changes in memory, or
- a ``SpooledTransaction`` whose changes are in a spool file
  (``apply.arrival.spool``): every streamed transaction (``streaming = on``), and a
  transaction sent whole that grew past ``spill_after`` changes.

A small transaction the receiver hands on whole (``WholeTransaction``: a
Begin, a few row changes and a Commit as one item) is made in one step,
without a message at a time.

Streamed blocks of several transactions interleave with each other and
with whole transactions. A Relation message inside a streamed block
describes the relation for that transaction only until it commits, as
PostgreSQL's apply worker replays it at commit: changes of the block are
read with their own transaction's latest Relation, and the session's
relation cache takes the transaction's Relations when it commits.

With ``two_phase``, Begin Prepare ... Prepare (or a streamed transaction's
Stream Prepare) makes a ``Prepared`` transaction, staged by the apply worker
until its Commit Prepared or Rollback Prepared (``PreparedFinish``), which
arrive later, in their own place in the stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc

from apply.arrival.spool import Spool, SpoolDirectory, SpooledTransaction
from apply.columns.change_columns import ChangeColumns
from apply.core.transactions import (
    Bounds,
    Change,
    MessageChange,
    Op,
    PreparedFinish,
    RemoteTransaction,
    RowChange,
    TruncateChange,
    change_size,
    image_size,
)
from apply.schema_changes.ddl import DDL_PREFIX
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    Relation,
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
from subscriber.replication.messages import (
    Prepare as PrepareMessage,
)
from subscriber.replication.runs import Decoded, WholeTransaction
from subscriber.replication.tuples import DELETE, INSERT, UPDATE, RowChanges
from subscriber.replication.wire import pg_now


@dataclass(frozen=True, slots=True)
class Prepared:
    """A PREPAREd remote transaction (``two_phase``): staged durably, applied at its COMMIT
    PREPARED. ``tx`` carries the prepare's LSNs and time."""

    gid: str
    tx: RemoteTransaction | SpooledTransaction

    @property
    def xid(self) -> int:
        return self.tx.xid

    @property
    def final_lsn(self) -> Lsn:
        return self.tx.final_lsn

    @property
    def end_lsn(self) -> Lsn:
        return self.tx.end_lsn

    @property
    def commit_time(self) -> int:
        return self.tx.commit_time


AssembledTransaction = RemoteTransaction | SpooledTransaction | Prepared | PreparedFinish
_OPS = {INSERT: Op.INSERT, UPDATE: Op.UPDATE, DELETE: Op.DELETE}


class UnsupportedStreamError(Exception):
    """The stream carries something this subscriber cannot apply yet."""


@dataclass
class _Open:
    begin: Begin
    gid: str | None = None  # a transaction being prepared (Begin Prepare)
    changes: list[Change] = field(default_factory=list)
    size: int = 0  # bytes of row data in ``changes``
    origin: Origin | None = None
    spool: Spool | None = None  # once the transaction outgrew memory


@dataclass
class _Streamed:
    spool: Spool
    origin: Origin | None = None


class TransactionAssembler:
    """Turns one session's messages into complete transactions, in commit order."""

    def __init__(
        self,
        spools: SpoolDirectory | None = None,
        spill_after: Bounds | None = None,
        *,
        messages: bool = True,
    ) -> None:
        if spill_after is not None and spools is None:
            raise ValueError("spill_after needs a spool directory")
        self.relations: dict[int, Relation] = {}
        self.types: dict[int, Type] = {}
        # Every logical message (``messages: true``); else only pgsub's DDL messages.
        self._messages = messages
        self._spools = spools
        self._spill_after = spill_after
        self._open: _Open | None = None
        self._streams: dict[int, _Streamed] = {}
        self._block: _Streamed | None = None  # the streamed block being received

    def reset(self) -> None:
        """A new connection: open and streamed transactions will be sent again from their start."""
        if self._open is not None and self._open.spool is not None:
            self._discard(self._open.spool)
        self._open = None
        for streamed in self._streams.values():
            self._discard(streamed.spool)
        self._streams.clear()
        self._block = None

    # One case per pgoutput message, in the protocol's own list: a dispatch, not a decision.
    def feed(self, message: Decoded) -> AssembledTransaction | None:  # noqa: PLR0912
        match message:
            case WholeTransaction():
                return self._whole(message)
            case RowChanges():
                self._add_rows(message)
            case Begin():
                self._open = _Open(message)
            case Relation():
                if self._block is not None:
                    self._block.spool.note_relation(message, message.xid)
                else:
                    self.relations[message.oid] = message
            case Type():
                self.types[message.oid] = message
            case Origin():
                if self._block is not None:
                    self._block.origin = message
                else:
                    self._current().origin = message
            case Insert(relation_oid=oid, new=new, xid=xid):
                self._add(RowChange(self._relation(oid), Op.INSERT, new, None), xid)
            case Update(relation_oid=oid, new=new, old=old, xid=xid):
                self._add(RowChange(self._relation(oid), Op.UPDATE, new, old), xid)
            case Delete(relation_oid=oid, old=old, xid=xid):
                self._add(RowChange(self._relation(oid), Op.DELETE, None, old), xid)
            case Truncate(relation_oids=oids, cascade=cascade, restart_identity=restart, xid=xid):
                relations = tuple(self._relation(oid) for oid in oids)
                self._add(TruncateChange(relations, cascade, restart), xid)
            case LogicalMessage():
                return self._message(message)
            case Commit():
                return self._commit(message)
            case StreamStart(xid=xid, first_segment=first):
                self._stream_start(xid, first)
            case StreamStop():
                self._stream_stop()
            case StreamAbort(xid=xid, subxid=subxid):
                self._stream_abort(xid, subxid)
            case StreamCommit():
                return self._stream_commit(message)
            case BeginPrepare():
                begin = Begin(message.prepare_lsn, message.prepare_time, message.xid)
                self._open = _Open(begin, gid=message.gid)
            case PrepareMessage():
                return self._prepare(message)
            case StreamPrepare():
                return self._stream_prepare(message)
            case CommitPrepared():
                return PreparedFinish(
                    message.gid,
                    message.xid,
                    True,
                    message.commit_lsn,
                    message.end_lsn,
                    message.commit_time,
                )
            case RollbackPrepared():
                return PreparedFinish(
                    message.gid,
                    message.xid,
                    False,
                    message.rollback_end_lsn,
                    message.rollback_end_lsn,
                    message.rollback_time,
                )
        return None

    # -- whole transactions ---------------------------------------------------

    def _current(self) -> _Open:
        if self._open is None:
            # The decoder already refuses changes outside a transaction.
            raise AssertionError("change outside a transaction")
        return self._open

    def _relation(self, oid: int) -> Relation:
        if self._block is not None:
            own = self._block.spool.relation(oid)
            if own is not None:
                return own
        return self.relations[oid]

    def _whole(self, whole: WholeTransaction) -> AssembledTransaction | None:
        """A small transaction in one step: what its messages one at a time would make."""
        if self._open is not None or self._block is not None:
            made = None  # a Begin where none may be: as its messages would
            for message in whole.messages():
                made = self.feed(message)
            return made
        relations = self.relations
        changes: list[Change] = []
        size = 0  # ``change_size`` of each, summed as they are made
        for message in whole.changes:
            relation = relations[message.relation_oid]
            if type(message) is Update:
                new, old = message.new, message.old
                changes.append(RowChange(relation, Op.UPDATE, new, old))
            elif type(message) is Insert:
                new, old = message.new, None
                changes.append(RowChange(relation, Op.INSERT, new, None))
            else:
                new, old = None, cast(Delete, message).old
                changes.append(RowChange(relation, Op.DELETE, None, old))
            size += image_size(new) + image_size(old)
        bound = self._spill_after
        if bound is not None and (len(changes) > bound.changes or size > bound.size):
            self._open = _Open(whole.begin)  # past the bounds: into a spool, one at a time
            for change in changes:
                self._add(change, None)
            return self._commit(whole.commit)
        return RemoteTransaction(
            xid=whole.xid,
            final_lsn=whole.final_lsn,
            end_lsn=whole.end_lsn,
            commit_time=whole.commit_time,
            changes=tuple(changes),
            size=size,
        )

    def _add(self, change: Change, xid: int | None) -> None:
        if self._block is not None:
            self._block.spool.append(change, xid)
            return
        open_ = self._current()
        if open_.spool is not None:
            open_.spool.append(change)
            return
        open_.changes.append(change)
        open_.size += change_size(change)
        self._spill_when_over(open_)

    def _add_rows(self, changes: RowChanges) -> None:
        open_, group = self._open, changes.groups[0]
        if (
            len(changes.groups) == 1
            and group.walked is not None
            and self._block is None
            and open_ is not None
            and open_.spool is None
        ):
            # The common case - one relation's changes in a transaction held in
            # memory - made with map(), not a Python step per row.
            new, old = group.walked.images()
            ops = map(_OPS.__getitem__, group.walked.types)
            relation_of_all = repeat(self._relation(group.relation_oid))
            open_.changes.extend(map(RowChange, relation_of_all, ops, new, old))
            open_.size += _column_bytes(group.walked.new.values + group.walked.old.values)
            self._spill_when_over(open_)
            return
        if len(changes.groups) == 1 and group.walked is not None and self._columns(changes):
            return
        relation = self._relation
        rows = changes.rows()
        made = [RowChange(relation(oid), _OPS[op], new, old) for oid, op, new, old, *_ in rows]
        open_ = self._open
        if self._block is None and open_ is not None and open_.spool is None:
            open_.changes.extend(made)
            open_.size += sum(map(change_size, made))
            self._spill_when_over(open_)
            return
        for change, row in zip(made, rows, strict=True):
            self._add(change, row[5])

    def _columns(self, changes: RowChanges) -> bool:
        """Spool one relation's walked changes as columns (``apply.columns.change_columns``), no
        Python step per change; False when they do not go to a spool that way."""
        group = changes.groups[0]
        assert group.walked is not None
        relation = self._relation(group.relation_oid)
        if not relation.columns:
            return False
        if self._block is not None:
            spool, xids = self._block.spool, set(changes.xids or ())
            if len(xids) != 1:
                return False  # a run across subtransactions: each change says where it begins
            subxid: int | None = xids.pop()
        elif self._open is not None and self._open.spool is not None:
            spool, subxid = self._open.spool, None
        else:
            return False
        spool.append_columns(ChangeColumns.walked(relation, group.walked), subxid)
        return True

    def _spill_when_over(self, open_: _Open) -> None:
        """A transaction past a batch's bounds goes on in a spool file, not in memory."""
        bound = self._spill_after
        if bound is not None and (len(open_.changes) > bound.changes or open_.size > bound.size):
            assert self._spools is not None
            spool = self._spools.open(f"tx-{open_.begin.xid}", open_.begin.xid, prestaged=True)
            spool.append_held(open_.changes)
            open_.changes = []
            open_.size = 0
            open_.spool = spool

    def _commit(self, commit: Commit) -> RemoteTransaction | SpooledTransaction:
        open_ = self._current()
        self._open = None
        origin = open_.origin
        head = RemoteTransaction(
            xid=open_.begin.xid,
            final_lsn=commit.commit_lsn,
            end_lsn=commit.end_lsn,
            commit_time=commit.commit_time,
            changes=tuple(open_.changes),
            origin=origin.name if origin else None,
            origin_lsn=origin.origin_lsn if origin else None,
            size=open_.size,
        )
        if open_.spool is None:
            return head
        return self._spooled(open_.spool, head)

    def _prepare(self, prepare: PrepareMessage) -> Prepared:
        """PREPARE: the transaction is complete, to be staged until COMMIT/ROLLBACK PREPARED."""
        open_ = self._current()
        gid = open_.gid if open_.gid is not None else prepare.gid
        tx = self._commit(Commit(0, prepare.prepare_lsn, prepare.end_lsn, prepare.prepare_time))
        return Prepared(gid, tx)

    def _stream_prepare(self, prepare: StreamPrepare) -> Prepared:
        """Stream Prepare: a streamed transaction's blocks, prepared."""
        tx = self._stream_commit(
            StreamCommit(prepare.xid, 0, prepare.prepare_lsn, prepare.end_lsn, prepare.prepare_time)
        )
        return Prepared(prepare.gid, tx)

    def _spooled(self, spool: Spool, head: RemoteTransaction) -> SpooledTransaction:
        assert self._spools is not None
        spool.close()
        self._spools.track(spool)
        if spool.prestage is not None:
            spool.prestage.finish()
        return SpooledTransaction(
            head, spool.path, spool.changes, self._spools.release, spool.prestage
        )

    def _message(self, message: LogicalMessage) -> RemoteTransaction | None:
        """A transactional message joins its transaction; another one is a transaction of
        its own, at its position in the stream (``messages: true``). Without ``messages``,
        only pgsub's schema change messages are kept (``apply.schema_changes.ddl``)."""
        if not self._messages and message.prefix != DDL_PREFIX:
            return None
        change = MessageChange(message.lsn, message.transactional, message.prefix, message.content)
        if message.transactional:
            self._add(change, message.xid)
            return None
        return RemoteTransaction(
            xid=0,
            final_lsn=message.lsn,
            end_lsn=message.lsn,
            commit_time=pg_now(),
            changes=(change,),
            size=len(message.content),
        )

    # -- streamed transactions ------------------------------------------------

    def _stream_start(self, xid: int, first: bool) -> None:
        if self._spools is None:
            raise UnsupportedStreamError(
                "a streamed transaction arrived but this pipeline has no spool directory"
            )
        streamed = self._streams.get(xid)
        if streamed is None and not first:
            raise UnsupportedStreamError(
                f"streamed block of transaction {xid} continues a transaction whose first "
                "block was not received; reconnect to have it sent again"
            )
        if streamed is None or first:
            if streamed is not None:
                self._discard(streamed.spool)
            spool = self._spools.open(f"stream-{xid}", xid, prestaged=True)
            streamed = self._streams[xid] = _Streamed(spool)
        self._block = streamed

    def _stream_stop(self) -> None:
        if self._block is None:
            return
        self._block.spool.close()
        assert self._spools is not None
        self._spools.track(self._block.spool)
        self._block = None

    def _stream_abort(self, xid: int, subxid: int) -> None:
        streamed = self._streams.get(xid)
        if streamed is None:
            return  # nothing of it was streamed to us
        if subxid == xid:
            del self._streams[xid]
            self._discard(streamed.spool)
            return
        streamed.spool.abort_subxact(subxid)
        assert self._spools is not None
        self._spools.track(streamed.spool)

    def _stream_commit(self, commit: StreamCommit) -> SpooledTransaction:
        streamed = self._streams.pop(commit.xid, None)
        if streamed is None:
            raise UnsupportedStreamError(
                f"Stream Commit of transaction {commit.xid}, of which no block was received"
            )
        for relation in streamed.spool.relations:
            self.relations[relation.oid] = relation  # as PostgreSQL replays them at commit
        origin = streamed.origin
        head = RemoteTransaction(
            xid=commit.xid,
            final_lsn=commit.commit_lsn,
            end_lsn=commit.end_lsn,
            commit_time=commit.commit_time,
            changes=(),
            origin=origin.name if origin else None,
            origin_lsn=Lsn(origin.origin_lsn) if origin else None,
        )
        return self._spooled(streamed.spool, head)

    def _discard(self, spool: Spool) -> None:
        assert self._spools is not None
        self._spools.discard(spool)


def _column_bytes(columns: tuple[pa.BinaryArray, ...]) -> int:
    """The bytes of the values in ``columns`` (Arrow sums them in C)."""
    return sum(int(pc.sum(pc.binary_length(column)).as_py() or 0) for column in columns)
