"""pgsub's own VACUUM (apply/delta/writer/vacuum.py): what no version of the retention names
and is older than it goes - replaced files, replaced deletion vectors, what a killed job left -;
every live file, every vector, every file a reader may still travel back to stays, on a local
disk and in a bucket; Spark and delta-rs read the table after it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest

from apply.core.features import FeatureMode, TableFeatures
from apply.delta.files.store import LOG, table_store
from apply.delta.table_options import TableOptions
from apply.delta.tables import DeltaTables
from apply.delta.writer.live_files import LiveFiles, newest_commit
from apply.delta.writer.local_tables import opened
from apply.delta.writer.vacuum import vacuum
from apply.worker.applier import BatchApplier
from tests.unit.apply.builders import batch, dele, ins, relation, tx, upd

pytestmark = pytest.mark.integration

T = relation("id", "v")
VECTORS = TableOptions(features=TableFeatures(deletion_vectors=FeatureMode.ALWAYS))
ORPHAN = "part-00000-left-by-a-killed-job.parquet"
HOUR = 3600.0

Model = dict[int, str]


def read_by_spark(spark: Any, path: str) -> Model:
    return {row.id: row.v for row in spark.read.format("delta").load(path).collect()}


def read_by_delta_rs(path: str, version: int | None = None) -> Model:
    """The rows as delta-rs's DataFusion reads them (it applies deletion vectors)."""
    table = opened(path)
    if version is not None:
        table.load_as_version(version)
    found = deltalake.QueryBuilder().register("t", table).execute("SELECT id, v FROM t")
    return {r["id"]: r["v"] for r in pa.table(found.read_all()).to_pylist()}


def written(spark: Any, warehouse: str) -> tuple[str, list[Model]]:
    """public.t written by pgsub's vector writer in three batches: its path, and its rows
    after each (versions 1, 2, 3 after Spark's CREATE at 0)."""
    tables = DeltaTables(spark, warehouse, "sub1", VECTORS)
    applier = BatchApplier("sub1", tables, lambda oid: None)
    model: Model = {i: f"v{i}" for i in range(1, 201)}
    seen = []
    try:
        applier.apply(batch(tx(*(ins(T, i, v) for i, v in model.items()), end=100)))
        seen.append(dict(model))
        for end, step in ((200, 7), (300, 5)):  # each batch gives the file a new vector
            changes = [upd(T, i, f"u{end}-{i}") for i in range(step, 201, step)]
            changes.append(dele(T, step + 1, None))
            applier.apply(batch(tx(*changes, end=end)))
            model.update({i: f"u{end}-{i}" for i in range(step, 201, step)})
            model.pop(step + 1, None)
            seen.append(dict(model))
    finally:
        applier.close()
    return tables.path("public.t"), seen


def vectors(path: str) -> set[str]:
    """The deletion vector files the table's live files carry."""
    store = table_store(path)
    live = LiveFiles(store)
    live.read(newest_commit(store))
    return {f.vector.name for f in live.files if f.vector is not None}


@pytest.fixture(params=["local", "bucket"])
def where(request: pytest.FixtureRequest, warehouse: Path) -> str:
    if request.param == "bucket":
        return str(request.getfixturevalue("s3_warehouse"))
    return str(warehouse)


def test_what_no_version_of_the_retention_names_goes_and_every_reader_reads_the_table(
    spark: Any, where: str
) -> None:
    path, seen = written(spark, where)
    store = table_store(path)
    live_vectors = vectors(path)
    assert live_vectors  # the table is written by vectors
    store.write(ORPHAN, b"PAR1")  # a file no commit names
    store.write("_pgsub_marker", b"kept")  # hidden: Delta's VACUUM leaves it
    files_before = {name for name, _ in _all(store)}

    # Nothing is older than the retention yet: nothing goes, not even the orphan.
    assert vacuum(store, HOUR).deleted == []

    # Two hours on: the files the batches replaced, the vectors replaced, the orphan go.
    swept = vacuum(store, HOUR, now=time.time() + 2 * HOUR)
    gone = set(swept.deleted)
    assert ORPHAN in gone
    assert "_pgsub_marker" not in gone
    assert not [name for name in gone if name.startswith(LOG)]
    assert live_vectors.isdisjoint(gone)
    replaced_vectors = {n for n in files_before - live_vectors if "deletion_vector_" in n}
    assert replaced_vectors  # the second batch replaced the first one's vector
    assert replaced_vectors <= gone
    assert {name for name, _ in _all(store)} == files_before - gone
    assert read_by_spark(spark, path) == seen[-1]
    assert read_by_delta_rs(path) == seen[-1]


def test_a_file_removed_within_the_retention_stays_for_time_travel_after_a_checkpoint(
    spark: Any, warehouse: Path
) -> None:
    """A file written long ago but removed a minute ago is what a reader of an older version
    reads: its tombstone keeps it, read from the checkpoint's ``remove`` column here."""
    path, seen = written(spark, str(warehouse))
    store = table_store(path)
    store.write(ORPHAN, b"PAR1")
    three_hours_ago = time.time() - 3 * HOUR
    for name, _ in _all(store):
        os.utime(Path(path) / name, (three_hours_ago, three_hours_ago))
    deltalake.DeltaTable(path).create_checkpoint()  # at the latest version: no commit after
    assert (Path(path) / LOG / f"{newest_commit(store):020d}.checkpoint.parquet").exists()

    assert vacuum(store, HOUR).deleted == [ORPHAN]
    for version, rows in enumerate(seen, start=1):
        assert read_by_delta_rs(path, version) == rows
    old = spark.read.format("delta").option("versionAsOf", 1).load(path).collect()
    assert {row.id: row.v for row in old} == seen[0]


def _all(store: Any) -> list[tuple[str, float]]:
    """Every file under the table, its log's too."""
    found, folders = [], [""]
    while folders:
        files, inner = store.contents(folders.pop())
        found += files
        folders += inner
    return found


def test_a_vector_named_by_an_absolute_path_inside_the_table_stays(tmp_path: Path) -> None:
    """A deletion vector may be named by an absolute path (``p``) rather than by a UUID:
    inside the table it is the listing's relative name, and the live file's vector stays;
    a removed file's old one goes past the retention."""
    table = tmp_path / "t"
    (table / LOG).mkdir(parents=True)
    for name in ("part-live.parquet", "part-old.parquet", "dv-live.bin", "dv-old.bin"):
        (table / name).write_bytes(b"x")

    def vector(name: str) -> dict[str, object]:
        path = f"file://{table}/{name}"
        return {"storageType": "p", "pathOrInlineDv": path, "offset": 1, "sizeInBytes": 4,
                "cardinality": 1}  # fmt: skip

    now = int(time.time() * 1000)
    actions = [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                      "readerFeatures": ["deletionVectors"],
                      "writerFeatures": ["deletionVectors"]}},
        {"metaData": {"id": "t", "format": {"provider": "parquet", "options": {}},
                      "schemaString": '{"type":"struct","fields":[]}',
                      "partitionColumns": [], "configuration": {}}},
        {"add": {"path": "part-live.parquet", "partitionValues": {}, "size": 1,
                 "modificationTime": now, "dataChange": True,
                 "deletionVector": vector("dv-live.bin")}},
        {"remove": {"path": "part-old.parquet", "deletionTimestamp": now - 3 * 3600_000,
                    "dataChange": True, "deletionVector": vector("dv-old.bin")}},
    ]  # fmt: skip
    commit = "\n".join(json.dumps(action) for action in actions)
    (table / LOG / "00000000000000000000.json").write_text(commit)

    swept = vacuum(table_store(str(table)), HOUR, now=time.time() + 2 * HOUR)
    assert sorted(swept.deleted) == ["dv-old.bin", "part-old.parquet"]
    assert (table / "dv-live.bin").exists() and (table / "part-live.parquet").exists()
