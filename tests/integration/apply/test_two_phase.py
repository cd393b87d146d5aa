"""two_phase: prepared transactions staged at PREPARE, applied once at COMMIT PREPARED."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import deltalake
import pytest

from apply.delta.state_store import PreparedStore
from subscriber.runtime import admin
from subscriber.runtime.config import Config
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE keyed (id int PRIMARY KEY, v text);
CREATE TABLE bag (a int, b text);
ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE PUBLICATION pub FOR TABLE keyed, bag;
"""


def staged(spark: Any, warehouse: Path) -> list[str]:
    return [gid for gid, _ in PreparedStore(spark, str(warehouse)).staged("sub1")]


def slot_two_phase(publisher: PgDatabase) -> bool:
    return bool(publisher.fetchval("SELECT two_phase FROM pg_replication_slots"))


def two_phase_history(warehouse: Path) -> list[str]:
    """What the state store recorded for two_phase, in order (read by delta-rs)."""
    path = warehouse / "_pgsub" / "subscription_settings"
    rows = deltalake.DeltaTable(str(path)).to_pyarrow_table()
    found = [r for r in rows.to_pylist() if r["key"] == "two_phase"]
    return [r["value"] for r in sorted(found, key=lambda r: r["recorded_at"])]


def keyed_values(rep: Replication) -> dict[int, str]:
    return {r["id"]: r["v"] for r in rep.rows("public.keyed")}


def test_prepared_transactions_wait_for_commit_prepared_and_apply_once(
    publisher_any: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """On every publisher major with protocol 3 (the matrix's two-phase scenario)."""
    publisher = publisher_any
    if publisher.major < 15:
        pytest.skip("two_phase needs PostgreSQL 15 (protocol 3)")
    publisher.execute(SCHEMA)
    publisher.set_config("logical_decoding_work_mem", "64kB")
    settings: dict[str, Any] = {"two_phase": True, "streaming": "on", "batch": {"max_changes": 700}}
    with Replication(publisher, spark, warehouse, **settings) as rep:
        publisher.execute("INSERT INTO keyed VALUES (0, 'before')")
        rep.caught_up()
        assert slot_two_phase(publisher)
        publisher.execute(
            "BEGIN; INSERT INTO keyed SELECT g, 'p' || g FROM generate_series(1, 100) g;"
            "INSERT INTO bag VALUES (1, 'prepared'); PREPARE TRANSACTION 'g1'"
        )
        rep.caught_up()
        # Prepared, not committed: nothing in the tables, staged, and confirmed upstream.
        assert keyed_values(rep) == {0: "before"} and staged(spark, warehouse) == ["g1"]
        confirmed = publisher.confirmed_flush_lsn("sub1")
        assert confirmed is not None
    # Restarted: the PREPARE is not sent again (it is confirmed); its staging is what holds it.
    with Replication(publisher, spark, warehouse, **settings) as rep:
        publisher.execute("INSERT INTO keyed VALUES (1000, 'committed after the prepare')")
        publisher.execute("COMMIT PREPARED 'g1'")
        rep.caught_up()
        rep.assert_equal("public.keyed", key=("id",))
        rep.assert_equal("public.bag")
        wait_until(lambda: staged(spark, warehouse) == [], what="the staging removed")

        publisher.execute("BEGIN; DELETE FROM keyed WHERE id <= 50; PREPARE TRANSACTION 'g2'")
        publisher.execute("ROLLBACK PREPARED 'g2'")
        # A large prepared transaction, streamed, with a rolled-back subtransaction.
        publisher.execute(
            "BEGIN; INSERT INTO bag SELECT g % 7, 'big' FROM generate_series(1, 3000) g;"
            "SAVEPOINT a; UPDATE keyed SET v = 'undone'; ROLLBACK TO SAVEPOINT a;"
            "UPDATE keyed SET v = 'big' WHERE id % 3 = 0; PREPARE TRANSACTION 'g3'"
        )
        rep.caught_up()
        assert staged(spark, warehouse) == ["g3"]
        wait_until(
            lambda: publisher.fetchval("SELECT stream_txns FROM pg_stat_replication_slots"),
            what="the prepared transaction streamed",
        )
        publisher.execute("COMMIT PREPARED 'g3'")
        rep.caught_up()
        rep.assert_equal("public.keyed", key=("id",))
        rep.assert_equal("public.bag")
        wait_until(lambda: staged(spark, warehouse) == [], what="the staging removed")
        assert len(keyed_values(rep)) == 102
    # Once more: nothing is applied twice.
    with Replication(publisher, spark, warehouse, **settings) as rep:
        rep.caught_up()
        rep.assert_equal("public.keyed", key=("id",))
        rep.assert_equal("public.bag")


def test_two_phase_is_pending_until_every_table_is_ready_then_refuses_copies(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """As PostgreSQL: a table-sync worker cannot follow a prepared transaction, so two-phase
    waits for READY; once on, a command that would copy a table again is refused."""
    publisher.execute(SCHEMA)
    publisher.execute("INSERT INTO keyed SELECT g, 'c' || g FROM generate_series(1, 20000) g")
    settings: dict[str, Any] = {"two_phase": True, "copy_data": True}
    with Replication(publisher, spark, warehouse, **settings) as rep:
        runner = rep.runner
        assert runner is not None
        wait_until(lambda: runner.status.two_phase == "enabled", timeout=120, what="two_phase on")
        assert two_phase_history(warehouse) == ["pending", "enabled"]
        assert slot_two_phase(publisher)
        publisher.execute(
            "BEGIN; UPDATE keyed SET v = 'two' WHERE id < 10; PREPARE TRANSACTION 'x'"
        )
        rep.caught_up()
        assert staged(spark, warehouse) == ["x"]
        publisher.execute("COMMIT PREPARED 'x'")
        rep.caught_up()
        rep.assert_equal("public.keyed", key=("id",))

        config = Config(warehouse=str(warehouse), subscriptions=[rep.config])
        with pytest.raises(admin.AdminError, match="two_phase is enabled"):
            admin.resync(config, rep.config, ["public.keyed"])
        publisher.execute(
            "CREATE TABLE later (id int PRIMARY KEY); ALTER PUBLICATION pub ADD TABLE later"
        )
        with pytest.raises(admin.AdminError, match="copy_data: false"):
            admin.refresh_publication(config, rep.config)
        no_copy = rep.config.model_copy(update={"copy_data": False})
        added, _ = admin.refresh_publication(config, no_copy)
        assert added == ["public.later"]
        wait_until(
            lambda: "public.later" in {s.qualified_name for s in runner.coordinator.statuses},
            timeout=60,
            what="the running leader to pick up the refresh",
        )
        publisher.execute("INSERT INTO later VALUES (1)")
        rep.caught_up()
        rep.assert_equal("public.later", key=("id",))


def test_a_transaction_prepared_before_two_phase_was_on_arrives_whole_at_its_commit(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """Prepared before the slot decoded prepares: COMMIT PREPARED sends it whole then
    (Begin Prepare ... Prepare, Commit Prepared). Then two_phase cannot be turned off."""
    publisher.execute(SCHEMA)
    with Replication(publisher, spark, warehouse) as rep:
        publisher.execute("INSERT INTO keyed VALUES (1, 'one')")
        publisher.execute("BEGIN; INSERT INTO keyed VALUES (2, 'two'); PREPARE TRANSACTION 'early'")
        rep.caught_up()
        assert keyed_values(rep) == {1: "one"} and not slot_two_phase(publisher)
    with Replication(publisher, spark, warehouse, two_phase=True) as rep:
        rep.caught_up()
        assert slot_two_phase(publisher)
        publisher.execute("COMMIT PREPARED 'early'")
        rep.caught_up()
        rep.assert_equal("public.keyed", key=("id",))
        wait_until(lambda: staged(spark, warehouse) == [], what="the staging removed")
    rep = Replication(publisher, spark, warehouse, two_phase=False).start(wait=False)
    try:
        runner = rep.runner
        assert runner is not None
        wait_until(
            lambda: "cannot be turned off" in (runner.status.last_error or ""),
            timeout=60,
            what="the refusal to turn two_phase off",
        )
    finally:
        rep.stop()


def test_a_failing_commit_prepared_is_skipped_by_its_lsn(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """The error names the COMMIT PREPARED's LSN (where pgsub applies it); `pgsub skip` of it
    skips the transaction, and the staging is removed."""
    publisher.execute(SCHEMA)
    with Replication(publisher, spark, warehouse, two_phase=True) as rep:
        publisher.execute("INSERT INTO keyed VALUES (1, 'one')")
        rep.caught_up()
        spark.sql(f"INSERT INTO delta.`{rep.path('public.keyed')}` VALUES (5, 'local')")
        publisher.execute("BEGIN; INSERT INTO keyed VALUES (5, 'remote'); PREPARE TRANSACTION 'c'")
        rep.caught_up()
        publisher.execute("COMMIT PREPARED 'c'")
        failed = rep.failed_at()
        runner = rep.runner
        assert runner is not None and "insert_exists" in (runner.status.last_error or "")
        rep.skip(failed)
        publisher.execute("INSERT INTO keyed VALUES (6, 'after')")
        rep.caught_up()
        assert keyed_values(rep) == {1: "one", 5: "local", 6: "after"}
        wait_until(lambda: staged(spark, warehouse) == [], what="the staging removed")
