"""A table with deletion vectors on takes pgsub's own write (apply/delta/writer/vector_write.py):
the rows the batch replaces are deleted by vectors, its rows written as one file, in a
commit Spark and delta-rs read as the publisher's rows; conflicts still go to Spark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest

from apply.batching.collapse import KeyedNet, collapse
from apply.columns import typemap
from apply.columns.schema import target_schema
from apply.core.features import FeatureMode, TableFeatures
from apply.core.records import CommitMark
from apply.delta.table_options import TableOptions
from apply.delta.tables import DeltaTables
from apply.delta.writer import delta_rs_merge, vector_write
from apply.delta.writer.local_merge import merge_locally
from apply.worker.applier import BatchApplier
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.messages import Column, Relation, ReplicaIdentity
from tests.support.delta_log import operations, writers
from tests.unit.apply.builders import batch, dele, ins, relation, tx, upd

pytestmark = pytest.mark.integration

T = relation("id", "v", "big")
VECTORS = TableFeatures(deletion_vectors=FeatureMode.ALWAYS)

Model = dict[int, tuple[str, str]]


def read_by_spark(spark: Any, folder: Path) -> Model:
    rows = spark.read.format("delta").load(str(folder)).collect()
    return {row.id: (row.v, row.big) for row in rows}


def read_by_delta_rs(folder: Path) -> Model:
    """The rows as delta-rs's DataFusion reads them (it applies deletion vectors)."""
    opened = deltalake.DeltaTable(str(folder))
    found = deltalake.QueryBuilder().register("t", opened).execute("SELECT id, v, big FROM t")
    return {r["id"]: (r["v"], r["big"]) for r in pa.table(found.read_all()).to_pylist()}


def vectors_in_log(folder: Path) -> list[dict[str, Any]]:
    """The deletion vectors of the ``add`` actions of pgsub's commits, oldest first."""
    found = []
    for commit in sorted((folder / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines()]
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        if info.get("engineInfo") == "pgsub":
            found += [
                a["add"]["deletionVector"] for a in actions if "deletionVector" in a.get("add", {})
            ]
    return found


def test_a_table_with_deletion_vectors_is_written_by_pgsub_and_read_by_spark_and_delta_rs(
    spark: Any, warehouse: Path
) -> None:
    tables = DeltaTables(spark, str(warehouse), "sub1", TableOptions(features=VECTORS))
    applier = BatchApplier("sub1", tables, lambda oid: None)
    folder = warehouse / "public" / "t"
    model: Model = {i: (f"v{i}", f"big{i % 7}") for i in range(1, 301)}
    try:
        applier.apply(batch(tx(*(ins(T, i, *model[i]) for i in range(1, 301)), end=100)))
        assert writers(folder) == ["Spark", "pgsub"]  # Spark's CREATE: deletion vectors on

        # Updates with an unchanged TOAST value, deletes, a re-insert, all scattered.
        changes = []
        for i in range(3, 301, 11):
            changes.append(upd(T, i, f"u{i}", ...))
            model[i] = (f"u{i}", model[i][1])
        for i in range(5, 301, 13):
            changes.append(dele(T, i, None, None))
            model.pop(i, None)
        changes += [dele(T, 7, None, None), ins(T, 7, "back", "again"), ins(T, 500, "n", "b")]
        model[7], model[500] = ("back", "again"), ("n", "b")
        applier.apply(batch(tx(*changes[:40], end=200), tx(*changes[40:], end=300)))
        assert read_by_delta_rs(folder) == model
        assert read_by_spark(spark, folder) == model
        assert writers(folder)[-1] == "pgsub" and operations(folder)[-1] == "MERGE"
        first_vectors = vectors_in_log(folder)
        assert first_vectors and first_vectors[-1]["cardinality"] > 0

        # A second batch adds to the vector of the file it touches again.
        applier.apply(batch(tx(upd(T, 1, "one", ...), dele(T, 2, None, None), end=400)))
        model[1] = ("one", model[1][1])
        model.pop(2)
        assert read_by_delta_rs(folder) == model
        assert vectors_in_log(folder)[-1]["cardinality"] > first_vectors[-1]["cardinality"]

        # A conflict (an update of a missing key) is judged by Spark's MERGE, which reads
        # pgsub's vectors; pgsub's next batch reads the vectors Spark wrote.
        result = applier.apply(batch(tx(upd(T, 2, "gone", "g"), upd(T, 4, "four", ...), end=500)))
        assert [f.kind for f in result.tables[0].write.conflicts] == ["update_missing"]
        model[4] = ("four", model[4][1])
        assert writers(folder)[-1] == "Spark"
        applier.apply(batch(tx(upd(T, 4, "again", ...), dele(T, 6, None, None), end=600)))
        model[4] = ("again", model[4][1])
        model.pop(6)
        assert writers(folder)[-1] == "pgsub"
        assert read_by_spark(spark, folder) == model
        assert read_by_delta_rs(folder) == model

        # Spark's DELETE of a range writes a vector with run containers; pgsub reads it.
        spark.sql(f"DELETE FROM delta.`{folder}` WHERE id BETWEEN 100 AND 250")
        for i in range(100, 251):
            model.pop(i, None)
        applier.apply(batch(tx(upd(T, 9, "nine", ...), end=650)))
        model[9] = ("nine", model[9][1])
        assert writers(folder)[-1] == "pgsub"
        assert read_by_delta_rs(folder) == model

        # A checkpoint, then a new process: the live files and vectors are read from it.
        deltalake.DeltaTable(str(folder)).create_checkpoint()
        applier.close()
        tables = DeltaTables(spark, str(warehouse), "sub1", TableOptions(features=VECTORS))
        applier = BatchApplier("sub1", tables, lambda oid: None)
        applier.apply(batch(tx(upd(T, 8, "after", ...), end=700)))
        model[8] = ("after", model[8][1])
        assert writers(folder)[-1] == "pgsub"
        assert read_by_delta_rs(folder) == model
        assert read_by_spark(spark, folder) == model
        assert tables.applied_lsn("public.t") == Lsn(700)

        # Every row deleted: each file goes, with no vector left.
        applier.apply(batch(tx(*(dele(T, i, None, None) for i in list(model)), end=800)))
        assert read_by_delta_rs(folder) == {} == read_by_spark(spark, folder)
        assert deltalake.DeltaTable(str(folder)).file_uris() == []
    finally:
        applier.close()


def test_a_batch_the_table_has_is_not_written_twice(spark: Any, warehouse: Path) -> None:
    tables = DeltaTables(spark, str(warehouse), "sub1", TableOptions(features=VECTORS))
    schema = target_schema(T, lambda oid: None, True)
    tables.prepare(schema)
    path = tables.path("public.t")

    def net(*changes: Any) -> KeyedNet:
        keyed = collapse(batch(tx(*changes)).tables(lambda name: ZERO)["public.t"])
        assert isinstance(keyed, KeyedNet)
        return keyed

    mark = CommitMark("sub1", Lsn(100), 0)
    first = merge_locally(path, schema, net(ins(T, 1, "a", "x"), ins(T, 2, "b", "y")), mark)
    assert first is not None and first.version is not None and first.inserted == 2
    updated = CommitMark("sub1", Lsn(200), 0)
    second = merge_locally(path, schema, net(upd(T, 1, "c", ...)), updated)
    assert second is not None and second.updated == 1
    again = merge_locally(path, schema, net(upd(T, 1, "c", ...)), updated)
    assert again is not None and again.version is None  # Delta's txn: committed before
    assert read_by_delta_rs(Path(path)) == {1: ("c", "x"), 2: ("b", "y")}
    # An insert of a key the table has is a conflict: left to Spark, nothing written.
    later = CommitMark("sub1", Lsn(300), 0)
    assert merge_locally(path, schema, net(ins(T, 1, "d", "z")), later) is None
    assert writers(Path(path)) == ["Spark", "pgsub", "pgsub"]


@pytest.mark.parametrize("way", ["rewrite", "merge", "vectors"])
def test_a_column_no_longer_published_keeps_its_values(
    spark: Any, warehouse: Path, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the publisher drops a column (kept in Delta, between published ones), an update
    leaves the row's value in it and an insert NULL, as Spark's MERGE does, whichever way
    the local path writes the batch; an unsent TOAST value still lands in its column."""
    if way == "merge":
        monkeypatch.setattr(delta_rs_merge, "REWRITE_MAX_BYTES", -1)
    features = VECTORS if way == "vectors" else TableFeatures()
    tables = DeltaTables(spark, str(warehouse), "sub1", TableOptions(features=features))
    applier = BatchApplier("sub1", tables, lambda oid: None)
    folder = warehouse / "public" / "t"
    wide = relation("id", "v", "gone", "big")
    try:
        applier.apply(
            batch(tx(ins(wide, 1, "a", "g1", "A"), ins(wide, 2, "b", "g2", "B"), end=100))
        )
        applier.apply(batch(tx(upd(T, 1, "c", ...), ins(T, 3, "n", "N"), end=200)))
        assert writers(folder)[-1] == ("delta-rs" if way == "merge" else "pgsub")
        rows = spark.read.format("delta").load(str(folder)).orderBy("id").collect()
        assert [row.asDict() for row in rows] == [
            {"id": 1, "v": "c", "gone": "g1", "big": "A"},
            {"id": 2, "v": "b", "gone": "g2", "big": "B"},
            {"id": 3, "v": "n", "gone": None, "big": "N"},
        ]
    finally:
        applier.close()


def test_small_files_are_folded_into_a_later_batch(
    spark: Any, warehouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch adds a file; once the table's fold count of small ones are live (3 here;
    by default 16 to 31, by the table's folder), a batch rewrites their alive rows into its
    own file and removes them: the file count stays bounded."""
    monkeypatch.setattr(vector_write, "fold_at", lambda location: 3)
    tables = DeltaTables(spark, str(warehouse), "sub1", TableOptions(features=VECTORS))
    applier = BatchApplier("sub1", tables, lambda oid: None)
    folder = warehouse / "public" / "t"
    model: Model = {i: (f"v{i}", "b") for i in range(1, 101)}
    try:
        applier.apply(batch(tx(*(ins(T, i, *model[i]) for i in range(1, 101)), end=100)))
        counts = []
        for step in range(1, 9):
            changes = [upd(T, i, f"s{step}", ...) for i in range(step, 90, 9)]
            changes += [dele(T, 100 - step, None, None), ins(T, 1000 + step, "n", "N")]
            for i in range(step, 90, 9):
                model[i] = (f"s{step}", model[i][1])
            model.pop(100 - step, None)
            model[1000 + step] = ("n", "N")
            applier.apply(batch(tx(*changes, end=100 + 100 * step)))
            counts.append(len(deltalake.DeltaTable(str(folder)).file_uris()))
            assert read_by_delta_rs(folder) == model
        assert max(counts) <= 3 and counts != sorted(counts)  # folded, more than once
        assert read_by_spark(spark, folder) == model
        assert set(writers(folder)[1:]) == {"pgsub"}
    finally:
        applier.close()


def test_a_file_mostly_deleted_by_its_vector_is_purged_by_a_batch(
    spark: Any, warehouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once its vector removes more than PURGE_ABOVE of a file's rows, a batch rewrites the
    file's alive rows into its own file and removes it: its vector is no longer rewritten
    by every batch, nor its removed rows read by every reader."""
    monkeypatch.setattr(vector_write, "PURGE_ABOVE", 0.2)
    tables = DeltaTables(spark, str(warehouse), "sub1", TableOptions(features=VECTORS))
    applier = BatchApplier("sub1", tables, lambda oid: None)
    folder = warehouse / "public" / "t"
    model: Model = {i: (f"v{i}", f"b{i}") for i in range(1, 101)}

    def files() -> set[str]:
        return set(deltalake.DeltaTable(str(folder)).file_uris())

    try:
        applier.apply(batch(tx(*(ins(T, i, *model[i]) for i in range(1, 101)), end=100)))
        (first,) = files()
        applier.apply(batch(tx(*(dele(T, i, None, None) for i in range(1, 11)), end=200)))
        changes = [upd(T, i, "u", ...) for i in range(11, 26)]
        applier.apply(batch(tx(*changes, end=300)))
        for i in range(1, 11):
            del model[i]
        for i in range(11, 26):
            model[i] = ("u", model[i][1])
        assert first in files()  # 10% removed before the last batch: kept
        applier.apply(batch(tx(upd(T, 50, "fifty", ...), end=400)))  # 25% before this one
        model[50] = ("fifty", model[50][1])
        assert first not in files()
        assert writers(folder)[-1] == "pgsub"
        assert read_by_delta_rs(folder) == model
        assert read_by_spark(spark, folder) == model
    finally:
        applier.close()


def test_a_text_key_is_found_by_a_set_lookup(spark: Any, warehouse: Path) -> None:
    """Integer keys are looked up by binary search; any other key by an Arrow set lookup."""
    coded = relation("code", "v", key=("code",), name="c")
    tables = DeltaTables(spark, str(warehouse), "sub1", TableOptions(features=VECTORS))
    applier = BatchApplier("sub1", tables, lambda oid: None)
    folder = warehouse / "public" / "c"
    try:
        applier.apply(batch(tx(*(ins(coded, f"k{i}", f"v{i}") for i in range(50)), end=100)))
        changes = [upd(coded, "k3", "three"), dele(coded, "k4", None), ins(coded, "k99", "new")]
        applier.apply(batch(tx(*changes, end=200)))
        want = {f"k{i}": f"v{i}" for i in range(50) if i != 4} | {"k3": "three", "k99": "new"}
        assert writers(folder)[-1] == "pgsub"
        opened = deltalake.DeltaTable(str(folder))
        found = deltalake.QueryBuilder().register("t", opened).execute("SELECT code, v FROM t")
        assert {r["code"]: r["v"] for r in pa.table(found.read_all()).to_pylist()} == want
    finally:
        applier.close()


def test_a_composite_key_is_looked_up_as_its_joined_text(spark: Any, warehouse: Path) -> None:
    """A key of several columns is one string per row, the columns' text joined by NUL: keys
    that plain concatenation would confuse ((1, '2x') and (12, 'x')) stay apart; updates
    with unsent TOAST values, deletes, a moved key and a conflict as for one column."""
    pairs = relation("id", "code", "v", "big", key=("id", "code"), name="p")
    tables = DeltaTables(spark, str(warehouse), "sub1", TableOptions(features=VECTORS))
    applier = BatchApplier("sub1", tables, lambda oid: None)
    folder = warehouse / "public" / "p"
    model = {(i % 10, f"c{i}"): (f"v{i}", f"big{i}") for i in range(60)}
    model |= {(1, "2x"): ("one-2x", "B1"), (12, "x"): ("twelve-x", "B12")}

    def read() -> dict[tuple[int, str], tuple[str, str]]:
        opened = deltalake.DeltaTable(str(folder))
        query = deltalake.QueryBuilder().register("t", opened)
        found = pa.table(query.execute("SELECT id, code, v, big FROM t").read_all())
        return {(r["id"], r["code"]): (r["v"], r["big"]) for r in found.to_pylist()}

    try:
        applier.apply(batch(tx(*(ins(pairs, *k, *v) for k, v in model.items()), end=100)))
        changes = [
            upd(pairs, 1, "2x", "changed", ...),
            dele(pairs, 12, "x", None, None),
            upd(pairs, 3, "c13", "updated", "U"),
            upd(pairs, 3, "c3-moved", "moved", "M", old=(3, "c3", None, None)),
            ins(pairs, 12, "y", "new", "N"),
        ]
        applier.apply(batch(tx(*changes, end=200)))
        model[(1, "2x")] = ("changed", "B1")
        del model[(12, "x")], model[(3, "c3")]
        model[(3, "c13")] = ("updated", "U")
        model[(3, "c3-moved")] = ("moved", "M")
        model[(12, "y")] = ("new", "N")
        assert writers(folder)[-1] == "pgsub" and operations(folder)[-1] == "MERGE"
        assert read() == model
        assert {
            (r.id, r.code): (r.v, r.big)
            for r in spark.read.format("delta").load(str(folder)).collect()
        } == model

        # An update of a missing pair is a conflict: Spark's MERGE judges it.
        result = applier.apply(batch(tx(upd(pairs, 12, "x", "gone", "g"), end=300)))
        assert [f.kind for f in result.tables[0].write.conflicts] == ["update_missing"]
        assert writers(folder)[-1] == "Spark"
        applier.apply(batch(tx(dele(pairs, 0, "c0", None, None), end=400)))
        del model[(0, "c0")]
        assert writers(folder)[-1] == "pgsub"
        assert read() == model
    finally:
        applier.close()


def test_maintenance_reads_a_local_tables_detail_as_spark_does(spark: Any, warehouse: Path) -> None:
    """Maintenance's file count, size and properties of a local table come from delta-rs
    (a Spark DESCRIBE DETAIL held the table for seconds); they are Spark's figures."""
    from apply.delta.spark.detail import detail

    tables = DeltaTables(spark, str(warehouse), "sub1", TableOptions(features=VECTORS))
    applier = BatchApplier("sub1", tables, lambda oid: None)
    folder = warehouse / "public" / "t"
    try:
        applier.apply(batch(tx(*(ins(T, i, "v", "b") for i in range(1, 50)), end=100)))
        applier.apply(batch(tx(upd(T, 3, "u", ...), dele(T, 4, None, None), end=200)))
        spark.sql(f"DELETE FROM delta.`{folder}` WHERE id = 5")  # a vector by Spark too
        row = spark.sql(f"DESCRIBE DETAIL delta.`{folder}`").first()
        spark_figures = (int(row["numFiles"]), int(row["sizeInBytes"]), dict(row["properties"]))
        assert detail(spark, str(folder)) == spark_figures
        assert spark_figures[2]["delta.enableDeletionVectors"] == "true"
    finally:
        applier.close()


# A decimal whose nearest double is above it: read as a double, it is no lower bound.
ROUNDED_UP = "12345678901234568300"


def test_a_file_added_again_with_a_vector_keeps_its_decimal_bounds_exact(
    spark: Any, warehouse: Path
) -> None:
    """A file a batch deletes rows of is added again with its vector and its statistics:
    every digit of a decimal bound kept. Read as a double, the lower bound 12345678901234568300
    became 1.2345678901234569e+19, above the file's row, and Spark, skipping files by it,
    found no row equal to it."""
    numeric = (38 << 16 | 9) + 4  # numeric(38, 9)
    amounts = Relation(
        16390,
        "public",
        "n",
        ReplicaIdentity.DEFAULT,
        (Column("id", typemap.INT4, -1, True), Column("d", typemap.NUMERIC, numeric, False)),
    )
    tables = DeltaTables(spark, str(warehouse), "sub1", TableOptions(features=VECTORS))
    applier = BatchApplier("sub1", tables, lambda oid: None)
    folder = warehouse / "public" / "n"
    try:
        values = {1: ROUNDED_UP} | {i: f"2000000000000000000{i}.5" for i in range(2, 10)}
        applier.apply(batch(tx(*(ins(amounts, i, d) for i, d in values.items()), end=100)))
        applier.apply(batch(tx(upd(amounts, 2, "7.25"), end=200)))
        assert writers(folder)[-1] == "pgsub"

        last = (folder / "_delta_log" / f"{2:020d}.json").read_text().splitlines()
        again = [json.loads(line)["add"] for line in last if '"deletionVector"' in line]
        assert len(again) == 1
        assert f'"minValues":{{"id":1,"d":{ROUNDED_UP}.000000000}}' in again[0]["stats"]

        query = f"SELECT id FROM delta.`{folder}` WHERE d = {ROUNDED_UP}"
        assert [row.id for row in spark.sql(query).collect()] == [1]
        opened = deltalake.DeltaTable(str(folder))
        found = deltalake.QueryBuilder().register("n", opened)
        rows = pa.table(found.execute(f"SELECT id FROM n WHERE d = {ROUNDED_UP}").read_all())
        assert rows.column("id").to_pylist() == [1]
    finally:
        applier.close()
