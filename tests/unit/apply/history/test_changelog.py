"""A change log table's rows: one per change, in order, with what each change carried."""

from __future__ import annotations

import pyarrow as pa
import pytest

from apply.batching.copy_source import CopySource
from apply.columns.schema import target_schema
from apply.core.batch import Batch
from apply.core.transactions import RemoteTransaction
from apply.history.changelog import (
    LSN,
    OP,
    SEQ,
    UNCHANGED_COLUMNS,
    XID,
    History,
    HistoryMode,
    ReservedColumnError,
    change_rows,
    changelog_schema,
    copied,
)
from subscriber.replication.lsn import Lsn
from tests.unit.apply.builders import batch, dele, ins, relation, trunc, tx, upd

REL = relation("id", "v", "big")
SCHEMA = target_schema(REL, lambda oid: None, keyed=True)


def rows_of(work_batch: Batch) -> list[dict[str, object]]:
    work = work_batch.tables(lambda table: Lsn(0))["public.t"]
    rows: list[dict[str, object]] = change_rows(work, SCHEMA, work_batch).to_pylist()
    return rows


def test_every_change_is_a_row_in_commit_order_with_its_transaction() -> None:
    rows = rows_of(
        batch(
            tx(ins(REL, 1, "a", "x"), upd(REL, 1, "b", ...), end=100, xid=7),
            tx(upd(REL, 2, "c", "y", old=(1, None, None)), dele(REL, 2, None, None), end=200),
            tx(trunc(REL), ins(REL, 3, "d", None), end=300, xid=9),
        )
    )
    assert [(r[OP], r["id"], r["v"], r["_pgsub_old_id"]) for r in rows] == [
        ("insert", 1, "a", None),
        ("update", 1, "b", None),
        ("update", 2, "c", 1),  # the key changed: the old one beside it
        ("delete", 2, None, None),
        ("truncate", None, None, None),
        ("insert", 3, "d", None),
    ]
    positions = [(100, 0), (100, 1), (200, 0), (200, 1), (300, 0), (300, 1)]
    assert [(r[LSN], r[SEQ]) for r in rows] == positions
    assert [r[XID] for r in rows] == [7, 7, 700, 700, 9, 9]
    # An unchanged TOASTed value is not in the change: NULL, and named.
    assert rows[1]["big"] is None and rows[1][UNCHANGED_COLUMNS] == ["big"]
    assert rows[0][UNCHANGED_COLUMNS] is None


def test_a_piece_of_a_large_transaction_counts_its_changes_from_where_it_starts() -> None:
    piece = RemoteTransaction(
        5, Lsn(90), Lsn(100), 0, (ins(REL, 4, "e", None),), size=1, first=10, total=20
    )
    rows = rows_of(Batch([piece]))
    assert [(r[LSN], r[SEQ]) for r in rows] == [(100, 10)]


def test_the_log_has_the_tables_columns_then_pgsubs_then_the_old_key() -> None:
    names = [c.name for c in changelog_schema(SCHEMA).columns]
    assert names[:3] == ["id", "v", "big"] and names[-1] == "_pgsub_old_id"
    assert changelog_schema(SCHEMA).key == ()
    multiset = target_schema(REL, lambda oid: None, keyed=False)
    assert not any(c.name.startswith("_pgsub_old_") for c in changelog_schema(multiset).columns)


def test_a_column_named_like_pgsubs_own_is_refused_by_name() -> None:
    schema = target_schema(relation("id", "_pgsub_op"), lambda oid: None, keyed=True)
    with pytest.raises(ReservedColumnError, match=r"'_pgsub_op' of public\.t"):
        changelog_schema(schema)


def test_a_copy_is_a_truncate_then_a_copy_row_per_row_read_here_or_by_parts() -> None:
    block = pa.table({"id": pa.array([1, 2], pa.int32()), "v": ["a", "b"], "big": [None, "x"]})
    source = copied(CopySource.in_memory([block]), SCHEMA, Lsn(0x500))
    here = pa.concat_tables(source.blocks()).to_pylist()
    by_parts = pa.concat_tables(
        table for part in source.parts for table in source.read(part)
    ).to_pylist()
    assert here == by_parts
    assert [(r[OP], r["id"], r[LSN], r[SEQ]) for r in here] == [
        ("truncate", None, 0x500, 0),
        ("copy", 1, 0x500, 1),
        ("copy", 2, 0x500, 1),
    ]


def test_each_table_is_kept_as_its_mode_says() -> None:
    history = History(HistoryMode.MIRROR, {"public.log": HistoryMode.CHANGELOG})
    assert history.of("public.log") is HistoryMode.CHANGELOG
    assert history.of("public.t") is HistoryMode.MIRROR
