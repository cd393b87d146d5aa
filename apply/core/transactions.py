"""Remote transactions as the apply side takes them: row changes with their Relation.

Values only. Each row change is kept with the Relation that described it
when it arrived, so that a column added in the middle of a batch
(``ALTER TABLE ... ADD COLUMN``) is read with the right layout on both sides
of the change. ``apply.arrival.assembly`` builds these from decoded messages.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from subscriber.replication.frozen import quick
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Relation, TupleData


class Op(Enum):
    INSERT = "INSERT"
    UPDATE = "UPDATE"
    DELETE = "DELETE"


@quick
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


@dataclass(frozen=True, slots=True)
class MessageChange:
    """A logical decoding message (``pg_logical_emit_message``), with ``messages: true``.

    A transactional one travels with its transaction; a non-transactional one
    arrives alone and is applied as a transaction of its own.
    """

    lsn: Lsn
    transactional: bool
    prefix: str
    content: bytes


Change = RowChange | TruncateChange | MessageChange


def change_size(change: Change) -> int:
    """The bytes of row data ``change`` holds (its values; what ``batch.max_bytes`` counts)."""
    if isinstance(change, MessageChange):
        return len(change.content)
    if not isinstance(change, RowChange):
        return 0
    return image_size(change.new) + image_size(change.old)


def image_size(image: TupleData | None) -> int:
    """The bytes of a row image's values (none: 0)."""
    return 0 if image is None else sum(map(len, filter(None, image.values)))


def operation(change: Change) -> str:
    """The ``op`` label of ``pgsub_changes_applied_total`` for ``change``."""
    if isinstance(change, RowChange):
        return change.op.value
    return "MESSAGE" if isinstance(change, MessageChange) else "TRUNCATE"


def operations(transactions: Sequence[RemoteTransaction]) -> Counter[str]:
    """The changes of ``transactions`` counted by ``operation`` (row changes by their ``Op``
    first, then named: a batch after a backlog holds 100,000 of them)."""
    ops: Counter[Op] = Counter()
    others: list[Change] = []
    for tx in transactions:
        for change in tx.changes:
            if type(change) is RowChange:
                ops[change.op] += 1
            else:
                others.append(change)
    counted = Counter({op.value: count for op, count in ops.items()})
    counted.update(map(operation, others))
    return counted


@dataclass(frozen=True, slots=True)
class Bounds:
    """How much row data one holder - a batch, the queue, a transaction in memory - takes.

    ``changes`` row changes or ``size`` bytes of values, whichever is reached
    first: the count bounds the per-change overhead, the bytes wide or
    TOASTed rows.
    """

    changes: int
    size: int = 2**62

    def __post_init__(self) -> None:
        if self.changes < 1 or self.size < 1:
            raise ValueError("bounds must be positive")

    def reached(self, changes: int, size: int) -> bool:
        return changes >= self.changes or size >= self.size


@dataclass(frozen=True, slots=True)
class PreparedFinish:
    """COMMIT PREPARED or ROLLBACK PREPARED of a transaction staged at its PREPARE."""

    gid: str
    xid: int
    commit: bool  # False: ROLLBACK PREPARED
    final_lsn: Lsn  # the COMMIT PREPARED record (what SKIP names); the rollback's end
    end_lsn: Lsn
    commit_time: int


@quick
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
    # A piece of a spooled transaction: the position of its first change in the whole
    # transaction and the whole transaction's change count (None: all of it is here).
    first: int = 0
    total: int | None = None
    size: int = 0  # bytes of row data in ``changes`` (see change_size)

    @property
    def partial(self) -> bool:
        """A piece that is not the transaction's last: applying it leaves the transaction open."""
        return self.total is not None and self.first + len(self.changes) < self.total
