"""pgoutput messages as values.

One frozen dataclass per message of protocol versions 1 to 4. ``xid`` on a
change is set only inside a streamed block (Stream Start .. Stream Stop).
Times are microseconds since the PostgreSQL epoch, as on the wire
(``subscriber.replication.wire.pg_timestamp`` turns them into datetimes).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from subscriber.replication.frozen import quick
from subscriber.replication.lsn import Lsn
from subscriber.replication.names import qualified_name


class ReplicaIdentity(Enum):
    DEFAULT = "d"
    NOTHING = "n"
    FULL = "f"
    INDEX = "i"


# TupleData column kinds, as the wire spells them.
NULL: Final = ord("n")
UNCHANGED: Final = ord("u")  # unchanged TOASTed value: not sent, keep the target's
TEXT: Final = ord("t")
BINARY: Final = ord("b")


@quick
@dataclass(frozen=True, slots=True)
class TupleData:
    """One row image. ``kinds[i]`` is NULL/UNCHANGED/TEXT/BINARY; ``values[i]``
    holds the bytes for TEXT and BINARY, None otherwise."""

    kinds: bytes
    values: tuple[bytes | None, ...]


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    typmod: int
    is_key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str  # "pg_catalog" when the wire says ""
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[Column, ...]
    xid: int | None = None

    @property
    def qualified_name(self) -> str:
        return qualified_name(self.namespace, self.name)

    @property
    def key_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.is_key)


@dataclass(frozen=True, slots=True)
class Type:
    oid: int
    namespace: str
    name: str
    xid: int | None = None


@quick
@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: Lsn
    commit_time: int
    xid: int


@quick
@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: int


@dataclass(frozen=True, slots=True)
class Origin:
    origin_lsn: Lsn
    name: str


@quick
@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: TupleData
    xid: int | None = None


@quick
@dataclass(frozen=True, slots=True)
class Update:
    relation_oid: int
    new: TupleData
    old: TupleData | None = None
    old_is_key: bool = False  # True for a 'K' (key-only) old image, False for 'O' (full)
    xid: int | None = None


@quick
@dataclass(frozen=True, slots=True)
class Delete:
    relation_oid: int
    old: TupleData
    old_is_key: bool
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    xid: int
    subxid: int
    abort_lsn: Lsn | None = None  # only with streaming = parallel
    abort_time: int | None = None


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    flags: int
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    flags: int
    prepare_end_lsn: Lsn
    rollback_end_lsn: Lsn
    prepare_time: int
    rollback_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    flags: int
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_time: int
    xid: int
    gid: str


Change = Insert | Update | Delete | Truncate
Message = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
)
