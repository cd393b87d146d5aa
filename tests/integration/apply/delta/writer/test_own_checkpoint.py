"""A table's checkpoint written by pgsub from what its writer holds
(apply/delta/writer/checkpoint.py): Spark, delta-rs and pgsub's own log replay start from
it once the commits before it are gone, with the same rows, marks, deletion vectors and
tombstones; a commit it does not follow leaves the checkpoint to delta-rs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apply.core.features import FeatureMode, TableFeatures
from apply.core.records import CommitMark
from apply.delta.files.local_store import LocalStore
from apply.delta.files.store import commit_name
from apply.delta.table_options import TableOptions
from apply.delta.tables import DeltaTables
from apply.delta.writer import overwrite as own_commits
from apply.delta.writer.checkpoint import keep_log_of
from apply.delta.writer.live_files import LiveFiles
from apply.delta.writer.open_table import OpenTable
from apply.delta.writer.overwrite import checkpoint_due, commit, overwrite
from apply.worker.applier import BatchApplier
from subscriber.replication.lsn import Lsn
from tests.support.delta_log import writers
from tests.unit.apply.builders import batch, dele, ins, relation, tx, upd

pytestmark = pytest.mark.integration

T = relation("id", "v")
PGSUB = "parquet-cpp-arrow"  # pgsub writes a checkpoint with pyarrow, delta-rs with parquet-rs


def checkpoints(folder: Path) -> dict[int, str]:
    """Each checkpoint's version and the library that wrote it."""
    return {
        int(path.name[:20]): str(pq.read_metadata(path).created_by)
        for path in sorted((folder / "_delta_log").glob("*.checkpoint.parquet"))
    }


def drop_commits_before(folder: Path, version: int) -> None:
    """The log's commits before ``version`` removed, as its cleanup does once they expire:
    a reader must start from the checkpoint at ``version``."""
    for path in (folder / "_delta_log").glob("*.json"):
        if int(path.name[:20]) < version:
            path.unlink()


def by_spark(spark: Any, folder: Path, **options: Any) -> dict[int, str]:
    reader = spark.read.format("delta")
    for name, value in options.items():
        reader = reader.option(name, value)
    return {row.id: row.v for row in reader.load(str(folder)).collect()}


def by_delta_rs(folder: Path) -> dict[int, str]:
    """The rows as delta-rs's DataFusion reads them (deletion vectors applied)."""
    table = deltalake.DeltaTable(str(folder))
    found = deltalake.QueryBuilder().register("t", table).execute("SELECT id, v FROM t")
    return {r["id"]: r["v"] for r in pa.table(found.read_all()).to_pylist()}


def test_a_small_tables_checkpoints_are_pgsubs_and_every_reader_starts_from_them(
    spark: Any, warehouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table rewritten whole at each batch: each checkpoint is pgsub's (the first from the
    log read once, the next from the commits it made), ``_last_checkpoint`` names the
    newest, the replaced files stay as tombstones; with every commit before it removed,
    Spark, delta-rs and a new process read the same rows and the table's progress, Spark
    travels back to it and commits after it."""
    monkeypatch.setattr(own_commits, "_CHECKPOINT_INTERVAL", 5)
    tables = DeltaTables(spark, str(warehouse), "sub1")
    applier = BatchApplier("sub1", tables, lambda oid: None)
    folder = warehouse / "public" / "t"
    model = {i: "a" for i in range(50)}
    at_version: dict[int, dict[int, str]] = {}
    try:
        applier.apply(batch(tx(*(ins(T, i, "a") for i in range(50)), end=100)))
        for n in range(1, 24):
            applier.apply(batch(tx(upd(T, n, f"b{n}"), end=100 + n * 10)))
            model[n] = f"b{n}"
            at_version[deltalake.DeltaTable(str(folder)).version()] = dict(model)
    finally:
        applier.close()
    made = checkpoints(folder)
    due = [v for v in range(1, 25) if checkpoint_due(v, {}, str(folder))]
    assert sorted(made) == due and len(due) >= 4, made
    assert all(by.startswith(PGSUB) for by in made.values()), made
    newest = max(made)
    last = json.loads((folder / "_delta_log" / "_last_checkpoint").read_text())
    assert last["version"] == newest and last["numOfAddFiles"] == 1
    rows = pq.read_table(folder / "_delta_log" / f"{newest:020d}.checkpoint.parquet")
    assert rows.num_rows == last["size"]
    tombstones = [r for r in rows.column("remove").to_pylist() if r is not None]
    assert len(tombstones) == newest - 1  # each batch's rewrite replaced the file before it
    assert [t["appId"] for t in rows.column("txn").to_pylist() if t is not None] == ["pgsub/sub1"]

    drop_commits_before(folder, newest)
    assert by_spark(spark, folder) == model
    assert by_delta_rs(folder) == model
    assert by_spark(spark, folder, versionAsOf=newest) == at_version[newest]
    replayed = LiveFiles(LocalStore(str(folder)))
    replayed.read(deltalake.DeltaTable(str(folder)).version())
    assert [f.name for f in replayed.files] == [
        Path(uri).name for uri in deltalake.DeltaTable(str(folder)).file_uris()
    ]
    assert DeltaTables(spark, str(warehouse), "sub1").applied_lsn("public.t") == Lsn(330)
    spark.sql(f"INSERT INTO delta.`{folder}` VALUES (1000, 'after')")
    assert by_delta_rs(folder) == {**model, 1000: "after"}


def test_a_deletion_vector_tables_checkpoints_carry_its_vectors(
    spark: Any, warehouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table written by deletion vectors: pgsub's checkpoints carry each live file's
    vector; with the commits before the newest gone, Spark and delta-rs read the rows, and
    a new process's batch finds the live files and vectors in it."""
    monkeypatch.setattr(own_commits, "_CHECKPOINT_INTERVAL", 4)
    vectors = TableOptions(features=TableFeatures(deletion_vectors=FeatureMode.ALWAYS))
    tables = DeltaTables(spark, str(warehouse), "sub1", vectors)
    applier = BatchApplier("sub1", tables, lambda oid: None)
    folder = warehouse / "public" / "t"
    model = {i: f"v{i}" for i in range(1, 301)}
    try:
        applier.apply(batch(tx(*(ins(T, i, model[i]) for i in range(1, 301)), end=100)))
        for n in range(1, 13):
            changes = [upd(T, n * 7, f"u{n}"), dele(T, 150 + n * 11, None)]
            applier.apply(batch(tx(*changes, end=100 + n * 10)))
            model[n * 7] = f"u{n}"
            model.pop(150 + n * 11)
    finally:
        applier.close()
    assert set(writers(folder)[1:]) == {"pgsub"}
    made = checkpoints(folder)
    assert len(made) >= 2 and all(by.startswith(PGSUB) for by in made.values()), made
    newest = max(made)
    rows = pq.read_table(folder / "_delta_log" / f"{newest:020d}.checkpoint.parquet")
    adds = [a for a in rows.column("add").to_pylist() if a is not None]
    assert any(a["deletionVector"] is not None for a in adds), adds
    live = deltalake.DeltaTable(str(folder), version=newest).get_add_actions(flatten=True)
    assert sorted(a["path"] for a in adds) == sorted(live.column("path").to_pylist())

    drop_commits_before(folder, newest)
    assert by_spark(spark, folder) == model
    assert by_delta_rs(folder) == model
    tables = DeltaTables(spark, str(warehouse), "sub1", vectors)
    applier = BatchApplier("sub1", tables, lambda oid: None)
    try:
        applier.apply(batch(tx(upd(T, 2, "again"), dele(T, 3, None), end=1000)))
    finally:
        applier.close()
    model[2] = "again"
    model.pop(3)
    assert writers(folder)[-1] == "pgsub"
    assert by_spark(spark, folder) == model
    assert by_delta_rs(folder) == model


def test_a_commit_it_does_not_follow_leaves_the_checkpoint_to_delta_rs(tmp_path: Path) -> None:
    """Another engine's commit with a field pgsub's checkpoint has no place for: that
    checkpoint is delta-rs's (nothing lost), and the next one pgsub's again."""
    folder = tmp_path / "t"
    deltalake.write_deltalake(str(folder), pa.table({"id": pa.array([1, 2], pa.int32())}))
    store = LocalStore(str(folder))
    interval = {"delta.checkpointInterval": "3"}
    deltalake.DeltaTable(str(folder)).alter.set_table_properties(interval)
    table = OpenTable(store, deltalake.DeltaTable(str(folder)))
    version = table.version
    shaped = {"path": "x.parquet", "size": 1, "modificationTime": 0, "dataChange": True}
    # An add and its remove in one commit: no file, but a field this does not know.
    other: list[dict[str, object]] = [
        {"commitInfo": {"operation": "WRITE"}},
        {"add": {**shaped, "partitionValues": {}, "futureField": {"a": 1}}},
        {"remove": {"path": "x.parquet", "deletionTimestamp": 0, "dataChange": True}},
    ]
    commit(store, version + 1, other)
    table.synced()
    made: dict[int, str] = {}
    for n in range(8):
        rows = pa.table({"id": pa.array([n], pa.int32())})
        mark = CommitMark("sub1", Lsn(100 + n), 0)
        own, _, actions = overwrite(store, table.version, table.files(), rows, mark)
        table.wrote(*mark.txn, own, actions=actions)
        keep_log_of(table)
        made = checkpoints(folder)
    first, *rest = sorted(made)
    assert made[first].startswith("parquet-rs"), made  # the foreign commit is before it
    assert rest and all(made[v].startswith(PGSUB) for v in rest), made
    drop_commits_before(folder, max(made))
    assert deltalake.DeltaTable(str(folder)).to_pyarrow_table().to_pylist() == [{"id": 7}]
    app_id, batch_version = mark.txn
    assert deltalake.DeltaTable(str(folder)).transaction_version(app_id) == batch_version
    assert (folder / "_delta_log" / commit_name(max(made)).split("/")[1]).exists()
