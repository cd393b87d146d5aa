"""Hand-built relations, row images and transactions for the pure apply tests."""

from __future__ import annotations

from apply.core.batch import Batch
from apply.core.transactions import (
    Change,
    Op,
    RemoteTransaction,
    RowChange,
    TruncateChange,
    change_size,
)
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import (
    NULL,
    TEXT,
    UNCHANGED,
    Column,
    Relation,
    ReplicaIdentity,
    TupleData,
)

INT4, TEXT_OID = 23, 25


def relation(
    *columns: str,
    key: tuple[str, ...] = ("id",),
    identity: ReplicaIdentity = ReplicaIdentity.DEFAULT,
    oid: int = 16384,
    name: str = "t",
) -> Relation:
    cols = tuple(
        Column(c, INT4 if c == "id" else TEXT_OID, -1, c in key or identity is ReplicaIdentity.FULL)
        for c in columns
    )
    return Relation(oid, "public", name, identity, cols)


def row(*values: object) -> TupleData:
    """Values: None for NULL, ... (Ellipsis) for an unchanged TOAST value, else text."""
    kinds = bytes(NULL if v is None else UNCHANGED if v is ... else TEXT for v in values)
    return TupleData(
        kinds, tuple(None if v is None or v is ... else str(v).encode() for v in values)
    )


def ins(rel: Relation, *values: object) -> RowChange:
    return RowChange(rel, Op.INSERT, row(*values), None)


def upd(rel: Relation, *values: object, old: tuple[object, ...] | None = None) -> RowChange:
    return RowChange(rel, Op.UPDATE, row(*values), None if old is None else row(*old))


def dele(rel: Relation, *values: object) -> RowChange:
    return RowChange(rel, Op.DELETE, None, row(*values))


def trunc(*rels: Relation) -> TruncateChange:
    return TruncateChange(tuple(rels), cascade=False, restart_identity=False)


def tx(*changes: Change, end: int = 100, xid: int = 700) -> RemoteTransaction:
    size = sum(map(change_size, changes))  # as the assembler counts it
    return RemoteTransaction(xid, Lsn(end - 8), Lsn(end), 0, tuple(changes), size=size)


def batch(*transactions: RemoteTransaction) -> Batch:
    return Batch(list(transactions))
