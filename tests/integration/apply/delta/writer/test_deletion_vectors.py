"""A table that grows past ``table_features.deletion_vectors_above`` gains deletion vectors
(``auto``): its MERGEs then leave the files the copy wrote in place, maintenance compacts
only the small files, and every reader still reads the publisher's rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from apply.delta.spark import maintenance
from subscriber.runtime.config import MaintenanceConfig
from subscriber.runtime.maintenance import Maintenance
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration

ROWS = 20_000


def live_files(path: str) -> dict[str, int]:
    """The table's data files (path -> bytes), as delta-rs reads its log."""
    import deltalake
    import pyarrow as pa

    actions = pa.table(deltalake.DeltaTable(path).get_add_actions(flatten=True))
    return dict(zip(actions["path"].to_pylist(), actions["size_bytes"].to_pylist(), strict=True))


def properties(spark: Any, path: str) -> dict[str, str]:
    return dict(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["properties"] or {})


@pytest.mark.parametrize("mode", ["auto", "never"])
def test_a_table_past_the_size_gains_deletion_vectors_and_keeps_its_big_files(
    publisher: PgDatabase, spark: Any, warehouse: Path, mode: str, monkeypatch: Any
) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text);"
        f"INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, {ROWS}) g;"
        "CREATE PUBLICATION pub FOR TABLE t"
    )
    features = {"deletion_vectors": mode, "deletion_vectors_above": 16 * 1024}
    with (
        capture_logs() as logs,
        Replication(
            publisher,
            spark,
            warehouse,
            copy_data=True,
            table_features=features,
            batch={"max_changes": 500, "max_delay": "50ms"},
        ) as rep,
    ):
        rep.caught_up()
        path = rep.path("public.t")
        copied = live_files(path)
        assert len(copied) == 1 and next(iter(copied.values())) > 16 * 1024
        # Gained with the copy, before READY, and the key index read: not in the first batch
        # while changes wait.
        vectors_at_copy = properties(spark, path).get("delta.enableDeletionVectors") == "true"
        assert vectors_at_copy == (mode == "auto")
        assert rep.runner is not None
        indexed = rep.runner.tables._local_merges._vectors  # what the copy left
        assert (path in indexed) == (mode == "auto")
        with publisher.connect() as conn:  # scattered keys, several batches
            for step in range(6):
                conn.execute("UPDATE t SET v = 'u' WHERE id %% 97 = %s", [step])
                conn.execute("DELETE FROM t WHERE id %% 1009 = %s", [step])
                conn.execute("INSERT INTO t VALUES (%s, 'new')", [ROWS + step + 1])
        rep.caught_up()
        rep.assert_equal("public.t", key=("id",))  # Spark, and delta-rs (QueryBuilder)
        runner = rep.runner
        assert runner is not None
        files = live_files(path)
        gained = [e for e in logs if e["event"] == "target table gains a reader feature"]
        if mode == "never":
            assert properties(spark, path).get("delta.enableDeletionVectors") != "true"
            assert gained == []
            assert not set(copied) & set(files)  # each MERGE rewrote the copy's file
            return
        assert properties(spark, path)["delta.enableDeletionVectors"] == "true"
        assert [(e["table"], e["feature"]) for e in gained] == [("public.t", "deletionVectors")]
        assert set(copied) <= set(files)  # the copy's file stays, rows deleted by bitmaps
        assert len(files) >= 3  # and batches added small files of the changed rows

        # Maintenance compacts the small files only: the copy's file is left as it is.
        applied = runner.tables.applied_lsn("public.t")
        monkeypatch.setattr(maintenance, "COMPACT_BELOW", next(iter(copied.values())) // 2)
        config = MaintenanceConfig(compact_files=2, vacuum_interval=0)
        Maintenance([runner], spark, str(warehouse), config, rep.metrics).round()
        after = live_files(path)
        assert set(copied) <= set(after)
        assert len(after) == 2  # the copy's file and one of everything since
        assert runner.tables.applied_lsn("public.t") == applied
        rep.assert_equal("public.t", key=("id",))
        publisher.execute("UPDATE t SET v = 'after' WHERE id % 101 = 0")
        rep.caught_up()
        rep.assert_equal("public.t", key=("id",))
