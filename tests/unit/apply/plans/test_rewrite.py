"""A small table's rows after a batch, computed in Arrow (apply/plans/rewrite.py), equal the
MERGE's: random keyed histories, cut into batches, against the one-by-one model."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from apply.batching.collapse import KeyedNet, collapse
from apply.batching.source import keyed_source
from apply.columns.columnar import arrow_schema
from apply.columns.schema import target_schema
from apply.core.batch import Batch
from apply.plans.rewrite import rewritten
from subscriber.replication.lsn import ZERO
from tests.unit.apply.batching.test_collapse_properties import (
    KEYED,
    Table,
    _cut,
    _s,
    apply_keyed,
    keyed_history,
)
from tests.unit.apply.builders import batch, dele, ins, tx, upd

SCHEMA = target_schema(KEYED, lambda oid: None, True)
ARROW = arrow_schema(SCHEMA.columns)


def _arrow(table: Table) -> pa.Table:
    keys = sorted(table, key=int)
    return pa.table(
        {
            "id": pa.array([int(k) for k in keys], pa.int32()),
            "v": [_s(table[k][0]) for k in keys],
            "big": [_s(table[k][1]) for k in keys],
        }
    ).cast(ARROW)


def _net(cut: Batch) -> KeyedNet:
    work = cut.tables(lambda name: ZERO)["public.t"]
    net = collapse(work)
    assert isinstance(net, KeyedNet)
    return net


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_rewrite_leaves_the_rows_the_merge_leaves(data: st.DataObject) -> None:
    changes, _ = data.draw(keyed_history())
    table: Table = {}
    for cut in _cut(data.draw, changes):
        if "public.t" not in cut.tables(lambda name: ZERO):
            continue
        net = _net(cut)
        before = _arrow(table)
        apply_keyed(table, net)
        if net.truncated or any(r.toast_key is not None for r in net.rows.values()):
            continue  # Spark's path: the rewrite never sees these
        after = rewritten(before, keyed_source(net, SCHEMA), ["id"])
        assert after is not None
        assert after.schema == before.schema
        assert after.sort_by("id").equals(_arrow(table))


def test_unsent_values_are_kept_from_the_row_they_replace() -> None:
    before = _arrow({b"1": (b"a", b"X"), b"2": (b"b", b"Y")})
    net = _net(batch(tx(upd(KEYED, 1, "c", ...), upd(KEYED, 2, None, "Z"))))
    after = rewritten(before, keyed_source(net, SCHEMA), ["id"])
    assert after is not None
    assert after.sort_by("id").to_pylist() == [
        {"id": 1, "v": "c", "big": "X"},
        {"id": 2, "v": None, "big": "Z"},
    ]


@given(st.sampled_from(["update_missing", "delete_missing", "insert_exists"]))
def test_a_conflict_is_left_to_spark(kind: str) -> None:
    before = _arrow({b"1": (b"a", b"X")})
    change = {
        "update_missing": upd(KEYED, 2, "c", "Z"),
        "delete_missing": dele(KEYED, 2, None, None),
        "insert_exists": ins(KEYED, 1, "c", "Z"),
    }[kind]
    net = _net(batch(tx(ins(KEYED, 5, "e", "E"), change)))
    assert rewritten(before, keyed_source(net, SCHEMA), ["id"]) is None


def test_a_column_no_longer_published_keeps_its_values_and_new_rows_get_null() -> None:
    """The table holds a column the publisher dropped ("gone", between the published ones):
    an update leaves its value, an insert leaves NULL, as Spark's MERGE does; unsent
    values are still taken from the published column they belong to."""
    before = _arrow({b"1": (b"a", b"X"), b"2": (b"b", b"Y")})
    before = pa.table(
        {
            "id": before["id"],
            "v": before["v"],
            "gone": pa.array(["g1", "g2"], pa.string()),
            "big": before["big"],
        }
    )
    net = _net(batch(tx(upd(KEYED, 1, "c", ...), ins(KEYED, 3, "n", "N"))))
    after = rewritten(before, keyed_source(net, SCHEMA), ["id"])
    assert after is not None
    assert after.schema == before.schema
    assert after.sort_by("id").to_pylist() == [
        {"id": 1, "v": "c", "gone": "g1", "big": "X"},
        {"id": 2, "v": "b", "gone": "g2", "big": "Y"},
        {"id": 3, "v": "n", "gone": None, "big": "N"},
    ]
