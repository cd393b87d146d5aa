"""Property: the net effect computed from columns equals the row-wise chain's.

``apply.batching.columns_net.keyed_columns_source`` must make, row for row, the MERGE
source that ``keyed_source(collapse(...))`` makes of the same changes, or
decline (None) only for what it leaves to the chain: a key change, an
unchanged TOASTed value in a chain of two or more changes, mixed formats.
The changes' columns also go through their spool form (an Arrow record
batch) and back to the same ``RowChange`` objects.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apply.batching.collapse import KeyedNet, collapse
from apply.batching.columns_net import keyed_columns_source
from apply.batching.source import keyed_source
from apply.columns.change_columns import ChangeColumns
from apply.columns.schema import TargetSchema, target_schema
from apply.core.batch import Batch
from apply.core.transactions import Op, RemoteTransaction, RowChange
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.messages import BINARY, UNCHANGED, Relation, TupleData
from tests.unit.apply.batching.test_collapse_properties import KEYED, keyed_history
from tests.unit.apply.builders import dele, ins, relation, upd

TWO_KEYS = relation("id", "k2", "v", key=("id", "k2"))


def schema_of(rel: Relation) -> TargetSchema:
    return target_schema(rel, lambda oid: None, True)


def row_wise(rel: Relation, changes: list[RowChange]) -> tuple[pa.Table, tuple[int, ...]]:
    tx = RemoteTransaction(1, Lsn(92), Lsn(100), 0, tuple(changes))
    net = collapse(Batch([tx]).tables(lambda name: ZERO)[rel.qualified_name])
    assert isinstance(net, KeyedNet)
    source = keyed_source(net, schema_of(rel))
    return source.table, source.keep_columns


def key_of(change: RowChange) -> bytes | None:
    image = change.old if change.op is Op.DELETE else change.new
    assert image is not None
    return image.values[0]


def declined_rightly(changes: list[RowChange]) -> bool:
    moves = any(
        c.op is Op.UPDATE
        and c.old is not None
        and c.new is not None
        and c.old.values[0] != c.new.values[0]
        for c in changes
    )
    chains = Counter(key_of(c) for c in changes)
    kept = any(c.new is not None and UNCHANGED in c.new.kinds for c in changes)
    return moves or (kept and max(chains.values()) > 1)


@st.composite
def plain_history(draw: st.DrawFn) -> list[RowChange]:
    """Inserts, updates and deletes of a few keys, no key change: the shape of nearly every
    large transaction, which the columns take whole. A value is now and then unchanged."""
    present: set[int] = set()
    changes: list[RowChange] = []
    for _ in range(draw(st.integers(1, 40))):
        action = draw(st.sampled_from(["insert", "update", "delete"]))
        key = draw(st.integers(0, 8))
        v = draw(st.sampled_from(["a", "b", None]))
        if action == "insert" and key not in present:
            present.add(key)
            changes.append(ins(KEYED, key, v, draw(st.sampled_from(["X", "Y", None]))))
        elif action == "update" and key in present:
            kept = draw(st.integers(0, 9)) == 0
            changes.append(upd(KEYED, key, v, ... if kept else draw(st.sampled_from(["Z", None]))))
        elif action == "delete" and key in present:
            present.discard(key)
            changes.append(dele(KEYED, key, None, None))
    return changes


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_the_columns_net_effect_is_the_chains(data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        changes = data.draw(plain_history())
    else:  # with key changes and kept values: declined, each for its reason
        history, _ = data.draw(keyed_history())
        changes = [c for c in history if isinstance(c, RowChange)]
    if not changes:
        return
    columns = ChangeColumns.of(KEYED, changes)
    got = keyed_columns_source(columns, schema_of(KEYED))
    if got is None:
        assert declined_rightly(changes)
        return
    expected, keep = row_wise(KEYED, changes)
    assert got.table.to_pylist() == expected.to_pylist()
    assert got.table.schema == expected.schema
    assert got.keep_columns == keep
    assert not got.moved


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_columns_go_to_their_spool_form_and_back(data: st.DataObject) -> None:
    history, _ = data.draw(keyed_history())
    changes = [c for c in history if isinstance(c, RowChange)]
    if not changes:
        return
    columns = ChangeColumns.of(KEYED, changes)
    known: dict[tuple[object, ...], Relation] = {}
    back = ChangeColumns.from_record_batch(columns.record_batch(), known)
    assert back.row_changes() == changes
    assert back.relation == KEYED
    assert back.operations() == Counter(c.op.value for c in changes)
    assert back.size == sum(
        len(v) for c in changes for i in (c.new, c.old) if i for v in i.values if v
    )


def test_a_composite_key_groups_by_every_key_column() -> None:
    changes = [
        ins(TWO_KEYS, 1, "a", "x"),
        ins(TWO_KEYS, 1, "b", "y"),
        upd(TWO_KEYS, 1, "a", "z"),
        dele(TWO_KEYS, 1, "b", None),
        ins(TWO_KEYS, 1, "b", "again"),
    ]
    got = keyed_columns_source(ChangeColumns.of(TWO_KEYS, changes), schema_of(TWO_KEYS))
    assert got is not None
    expected, _ = row_wise(TWO_KEYS, changes)
    assert got.table.to_pylist() == expected.to_pylist()
    assert [(r["id"], r["k2"], r["v"]) for r in got.table.to_pylist()] == [
        (1, "a", "z"),
        (1, "b", "again"),
    ]


def binary_int(value: int) -> bytes:
    return value.to_bytes(4, "big", signed=True)


def test_binary_keys_and_values_are_read_in_their_format() -> None:
    """``binary: true``: an int4 key sent in binary; the text column stays text."""
    rel = relation("id", "v")

    def image(key: int, v: str) -> TupleData:
        return TupleData(bytes([BINARY, BINARY]), (binary_int(key), v.encode()))

    changes = [
        RowChange(rel, Op.INSERT, image(7, "seven"), None),
        RowChange(rel, Op.UPDATE, image(7, "SEVEN"), None),
        RowChange(rel, Op.DELETE, None, image(8, "")),
    ]
    got = keyed_columns_source(ChangeColumns.of(rel, changes), schema_of(rel))
    assert got is not None
    expected, _ = row_wise(rel, changes)
    assert got.table.to_pylist() == expected.to_pylist()
    assert got.table.column("id").to_pylist() == [7, 8]


@pytest.mark.parametrize(
    "changes",
    [
        [upd(KEYED, 2, "v", "big", old=(1, None, None))],  # a key change
        [ins(KEYED, 1, "v", "big"), upd(KEYED, 1, "w", ...)],  # a kept value, a chain of two
    ],
    ids=["key change", "kept value in a chain"],
)
def test_what_only_the_chain_can_do_is_left_to_it(changes: list[RowChange]) -> None:
    assert keyed_columns_source(ChangeColumns.of(KEYED, changes), schema_of(KEYED)) is None


def test_a_kept_value_of_a_lone_update_is_a_keep_flag() -> None:
    changes = [upd(KEYED, 1, "w", ...), upd(KEYED, 2, "x", "new")]
    got = keyed_columns_source(ChangeColumns.of(KEYED, changes), schema_of(KEYED))
    assert got is not None
    assert got.keep_columns == (2,)
    assert got.table.column("__pgsub_keep_2").to_pylist() == [True, False]
