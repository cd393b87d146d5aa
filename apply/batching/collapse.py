"""The net effect of a batch on one table (docs/architecture.md, "Batches"). Pure.

Applying a batch's changes one by one and applying their net effect must
give the same table. Two shapes:

- A table with a key (replica identity DEFAULT with a primary key, or
  USING INDEX) becomes one ``KeyedRow`` per key: whether the row exists at
  the end and its last image. The chain's *first* change is kept, because
  conflicts are judged on it against the table's state before the batch
  (``First.expects_present``). An update that changes the key is a delete
  of the old key and an insert of the new one.
- A table without a key (REPLICA IDENTITY FULL, or no identity: inserts
  only) is a multiset: the net effect is a count delta per distinct row,
  so that deleting one of two equal rows removes exactly one copy.

Unchanged TOASTed values (``u``) are taken from an earlier image of the
same chain; when the chain has none, they stay ``u`` and the writer keeps
the target's value (from the row at ``toast_key`` when a key change moved
it). A TRUNCATE drops every earlier change of the table and marks the net
effect as applying to an empty table.

Every image is laid out as the table's latest Relation in the batch (by
column name), so rows from both sides of an ``ALTER TABLE`` line up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from apply.core.batch import TableChange, TableWork
from apply.core.errors import ApplyError
from apply.core.transactions import Op, RowChange
from conflicts.kinds import First
from subscriber.replication.messages import (
    BINARY,
    NULL,
    UNCHANGED,
    Relation,
    ReplicaIdentity,
    TupleData,
)

Key = tuple[bytes | None, ...]


class CollapseError(ApplyError):
    """A change that the table's replica identity cannot place."""


@dataclass(slots=True)
class KeyedRow:
    key: Key
    first: First
    first_tx: int  # index of the first change's transaction in the batch
    present: bool  # whether the row exists after the batch
    image: TupleData | None  # the last image when present (may hold 'u' columns)
    reinserted: bool = False  # an insert follows the first change
    toast_key: Key | None = None  # 'u' values come from the target row at this key
    changes: int = 1  # how many changes of the batch the chain holds
    partner: Key | None = None  # the other key of the key-changing update that began the chain
    last_tx: int = -1  # index of the last change's transaction in the batch (-1: first_tx's)

    @property
    def latest_tx(self) -> int:
        return self.first_tx if self.last_tx < 0 else self.last_tx

    @property
    def keeps_target_values(self) -> bool:
        return self.image is not None and UNCHANGED in self.image.kinds


@dataclass(slots=True)
class MultisetRow:
    image: TupleData
    delta: int
    first_tx: int


@dataclass
class KeyedNet:
    relation: Relation
    key_columns: tuple[str, ...]
    rows: dict[Key, KeyedRow] = field(default_factory=dict)
    truncated: bool = False
    # The key values' format (TEXT or BINARY per key column), from the first image: a key
    # is never NULL or unchanged, and a column's format is its type's (``binary: true``).
    key_kinds: bytes | None = None
    truncate_tx: int = -1  # index of the last TRUNCATE's transaction in the batch
    # Each transaction of the batch by index: (commit LSN, commit time), set by the applier
    # for tables that record which change last wrote a row (``apply.history.stamps``).
    commits: Sequence[tuple[int, int]] = ()

    def key_is_binary(self, position: int) -> bool:
        return self.key_kinds is not None and self.key_kinds[position] == BINARY

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Pickled as one plain tuple a row (a writer process's net, ``merge_processes``):
        a slots dataclass's own pickling runs Python for each row and each image, under
        the apply process's lock - 7.5 us a row against 2.5, and 7 us against 3 to load
        in the process (docs/performance.md, "8,000/s over 200 tables with writer
        processes")."""
        rows = [
            (
                row.key,
                row.first,
                row.first_tx,
                row.present,
                None if row.image is None else (row.image.kinds, row.image.values),
                row.reinserted,
                row.toast_key,
                row.changes,
                row.partner,
                row.last_tx,
            )
            for row in self.rows.values()
        ]
        return (
            _keyed_net,
            (
                self.relation,
                self.key_columns,
                self.truncated,
                self.key_kinds,
                self.truncate_tx,
                self.commits,
                rows,
            ),
        )


# A ``KeyedRow`` as ``KeyedNet.__reduce__`` sends it: its fields in order, its image as
# (kinds, values).
_SentRow = tuple[
    Key,
    First,
    int,
    bool,
    tuple[bytes, tuple[bytes | None, ...]] | None,
    bool,
    Key | None,
    int,
    Key | None,
    int,
]


def _keyed_net(
    relation: Relation,
    key_columns: tuple[str, ...],
    truncated: bool,
    key_kinds: bytes | None,
    truncate_tx: int,
    commits: Sequence[tuple[int, int]],
    rows: list[_SentRow],
) -> KeyedNet:
    """A ``KeyedNet`` from what its ``__reduce__`` gave, its rows in their order."""
    net = KeyedNet(relation, key_columns, {}, truncated, key_kinds, truncate_tx, commits)
    made = net.rows
    for key, first, first_tx, present, image, reinserted, toast_key, changes, partner, last in rows:
        kept = None if image is None else TupleData(*image)
        made[key] = KeyedRow(
            key, first, first_tx, present, kept, reinserted, toast_key, changes, partner, last
        )
    return net


@dataclass
class MultisetNet:
    relation: Relation
    rows: dict[TupleData, MultisetRow] = field(default_factory=dict)
    truncated: bool = False


Net = KeyedNet | MultisetNet


def net_bytes(net: Net) -> int:
    """The bytes of the rows ``net`` changes, as the publisher sent their values: a row
    written, its image; a row deleted, its key (a copy of a multiset's row, its image). What
    a batch's writes are measured against (``pgsub_table_change_bytes_total``)."""
    total = 0
    if isinstance(net, MultisetNet):
        for multiset_row in net.rows.values():
            image = sum(len(v) for v in multiset_row.image.values if v is not None)
            total += image * abs(multiset_row.delta)
        return total
    for row in net.rows.values():
        values = row.image.values if row.present and row.image is not None else row.key
        total += sum(len(v) for v in values if v is not None)
    return total


def is_keyed(relation: Relation) -> bool:
    return relation.replica_identity in (
        ReplicaIdentity.DEFAULT,
        ReplicaIdentity.INDEX,
    ) and any(c.is_key for c in relation.columns)


class Layout:
    """Maps images of any Relation version onto the table's latest layout."""

    def __init__(self, latest: Relation) -> None:
        self.latest = latest
        self._maps: dict[int, tuple[Relation, list[int | None] | None]] = {}

    def _map(self, relation: Relation) -> list[int | None] | None:
        """Positions in ``relation`` of each latest column; None when identical."""
        if relation is self.latest:
            return None
        cached = self._maps.get(id(relation))
        if cached is not None and cached[0] is relation:
            return cached[1]
        if relation.columns == self.latest.columns:
            positions = None
        else:
            index = {c.name: i for i, c in enumerate(relation.columns)}
            positions = [index.get(c.name) for c in self.latest.columns]
        self._maps[id(relation)] = (relation, positions)
        return positions

    def normalize(self, image: TupleData, relation: Relation) -> TupleData:
        positions = self._map(relation)
        if positions is None:
            return image
        kinds = bytes(NULL if p is None else image.kinds[p] for p in positions)
        values = tuple(None if p is None else image.values[p] for p in positions)
        return TupleData(kinds, values)


def _overlay(new: TupleData, base: TupleData | None) -> TupleData:
    """``new`` with its unchanged ('u') columns taken from ``base`` where it has them."""
    if base is None or UNCHANGED not in new.kinds:
        return new
    kinds = bytearray(new.kinds)
    values = list(new.values)
    for i, kind in enumerate(new.kinds):
        if kind == UNCHANGED:
            kinds[i] = base.kinds[i]
            values[i] = base.values[i]
    return TupleData(bytes(kinds), tuple(values))


def _after_last_truncate(changes: Sequence[TableChange]) -> tuple[Sequence[TableChange], int]:
    """The changes after the last TRUNCATE, and its transaction's index (-1: none)."""
    for position in range(len(changes) - 1, -1, -1):
        if not isinstance(changes[position].change, RowChange):
            return changes[position + 1 :], changes[position].tx
    return changes, -1


def collapse(work: TableWork) -> Net:
    """The net effect of ``work`` on its table."""
    changes, truncate_tx = _after_last_truncate(work.changes)
    truncated = truncate_tx >= 0
    layout = Layout(work.relation)
    if is_keyed(work.relation):
        keyed = KeyedNet(
            work.relation,
            tuple(c.name for c in work.relation.columns if c.is_key),
            truncated=truncated,
            truncate_tx=truncate_tx,
        )
        fold_keyed(keyed, changes, layout)
        return keyed
    multiset = MultisetNet(work.relation, truncated=truncated)
    _collapse_multiset(multiset, changes, layout)
    return multiset


def fold_keyed(net: KeyedNet, changes: Sequence[TableChange], layout: Layout) -> None:
    """Fold ``changes`` (none a TRUNCATE) into ``net``: folding a table's changes in parts,
    in order, gives the net effect of all of them (``apply.batching.forming``)."""
    rows = net.rows
    key_positions = [i for i, c in enumerate(net.relation.columns) if c.is_key]
    # A key of one column (most tables) read without a generator: a change at a time.
    first = key_positions[0] if len(key_positions) == 1 else None

    def key_of(image: TupleData) -> Key:
        if net.key_kinds is None:
            net.key_kinds = bytes(image.kinds[p] for p in key_positions)
        values = image.values
        if first is not None:
            return (values[first],)
        return tuple(values[p] for p in key_positions)

    latest, insert = layout.latest, Op.INSERT
    for entry in changes:
        change = entry.change
        assert isinstance(change, RowChange)
        tx = entry.tx
        new = change.new
        if (
            first is not None
            and change.relation is latest
            and change.old is None
            and new is not None
            and net.key_kinds is not None
        ):
            # Most changes: an INSERT or an UPDATE of a key's first change in the batch, a
            # key of one column, the table's latest layout - made without a call but the row's.
            key: Key = (new.values[first],)
            if key not in rows:
                made = First.INSERT if change.op is insert else First.UPDATE
                rows[key] = KeyedRow(key, made, tx, True, new)
                continue
        _fold_change(rows, change, tx, key_of, layout)


def _fold_change(
    rows: dict[Key, KeyedRow],
    change: RowChange,
    tx: int,
    key_of: Callable[[TupleData], Key],
    layout: Layout,
) -> None:
    """``fold_keyed`` of one change, any change."""
    relation = change.relation
    if change.op is Op.DELETE:
        assert change.old is not None
        key = key_of(layout.normalize(change.old, relation))
        row = rows.get(key)
        if row is None:
            rows[key] = KeyedRow(key, First.DELETE, tx, False, None)
        else:
            row.present, row.image, row.toast_key = False, None, None
            row.changes, row.last_tx = row.changes + 1, tx
        return
    assert change.new is not None
    new = layout.normalize(change.new, relation)
    key = key_of(new)
    if change.op is Op.INSERT:
        row = rows.get(key)
        if row is None:
            rows[key] = KeyedRow(key, First.INSERT, tx, True, new)
        else:
            row.present, row.image, row.toast_key, row.reinserted = True, new, None, True
            row.changes, row.last_tx = row.changes + 1, tx
        return
    old_key = key if change.old is None else key_of(layout.normalize(change.old, relation))
    if old_key == key:
        row = rows.get(key)
        if row is None:
            rows[key] = KeyedRow(key, First.UPDATE, tx, True, new)
        else:
            row.image = _overlay(new, row.image if row.present else None)
            row.present = True
            row.changes, row.last_tx = row.changes + 1, tx
        return
    _key_change(rows, old_key, key, new, tx)


def _key_change(rows: dict[Key, KeyedRow], old_key: Key, key: Key, new: TupleData, tx: int) -> None:
    """An update that changed the key: a delete of the old key, an insert of the new one."""
    old_row = rows.get(old_key)
    if old_row is None:
        base, toast_key = None, old_key
        rows[old_key] = KeyedRow(old_key, First.KEY_UPDATE_OLD, tx, False, None, partner=key)
    else:
        base = old_row.image if old_row.present else None
        toast_key = old_row.toast_key or old_key
        old_row.present, old_row.image, old_row.toast_key = False, None, None
        old_row.changes, old_row.last_tx = old_row.changes + 1, tx
    image = _overlay(new, base)
    moved_toast = toast_key if UNCHANGED in image.kinds else None
    row = rows.get(key)
    if row is None:
        rows[key] = KeyedRow(
            key, First.KEY_UPDATE_NEW, tx, True, image, toast_key=moved_toast, partner=old_key
        )
    else:
        row.present, row.image, row.reinserted = True, image, True
        row.toast_key = moved_toast
        row.changes, row.last_tx = row.changes + 1, tx


def _collapse_multiset(net: MultisetNet, changes: Sequence[TableChange], layout: Layout) -> None:
    rows = net.rows

    def count(image: TupleData, delta: int, tx: int) -> None:
        row = rows.get(image)
        if row is None:
            rows[image] = MultisetRow(image, delta, tx)
        else:
            row.delta += delta

    for entry in changes:
        change = entry.change
        assert isinstance(change, RowChange)
        relation = change.relation
        old = None if change.old is None else layout.normalize(change.old, relation)
        new = None if change.new is None else layout.normalize(change.new, relation)
        if change.op is Op.INSERT:
            assert new is not None
            count(new, 1, entry.tx)
        elif change.op is Op.DELETE:
            assert old is not None
            count(old, -1, entry.tx)
        else:
            assert new is not None
            if old is None:
                raise CollapseError(
                    f"UPDATE of {relation.qualified_name} without an old row: a table without "
                    "a key needs REPLICA IDENTITY FULL for updates"
                )
            count(old, -1, entry.tx)
            count(_overlay(new, old), 1, entry.tx)
    for image in [image for image, row in rows.items() if row.delta == 0]:
        del rows[image]
