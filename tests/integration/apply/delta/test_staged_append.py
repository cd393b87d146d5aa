"""A large transaction that only inserts keys the table cannot hold is appended by delta-rs,
streamed from its staged pieces (apply/delta/writer/local_merge.py, ``append_staged``): the rows,
the mark and exactly-once as Spark's MERGE; a key range that meets the table's files, or a
piece that is not all inserts, is not appended."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apply.batching.columns_net import keyed_columns_source
from apply.columns.change_columns import ChangeColumns
from apply.columns.schema import target_schema
from apply.core.records import CommitMark
from apply.core.transactions import RowChange
from apply.delta.tables import DeltaTables
from apply.delta.writer.local_merge import LocalMerges
from apply.plans.staging import StagedSource
from subscriber.replication.lsn import Lsn
from tests.integration.apply.delta.writer.test_local_merge import delta_rs_rows
from tests.support.delta_log import operations
from tests.unit.apply.builders import ins, relation, upd

pytestmark = pytest.mark.integration

T = relation("id", "v")
SCHEMA = target_schema(T, lambda oid: None, True)


def staged(directory: Path, *pieces: list[RowChange]) -> StagedSource:
    stage = StagedSource(directory, SCHEMA)
    for changes in pieces:
        source = keyed_columns_source(ChangeColumns.of(T, changes), SCHEMA)
        assert source is not None and stage.add_source(source)
    return stage


@pytest.fixture
def table(spark: Any, warehouse: Path) -> tuple[str, LocalMerges]:
    """The empty target table's path, and a fresh ``LocalMerges``."""
    tables = DeltaTables(spark, str(warehouse), "sub1")
    tables.prepare(SCHEMA)
    return tables.path("public.t"), LocalMerges()


def inserts(first: int, last: int) -> list[RowChange]:
    return [ins(T, i, f"v{i}") for i in range(first, last + 1)]


def test_inserts_of_absent_keys_are_appended_once_with_their_mark(
    spark: Any, table: tuple[str, LocalMerges], tmp_path: Path
) -> None:
    path, local = table
    mark = CommitMark("sub1", Lsn(100), 0)
    stage = staged(tmp_path / "a", inserts(1, 300), inserts(301, 700))
    first = local.append_staged(path, SCHEMA, stage, mark)
    assert first is not None and first.version is not None and first.inserted == 700
    again = local.append_staged(path, SCHEMA, stage, mark)
    assert again is not None and again.version is None  # Delta's txn: committed before
    rows = delta_rs_rows(Path(path), key=("id",))
    assert [r["id"] for r in rows] == list(range(1, 701)) and rows[0]["v"] == "v1"
    assert operations(Path(path))[-1] == "WRITE"
    commit = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()[-1]
    assert json.loads(commit["userMetadata"])["pgsub"]["lsn"] == str(Lsn(100))
    # Keys above every file's range: appended too.
    later = staged(tmp_path / "b", inserts(800, 900))
    assert local.append_staged(path, SCHEMA, later, CommitMark("sub1", Lsn(200), 0))
    assert len(delta_rs_rows(Path(path), key=("id",))) == 801
    assert spark.read.format("delta").load(path).count() == 801  # pgsub's commits, read by Spark


def test_what_is_not_an_append_is_left_to_the_merge(
    table: tuple[str, LocalMerges], tmp_path: Path
) -> None:
    path, local = table
    assert local.append_staged(
        path, SCHEMA, staged(tmp_path / "a", inserts(10, 20)), CommitMark("sub1", Lsn(100), 0)
    )
    meets = staged(tmp_path / "b", inserts(15, 30))  # 15..20 may be in the table's file
    assert local.append_staged(path, SCHEMA, meets, CommitMark("sub1", Lsn(200), 0)) is None
    updates = staged(tmp_path / "c", [upd(T, 12, "changed")], inserts(40, 41))
    assert local.append_staged(path, SCHEMA, updates, CommitMark("sub1", Lsn(300), 0)) is None
    assert len(delta_rs_rows(Path(path), key=("id",))) == 11
