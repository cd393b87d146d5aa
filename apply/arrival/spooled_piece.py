"""A piece of a spooled transaction as it was spooled: whole frames, rows and columns (no I/O).

``apply.arrival.spool.SpooledTransaction.frames`` cuts a transaction's spool file
into pieces of whole frames; a piece says what it counts, and splits into
the tables whose changes here all came as columns (``apply.columns.change_columns``,
for ``apply.batching.columns_net``) and the other changes as rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace

from apply.columns.change_columns import ChangeColumns
from apply.core.transactions import (
    Change,
    MessageChange,
    RemoteTransaction,
    RowChange,
    TruncateChange,
    change_size,
    operation,
)


@dataclass(frozen=True, slots=True)
class SpooledPiece:
    """Consecutive frames of a spooled transaction (``SpooledTransaction.frames``)."""

    head: RemoteTransaction
    frames: tuple[list[Change] | ChangeColumns, ...]
    first: int  # the position of its first change in the whole transaction
    count: int  # its changes

    def operations(self) -> Counter[str]:
        """Its changes counted by operation (``pgsub_changes_applied_total``'s ``op``)."""
        counts: Counter[str] = Counter()
        for frame in self.frames:
            if isinstance(frame, ChangeColumns):
                counts.update(frame.operations())
            else:
                counts.update(operation(change) for change in frame)
        return counts

    @property
    def has_messages(self) -> bool:
        return any(
            isinstance(change, MessageChange)
            for frame in self.frames
            if not isinstance(frame, ChangeColumns)
            for change in frame
        )

    def split(self) -> tuple[dict[str, ChangeColumns], RemoteTransaction]:
        """The tables whose every change here is in columns of one Relation, with those
        columns joined in order; and the other changes as rows, in order. The rows' positions
        are not the transaction's: they are for a net effect, not a resumable piece."""
        columns: dict[str, list[ChangeColumns]] = {}
        in_rows: set[str] = set()
        for frame in self.frames:
            if isinstance(frame, ChangeColumns):
                columns.setdefault(frame.relation.qualified_name, []).append(frame)
            else:
                in_rows.update(_tables_of(frame))
        for name, parts in columns.items():
            if any(part.relation != parts[0].relation for part in parts):
                in_rows.add(name)
        rows: list[Change] = []
        for frame in self.frames:
            if not isinstance(frame, ChangeColumns):
                rows.extend(frame)
            elif frame.relation.qualified_name in in_rows:
                rows.extend(frame.row_changes())
        joined = {
            name: ChangeColumns.joined(parts)
            for name, parts in columns.items()
            if name not in in_rows
        }
        return joined, replace(self.head, changes=tuple(rows), size=sum(map(change_size, rows)))


def _tables_of(changes: list[Change]) -> Iterator[str]:
    for change in changes:
        if isinstance(change, RowChange):
            yield change.relation.qualified_name
        elif isinstance(change, TruncateChange):
            yield from (relation.qualified_name for relation in change.relations)
