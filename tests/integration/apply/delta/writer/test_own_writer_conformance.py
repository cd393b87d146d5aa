"""pgsub's own Delta writer held to the protocol: every kind of commit it makes, read back by
every reader and by its own log replay, row for row; and docs/tables.md's "Which reader
opens what" checked against what each reader does with each kind of table pgsub makes.

The commits: a small table rewritten whole (``apply.delta.writer.overwrite.overwrite``), a large
transaction's inserts appended (``append``, through ``LocalMerges.append_staged``),
deletion vectors (``apply.delta.writer.vector_write``) - and between them delta-rs's MERGE and
overwrite, Spark's DELETE (its own vectors), checkpoints written by delta-rs, by Spark and by
pgsub (``apply.delta.writer.checkpoint``).
After each one the table is read by Spark, delta-rs (``to_pyarrow_table`` and its
``QueryBuilder``), polars, and pgsub's replay (``LiveFiles``: the live files, each less the
rows its vector deletes), and compared with the rows the commits should have left.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import deltalake
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apply.batching.collapse import KeyedNet, collapse
from apply.batching.columns_net import keyed_columns_source
from apply.columns.change_columns import ChangeColumns
from apply.columns.schema import target_schema
from apply.core.features import FeatureMode, TableFeatures
from apply.core.records import CommitMark
from apply.delta.files.local_store import LocalStore
from apply.delta.table_options import TableOptions
from apply.delta.tables import DeltaTables
from apply.delta.writer import (
    checkpoint,
    deletion_vectors,
    delta_rs_merge,
    overwrite,
    vector_write,
)
from apply.delta.writer.live_files import LiveFiles, latest_version
from apply.delta.writer.local_merge import LocalMerges
from apply.plans.staging import StagedSource
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.messages import Column, Relation, ReplicaIdentity
from tests.support.delta_log import writers
from tests.unit.apply.builders import batch, dele, ins, tx, upd

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[5]
PLAIN = Relation(
    16384,
    "public",
    "t",
    ReplicaIdentity.DEFAULT,
    (Column("id", 23, -1, True), Column("v", 25, -1, False)),
)
STAMPED = Relation(
    16384,
    "public",
    "t",
    ReplicaIdentity.DEFAULT,
    (Column("id", 23, -1, True), Column("v", 25, -1, False), Column("at", 1114, -1, False)),
)
Row = tuple[Any, ...]


def _at(key: int) -> str:
    return f"2024-01-{1 + key % 28:02d} 10:{key % 60:02d}:00"


class Model:
    """The rows the commits should have left, and pgsub's ways of writing them."""

    def __init__(self, spark: Any, warehouse: Path, relation: Relation, vectors: bool) -> None:
        features = TableFeatures(
            deletion_vectors=FeatureMode.ALWAYS if vectors else FeatureMode.NEVER
        )
        self.tables = DeltaTables(spark, str(warehouse), "sub1", TableOptions(features=features))
        self.features = features
        self.relation = relation
        self.schema = target_schema(relation, lambda oid: None, True)
        self.tables.prepare(self.schema)
        self.path = self.tables.path("public.t")
        self.folder = Path(self.path)
        self.rows: dict[int, Row] = {}
        self.lsn = 100
        self.spark = spark

    def values(self, key: int, text: str) -> tuple[object, ...]:
        return (key, text, _at(key)) if len(self.relation.columns) == 3 else (key, text)

    def expected(self, key: int, text: str) -> Row:
        if len(self.relation.columns) == 3:
            return (key, text, datetime.fromisoformat(_at(key)))
        return (key, text)

    def mark(self) -> CommitMark:
        self.lsn += 100
        return CommitMark("sub1", Lsn(self.lsn), 0)

    def net(self, upserts: dict[int, str], deletes: list[int]) -> KeyedNet:
        changes: list[Any] = []
        for key, text in upserts.items():
            made = ins if key not in self.rows else upd
            changes.append(made(self.relation, *self.values(key, text)))
        nulls = (None,) * (len(self.relation.columns) - 1)
        changes += [dele(self.relation, key, *nulls) for key in deletes]
        work = batch(tx(*changes)).tables(lambda name: ZERO)["public.t"]
        keyed = collapse(work)
        assert isinstance(keyed, KeyedNet)
        for key, text in upserts.items():
            self.rows[key] = self.expected(key, text)
        for key in deletes:
            del self.rows[key]
        return keyed

    def merge(self, upserts: dict[int, str], deletes: Sequence[int] = ()) -> str:
        """One batch through ``LocalMerges``: the engine that committed it."""
        net = self.net(upserts, list(deletes))
        written = LocalMerges(features=self.features).merge(
            self.path, self.schema, net, self.mark()
        )
        assert written is not None and written.version is not None
        return writers(self.folder)[-1]

    def append(self, keys: range, tmp: Path) -> str:
        """A large transaction that only inserts absent keys, staged then appended."""
        stage = StagedSource(tmp / f"stage-{self.lsn}", self.schema)
        changes = [ins(self.relation, *self.values(k, "appended")) for k in keys]
        source = keyed_columns_source(ChangeColumns.of(self.relation, changes), self.schema)
        assert source is not None and stage.add_source(source)
        merges = LocalMerges(features=self.features)
        written = merges.append_staged(self.path, self.schema, stage, self.mark())
        assert written is not None and written.inserted == len(keys)
        self.rows.update({k: self.expected(k, "appended") for k in keys})
        return writers(self.folder)[-1]

    def spark_delete(self, keys: list[int]) -> None:
        """Another engine's DELETE (Spark's own deletion vectors on a table that has them)."""
        listed = ", ".join(map(str, keys))
        self.spark.sql(f"DELETE FROM delta.`{self.folder}` WHERE id IN ({listed})").collect()
        for key in keys:
            del self.rows[key]

    def checkpoint_by_spark(self) -> None:
        ref = f"delta.`{self.folder}`"
        self.spark.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES ('delta.checkpointInterval' = '1')")
        self.spark.sql(f"ALTER TABLE {ref} UNSET TBLPROPERTIES ('delta.checkpointInterval')")
        assert any(self.folder.glob("_delta_log/*.checkpoint.parquet"))

    def merge_checkpointed(
        self, upserts: dict[int, str], deletes: Sequence[int] = (), *, by: str = "pgsub"
    ) -> str:
        """One batch through ``LocalMerges``, whose commit is then checkpointed: by pgsub
        itself (``apply.delta.writer.checkpoint``: the last checkpoint and the commits
        since), or by delta-rs where the last checkpoint is one pgsub does not follow
        (Spark's, in another schema). The engine that committed the batch."""
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(checkpoint, "checkpoint_due", lambda *args: True)
            patch.setattr(overwrite, "checkpoint_due", lambda *args: True)
            engine = self.merge(upserts, deletes)
        version = deltalake.DeltaTable(self.path).version()
        made = self.folder / "_delta_log" / f"{version:020d}.checkpoint.parquet"
        library = {"pgsub": "parquet-cpp-arrow", "delta-rs": "parquet-rs"}[by]
        assert str(pq.read_metadata(made).created_by).startswith(library)
        return engine

    def checkpoint_by_delta_rs(self) -> None:
        table = deltalake.DeltaTable(self.path)
        table.create_checkpoint()
        assert (self.folder / "_delta_log" / f"{table.version():020d}.checkpoint.parquet").exists()

    def sorted_rows(self) -> list[Row]:
        return sorted(self.rows.values())


# -- the readers -------------------------------------------------------------------------


def _canonical(rows: list[dict[str, Any]], names: list[str]) -> list[Row]:
    def value(v: Any) -> Any:
        if isinstance(v, datetime):
            return v.replace(tzinfo=None)
        return v

    return sorted(tuple(value(row[n]) for n in names) for row in rows)


def read_spark(spark: Any, path: Path, names: list[str]) -> list[Row]:
    frame = spark.read.format("delta").load(str(path))
    return _canonical([r.asDict() for r in frame.collect()], names)


def read_pyarrow(path: Path, names: list[str]) -> list[Row]:
    return _canonical(deltalake.DeltaTable(str(path)).to_pyarrow_table().to_pylist(), names)


def read_query_builder(path: Path, names: list[str]) -> list[Row]:
    table = deltalake.DeltaTable(str(path))
    columns = ", ".join(f'"{n}"' for n in names)
    found = deltalake.QueryBuilder().register("t", table).execute(f"SELECT {columns} FROM t")
    return _canonical(pa.table(found.read_all()).to_pylist(), names)


def read_polars(path: Path, names: list[str]) -> list[Row]:
    return _canonical(pl.read_delta(str(path)).to_dicts(), names)


def read_own_replay(path: Path, names: list[str]) -> list[Row]:
    """pgsub's own reading of the log: its live files, each less what its vector deletes."""
    store = LocalStore(str(path))
    files = LiveFiles(store)
    files.read(latest_version(store))
    rows: list[dict[str, Any]] = []
    for file in files.files:
        table = pq.read_table(store.source(file.name))
        if file.vector is not None:
            keep = np.ones(table.num_rows, dtype=np.bool_)
            keep[deletion_vectors.read(store, file.vector).astype(np.int64)] = False
            table = table.filter(pa.array(keep))
        rows += table.to_pylist()
    return _canonical(rows, names)


def _spark_reader(spark: Any) -> Callable[[Path, list[str]], list[Row]]:
    return lambda path, names: read_spark(spark, path, names)


def readers(spark: Any) -> dict[str, Callable[[Path, list[str]], list[Row]]]:
    """Each reader of docs/tables.md's table, by the name its row starts with."""
    return {
        "Spark": _spark_reader(spark),
        "delta-rs 1.6.6 `to_pyarrow_table`": read_pyarrow,
        "delta-rs 1.6.6 `QueryBuilder`": read_query_builder,
        "polars 2.1": read_polars,
        "pgsub's own log replay": read_own_replay,
    }


def check_every_reader(spark: Any, model: Model, kind: str) -> None:
    """Each reader that docs/tables.md says opens ``kind`` reads exactly the model's rows;
    each one it says refuses ``kind`` refuses it."""
    names = [c.name for c in model.schema.columns]
    table = documented_readers()
    for reader, read in readers(spark).items():
        opens = table[reader][kind]
        if opens == "yes":
            assert read(model.folder, names) == model.sorted_rows(), f"{reader} on {kind}"
        elif opens == "no":
            with pytest.raises(Exception):  # noqa: B017 - whatever the reader raises
                read(model.folder, names)


def documented_readers() -> dict[str, dict[str, str]]:
    """docs/tables.md's "Which reader opens what": reader -> kind of table -> yes/no/—."""
    text = (ROOT / "docs" / "tables.md").read_text()
    section = text.split("## Which reader opens what", 1)[1]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip(" `") for cell in lines[0].strip("|").split("|")]
    found: dict[str, dict[str, str]] = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for reader in readers_named(cells[0]):
            found[reader] = {
                header[i]: re.sub(r"[^a-z—]", "", cells[i].split()[0].lower())
                for i in range(1, len(header))
                if header[i] in KINDS
            }
    return found


def readers_named(cell: str) -> list[str]:
    return [name for name in READER_NAMES if cell.startswith(name)]


READER_NAMES = (
    "Spark",
    "delta-rs 1.6.6 `to_pyarrow_table`",
    "delta-rs 1.6.6 `QueryBuilder`",
    "polars 2.1",
    "pgsub's own log replay",
)
KINDS = ("plain", "timestampNtz", "columnMapping", "typeWidening", "deletionVectors")


# -- the tests ---------------------------------------------------------------------------


def no_checkpoints_but_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """No checkpoint at the table's own versions (they hang on pytest's folder name), only
    where a test asks for one: each test's checkpoints are the same each run."""
    monkeypatch.setattr(checkpoint, "checkpoint_due", lambda *args: False)
    monkeypatch.setattr(overwrite, "checkpoint_due", lambda *args: False)


def test_the_documented_table_names_every_reader_and_kind() -> None:
    table = documented_readers()
    assert sorted(table) == sorted(READER_NAMES)
    assert all(sorted(kinds) == sorted(KINDS) for kinds in table.values())


@pytest.mark.parametrize("kind", ["plain", "timestampNtz"])
def test_a_table_without_vectors_through_every_commit_pgsub_makes(
    spark: Any, warehouse: Path, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Model(spark, warehouse, PLAIN if kind == "plain" else STAMPED, vectors=False)
    no_checkpoints_but_asked(monkeypatch)
    own = "pgsub"  # timestampNtz too: a feature its own commits meet
    assert model.merge({k: "first" for k in range(100)}) == own  # rewritten whole
    check_every_reader(spark, model, kind)
    model.checkpoint_by_delta_rs()
    assert model.merge({k: "second" for k in range(0, 100, 3)}, [1, 2, 4]) == own
    check_every_reader(spark, model, kind)
    assert model.append(range(1000, 3000), tmp_path) == own  # a large transaction's inserts
    check_every_reader(spark, model, kind)
    assert model.merge_checkpointed({9: "checkpointed"}, [10]) == own
    check_every_reader(spark, model, kind)
    model.checkpoint_by_spark()
    monkeypatch.setattr(delta_rs_merge, "REWRITE_MAX_BYTES", -1)  # delta-rs's MERGE now
    assert model.merge({5: "merged", 2500: "merged", 4000: "new"}, [7, 1500]) == "delta-rs"
    check_every_reader(spark, model, kind)
    monkeypatch.undo()
    assert model.merge({6: "rewritten"}, [8]) == own  # after a Spark checkpoint
    check_every_reader(spark, model, kind)


def test_a_table_with_vectors_through_every_commit_pgsub_makes(
    spark: Any, warehouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A table's fold point comes from its folder's name (``fold_at``: 16 to 31): at 20 the
    # last fold of these 40 batches takes every file with a vector, and whether a run met it
    # hung on pytest's temporary folder. Fixed here, so the end state is the same each run.
    monkeypatch.setattr(vector_write, "fold_at", lambda location: 23)
    no_checkpoints_but_asked(monkeypatch)
    model = Model(spark, warehouse, PLAIN, vectors=True)
    model.merge({k: "first" for k in range(5000)})
    check_every_reader(spark, model, "deletionVectors")
    steps = 40  # past any table's fold point (16 to 31 files), then a purge of the first file
    for step in range(steps):
        keys = range(step * 120, step * 120 + 100)
        upserts = {k: f"s{step}" for k in keys if k % 5}
        deletes = [k for k in keys if not k % 5][:10]
        if step in (7, 27):  # after delta-rs's checkpoint; after the one below
            assert model.merge_checkpointed(upserts, deletes) == "pgsub"
        elif step == 26:  # after Spark's checkpoint (step 10): delta-rs's
            assert model.merge_checkpointed(upserts, deletes, by="delta-rs") == "pgsub"
        else:
            assert model.merge(upserts, deletes) == "pgsub"
        if step == 5:
            model.checkpoint_by_delta_rs()
        if step == 10:
            model.spark_delete([4998, 4999])  # Spark's own vectors, which pgsub's replay reads
            model.checkpoint_by_spark()  # their descriptors in a checkpoint's add structs
        if step in (0, 6, 7, 11, 25, 26, 27, steps - 1):
            check_every_reader(spark, model, "deletionVectors")
    assert writers(model.folder).count("pgsub") == steps + 1  # every batch by pgsub's own commits
    store = LocalStore(model.path)
    files = LiveFiles(store)
    files.read(latest_version(store))
    assert any(f.vector is not None for f in files.files)
    assert len(files.files) <= 23  # the small files folded as they went


@pytest.mark.parametrize("kind", ["columnMapping", "typeWidening"])
def test_tables_pgsub_makes_with_spark_are_opened_as_documented(
    spark: Any, warehouse: Path, kind: str
) -> None:
    """A table with column mapping (a column name Delta needs it for) or type widening (a
    column widened past the rewrite bound): written by Spark, read as the table says."""
    model = Model(spark, warehouse, PLAIN, vectors=False)
    ref = f"delta.`{model.folder}`"
    model.merge({k: "v" for k in range(10)})
    if kind == "columnMapping":
        spark.sql(
            f"ALTER TABLE {ref} SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
            "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')"
        )
    else:
        spark.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
        spark.sql(f"ALTER TABLE {ref} ALTER COLUMN id TYPE bigint")
    check_every_reader(spark, model, kind)
