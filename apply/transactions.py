"""Transaction assembly: decoded messages in, complete remote transactions out.

Pure. ``TransactionAssembler.feed`` takes the messages of one replication
session in stream order and returns a ``RemoteTransaction`` when a Commit
closes one; everything else returns None. Each row change is kept with the
Relation that described it when it arrived, so that a column added in the
middle of a batch (``ALTER TABLE ... ADD COLUMN``) is read with the right
layout on both sides of the change.

Streamed (``streaming = on``) and two-phase transactions are not assembled
here yet; their messages raise ``UnsupportedStreamError`` so that a
misconfigured subscription stops with a clear error instead of losing rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from subscriber.lsn import Lsn
from subscriber.messages import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Relation,
    Truncate,
    TupleData,
    Type,
    Update,
)


class Op(Enum):
    INSERT = "INSERT"
    UPDATE = "UPDATE"
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class RowChange:
    """One row change of one relation, as the publisher sent it."""

    relation: Relation
    op: Op
    new: TupleData | None  # INSERT, UPDATE
    old: TupleData | None  # DELETE; UPDATE with a key change ('K') or under FULL ('O')


@dataclass(frozen=True, slots=True)
class TruncateChange:
    relations: tuple[Relation, ...]
    cascade: bool
    restart_identity: bool


Change = RowChange | TruncateChange


@dataclass(frozen=True, slots=True)
class RemoteTransaction:
    """A committed remote transaction, ready to apply."""

    xid: int
    final_lsn: Lsn  # the commit record's LSN: what SKIP names
    end_lsn: Lsn  # the end of the commit record: what progress is reported in
    commit_time: int  # microseconds since the PostgreSQL epoch
    changes: tuple[Change, ...]
    origin: str | None = None
    origin_lsn: Lsn | None = None

    @property
    def relations(self) -> set[int]:
        oids: set[int] = set()
        for change in self.changes:
            if isinstance(change, RowChange):
                oids.add(change.relation.oid)
            else:
                oids.update(r.oid for r in change.relations)
        return oids


class UnsupportedStreamError(Exception):
    """The stream carries something this subscriber cannot apply yet."""


@dataclass
class _Open:
    begin: Begin
    changes: list[Change] = field(default_factory=list)
    origin: Origin | None = None


class TransactionAssembler:
    """Turns one session's messages into complete transactions, in commit order."""

    def __init__(self) -> None:
        self.relations: dict[int, Relation] = {}
        self.types: dict[int, Type] = {}
        self._open: _Open | None = None

    def reset(self) -> None:
        """A new connection: the open transaction will be sent again from its start."""
        self._open = None

    def feed(self, message: Message) -> RemoteTransaction | None:
        match message:
            case Begin():
                self._open = _Open(message)
            case Relation():
                self.relations[message.oid] = message
            case Type():
                self.types[message.oid] = message
            case Origin():
                self._current().origin = message
            case Insert(relation_oid=oid, new=new):
                self._add(RowChange(self.relations[oid], Op.INSERT, new, None))
            case Update(relation_oid=oid, new=new, old=old):
                self._add(RowChange(self.relations[oid], Op.UPDATE, new, old))
            case Delete(relation_oid=oid, old=old):
                self._add(RowChange(self.relations[oid], Op.DELETE, None, old))
            case Truncate(relation_oids=oids, cascade=cascade, restart_identity=restart):
                relations = tuple(self.relations[oid] for oid in oids)
                self._add(TruncateChange(relations, cascade, restart))
            case LogicalMessage():
                pass  # routing logical messages to a table is an option not offered yet
            case Commit():
                return self._commit(message)
            case _:
                raise UnsupportedStreamError(
                    f"{type(message).__name__} messages (streamed or two-phase transactions) "
                    "are not applied yet; set streaming: off and two_phase: false"
                )
        return None

    def _current(self) -> _Open:
        if self._open is None:
            # The decoder already refuses changes outside a transaction.
            raise AssertionError("change outside a transaction")
        return self._open

    def _add(self, change: Change) -> None:
        self._current().changes.append(change)

    def _commit(self, commit: Commit) -> RemoteTransaction:
        open_ = self._current()
        self._open = None
        origin = open_.origin
        return RemoteTransaction(
            xid=open_.begin.xid,
            final_lsn=commit.commit_lsn,
            end_lsn=commit.end_lsn,
            commit_time=commit.commit_time,
            changes=tuple(open_.changes),
            origin=origin.name if origin else None,
            origin_lsn=origin.origin_lsn if origin else None,
        )
