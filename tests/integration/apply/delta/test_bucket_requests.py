"""What a batch asks of an object store, request by request (versitygw's access log).

In a bucket every request is a round trip the batch waits for, and a bill: a
batch of one table is its rows' PUT, its vector's PUT, its commit's
conditional PUT and the two HEADs that find the log as pgsub left it - no
multipart upload for a small file, no read of a file this process wrote
(a small table's next rewrite, a fold of small batch files:
``apply.delta.writer.kept_rows``). The state tables the daemon polls are
read incrementally: a poll with nothing new reads no file.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest

from apply.batching.copy_source import CopySource
from apply.columns.columnar import arrow_schema
from apply.columns.schema import target_schema
from apply.core.records import CommitMark, StoredTableState
from apply.delta.state_store import TableStateStore
from apply.delta.tables import DeltaTables
from apply.delta.writer import overwrite as own_commits
from apply.delta.writer import vector_write
from apply.delta.writer.local_tables import opened, read_subscription
from apply.worker.applier import BatchApplier
from subscriber.replication.lsn import Lsn
from tests.plugins.s3 import (
    S3Server,
    bucket_warehouse,
    logged_requests,
    object_kind,
    start_s3_server,
    stop_s3_server,
)
from tests.unit.apply.builders import batch, ins, relation, tx, upd

pytestmark = pytest.mark.integration

T = relation("id", "v")
MARKS = "_test-marks/mark-"  # the keys ``Logged.since`` asks for: never written


class Logged:
    """A bucket whose requests are counted."""

    def __init__(self, server: S3Server, log: Path, warehouse: str) -> None:
        self.server, self.log, self.warehouse = server, log, warehouse
        self._seen = 0
        self._marks = 0

    def since(self) -> list[tuple[str, str]]:
        """The requests made since the last call, the marks excepted.

        versitygw writes a request's log line after it answers, so a line can come late
        (seconds, on a loaded machine). A mark - a HEAD of a key no test writes, sent after
        every request counted has been answered - is logged after them: the log is read
        once the mark is in it and the log has then stopped growing."""
        import obstore
        from obstore.store import from_url

        self._marks += 1
        mark = f"{MARKS}{self._marks}"
        config, client = self.server.storage().obstore_config()
        root = from_url(self.warehouse, config=config, client_options=client)  # type: ignore[call-overload]
        with contextlib.suppress(FileNotFoundError):
            obstore.head(root, mark)
        deadline = time.monotonic() + 60
        made = logged_requests(self.log)
        while not any(key.endswith(mark) for _, key in made[self._seen :]):
            assert time.monotonic() < deadline, f"versitygw never logged the mark {mark}"
            time.sleep(0.05)
            made = logged_requests(self.log)
        while True:
            time.sleep(0.2)
            again = logged_requests(self.log)
            if len(again) == len(made):
                break
            made = again
        new, self._seen = made[self._seen :], len(made)
        return [(op, key) for op, key in new if MARKS not in key]


@pytest.fixture(scope="module")
def logged_server() -> Iterator[tuple[S3Server, Path]]:
    scratch = Path(tempfile.mkdtemp(prefix="pgsub-requests-"))
    server = start_s3_server(scratch / "root", access_log=scratch / "access.log")
    try:
        yield server, scratch / "access.log"
    finally:
        stop_s3_server(server)
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def bucket(
    logged_server: tuple[S3Server, Path], request: pytest.FixtureRequest
) -> Iterator[Logged]:
    server, log = logged_server
    with bucket_warehouse(server, request) as warehouse:
        yield Logged(server, log, warehouse)


def of_table(made: list[tuple[str, str]], table: str) -> Counter[str]:
    """The requests on ``table``'s objects, by operation and kind of object."""
    return Counter(f"{op} {object_kind(key)}" for op, key in made if f"/{table}/" in key)


def assert_written_whole(made: Counter[str], batches: int, *kinds: str) -> None:
    """``batches`` batches each PUT one object of each of ``kinds`` whole (no multipart
    upload) and read no data file back."""
    for kind in kinds:
        assert made[f"PutObject {kind}"] == batches, made
    assert not {k for k in made if "Multipart" in k or "UploadPart" in k}, made
    assert made["GetObject data"] == 0, made


def test_a_small_table_rewritten_each_batch_is_a_put_of_its_rows_and_of_its_commit(
    spark: Any, bucket: Logged
) -> None:
    """A 50-row table rewritten whole by pgsub's own commit: each batch PUTs its one file
    (one request, not a multipart upload) and its commit, after two HEADs; the rows it
    rewrites are the ones it wrote last batch, never read back from the bucket."""
    tables = DeltaTables(spark, bucket.warehouse, "sub1")
    applier = BatchApplier("sub1", tables, lambda oid: None)
    path = tables.path("public.t")
    try:
        applier.apply(batch(tx(*(ins(T, i, "a") for i in range(50)), end=100)))
        bucket.since()
        for n in range(1, 13):
            applier.apply(batch(tx(upd(T, n, f"b{n}"), end=100 + n * 10)))
    finally:
        applier.close()
    made = of_table(bucket.since(), "t")
    assert_written_whole(made, 12, "data", "commit")
    assert made["HeadObject commit"] <= 24, made
    rows = opened(path).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["v"]) for r in rows) == [
        (i, f"b{i}" if 1 <= i <= 12 else "a") for i in range(50)
    ]
    assert tables.applied_lsn("public.t") == Lsn(220)


def test_a_batch_by_deletion_vectors_reads_no_file_it_wrote_even_when_it_folds(
    spark: Any, bucket: Logged, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table written by deletion vectors: a batch is its rows' PUT, its vector's PUT and
    its commit, whole files, never a multipart upload; the batches that fold the small
    files of earlier ones (every 16 to 31) take their rows from memory, not the bucket.
    The batch that turns them on reads the log once, without a HEAD a commit."""
    # The fold point comes from the table's path (16 to 31, ``fold_at``), here a bucket of a
    # random name: fixed, so that the 40 batches fold the same way each run.
    monkeypatch.setattr(vector_write, "fold_at", lambda location: 16)
    tables = DeltaTables(spark, bucket.warehouse, "sub1")
    applier = BatchApplier("sub1", tables, lambda oid: None)
    path = tables.path("public.t")
    model = {i: f"{i:064d}" for i in range(20_000)}
    try:
        applier.apply(batch(tx(*(ins(T, i, v) for i, v in model.items()), end=100)))
        bucket.since()
        applier.apply(batch(tx(upd(T, 1, "one"), end=110)))  # vectors turned on
        gained = of_table(bucket.since(), "t")
        model[1] = "one"
        assert "deletionVectors" in (opened(path).protocol().reader_features or ())
        bucket.since()
        for n in range(2, 42):
            key = n * 97
            applier.apply(batch(tx(upd(T, key, f"n{n}"), end=100 + n * 10)))
            model[key] = f"n{n}"
    finally:
        applier.close()
    assert_written_whole(of_table(bucket.since(), "t"), 40, "deletion vector", "data", "commit")
    # The batch that turns vectors on: one commit (the protocol's actions beside the
    # batch's); its log read by one listing, each commit asked for once (no HEAD a commit,
    # no listing to find what the log check just found), and not read again by delta-rs
    # after a commit of the protocol's own (7 GETs then).
    assert gained["PutObject commit"] == 1, gained
    assert gained["HeadObject commit"] <= 2, gained
    assert gained["ListObjectsV2 log listing"] <= 2, gained
    assert gained["GetObject commit"] <= 5, gained
    assert gained["GetObject data"] == 0, gained  # the key index from the rows kept
    files = opened(path).get_add_actions(flatten=True)
    assert files.num_rows < 20  # folded: the 40 batch files are not all live
    found = deltalake.QueryBuilder().register("t", opened(path)).execute("SELECT id, v FROM t")
    got = {r["id"]: r["v"] for r in pa.table(found.read_all()).to_pylist()}
    assert got == model


def test_a_state_table_polled_with_nothing_new_reads_no_file(bucket: Logged) -> None:
    """The daemon polls its state tables: a poll with nothing new is a HEAD and a LIST, one
    after an append reads only the file it added (its footer, then its rows); the rows are
    always the table's."""

    def no_spark() -> Any:
        raise AssertionError("the state store asked for Spark")

    states = TableStateStore(no_spark, bucket.warehouse)
    for oid in range(16384, 16394):
        states.record("sub1", [StoredTableState(oid, "public", f"t{oid}", "d", Lsn(100))])
    assert len(states.load("sub1")) == 10
    bucket.since()
    assert len(states.load("sub1")) == 10
    made = bucket.since()
    assert not [r for r in made if r[0] == "GetObject" and r[1].endswith(".parquet")], made
    assert len(made) <= 3, made
    states.record("sub1", [StoredTableState(16384, "public", "t16384", "r", Lsn(200))])
    bucket.since()
    loaded = states.load("sub1")
    made = bucket.since()
    assert loaded[16384].state == "r"
    assert len({r[1] for r in made if r[0] == "GetObject" and r[1].endswith(".parquet")}) == 1


def test_a_state_table_made_anew_at_its_path_is_read_anew(bucket: Logged) -> None:
    """A state table removed and made again where it was (its log restarted at version 0):
    the kept read is dropped, and only the new table's rows are found."""
    import obstore
    from obstore.store import from_url

    def no_spark() -> Any:
        raise AssertionError("the state store asked for Spark")

    states = TableStateStore(no_spark, bucket.warehouse)
    for n in range(3):
        states.record("sub1", [StoredTableState(16384 + n, "public", f"t{n}", "r", Lsn(100))])
    assert len(states.load("sub1")) == 3
    config, client = bucket.server.storage().obstore_config()
    root = from_url(bucket.warehouse, config=config, client_options=client)  # type: ignore[call-overload]
    for chunk in obstore.list(root, "_pgsub/table_states/"):
        obstore.delete(root, [item["path"] for item in chunk])
    states.record("sub1", [StoredTableState(20000, "public", "x", "i", Lsn(300))])
    assert list(states.load("sub1")) == [20000]
    assert read_subscription(f"{bucket.warehouse}/_pgsub/table_states", "sub1") is not None


def test_a_restart_reads_a_table_progress_from_its_newest_commit_alone(
    spark: Any, bucket: Logged
) -> None:
    """After a restart a table's progress (the LSN of its latest batch) is read from its
    newest commit: the checkpoint's pointer, a listing of the log from it, that commit -
    not the log replayed from its checkpoint and a hundred commits read (delta-rs's
    history: 7 ms of CPU a table, which held the first batch of 200 tables for seconds),
    nor a listing first to ask whether the table is there. A table that is not there has
    no progress, found by that one listing."""
    tables = DeltaTables(spark, bucket.warehouse, "sub1")
    applier = BatchApplier("sub1", tables, lambda oid: None)
    try:
        applier.apply(batch(tx(*(ins(T, i, "a") for i in range(50)), end=100)))
        for n in range(1, 15):  # past the checkpoint at version 10
            applier.apply(batch(tx(upd(T, n, f"b{n}"), end=100 + n * 10)))
    finally:
        applier.close()
    bucket.since()
    assert DeltaTables(spark, bucket.warehouse, "sub1").applied_lsn("public.t") == Lsn(240)
    made = bucket.since()
    kinds = of_table(made, "t")
    assert kinds["GetObject commit"] == 1, kinds
    assert kinds["ListObjectsV2 log listing"] == 1, kinds  # the log from its checkpoint
    assert not [key for _, key in made if key.endswith(".parquet")], made
    assert DeltaTables(spark, bucket.warehouse, "sub1").applied_lsn("public.absent") == Lsn(0)
    absent = of_table(bucket.since(), "absent")
    assert absent["ListObjectsV2 log listing"] == 1, absent
    assert absent.total() <= 2, absent  # the checkpoint's pointer, the listing


def test_a_copy_reads_its_tables_log_once(spark: Any, bucket: Logged, tmp_path: Path) -> None:
    """A table's creation is one PUT of its first commit, after one listing of its log
    (delta-rs's read the log it had made three times: 14 requests). Its copy into a bucket
    - its write, its size check, the key index its first batch needs - goes on from one
    opening of the table's log, brought forward over the copy's commit: two listings of
    the log and its few commits read once each (each step opened the log again: four
    listings, twelve reads of commits, four of its checkpoint). The rows are the copy's,
    and a batch after it applies over them."""
    tables = DeltaTables(spark, bucket.warehouse, "sub1")
    applier = BatchApplier("sub1", tables, lambda oid: None)
    schema = target_schema(T, lambda oid: None, keyed=True)
    arrow = arrow_schema(schema.columns)
    block = pa.table({"id": list(range(500)), "v": [f"v{i}" for i in range(500)]}).cast(arrow)
    try:
        bucket.since()
        tables.prepare(schema)
        created = of_table(bucket.since(), "t")
        copied, _ = tables.copy_into(
            schema, CopySource.in_memory([block]), CommitMark("sub1", Lsn(100), 0), tmp_path
        )
        made = of_table(bucket.since(), "t")
        applier.apply(batch(tx(upd(T, 7, "seven"), end=110)))
    finally:
        applier.close()
    assert copied == 500
    assert created == {"ListObjectsV2 log listing": 1, "PutObject commit": 1}, created
    assert made["PutObject data"] == 1, made
    assert made["PutObject commit"] == 1, made
    assert made["ListObjectsV2 log listing"] <= 2, made
    assert made["GetObject commit"] <= 4, made
    assert made["GetObject checkpoint"] <= 1, made
    found = opened(tables.path("public.t")).to_pyarrow_table().to_pylist()
    assert {r["id"]: r["v"] for r in found} == {
        i: "seven" if i == 7 else f"v{i}" for i in range(500)
    }


def test_a_tables_checkpoint_reads_no_commit_it_made(
    spark: Any, bucket: Logged, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table's checkpoint is pgsub's, made from the commits it made: its last checkpoint
    read once, the new one and its pointer PUT, one listing of the log's oldest files for
    the expired ones, no commit read - delta-rs's read each commit since the last one four
    times (412 GETs a checkpoint at the default interval). The first after the table is
    opened reads each commit since the last checkpoint once."""
    monkeypatch.setattr(own_commits, "_CHECKPOINT_INTERVAL", 10)
    tables = DeltaTables(spark, bucket.warehouse, "sub1")
    applier = BatchApplier("sub1", tables, lambda oid: None)
    path = tables.path("public.t")
    try:
        applier.apply(batch(tx(*(ins(T, i, "a") for i in range(50)), end=100)))
        for n in range(1, 12):  # through the first checkpoint
            applier.apply(batch(tx(upd(T, n, f"b{n}"), end=100 + n * 10)))
        bucket.since()
        for n in range(12, 32):  # two more checkpoints, from what the writer holds
            applier.apply(batch(tx(upd(T, n, f"b{n}"), end=100 + n * 10)))
    finally:
        applier.close()
    made = of_table(bucket.since(), "t")
    assert made["GetObject commit"] == 0, made
    assert made["PutObject checkpoint"] == 4, made  # two checkpoints, two pointers
    assert made["GetObject checkpoint"] == 2, made  # each one's base, whole: one GET
    assert made["ListObjectsV2 log listing"] == 2, made  # the expired log's, from its start
    assert_written_whole(made, 20, "data", "commit")
    rows = opened(path).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["v"]) for r in rows) == [
        (i, f"b{i}" if 1 <= i <= 31 else "a") for i in range(50)
    ]
    assert tables.applied_lsn("public.t") == Lsn(410)
