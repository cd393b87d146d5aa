"""Stamped tables' layouts, stamps and MERGE plans: a mirror's metadata columns
(``history.metadata_columns``) and soft deletes (``history: soft_delete``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from apply.batching.collapse import KeyedNet, collapse
from apply.batching.copy_source import CopySource
from apply.batching.source import keyed_source
from apply.columns.schema import target_schema
from apply.core.transactions import RemoteTransaction
from apply.history.changelog import COMMIT_TIME, LSN, HistoryMode, ReservedColumnError
from apply.history.stamps import (
    DELETED,
    Stamping,
    copied,
    kept_as,
    soft_delete_schema,
    stamped,
    stamped_schema,
    stamping,
)
from apply.plans.merge_plan import (
    ClauseKind,
    expected_touched,
    keyed_merge,
    merge_sql,
    soft_resync_merge,
)
from subscriber.replication.lsn import Lsn
from tests.unit.apply.builders import batch, dele, ins, relation, trunc, tx, upd

REL = relation("id", "v")
SCHEMA = target_schema(REL, lambda oid: None, keyed=True)
BAG = target_schema(relation("a", "b", key=()), lambda oid: None, keyed=False)


def net_of(*transactions: RemoteTransaction) -> KeyedNet:
    work_batch = batch(*transactions)
    net = collapse(work_batch.tables(lambda table: Lsn(0))["public.t"])
    assert isinstance(net, KeyedNet)
    commits = enumerate(work_batch.transactions)
    net.commits = tuple((int(t.end_lsn), 1_000_000 * i) for i, t in commits)  # i seconds
    return net


def test_the_layout_adds_pgsub_columns_and_keeps_the_key() -> None:
    stored = soft_delete_schema(SCHEMA)
    assert [c.name for c in stored.columns] == ["id", "v", DELETED, LSN, COMMIT_TIME]
    assert stored.key == ("id",)
    clashing = target_schema(relation("id", "_pgsub_deleted"), lambda oid: None, keyed=True)
    with pytest.raises(ReservedColumnError, match="soft_delete"):
        soft_delete_schema(clashing)


def test_a_table_without_a_key_is_kept_as_a_mirror() -> None:
    assert kept_as(HistoryMode.SOFT_DELETE, SCHEMA) is HistoryMode.SOFT_DELETE
    assert kept_as(HistoryMode.SOFT_DELETE, BAG) is HistoryMode.MIRROR
    assert kept_as(HistoryMode.CHANGELOG, BAG) is HistoryMode.CHANGELOG


def test_each_row_is_stamped_with_its_last_change() -> None:
    net = net_of(
        tx(ins(REL, 1, "a"), ins(REL, 2, "b"), end=100),
        tx(upd(REL, 1, "c"), end=200),
        tx(dele(REL, 2, None), ins(REL, 3, "d"), end=300),
    )
    source = stamped(keyed_source(net, SCHEMA).table, list(net.rows.values()), net.commits)
    by_id = {r["id"]: r for r in source.to_pylist()}
    assert {i: r[LSN] for i, r in by_id.items()} == {1: 200, 2: 300, 3: 300}
    assert by_id[1][COMMIT_TIME] == datetime(2000, 1, 1, 0, 0, 1, tzinfo=UTC)


def test_the_truncate_is_remembered_by_its_transaction() -> None:
    net = net_of(tx(ins(REL, 1, "a"), end=100), tx(trunc(REL), ins(REL, 2, "b"), end=200))
    assert net.truncated and net.commits[net.truncate_tx][0] == 200
    assert list(net.rows) == [(b"2",)]


def test_the_merge_marks_deletes_and_treats_marked_rows_as_absent() -> None:
    plan = keyed_merge(SCHEMA, (), stamping=Stamping.SOFT_DELETE)
    kinds = [c.kind for c in plan.clauses]
    assert ClauseKind.MATCHED_DELETE not in kinds  # a delete is an update of the mark
    raising, marking, updating, inserting = plan.clauses
    assert raising.condition is not None and "NOT t.`_pgsub_deleted`" in raising.condition
    assert marking.assignments["`_pgsub_deleted`"] == "true"
    assert marking.condition == "NOT s.__pgsub_present AND NOT t.`_pgsub_deleted`"
    assert updating.condition is not None and "__pgsub_reinserted" in updating.condition
    for clause in (marking, updating, inserting):
        assert clause.assignments["`_pgsub_lsn`"] == "s.`_pgsub_lsn`"
    assert updating.assignments["`_pgsub_deleted`"] == "false"
    assert inserting.assignments["`_pgsub_deleted`"] == "false"
    mirror = merge_sql(keyed_merge(SCHEMA, ()), "t", "s")
    assert "`_pgsub_" not in mirror and "THEN DELETE" in mirror


def test_a_conflict_free_merge_touches_every_present_chain_and_every_expected_delete() -> None:
    # 1 updated, 2 deleted, 3 inserted, 4 inserted and deleted (never seen: untouched).
    net = net_of(
        tx(upd(REL, 1, "a"), dele(REL, 2, None), ins(REL, 3, "c"), end=100),
        tx(ins(REL, 4, "d"), dele(REL, 4, None), end=200),
    )
    assert expected_touched(keyed_source(net, SCHEMA).table) == 3


def test_copied_rows_are_alive_at_the_copy_lsn() -> None:
    block = pa.table({"id": pa.array([1, 2], pa.int32()), "v": ["a", "b"]})
    source = copied(CopySource.in_memory([block]), SCHEMA, Lsn(500), Stamping.SOFT_DELETE)
    rows = [r for b in source.blocks() for r in b.to_pylist()]
    assert rows == [
        {"id": 1, "v": "a", DELETED: False, LSN: 500, COMMIT_TIME: None},
        {"id": 2, "v": "b", DELETED: False, LSN: 500, COMMIT_TIME: None},
    ]
    assert [r for b in source.read(None) for r in b.to_pylist()] == rows


def test_metadata_columns_stamp_a_mirror_s_rows_and_deletes_still_delete() -> None:
    assert stamping(HistoryMode.MIRROR, SCHEMA, True) is Stamping.LAST_WRITE
    assert stamping(HistoryMode.MIRROR, SCHEMA, False) is Stamping.NONE
    assert stamping(HistoryMode.SOFT_DELETE, SCHEMA, False) is Stamping.SOFT_DELETE
    assert stamping(HistoryMode.MIRROR, BAG, True) is Stamping.NONE  # no key: plain
    assert stamping(HistoryMode.CHANGELOG, SCHEMA, True) is Stamping.NONE
    stored = stamped_schema(SCHEMA, Stamping.LAST_WRITE)
    assert [c.name for c in stored.columns] == ["id", "v", LSN, COMMIT_TIME]
    plan = keyed_merge(SCHEMA, (), stamping=Stamping.LAST_WRITE)
    assert [c.kind for c in plan.clauses] == [
        ClauseKind.MATCHED_UPDATE,  # insert_exists raises
        ClauseKind.MATCHED_DELETE,
        ClauseKind.MATCHED_UPDATE,
        ClauseKind.NOT_MATCHED_INSERT,
    ]
    for clause in (plan.clauses[2], plan.clauses[3]):
        assert clause.assignments["`_pgsub_commit_time`"] == "s.`_pgsub_commit_time`"
        assert "`_pgsub_deleted`" not in clause.assignments
    block = pa.table({"id": pa.array([1], pa.int32()), "v": ["a"]})
    source = copied(CopySource.in_memory([block]), SCHEMA, Lsn(7), Stamping.LAST_WRITE)
    assert [r for b in source.blocks() for r in b.to_pylist()] == [
        {"id": 1, "v": "a", LSN: 7, COMMIT_TIME: None}
    ]


def test_a_resync_merges_the_copy_and_marks_what_it_lacks_at_its_lsn() -> None:
    sql = merge_sql(soft_resync_merge(SCHEMA, 500), "t", "s")
    assert "WHEN MATCHED THEN UPDATE SET `id` = s.`id`" in sql
    assert "`_pgsub_deleted` = s.`_pgsub_deleted`" in sql  # the copy's rows: alive
    assert (
        "WHEN NOT MATCHED BY SOURCE AND (NOT t.`_pgsub_deleted`) THEN UPDATE SET "
        "`_pgsub_deleted` = true, `_pgsub_lsn` = 500, `_pgsub_commit_time` = NULL"
    ) in sql
