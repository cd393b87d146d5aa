"""Writes that follow the batch (apply/delta/writer/write_cost.py, apply.core.features.write_gain):
a
batch that would rewrite far more than it writes turns its table's deletion vectors on,
by pgsub's own commit, and writes only its rows; one that changes most of a small table
rewrites it, and the table keeps every reader. Each write says what it wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import deltalake
import polars as pl
import pytest
from structlog.testing import capture_logs

from apply.batching.collapse import KeyedNet, collapse
from apply.columns.schema import target_schema
from apply.core.features import FeatureMode, TableFeatures
from apply.core.records import CommitMark, WriteResult
from apply.delta.table_options import TableOptions
from apply.delta.tables import DeltaTables
from subscriber.replication.lsn import ZERO, Lsn
from tests.support.delta_log import operations, writers
from tests.unit.apply.builders import batch, dele, ins, relation, tx, upd

pytestmark = pytest.mark.integration

T = relation("id", "v")
SCHEMA = target_schema(T, lambda oid: None, True)


def _net(*changes: Any) -> KeyedNet:
    keyed = collapse(batch(tx(*changes)).tables(lambda name: ZERO)["public.t"])
    assert isinstance(keyed, KeyedNet)
    return keyed


def _tables(spark: Any, warehouse: Path, vectors: FeatureMode) -> DeltaTables:
    options = TableOptions(features=TableFeatures(deletion_vectors=vectors))
    tables = DeltaTables(spark, str(warehouse), "sub1", options)
    tables.prepare(SCHEMA)
    return tables


def _write(tables: DeltaTables, lsn: int, *changes: Any) -> WriteResult:
    return tables.write(SCHEMA, _net(*changes), CommitMark("sub1", Lsn(lsn), 0))


def _commits(folder: Path) -> list[Path]:
    return sorted((folder / "_delta_log").glob("*.json"))


def _protocol(folder: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for commit in _commits(folder):
        for line in commit.read_text().splitlines():
            found = json.loads(line).get("protocol", found)
    return found


def test_ten_updates_of_a_large_table_write_their_rows_not_the_table(
    spark: Any, warehouse: Path
) -> None:
    tables = _tables(spark, warehouse, FeatureMode.AUTO)
    folder = warehouse / "public" / "t"
    copy = _write(tables, 100, *(ins(T, i, f"row {i:08d}") for i in range(200_000)))
    assert copy.written_bytes > 1_000_000  # the table's first rows: its size
    with capture_logs() as logs:
        ten = _write(tables, 200, *(upd(T, i, "changed") for i in range(0, 200_000, 20_000)))
    assert ten.updated == 10
    assert ten.written_bytes < 16_384, ten  # its rows, a vector file, its commit
    assert 0 < ten.changed_bytes < 200
    assert _protocol(folder)["readerFeatures"] == ["deletionVectors"]
    # Turned on by the batch's own commit, the first that writes vectors: one version.
    assert writers(folder)[-1] == "pgsub" and operations(folder)[-2:] == ["WRITE", "MERGE"]
    last = [json.loads(line) for line in _commits(folder)[-1].read_text().splitlines()]
    assert [a["protocol"]["minReaderVersion"] for a in last if "protocol" in a] == [3]
    assert any("deletionVector" in a.get("add", {}) for a in last)
    # The next batch writes with them, its snapshot read again only when asked for.
    again = _write(tables, 300, *(upd(T, i, "again") for i in range(5, 200_000, 40_000)))
    assert again.updated == 5 and again.written_bytes < 16_384, again
    protocols = [c for c in _commits(folder) if '"protocol"' in c.read_text()]
    assert len(protocols) == 2  # the table's creation, then the first batch with vectors
    (gained,) = [e for e in logs if e["event"] == "target table gains a reader feature"]
    assert gained["feature"] == "deletionVectors" and "rewrite_factor" in gained["reason"]
    assert "to_pyarrow_table" in gained["excludes"]
    # Every reader that reads deletion vectors reads the batch.
    rows = spark.read.format("delta").load(str(folder)).where("v = 'changed'").count()
    assert rows == 10
    assert pl.read_delta(str(folder)).filter(pl.col("v") == "changed").height == 10
    assert pl.read_delta(str(folder)).filter(pl.col("v") == "again").height == 5
    assert spark.read.format("delta").load(str(folder)).count() == 200_000


def test_a_batch_that_changes_most_of_a_small_table_rewrites_it(
    spark: Any, warehouse: Path
) -> None:
    tables = _tables(spark, warehouse, FeatureMode.AUTO)
    folder = warehouse / "public" / "t"
    _write(tables, 100, *(ins(T, i, "a") for i in range(100)))
    most = _write(tables, 200, *(upd(T, i, "b") for i in range(90)))
    assert most.updated == 90
    assert "readerFeatures" not in _protocol(folder)  # every reader still opens it
    assert operations(folder)[-1] == "WRITE"  # rewritten whole
    table = deltalake.DeltaTable(str(folder)).to_pyarrow_table()
    assert sorted(table.column("v").to_pylist()).count("b") == 90


def test_a_small_table_keeps_every_reader_whatever_its_batches(spark: Any, warehouse: Path) -> None:
    """A table of a few tens of KB: a batch that only deletes (it would write no rows with
    vectors) and a one-row update each rewrite it; it never gains deletion vectors."""
    tables = _tables(spark, warehouse, FeatureMode.AUTO)
    folder = warehouse / "public" / "t"
    copy = _write(tables, 100, *(ins(T, i, f"{i:064d}") for i in range(2_000)))
    # Past four times a vector batch's fixed 4 KiB, under the 64-KiB floor.
    assert 16_384 < copy.written_bytes < 65_536, copy
    deleted = _write(tables, 200, dele(T, 7, None))
    updated = _write(tables, 300, upd(T, 8, "b"))
    assert deleted.deleted == 1 and updated.updated == 1
    assert "readerFeatures" not in _protocol(folder)  # every reader still opens it
    assert operations(folder)[-2:] == ["WRITE", "WRITE"]  # rewritten whole, twice
    table = deltalake.DeltaTable(str(folder)).to_pyarrow_table()
    assert table.num_rows == 1_999 and table.column("v").to_pylist().count("b") == 1


def test_never_keeps_rewriting_and_says_what_it_costs(spark: Any, warehouse: Path) -> None:
    tables = _tables(spark, warehouse, FeatureMode.NEVER)
    folder = warehouse / "public" / "t"
    _write(tables, 100, *(ins(T, i, f"row {i:08d}") for i in range(200_000)))
    one = _write(tables, 200, upd(T, 7, "changed"))
    assert "readerFeatures" not in _protocol(folder)
    assert one.written_bytes > 1_000_000  # the whole table, for one row: the metric shows it
    assert one.changed_bytes < 20
