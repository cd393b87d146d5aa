"""A large transaction staged in pieces, written without Spark (apply/delta/writer/local_merge.py).

One that only inserts keys the table cannot hold is appended, streamed from its staged
pieces (``append_staged``): the rows, the mark and exactly-once as Spark's MERGE; a key
range that meets the table's files, or a piece that is not all inserts, is not appended.
One that changes rows of a table without deletion vectors is written copy-on-write by its
keys' positions (``merge_staged``; ``vector_write``, ``copy_on_write``): only the files
holding its keys are rewritten, no deletion vector is written, the commit carries its mark
once, and delta-rs and Spark read the rows the batch leaves."""

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
from tests.unit.apply.builders import dele, ins, relation, upd

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


def last_commit(table: Path) -> list[dict[str, Any]]:
    newest = sorted((table / "_delta_log").glob("*.json"))[-1]
    return [json.loads(line) for line in newest.read_text().splitlines()]


def live_files(table: Path) -> set[str]:
    live: set[str] = set()
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                live.add(action["add"]["path"])
            if "remove" in action:
                live.discard(action["remove"]["path"])
    return live


def test_a_staged_change_rewrites_only_the_files_holding_its_keys_without_vectors(
    spark: Any, table: tuple[str, LocalMerges], tmp_path: Path
) -> None:
    path, local = table
    for i, (first, last) in enumerate([(1, 300), (301, 700), (800, 900)]):
        mark = CommitMark("sub1", Lsn(100 + i), 0)
        assert local.append_staged(
            path, SCHEMA, staged(tmp_path / f"f{i}", inserts(first, last)), mark
        )
    files = live_files(Path(path))
    assert len(files) == 3
    untouched = {name for name in files if any(r["id"] == 850 for r in _rows_of(Path(path), name))}
    changes = [upd(T, 5, "five"), dele(T, 310, None), ins(T, 750, "new"), upd(T, 700, "last")]
    mark = CommitMark("sub1", Lsn(500), 0)
    written = local.merge_staged(path, SCHEMA, staged(tmp_path / "m", changes), mark)
    assert written is not None and written.version is not None
    assert (written.inserted, written.updated, written.deleted) == (1, 2, 1)
    actions = last_commit(Path(path))
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info["operation"] == "MERGE" and "looked up in memory" in json.dumps(info)
    assert json.loads(info["userMetadata"])["pgsub"]["lsn"] == str(Lsn(500))
    assert not any("deletionVector" in json.dumps(a) for a in actions)
    now = live_files(Path(path))
    assert untouched <= now and len(now) == 2  # the third file stays; two become one
    expected = {i: f"v{i}" for i in [*range(1, 701), *range(800, 901)]}
    expected |= {5: "five", 700: "last", 750: "new"}
    del expected[310]
    rows = delta_rs_rows(Path(path), key=("id",))
    assert {r["id"]: r["v"] for r in rows} == expected and len(rows) == len(expected)
    read = spark.read.format("delta").load(path).collect()
    assert {r["id"]: r["v"] for r in read} == expected
    again = local.merge_staged(path, SCHEMA, staged(tmp_path / "m2", changes), mark)
    assert again is not None and again.version is None  # Delta's txn: committed before
    assert len(delta_rs_rows(Path(path), key=("id",))) == len(expected)


def test_a_staged_update_of_a_missing_row_is_left_to_spark(
    table: tuple[str, LocalMerges], tmp_path: Path
) -> None:
    path, local = table
    first = staged(tmp_path / "a", inserts(1, 100))
    assert local.append_staged(path, SCHEMA, first, CommitMark("sub1", Lsn(100), 0))
    missing = staged(tmp_path / "b", [upd(T, 500, "nowhere"), upd(T, 5, "five")])
    assert local.merge_staged(path, SCHEMA, missing, CommitMark("sub1", Lsn(200), 0)) is None
    assert len(live_files(Path(path))) == 1  # nothing written


def _rows_of(table: Path, name: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = pq.read_table(table / name).to_pylist()
    return rows
