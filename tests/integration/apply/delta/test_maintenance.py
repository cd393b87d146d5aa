"""Maintenance keeps tables small and never costs a row, exactly-once, or time travel."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from apply.delta import local_merge
from subscriber.runtime.config import MaintenanceConfig
from subscriber.runtime.maintenance import Maintenance
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
    monkeypatch.setattr(local_merge, "REWRITE_MAX_BYTES", -1)
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
            # (apply.batch.GROWTH) and put several inserts in one commit.
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
    from apply.delta.state_store import CheckpointStore

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
