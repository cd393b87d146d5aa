"""A keyed batch on a local warehouse is merged by delta-rs (apply/delta/writer/local_merge.py):
the same rows, marks and exactly-once as Spark's MERGE; a conflict goes to Spark's path.
Each test runs twice: a small table rewritten whole (apply/plans/rewrite.py), and merged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from apply.batching.collapse import KeyedNet
from apply.columns.schema import target_schema
from apply.core.errors import CommitRacedError
from apply.core.records import CommitMark
from apply.delta.files.local_store import LocalStore
from apply.delta.tables import DeltaTables
from apply.delta.writer import delta_rs_merge
from apply.delta.writer.local_merge import merge_locally
from apply.delta.writer.open_table import OpenTable
from apply.delta.writer.overwrite import checkpoint_due, overwrite
from apply.worker.applier import BatchApplier
from subscriber.replication.lsn import ZERO, Lsn
from tests.support.delta_log import operations, writers
from tests.unit.apply.builders import batch, dele, ins, relation, trunc, tx, upd

pytestmark = pytest.mark.integration

T = relation("id", "v", "big")


def delta_rs_rows(table: Path, key: tuple[str, ...]) -> list[dict[str, Any]]:
    """The table's rows as delta-rs lists its files (pyarrow reads them), sorted by ``key``."""
    log = deltalake.DeltaTable(str(table))
    schema = pa.schema(log.schema().to_arrow())
    rows = ds.dataset(log.file_uris(), schema=schema, format="parquet").to_table().to_pylist()
    return sorted(rows, key=lambda row: tuple(row[k] for k in key))


@pytest.fixture(params=["rewrite", "merge"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How delta-rs writes a small table's batch: "rewrite" (the default for a small table)
    or "merge" (every table, as above ``REWRITE_MAX_BYTES``)."""
    if request.param == "merge":
        monkeypatch.setattr(delta_rs_merge, "REWRITE_MAX_BYTES", -1)
    return str(request.param)


def test_a_keyed_batch_is_merged_by_delta_rs_and_a_conflict_by_spark(
    spark: Any, warehouse: Path, way: str
) -> None:
    tables = DeltaTables(spark, str(warehouse), "sub1")
    applier = BatchApplier("sub1", tables, lambda oid: None)
    folder = warehouse / "public" / "t"
    local = "pgsub" if way == "rewrite" else "delta-rs"
    try:
        applier.apply(batch(tx(*(ins(T, i, f"v{i}", "big") for i in range(1, 6)), end=100)))
        applier.apply(
            batch(
                tx(upd(T, 1, "one", ...), dele(T, 2, None, None), end=200),  # TOAST kept
                tx(ins(T, 9, "nine", "b9"), upd(T, 3, "x", "y"), end=300),
                tx(dele(T, 3, None, None), ins(T, 3, "back", "again"), end=400),  # re-insert
            )
        )
        want = [
            {"id": 1, "v": "one", "big": "big"},
            {"id": 3, "v": "back", "big": "again"},
            {"id": 4, "v": "v4", "big": "big"},
            {"id": 5, "v": "v5", "big": "big"},
            {"id": 9, "v": "nine", "big": "b9"},
        ]
        assert delta_rs_rows(folder, key=("id",)) == want
        assert writers(folder)[1:] == [local, local]  # after Spark's CREATE
        assert operations(folder)[1:] == ["WRITE" if way == "rewrite" else "MERGE"] * 2
        assert tables.applied_lsn("public.t") == Lsn(400)

        # An update of a missing row (update_missing, skipped): judged and reported by Spark.
        result = applier.apply(batch(tx(upd(T, 2, "gone", "g"), upd(T, 4, "four", ...), end=500)))
        (written,) = result.tables
        assert [f.kind for f in written.write.conflicts] == ["update_missing"]
        assert writers(folder)[-1] == "Spark"
        assert {r["id"]: r["v"] for r in delta_rs_rows(folder, key=("id",))}[4] == "four"

        # A TRUNCATE takes Spark's path too.
        applier.apply(batch(tx(trunc(T), ins(T, 7, "seven", "s"), end=600)))
        assert delta_rs_rows(folder, key=("id",)) == [{"id": 7, "v": "seven", "big": "s"}]
        assert writers(folder)[-1] == "Spark"

        # The open table reads Spark's commits before its next MERGE.
        applier.apply(batch(tx(upd(T, 7, "after", ...), ins(T, 8, "eight", "e"), end=700)))
        assert delta_rs_rows(folder, key=("id",)) == [
            {"id": 7, "v": "after", "big": "s"},
            {"id": 8, "v": "eight", "big": "e"},
        ]
        assert writers(folder)[-1] == local
    finally:
        applier.close()


def test_a_batch_the_table_has_is_not_merged_twice(spark: Any, warehouse: Path, way: str) -> None:
    tables = DeltaTables(spark, str(warehouse), "sub1")
    schema = target_schema(T, lambda oid: None, True)
    tables.prepare(schema)
    path = tables.path("public.t")

    def net(*changes: Any) -> KeyedNet:
        from apply.batching.collapse import collapse

        work = batch(tx(*changes)).tables(lambda name: ZERO)["public.t"]
        keyed = collapse(work)
        assert isinstance(keyed, KeyedNet)
        return keyed

    mark = CommitMark("sub1", Lsn(100), 0)
    first = merge_locally(path, schema, net(ins(T, 1, "a", "x")), mark)
    assert first is not None and first.version is not None and first.inserted == 1
    again = merge_locally(path, schema, net(ins(T, 1, "a", "x")), mark)
    assert again is not None and again.version is None  # Delta's txn: committed before
    assert delta_rs_rows(Path(path), key=("id",)) == [{"id": 1, "v": "a", "big": "x"}]
    # An insert of a key the table has is a conflict: left to Spark, nothing written.
    later = CommitMark("sub1", Lsn(200), 0)
    assert merge_locally(path, schema, net(ins(T, 1, "b", "y")), later) is None
    assert len(writers(Path(path))) == 2


def test_own_commits_are_read_by_spark_and_delta_rs_and_checkpointed(
    spark: Any, warehouse: Path
) -> None:
    """pgsub's own overwrite commits (apply/delta/writer/overwrite.py) are a table Spark and
    delta-rs read, with their marks, and a checkpoint at the table's interval."""
    tables = DeltaTables(spark, str(warehouse), "sub1")
    applier = BatchApplier("sub1", tables, lambda oid: None)
    folder = warehouse / "public" / "t"
    try:
        applier.apply(batch(tx(*(ins(T, i, "v", "big") for i in range(1, 6)), end=100)))
        spark.sql(f"ALTER TABLE delta.`{folder}` SET TBLPROPERTIES (delta.checkpointInterval = 3)")
        for n in range(1, 6):
            applier.apply(
                batch(tx(upd(T, n, f"u{n}", ...), ins(T, 10 + n, "new", "b"), end=200 + n))
            )
        applier.apply(batch(tx(dele(T, 1, None, None), end=300)))
        # The CREATE, the first batch, the ALTER, then the six batches.
        assert writers(folder) == ["pgsub", "pgsub", "Spark"] + ["pgsub"] * 6
        want = [{"id": i, "v": f"u{i}", "big": "big"} for i in range(2, 6)] + [
            {"id": 10 + n, "v": "new", "big": "b"} for n in range(1, 6)
        ]
        by_spark = spark.read.format("delta").load(str(folder)).orderBy("id").collect()
        assert [row.asDict() for row in by_spark] == want
        assert (
            deltalake.DeltaTable(str(folder)).to_pyarrow_table().sort_by("id").to_pylist() == want
        )
        checkpoints = sorted(p.name for p in (folder / "_delta_log").glob("*.checkpoint.parquet"))
        interval = {"delta.checkpointInterval": "3"}  # at versions of the table's own
        due = [v for v in range(3, 9) if checkpoint_due(v, interval, str(folder))]
        # The first batch's version 1 came before the ALTER, at the default interval: due
        # there for one folder's name in 100 (pytest's, here).
        before = [1] if checkpoint_due(1, {}, str(folder)) else []
        assert len(due) == 2
        assert checkpoints == [f"{v:020d}.checkpoint.parquet" for v in before + due]
        history = spark.sql(f"DESCRIBE HISTORY delta.`{folder}`").orderBy("version").collect()
        assert '"lsn":"0/12C"' in history[-1].userMetadata  # LSN 300's mark
        tables_again = DeltaTables(spark, str(warehouse), "sub1")
        assert tables_again.applied_lsn("public.t") == Lsn(300)  # read from the log anew
    finally:
        applier.close()


def test_a_commit_another_writer_made_first_is_not_overwritten(warehouse: Path) -> None:
    """Two writers of one version: the second commit is refused, its file removed."""
    folder = warehouse / "t"
    rows = pa.table({"id": pa.array([1], pa.int32())})
    deltalake.write_deltalake(str(folder), rows)
    table = deltalake.DeltaTable(str(folder))
    live = OpenTable(LocalStore(str(folder)), table).files()
    deltalake.write_deltalake(str(folder), rows, mode="append")  # version 1, by another
    before = sorted(p.name for p in folder.glob("*.parquet"))
    with pytest.raises(CommitRacedError):
        overwrite(LocalStore(str(folder)), 0, live, rows, CommitMark("sub1", Lsn(100), 0))
    assert sorted(p.name for p in folder.glob("*.parquet")) == before
    assert deltalake.DeltaTable(str(folder)).to_pyarrow_table().num_rows == 2
    assert not list((folder / "_delta_log").glob(".*"))  # no temporary file left


def test_a_small_table_rewritten_batch_after_batch_keeps_one_chunk_of_one_file(
    spark: Any, warehouse: Path
) -> None:
    """Each rewrite's rows are kept for the next (``kept_rows``): as one chunk - a chunk
    added a batch made each rewrite's statistics a batch slower, a small table's 60th
    batch three times its first - and only for the live file, not every file it replaced
    (memory grew by a copy a table a batch until the budget was full)."""
    from apply.delta.writer.kept_rows import KEPT

    tables = DeltaTables(spark, str(warehouse), "sub1")
    applier = BatchApplier("sub1", tables, lambda oid: None)
    location = str(warehouse / "public" / "t")
    try:
        applier.apply(batch(tx(*(ins(T, i, "a", "b") for i in range(100)), end=100)))
        for n in range(1, 21):
            applier.apply(batch(tx(upd(T, n, f"n{n}", "b"), end=100 + n * 10)))
    finally:
        applier.close()
    kept = [(key, rows) for key, rows in KEPT._rows.items() if key[0].rstrip("/") == location]
    assert len(kept) == 1, [key for key, _ in kept]
    (_, live_name), rows = kept[0]
    assert rows.column("id").num_chunks == 1
    assert live_name in {Path(uri).name for uri in deltalake.DeltaTable(location).file_uris()}
    assert sorted(rows.column("v").to_pylist()) == sorted(
        [f"n{i}" if 1 <= i <= 20 else "a" for i in range(100)]
    )
