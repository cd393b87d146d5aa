"""Conflicts from real scenarios: another writer of the Delta table, then the publisher's change."""

import json
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration


def counter(rep: Replication, kind: str, relation: str = "public.t") -> float:
    value = rep.metrics.registry.get_sample_value(
        "pgsub_conflicts_total", {"subscription": "sub1", "relation": relation, "type": kind}
    )
    return value or 0.0


def conflict_rows(spark: Any, warehouse: Path) -> list[dict[str, Any]]:
    path = str(warehouse / "_pgsub" / "conflicts")
    return [
        r.asDict() for r in spark.read.format("delta").load(path).orderBy("recorded_at").collect()
    ]


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_missing_rows_are_logged_counted_recorded_and_skipped(
    publisher: PgDatabase, spark: Any, warehouse: Path, binary: bool
) -> None:
    """Binary mode too: its keys are looked up typed and its values logged as text."""
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t"
    )
    with (
        Replication(publisher, spark, warehouse, binary=binary) as rep,
        capture_logs() as events,
    ):
        publisher.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 5) g")
        rep.caught_up()
        # Another writer removes two rows from the Delta table...
        from delta.tables import DeltaTable

        DeltaTable.forPath(spark, rep.path("public.t")).delete("id IN (1, 2)")
        # ...then the publisher changes them: PostgreSQL logs and skips both.
        publisher.execute("UPDATE t SET v = 'new' WHERE id = 1; DELETE FROM t WHERE id = 2")
        publisher.execute("UPDATE t SET v = 'fine' WHERE id = 3")
        rep.caught_up()
        assert counter(rep, "update_missing") == 1 and counter(rep, "delete_missing") == 1
        assert sorted((r["id"], r["v"]) for r in rep.rows("public.t")) == [
            (3, "fine"),
            (4, "v4"),
            (5, "v5"),
        ]
    messages = [e for e in events if str(e["event"]).startswith("conflict detected")]
    kinds = sorted(e["conflict"] for e in messages)
    assert kinds == ["delete_missing", "update_missing"]
    update = next(e for e in messages if e["conflict"] == "update_missing")
    assert update["event"] == 'conflict detected on relation "public.t": conflict=update_missing'
    assert update["remote_row"] == {"id": "1", "v": "new"}
    assert update["replica_identity"] == {"id": "1"}
    delete = next(e for e in messages if e["conflict"] == "delete_missing")
    assert delete["replica_identity"] == {"id": "2"}
    assert update["detail"].startswith("Could not find the row to be updated.")
    assert update["log_level"] == "warning" and update["remote_xid"] > 0
    rows = conflict_rows(spark, warehouse)
    assert sorted(r["type"] for r in rows) == ["delete_missing", "update_missing"]
    assert json.loads(next(r for r in rows if r["type"] == "update_missing")["remote_row"]) == {
        "id": "1",
        "v": "new",
    }


def test_insert_exists_stops_the_apply_at_its_transaction(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t"
    )
    with Replication(publisher, spark, warehouse) as rep:
        publisher.execute("INSERT INTO t VALUES (1, 'one')")
        rep.caught_up()
        spark.createDataFrame([(7, "local " + "x" * 100)], "id int, v string").write.format(
            "delta"
        ).mode("append").save(rep.path("public.t"))
        xid = publisher.fetchval("INSERT INTO t VALUES (7, 'remote') RETURNING txid_current()")
        publisher.execute("INSERT INTO t VALUES (8, 'after')")
        runner = rep.runner
        assert runner is not None
        wait_until(lambda: counter(rep, "insert_exists") >= 2, timeout=120, what="retries")
        error = runner.status.last_error or ""
        assert 'conflict detected on relation "public.t": conflict=insert_exists' in error
        assert f"in transaction {xid} finished at" in error
        # Nothing at or after the conflicting transaction is applied or confirmed.
        assert sorted(r["id"] for r in rep.rows("public.t")) == [1, 7]
        confirmed = publisher.fetchval(
            "SELECT confirmed_flush_lsn < pg_current_wal_insert_lsn()"
            " FROM pg_replication_slots WHERE slot_name = 'sub1'"
        )
        assert confirmed
        rows = conflict_rows(spark, warehouse)
        first = rows[0]
        assert first["type"] == "insert_exists" and first["resolution"] == "error"
        assert json.loads(first["existing_local_row"])["v"] == "local " + "x" * 100  # full value
        assert first["remote_xid"] == xid


def test_a_chain_is_judged_on_its_first_change_and_apply_remote_upserts(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t"
    )
    resolutions = {"insert_exists": "apply_remote", "update_exists": "apply_remote"}
    with Replication(
        publisher, spark, warehouse, conflicts=resolutions, batch={"max_delay": "3s"}
    ) as rep:
        publisher.execute("INSERT INTO t VALUES (1, 'one')")
        rep.caught_up()
        spark.createDataFrame([(5, "local")], "id int, v string").write.format("delta").mode(
            "append"
        ).save(rep.path("public.t"))
        # Insert then update of a key that already exists: one chain, judged on the insert.
        publisher.execute(
            "BEGIN; INSERT INTO t VALUES (5, 'remote');"
            " UPDATE t SET v = 'remote2' WHERE id = 5; COMMIT"
        )
        rep.caught_up()
        assert counter(rep, "insert_exists") == 1 and counter(rep, "update_missing") == 0
        rep.assert_equal("public.t", key=("id",))
        # An update that moves a row onto a key another writer used: update_exists.
        spark.createDataFrame([(9, "local")], "id int, v string").write.format("delta").mode(
            "append"
        ).save(rep.path("public.t"))
        publisher.execute("UPDATE t SET id = 9 WHERE id = 1")
        rep.caught_up()
        assert counter(rep, "update_exists") == 1
        rep.assert_equal("public.t", key=("id",))


def test_skip_by_the_logged_lsn_resumes_without_exactly_that_transaction(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t"
    )
    with Replication(publisher, spark, warehouse) as rep:
        publisher.execute("INSERT INTO t VALUES (1, 'one')")
        rep.caught_up()
        spark.createDataFrame([(7, "local")], "id int, v string").write.format("delta").mode(
            "append"
        ).save(rep.path("public.t"))
        publisher.execute(
            "BEGIN; INSERT INTO t VALUES (6, 'same tx'); INSERT INTO t VALUES (7, 'remote'); COMMIT"
        )
        publisher.execute("INSERT INTO t VALUES (8, 'after')")
        runner = rep.runner
        assert runner is not None
        rep.skip(rep.failed_at())
        rep.caught_up()
        # The publisher minus exactly the skipped transaction (rows 6 and 7), plus the local 7.
        assert sorted((r["id"], r["v"]) for r in rep.rows("public.t")) == [
            (1, "one"),
            (7, "local"),
            (8, "after"),
        ]
        assert runner.settings.skip_lsn is None  # cleared once the skip was durable


def test_disable_on_error_stops_and_enable_resumes(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    from delta.tables import DeltaTable

    from subscriber.runtime import admin
    from subscriber.runtime.config import Config

    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t"
    )
    with Replication(publisher, spark, warehouse, disable_on_error=True) as rep:
        publisher.execute("INSERT INTO t VALUES (1, 'one')")
        rep.caught_up()
        spark.createDataFrame([(2, "local")], "id int, v string").write.format("delta").mode(
            "append"
        ).save(rep.path("public.t"))
        publisher.execute("INSERT INTO t VALUES (2, 'remote')")
        runner = rep.runner
        assert runner is not None
        wait_until(lambda: runner.status.state == "disabled", timeout=120, what="disabled")
        assert counter(rep, "insert_exists") == 1  # no retries while disabled
        disabled = rep.metrics.registry.get_sample_value(
            "pgsub_subscription_enabled", {"subscription": "sub1"}
        )
        assert disabled == 0
        DeltaTable.forPath(spark, rep.path("public.t")).delete("id = 2")  # the operator repairs
        admin.set_enabled(
            Config(warehouse=str(warehouse), subscriptions=[rep.config]), rep.config, True
        )
        rep.caught_up()
        rep.assert_equal("public.t", key=("id",))


def test_disable_on_error_covers_a_failed_table_sync(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    from subscriber.runtime import admin
    from subscriber.runtime.config import Config
    from tablesync.state import TableState

    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t;"
        " INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 3) g"
    )
    # No Delta table and create_tables off: the table-sync worker fails.
    settings: dict[str, Any] = {"copy_data": True, "create_tables": False, "disable_on_error": True}
    with Replication(publisher, spark, warehouse, **settings) as rep:
        runner = rep.runner
        assert runner is not None
        wait_until(lambda: runner.status.state == "disabled", timeout=120, what="disabled")
        assert "create_tables is off" in (runner.status.last_error or "")
        errors = rep.metrics.registry.get_sample_value(
            "pgsub_sync_errors_total", {"subscription": "sub1"}
        )
        assert errors == 1  # disabled, not retried
        # The operator creates the table, then enables the subscription.
        spark.sql(f"CREATE TABLE delta.`{rep.path('public.t')}` (id INT, v STRING) USING delta")
        publisher.execute("INSERT INTO t VALUES (4, 'while disabled')")
        admin.set_enabled(
            Config(warehouse=str(warehouse), subscriptions=[rep.config]), rep.config, True
        )
        wait_until(
            lambda: all(s.state is TableState.READY for s in runner.coordinator.statuses),
            timeout=180,
            what="the table to be READY",
        )
        rep.caught_up()
        rep.assert_equal("public.t", key=("id",))
