"""The warehouse in an object store (apply/delta/files/store.py, storage.py): pgsub's own commits
by conditional PUT, a lost race made again, a retried PUT taken for its own, delta-rs's
merges and the state store there - every table read back from the bucket by Spark,
delta-rs, polars and pgsub's own replay."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, cast

import deltalake
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apply.batching.error_context import TransactionError
from apply.core.errors import CommitRacedError
from apply.core.features import TableFeatures
from apply.core.maintenance_policy import retention_properties
from apply.core.records import CommitMark, StoredTableState
from apply.delta.files.object_store import ObjectStore
from apply.delta.files.storage import storage_for
from apply.delta.files.store import commit_name, table_store
from apply.delta.spark.maintenance import Grown, is_delta_table, tend
from apply.delta.state_store import CheckpointStore, TableStateStore
from apply.delta.tables import DeltaTables
from apply.delta.writer import deletion_vectors, delta_rs_merge
from apply.delta.writer.live_files import LiveFiles, latest_version
from apply.delta.writer.local_merge import LocalMerges
from apply.delta.writer.local_tables import opened
from apply.worker.applier import BatchApplier
from subscriber.replication.lsn import Lsn
from subscriber.runtime.config import MaintenanceConfig
from tests.integration.apply.delta.test_staged_append import SCHEMA as STAGED
from tests.integration.apply.delta.test_staged_append import inserts, staged
from tests.plugins.s3 import S3Server
from tests.unit.apply.builders import batch, dele, ins, relation, tx, upd

pytestmark = pytest.mark.integration

T = relation("id", "v")
Rows = list[tuple[int, str]]


def engines(path: str) -> list[str]:
    """Each commit's engine, oldest first, read from the bucket."""
    import json

    store = table_store(path)
    found = []
    for version in range(latest_version(store) + 1):
        for line in store.read(commit_name(version)).decode().splitlines():
            info = json.loads(line).get("commitInfo")
            if info is not None:
                client = str(info.get("clientVersion") or info.get("engineInfo") or "")
                found.append(
                    "pgsub"
                    if client == "pgsub"
                    else "delta-rs"
                    if "delta-rs" in client
                    else "Spark"
                )
    return found


def by_spark(spark: Any, path: str) -> Rows:
    rows = spark.read.format("delta").load(path).collect()
    return sorted((int(r["id"]), str(r["v"])) for r in rows)


def by_delta_rs(path: str) -> Rows:
    table = opened(path)
    found = deltalake.QueryBuilder().register("t", table).execute("SELECT id, v FROM t")
    return sorted((int(r["id"]), str(r["v"])) for r in pa.table(found.read_all()).to_pylist())


def by_polars(path: str) -> Rows:
    options = storage_for(path).delta_rs_options()
    frame = pl.read_delta(path.replace("s3a://", "s3://"), storage_options=options)
    return sorted((int(r["id"]), str(r["v"])) for r in frame.to_dicts())


def by_own_replay(path: str) -> Rows:
    store = table_store(path)
    files = LiveFiles(store)
    files.read(latest_version(store))
    rows: Rows = []
    for file in files.files:
        table = pq.ParquetFile(store.open(file.name)).read()
        if file.vector is not None:
            keep = np.ones(table.num_rows, dtype=np.bool_)
            keep[deletion_vectors.read(store, file.vector).astype(np.int64)] = False
            table = table.filter(pa.array(keep))
        rows += [(int(r["id"]), str(r["v"])) for r in table.to_pylist()]
    return sorted(rows)


def table_t(spark: Any, warehouse: str) -> tuple[DeltaTables, BatchApplier, str]:
    """Subscription sub1's tables in ``warehouse``, an applier of its batches, and the path of
    its table public.t."""
    tables = DeltaTables(spark, warehouse, "sub1")
    return tables, BatchApplier("sub1", tables, lambda oid: None), tables.path("public.t")


def every_reader(spark: Any, path: str, want: Rows) -> None:
    assert by_spark(spark, path) == want
    assert by_delta_rs(path) == want
    assert by_polars(path) == want
    assert by_own_replay(path) == want


def test_every_kind_of_commit_lands_in_the_bucket_and_reads_back(
    spark: Any, s3_warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table rewritten whole by pgsub's own commit, then turned to deletion vectors by the
    write-cost rule and written by them, then merged by delta-rs: in the bucket, each step
    read back by every reader."""
    tables, applier, path = table_t(spark, s3_warehouse)
    model = {i: f"v{i}" for i in range(50)}
    try:
        applier.apply(batch(tx(*(ins(T, i, v) for i, v in model.items()), end=100)))
        assert engines(path)[-1] == "pgsub"  # rewritten whole, by pgsub's own commit
        every_reader(spark, path, sorted(model.items()))

        bigger = {i: f"{i:064d}" for i in range(50, 20_050)}
        applier.apply(batch(tx(*(ins(T, i, v) for i, v in bigger.items()), end=200)))
        model.update(bigger)
        applier.apply(batch(tx(upd(T, 7, "seven"), dele(T, 8, None), end=300)))
        model[7] = "seven"
        del model[8]
        assert engines(path)[-2:] == ["pgsub", "pgsub"]  # vectors on, then the batch by them
        assert "deletionVectors" in (opened(path).protocol().reader_features or ())
        every_reader(spark, path, sorted(model.items()))

        monkeypatch.setattr(delta_rs_merge, "REWRITE_MAX_BYTES", -1)
        plain = DeltaTables(spark, s3_warehouse, "sub1")  # another table, merged by delta-rs
        other = relation("id", "v", name="u", oid=16385)
        merging = BatchApplier("sub1", plain, lambda oid: None)
        merging.apply(batch(tx(*(ins(other, i, "a") for i in range(10)), end=400)))
        merging.apply(batch(tx(upd(other, 3, "b"), end=500)))
        merging.close()
        assert tables.applied_lsn("public.t") == Lsn(300)
        assert plain.applied_lsn("public.u") == Lsn(500)
    finally:
        applier.close()


def test_a_commit_another_writer_made_first_is_made_again_on_top_of_it(
    spark: Any, s3_warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer takes the version pgsub's commit was for (its conditional PUT refused:
    412): nothing of pgsub's is committed, and the batch is made again on the table as that
    writer left it - no row lost, none doubled."""
    tables, applier, path = table_t(spark, s3_warehouse)
    raced: list[int] = []
    real_put = ObjectStore.put_if_absent

    def put_after_another(store: ObjectStore, name: str, data: bytes) -> bool:
        if name.startswith("_delta_log/") and name.endswith(".json") and not raced:
            raced.append(1)  # another engine's append takes the version first
            rows = pa.table({"id": pa.array([1000], pa.int32()), "v": ["theirs"]})
            deltalake.write_deltalake(
                path, rows, mode="append", storage_options=storage_for(path).delta_rs_options()
            )
        return real_put(store, name, data)

    try:
        applier.apply(batch(tx(*(ins(T, i, "a") for i in range(5)), end=100)))
        monkeypatch.setattr(ObjectStore, "put_if_absent", put_after_another)
        result = applier.apply(batch(tx(upd(T, 2, "b"), end=200)))
        applier.verify(result)
    finally:
        applier.close()
    assert raced
    want = [(0, "a"), (1, "a"), (2, "b"), (3, "a"), (4, "a"), (1000, "theirs")]
    every_reader(spark, path, want)
    assert tables.applied_lsn("public.t") == Lsn(200)


# pgsub's own two ways of committing a small batch: by deletion vectors (a table whose first
# update turns them on), and rewritten whole (a small table).
OWN_WAYS = {"by deletion vectors": 20_000, "rewritten whole": 50}


def own_table(applier: BatchApplier, rows: int) -> dict[int, str]:
    """A table of ``rows`` rows and one update of it; the rows it holds."""
    model = {i: f"{i:064d}" for i in range(rows)}
    applier.apply(batch(tx(*(ins(T, i, v) for i, v in model.items()), end=100)))
    applier.apply(batch(tx(upd(T, 1, "one"), end=110)))
    model[1] = "one"
    return model


@pytest.mark.parametrize("rows", OWN_WAYS.values(), ids=OWN_WAYS.keys())
def test_a_batch_after_another_writers_commit_is_made_on_top_of_it_without_a_refused_put(
    spark: Any, s3_warehouse: str, monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    """Another engine commits between two batches of a table pgsub commits to itself. pgsub
    asks whether the log moved on while it writes the batch's files
    (``OpenTable.ask_latest``) and takes the answer before its commit: the batch is made
    again on the table as that engine left it, without a refused PUT - no row lost, none
    doubled."""
    tables, applier, path = table_t(spark, s3_warehouse)
    refused: list[str] = []
    real_put = ObjectStore.put_if_absent

    def put(store: ObjectStore, name: str, data: bytes) -> bool:
        made = real_put(store, name, data)
        if not made:
            refused.append(name)
        return made

    monkeypatch.setattr(ObjectStore, "put_if_absent", put)
    try:
        model = own_table(applier, rows)
        assert engines(path)[-1] == "pgsub"
        theirs = pa.table({"id": pa.array([50_000], pa.int32()), "v": ["theirs"]})
        options = storage_for(path).delta_rs_options()
        deltalake.write_deltalake(path, theirs, mode="append", storage_options=options)
        result = applier.apply(batch(tx(upd(T, 2, "two"), dele(T, 3, None), end=120)))
        applier.verify(result)
    finally:
        applier.close()
    model[2] = "two"
    del model[3]
    model[50_000] = "theirs"
    assert engines(path)[-2:] == ["delta-rs", "pgsub"]
    assert refused == []  # the check before the commit found the other engine's version
    found = deltalake.QueryBuilder().register("t", opened(path)).execute("SELECT id, v FROM t")
    assert {r["id"]: r["v"] for r in pa.table(found.read_all()).to_pylist()} == model
    assert {r.id: r.v for r in spark.read.format("delta").load(path).collect()} == model
    assert tables.applied_lsn("public.t") == Lsn(120)


@pytest.mark.parametrize("rows", OWN_WAYS.values(), ids=OWN_WAYS.keys())
def test_a_table_deleted_from_the_bucket_is_not_written_into_again(
    spark: Any, s3_server: S3Server, s3_warehouse: str, rows: int
) -> None:
    """A table pgsub commits to itself, deleted from the bucket by someone else while pgsub
    keeps it open: its next batch stops with an error naming the table (the daemon then
    finds it gone: ``test_target_tables``) and PUTs nothing where the table was - no data
    file, vector or commit that would make a log starting at a later version."""
    _, applier, path = table_t(spark, s3_warehouse)
    bucket, _, key = path.removeprefix("s3a://").partition("/")
    folder = s3_server.root / bucket / key
    try:
        own_table(applier, rows)
        shutil.rmtree(folder)
        with pytest.raises(TransactionError, match=f"{path} at LSN 0/78"):
            applier.apply(batch(tx(upd(T, 2, "two"), end=120)))
    finally:
        applier.close()
    assert not folder.exists() or not [f for f in folder.rglob("*") if f.is_file()]


def test_a_put_retried_after_its_answer_was_lost_is_taken_for_its_own(
    s3_server: S3Server, s3_warehouse: str
) -> None:
    """The store made the first PUT, its answer was lost, the retry is refused (412): the
    object holds exactly what was put, so it is this writer's; anything else is a lost
    race."""
    store = ObjectStore(f"{s3_warehouse}/t", s3_server.storage())
    name = commit_name(0)
    assert store.put_if_absent(name, b'{"commitInfo":{"txnId":"a"}}\n')
    assert store.put_if_absent(name, b'{"commitInfo":{"txnId":"a"}}\n')  # the retry
    assert not store.put_if_absent(name, b'{"commitInfo":{"txnId":"b"}}\n')  # another's
    assert store.read(name) == b'{"commitInfo":{"txnId":"a"}}\n'
    with pytest.raises(CommitRacedError):
        from apply.delta.writer.overwrite import commit

        commit(store, 0, [{"commitInfo": {"txnId": "c"}}])


def test_commits_read_at_once_come_back_in_order_and_a_missing_one_is_said(
    s3_server: S3Server, s3_warehouse: str
) -> None:
    """``read_each`` (how pgsub's replay of a log reads the commits after its checkpoint:
    all asked at once, one round trip) gives each object's bytes in the order asked, and
    FileNotFoundError where one is not there - what tells the replay a commit was cleaned
    up."""
    store = ObjectStore(f"{s3_warehouse}/t", s3_server.storage())
    names = [commit_name(version) for version in range(12)]
    for version, name in enumerate(names):
        assert store.put_if_absent(name, f'{{"commitInfo":{{"n":{version}}}}}\n'.encode())
    wanted = names[::-1] + names[3:5]
    assert store.read_each(wanted) == [store.read(name) for name in wanted]
    assert store.read_each([]) == []
    with pytest.raises(FileNotFoundError):
        store.read_each([names[0], commit_name(99), names[1]])


def test_a_bucket_near_by_is_written_by_few_writers_one_far_away_by_many(
    spark: Any, s3_warehouse: str
) -> None:
    """The merge pool's size follows the store's measured round trip (``writers_for``): a
    gateway on this machine answers in milliseconds, and 16 threads there only contended for
    Python's lock (lag p99 6.76 s against 4.45 s with 4, docs/performance.md)."""
    from apply.delta.files.store_check import LOCAL_WRITERS, MAX_WRITERS, round_trip, writers_for

    measured = round_trip(s3_warehouse)
    assert measured is not None and 0 < measured < 1.0
    writers = DeltaTables(spark, s3_warehouse, "sub1").writers
    assert writers == writers_for(measured) and LOCAL_WRITERS <= writers < 16
    assert writers_for(0.001) == LOCAL_WRITERS and writers_for(0.02) == 9
    assert writers_for(0.05) == 21 and writers_for(0.2) == MAX_WRITERS
    assert writers_for(None) == 16  # not measured: as many as before


def test_the_state_store_lives_in_the_bucket_without_spark(
    s3_warehouse: str,
) -> None:
    """Table states and checkpoints appended and read back by delta-rs in the bucket: no
    Spark session is ever asked for (the admin commands' path)."""

    def no_spark() -> Any:
        raise AssertionError("the state store asked for Spark")

    states = TableStateStore(no_spark, s3_warehouse)
    states.record("sub1", [StoredTableState(16384, "public", "t", "r", Lsn(100))])
    assert [s.state for s in states.load("sub1").values()] == ["r"]
    checkpoints = CheckpointStore(no_spark, s3_warehouse)
    checkpoints.record("sub1", Lsn(200), 0, {"public.t": 3})
    assert checkpoints.origin_lsn("sub1") == Lsn(200)


def test_a_large_transaction_is_written_by_its_keys_positions_in_the_bucket(
    spark: Any, s3_warehouse: str, tmp_path: Path
) -> None:
    """A staged transaction that changes rows of a table without deletion vectors, in a
    bucket: copy-on-write by its keys' positions (``merge_staged``), as on a local disk -
    only the files holding its keys rewritten, no vector, its mark once (sent again:
    nothing written), and every reader reads the rows it leaves."""
    tables = DeltaTables(spark, s3_warehouse, "sub1")
    tables.prepare(STAGED)
    path, local = tables.path("public.t"), LocalMerges()
    for i, (first, last) in enumerate([(1, 300), (301, 700), (800, 900)]):
        mark = CommitMark("sub1", Lsn(100 + i), 0)
        assert local.append_staged(
            path, STAGED, staged(tmp_path / f"f{i}", inserts(first, last)), mark
        )
    before = live_rows(path)
    assert len(before) == 3
    untouched = {name for name, ids in before.items() if 850 in ids}
    changes = [upd(T, 5, "five"), dele(T, 310, None), ins(T, 750, "new"), upd(T, 700, "last")]
    mark = CommitMark("sub1", Lsn(500), 0)
    written = local.merge_staged(path, STAGED, staged(tmp_path / "m", changes), mark)
    assert written is not None and written.version is not None
    assert (written.inserted, written.updated, written.deleted) == (1, 2, 1)
    store = table_store(path)
    actions = [
        json.loads(line) for line in store.read(commit_name(written.version)).decode().splitlines()
    ]
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info["operation"] == "MERGE" and "looked up in memory" in json.dumps(info)
    assert json.loads(info["userMetadata"])["pgsub"]["lsn"] == str(Lsn(500))
    assert not any("deletionVector" in json.dumps(a) for a in actions)
    now = live_rows(path)
    assert untouched <= set(now) and len(now) == 2  # the third file stays; two become one
    model = {i: f"v{i}" for i in [*range(1, 701), *range(800, 901)]}
    model |= {5: "five", 700: "last", 750: "new"}
    del model[310]
    every_reader(spark, path, sorted(model.items()))
    again = local.merge_staged(path, STAGED, staged(tmp_path / "m2", changes), mark)
    assert again is not None and again.version is None  # Delta's txn: committed before
    assert by_delta_rs(path) == sorted(model.items())


def live_rows(path: str) -> dict[str, set[int]]:
    """Each live file of the table in the bucket, with the keys it holds."""
    store = table_store(path)
    files = LiveFiles(store)
    files.read(latest_version(store))
    return {
        file.name: set(pq.ParquetFile(store.open(file.name)).read(["id"]).column(0).to_pylist())
        for file in files.files
    }


class NoSpark:
    """A Spark session that must not be asked anything."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"Spark was asked for {name}")


def test_maintenance_of_a_small_table_in_the_bucket_asks_nothing_of_spark(
    spark: Any, s3_warehouse: str
) -> None:
    """A small table's maintenance in the bucket - its detail, its compaction by delta-rs
    with the table's mark, its VACUUM - and the check that a state table is there run
    without a JVM: a daemon of small tables needs none for them."""
    tables, applier, path = table_t(spark, s3_warehouse)
    model = {i: "a" for i in range(10)}
    try:
        applier.apply(batch(tx(*(ins(T, i, v) for i, v in model.items()), end=140)))
    finally:
        applier.close()
    mark = opened(path).history(1)[0]["userMetadata"]
    options = storage_for(path).delta_rs_options()
    for n in range(100, 104):  # another engine's small files
        rows = pa.table({"id": pa.array([n], pa.int32()), "v": [f"b{n}"]})
        deltalake.write_deltalake(path, rows, mode="append", storage_options=options)
        model[n] = f"b{n}"
    policy = MaintenanceConfig(compact_files=2, vacuum_interval=0).policy()
    grown = Grown("public.t", TableFeatures())
    done = tend(
        cast("Any", NoSpark()), path, policy, vacuum=True, mark=lambda: mark, features=grown
    )
    assert done.compacted and done.files_before > 2 and done.files_after == 1
    assert done.deleted == 0  # nothing older than the retention yet
    assert engines(path)[-1] == "delta-rs"
    assert tables.applied_lsn("public.t") == Lsn(140)  # the mark carried
    every_reader(spark, path, sorted(model.items()))
    assert is_delta_table(cast("Any", NoSpark()), path)
    assert not is_delta_table(cast("Any", NoSpark()), f"{s3_warehouse}/public/none")


def test_a_state_tables_history_properties_are_set_in_the_bucket_without_spark(
    spark: Any, s3_warehouse: str
) -> None:
    """The state tables are made by delta-rs without the history's properties; a daemon's
    first round sets them by delta-rs, not by a Spark commit (a JVM started for them, the
    worker's checkpoint waiting 9 s in a bucket), and Spark reads them."""
    store = CheckpointStore(cast("Any", NoSpark()), s3_warehouse)
    store.record("sub1", Lsn(7), 0, {"public.t": 1})
    policy = MaintenanceConfig(retention=3600).policy()
    done = tend(
        cast("Any", NoSpark()),
        store.path,
        policy,
        vacuum=False,
        mark=lambda: None,
        held=store.writing,
    )
    assert not done.compacted
    assert engines(store.path) == ["delta-rs", "delta-rs"]
    properties = spark.sql(f"DESCRIBE DETAIL delta.`{store.path}`").first()["properties"]
    assert properties == retention_properties(policy)
    assert store.origin_lsn("sub1") == Lsn(7)
    again = tend(  # nothing left to set: no commit
        cast("Any", NoSpark()), store.path, policy, vacuum=False, mark=lambda: None
    )
    assert again.files_before == 1 and len(engines(store.path)) == 2
