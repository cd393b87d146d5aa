"""Maintenance keeps tables small and never costs a row, exactly-once, or time travel."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from apply.delta.spark import maintenance as delta_maintenance
from apply.delta.spark.maintenance import tend
from apply.delta.state_store import CheckpointStore
from apply.delta.writer import delta_rs_merge
from apply.delta.writer.local_tables import opened
from subscriber.replication.lsn import Lsn
from subscriber.runtime.config import MaintenanceConfig
from subscriber.runtime.maintenance import Maintenance
from subscriber.runtime.subscription import SubscriptionRunner
from tests.support.delta_log import operations, writers
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration


def data_files(spark: Any, path: str) -> int:
    return int(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["numFiles"])


def test_compaction_and_vacuum_keep_rows_progress_and_time_travel(
    publisher: PgDatabase, spark: Any, warehouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each insert merged, adding a file of its own, as in a table past REWRITE_MAX_BYTES
    # (a table that small is otherwise rewritten whole by each batch: one file).
    monkeypatch.setattr(delta_rs_merge, "REWRITE_MAX_BYTES", -1)
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t"
    )
    settings: dict[str, Any] = {
        "batch": {"max_changes": 1, "max_delay": "10ms"},
        "checkpoint_interval": 0,
    }
    with Replication(publisher, spark, warehouse, **settings) as rep:
        for n in range(1, 7):  # one commit, and one more file, each
            publisher.execute(f"INSERT INTO t VALUES ({n}, 'v')")
            # Applied before the next: a lagging target would grow the batch
            # (apply.core.batch.GROWTH) and put several inserts in one commit.
            rep.caught_up()
        path = rep.path("public.t")
        before = data_files(spark, path)
        assert before >= 6
        runner = rep.runner
        assert runner is not None
        applied = runner.tables.applied_lsn("public.t")
        checkpoint = (
            spark.read.format("delta")
            .load(str(warehouse / "_pgsub" / "checkpoints"))
            .where("tables['public.t'] IS NOT NULL")
            .orderBy("lsn")
            .first()
        )
        config = MaintenanceConfig(compact_files=4, vacuum_interval=0)
        Maintenance([runner], spark, str(warehouse), config, rep.metrics).round()

        assert data_files(spark, path) < 4
        # A table this small is compacted by delta-rs (no JVM), its mark carried.
        assert operations(Path(path))[-1] == "OPTIMIZE"
        assert writers(Path(path))[-1] == "delta-rs"
        assert runner.table_files == {"public.t": data_files(spark, path)}  # its /status
        last = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()
        assert last["operation"] in ("OPTIMIZE", "VACUUM END")
        assert '"lsn"' in (last["userMetadata"] or "")  # the table's mark carried forward
        assert runner.tables.applied_lsn("public.t") == applied
        rep.assert_equal("public.t", key=("id",))  # Spark and delta-rs
        # Time travel to a recorded checkpoint still reads that point's rows.
        version = checkpoint["tables"]["public.t"]
        old = spark.read.format("delta").option("versionAsOf", version).load(path)
        assert old.count() == 1
        # Replication goes on, exactly once.
        publisher.execute("INSERT INTO t SELECT g, 'after' FROM generate_series(7, 14) g")
        rep.caught_up()
        rep.assert_equal("public.t", key=("id",))
        registry = rep.metrics.registry
        labels = {"subscription": "sub1", "relation": "public.t", "operation": "optimize"}
        assert registry.get_sample_value("pgsub_maintenance_total", labels) == 1
        properties = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["properties"]
        assert properties["delta.setTransactionRetentionDuration"] == "interval 168 hours"


def test_checkpoint_rows_past_the_retention_are_pruned_but_the_latest(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t"
    )
    settings: dict[str, Any] = {
        "batch": {"max_changes": 1, "max_delay": "10ms"},
        "checkpoint_interval": 0,
    }
    with Replication(publisher, spark, warehouse, **settings) as rep:
        with publisher.connect() as conn:
            for n in range(1, 6):
                conn.execute("INSERT INTO t VALUES (%s, 'v')", [n])
        rep.caught_up()
    store = CheckpointStore(spark, str(warehouse))
    origin = store.origin_lsn("sub1")
    store.prune("sub1", datetime.now(UTC) + timedelta(minutes=1))
    rows = spark.read.format("delta").load(store.path).collect()
    assert [r["lsn"] for r in rows] == [int(origin)]
    assert store.origin_lsn("sub1") == origin


@contextmanager
def one_row(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> Iterator[tuple[Replication, SubscriptionRunner]]:
    """public.t replicated with one row, applied; the replication and its runner."""
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t"
    )
    settings: dict[str, Any] = {"batch": {"max_delay": "10ms"}, "checkpoint_interval": 0}
    with Replication(publisher, spark, warehouse, **settings) as rep:
        publisher.execute("INSERT INTO t VALUES (1, 'v')")
        rep.caught_up()
        assert rep.runner is not None
        yield rep, rep.runner


@pytest.mark.parametrize("by", ["pgsub", "spark"])
def test_vacuum_runs_beside_the_tables_writes_and_commits_nothing(
    publisher: PgDatabase, spark: Any, warehouse: Path, monkeypatch: pytest.MonkeyPatch, by: str
) -> None:
    """A full VACUUM (Spark's lists the folder: 52-82 s on a 1M-row table in the long soak)
    does not hold the table's batches, and leaves no commit with an older mark after theirs:
    pgsub's own where it reaches the warehouse, Spark's where it does not."""
    with one_row(publisher, spark, warehouse) as (rep, runner):
        # What a killed job leaves: a file no commit names, older than the retention.
        orphan = Path(rep.path("public.t")) / "part-00000-left-by-a-killed-job.parquet"
        orphan.write_bytes(b"PAR1")
        hours_ago = time.time() - 3 * 3600
        os.utime(orphan, (hours_ago, hours_ago))
        vacuuming, applied = threading.Event(), threading.Event()
        name = "swept" if by == "pgsub" else "_vacuum"
        vacuum = getattr(delta_maintenance, name)

        def vacuum_held_open(*args: Any, **kwargs: Any) -> Any:
            vacuuming.set()
            applied.wait(timeout=240)  # the batch below, applied meanwhile
            return vacuum(*args, **kwargs)

        monkeypatch.setattr(delta_maintenance, name, vacuum_held_open)
        if by == "spark":  # as where pgsub does not reach the warehouse
            monkeypatch.setattr(delta_maintenance, "reachable", lambda path: False)
        policy = MaintenanceConfig(vacuum_interval=0, retention=3600).policy()
        with ThreadPoolExecutor(1) as pool:
            tending = pool.submit(runner.tables.tend, "public.t", policy, vacuum=True)
            try:
                assert vacuuming.wait(timeout=120)
                publisher.execute("INSERT INTO t VALUES (2, 'w')")
                rep.caught_up()  # its MERGE, while VACUUM is under way
                applied_lsn = runner.tables.applied_lsn("public.t")
            finally:
                applied.set()
            done = tending.result(timeout=300)
        assert done.vacuumed
        assert done.deleted == (1 if by == "pgsub" else None)
        assert not orphan.exists()  # the full VACUUM did its work
        history = spark.sql(f"DESCRIBE HISTORY delta.`{rep.path('public.t')}`").collect()
        assert not [row for row in history if row["operation"].startswith("VACUUM")]
        assert runner.tables.applied_lsn("public.t") == applied_lsn  # no older mark came after
        rep.assert_equal("public.t", key=("id",))


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_checkpoints_recorded_while_maintenance_prunes_and_compacts_them(
    spark: Any, warehouse: Path, where: str, request: pytest.FixtureRequest
) -> None:
    """The apply worker records a checkpoint per batch while the maintenance thread prunes
    and compacts ``_pgsub/checkpoints``: neither may fail the other (in the long soak a
    prune's delete failed a checkpoint's commit, and the worker restarted). On a local disk
    and in a bucket delta-rs compacts it, without Spark (12-13 s in a bucket, the
    checkpoints waiting)."""
    root = str(request.getfixturevalue("s3_warehouse")) if where == "bucket" else str(warehouse)
    recorder = CheckpointStore(spark, root)  # the worker's and maintenance's
    pruner = CheckpointStore(spark, root)  # objects, as in the daemon
    recorder.record("sub1", Lsn(1), 0, {"public.t": 1})
    policy = MaintenanceConfig(compact_files=2, vacuum_interval=0).policy()
    stopping, failures, recorded = threading.Event(), list[BaseException](), [1]

    def record() -> None:
        try:
            while not stopping.is_set():
                lsn = recorded[-1] + 1
                recorder.record("sub1", Lsn(lsn), 0, {"public.t": lsn})
                recorded.append(lsn)
        except BaseException as exc:  # reported below
            failures.append(exc)

    worker = threading.Thread(target=record)
    worker.start()
    # Twelve rounds at least, and on until more than 20 checkpoints were recorded beside
    # them: the two really run side by side whatever the machine's load (a busy one made
    # 14 records in 12 rounds); a deadline ends a recorder that stalled.
    rounds, deadline = 0, time.monotonic() + 300
    try:
        while (rounds < 12 or len(recorded) <= 20) and not failures:
            assert time.monotonic() < deadline, f"{len(recorded)} recorded in {rounds} rounds"
            pruner.prune("sub1", datetime.now(UTC))
            tend(spark, pruner.path, policy, vacuum=False, mark=lambda: None, held=pruner.writing)
            rounds += 1
    finally:
        stopping.set()
        worker.join(timeout=120)
    assert not failures, failures
    assert recorder.origin_lsn("sub1") == Lsn(recorded[-1])
    kept = [row["lsn"] for row in spark.read.format("delta").load(recorder.path).collect()]
    assert recorded[-1] in kept
    assert len(kept) < len(recorded)  # pruned as it went
    compactions = [c for c in opened(recorder.path).history() if c["operation"] == "OPTIMIZE"]
    assert compactions
    assert all(str(c.get("clientVersion")).startswith("delta-rs") for c in compactions)


def test_a_round_with_nothing_to_commit_neither_holds_the_table_nor_waits_for_it(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """A table is looked at without holding it: a round that finds nothing to commit (most
    rounds) neither holds the table's batch up nor waits for it; one that has something to
    commit waits for the table."""
    with one_row(publisher, spark, warehouse) as (rep, runner):
        quiet = MaintenanceConfig().policy()  # the table's own retention: nothing due
        shorter = MaintenanceConfig(retention=3600).policy()  # its properties to set
        applied = runner.tables.applied_lsn("public.t")
        with ThreadPoolExecutor(1) as pool:
            with runner.tables.exclusive("public.t"):  # as a batch's MERGE holds it
                done = pool.submit(runner.tables.tend, "public.t", quiet, vacuum=True)
                assert done.result(timeout=120).vacuumed  # not waiting for the table
                due = pool.submit(runner.tables.tend, "public.t", shorter, vacuum=False)
                time.sleep(1)
                assert not due.done()  # waits for the table
            due.result(timeout=120)
        properties = spark.sql(f"DESCRIBE DETAIL delta.`{rep.path('public.t')}`").first()
        assert properties["properties"]["delta.logRetentionDuration"] == "interval 1 hours"
        # Set by delta-rs (no JVM), carrying the table's mark.
        latest = opened(rep.path("public.t")).history(1)[0]
        assert latest["operation"] == "SET TBLPROPERTIES"
        assert str(latest["clientVersion"]).startswith("delta-rs")
        assert runner.tables.applied_lsn("public.t") == applied
        rep.assert_equal("public.t", key=("id",))
